//! What the runtime's test files share: where the repository, the oracle
//! fixture and its model card are.

use linnet_compiler::package::LoadOptions;
use std::path::PathBuf;

pub fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The f32 oracle configuration: package card and weights.
pub fn oracle() -> PathBuf {
    root().join("tests/fixtures/oracle/tiny-qwen3.5-moe")
}

/// The seed package instantiated as the f32 oracle's card says.
pub fn oracle_options() -> LoadOptions {
    LoadOptions { nest: Some(oracle().join("package/nest-f32.toml")), stdlib: Some(root().join("stdlib")), ..LoadOptions::default() }
}
