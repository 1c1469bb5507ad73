//! What the runtime's test files share: where the repository, the oracle
//! fixture and its model card are, the golden files' contents, and the
//! dense oracle checkpoint's generics. Each test file uses a part of it.
#![allow(dead_code)]

use linnet_frontend::package::LoadOptions;
use safetensors::SafeTensors;
use std::path::{Path, PathBuf};

pub fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// The f32 oracle configuration: package card and weights.
pub fn oracle() -> PathBuf {
    root().join("tests/fixtures/oracle/tiny-qwen3.5-moe")
}

/// The seed package instantiated as the f32 oracle's card says.
pub fn oracle_options() -> LoadOptions {
    LoadOptions {
        nest: Some(oracle().join("package/nest-f32.toml")),
        stdlib: Some(root().join("stdlib")),
        ..LoadOptions::default()
    }
}

/// The dense oracle checkpoint's generics (its `config.json`), given as
/// `--set` gives them: its folder has no model card of its own.
pub const DENSE_GENERICS: [(&str, &str); 14] = [
    ("Vocab", "512"),
    ("H", "64"),
    ("Heads", "4"),
    ("KvHeads", "2"),
    ("HeadDim", "32"),
    ("KeyHeads", "2"),
    ("ValueHeads", "4"),
    ("KeyDim", "16"),
    ("ValueDim", "16"),
    ("Conv", "128"),
    ("Inner", "96"),
    ("Groups", "2"),
    ("Batch", "2"),
    ("MaxSeq", "64"),
];

/// One sequence of an oracle's golden file.
pub struct Golden {
    pub tokens: Vec<i64>,
    /// The reference's logits at every position, a row each.
    pub logits: Vec<Vec<f32>>,
    /// The tokens greedy generation appends after the whole sequence.
    pub greedy: Vec<i64>,
}

/// Every sequence of `dir/golden-{dtype}.safetensors`, in order.
pub fn golden(dir: &Path, dtype: &str) -> Vec<Golden> {
    let bytes = std::fs::read(dir.join(format!("golden-{dtype}.safetensors"))).expect("golden file");
    let file = SafeTensors::deserialize(&bytes).expect("golden safetensors");
    let words = |name: &str| -> Vec<[u8; 4]> {
        file.tensor(name).expect(name).data().chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]).collect()
    };
    let ints = |name: &str| -> Vec<i64> { words(name).into_iter().map(|w| i64::from(i32::from_le_bytes(w))).collect() };
    let mut sequences = Vec::new();
    for n in 0.. {
        let Ok(logits) = file.tensor(&format!("seq{n}.logits")) else { break };
        let width = *logits.shape().last().expect("logits have a vocabulary axis");
        let floats: Vec<f32> = words(&format!("seq{n}.logits")).into_iter().map(f32::from_le_bytes).collect();
        sequences.push(Golden {
            tokens: ints(&format!("seq{n}.tokens")),
            logits: floats.chunks(width).map(<[f32]>::to_vec).collect(),
            greedy: ints(&format!("seq{n}.greedy")),
        });
    }
    sequences
}
