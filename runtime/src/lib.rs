//! The Linnet runtime: a package is checked and lowered by the compiler,
//! its weights are found and validated (or drawn at random), and its
//! entries run on the reference interpreter. All file IO of running a
//! model is here.

pub mod bench;
pub mod generate;
pub mod init;
pub mod npy;
pub mod random;
pub mod sampling;
pub mod server;
pub mod text;
pub mod weights;

use linnet_compiler::diagnostic;
use linnet_compiler::driver;
use linnet_compiler::interp::Machine;
use linnet_compiler::ir::Model;
use linnet_compiler::package::{LoadOptions, Package};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Where the parameters come from.
#[derive(Clone, Debug)]
pub enum Weights {
    /// A checkpoint folder; `None` looks in the Hugging Face cache.
    Checkpoint(Option<PathBuf>),
    /// Drawn in memory from a seeded generator.
    Random(u64),
}

pub struct Loaded {
    pub machine: Machine,
    /// The checkpoint's folder, when there is one.
    pub weights_dir: Option<PathBuf>,
    pub text: Option<text::TextModel>,
}

/// A package checked and lowered, or the rendered reasons why not.
pub fn lower(package: &Path, options: &LoadOptions) -> Result<(Model, Package), String> {
    match driver::lower_package(package, options) {
        Ok((model, checked)) => Ok((model, checked.package.expect("a lowered package was loaded"))),
        Err(checked) => {
            let mut out = Vec::new();
            diagnostic::render_human(&checked.diagnostics, &checked.sources, false, &mut out).map_err(|e| e.to_string())?;
            Err(format!("{}the package does not check; fix the errors above", String::from_utf8_lossy(&out)))
        }
    }
}

/// The package's bindings: parameter path to checkpoint tensor name.
pub fn bindings(package: &Package) -> HashMap<String, String> {
    package
        .bindings
        .as_ref()
        .map(|b| b.entries.iter().map(|(path, tensor, _)| (path.clone(), tensor.clone())).collect())
        .unwrap_or_default()
}

/// A package ready to run on the interpreter, or why not, as text.
pub fn load(package: &Path, options: &LoadOptions, weights: &Weights) -> Result<Loaded, String> {
    load_on(package, options, weights, linnet_compiler::interp::Backend::Interp)
}

/// A package ready to run on `backend`, or why not, as text.
pub fn load_on(package: &Path, options: &LoadOptions, weights: &Weights, backend: linnet_compiler::interp::Backend) -> Result<Loaded, String> {
    let (model, package) = lower(package, options)?;
    let nest = package.nest.as_ref().expect("a lowered package has a model card");
    match weights {
        Weights::Random(seed) => {
            let params = random::params(&model, *seed);
            Ok(Loaded { machine: Machine::new(model, params).with_backend(backend), weights_dir: None, text: None })
        }
        Weights::Checkpoint(dir) => {
            let dir = weights::locate(dir.as_deref(), nest.repo.as_deref(), nest.revision.as_deref())?;
            let params = weights::load(&model, &bindings(&package), &dir, &nest.weight_files).map_err(|problems| {
                format!("the weights in {} do not fit `{}`:\n  {}", dir.display(), model.name, problems.join("\n  "))
            })?;
            let text = text::TextModel::load(&dir)?;
            Ok(Loaded { machine: Machine::new(model, params).with_backend(backend), weights_dir: Some(dir), text })
        }
    }
}
