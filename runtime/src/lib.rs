//! The Linnet runtime: a package is checked and lowered by the compiler,
//! its weights are found and validated, and its entries run on the
//! reference interpreter. All file IO of running a model is here.

pub mod generate;
pub mod npy;
pub mod weights;

use linnet_compiler::diagnostic;
use linnet_compiler::driver;
use linnet_compiler::interp::Machine;
use linnet_compiler::package::LoadOptions;
use std::collections::HashMap;
use std::path::Path;

/// A package ready to run, or why not, as text for a person.
pub fn load(package: &Path, options: &LoadOptions, weights_dir: Option<&Path>) -> Result<Machine, String> {
    let (model, checked) = match driver::lower_package(package, options) {
        Ok(lowered) => lowered,
        Err(checked) => {
            let mut out = Vec::new();
            diagnostic::render_human(&checked.diagnostics, &checked.sources, false, &mut out).map_err(|e| e.to_string())?;
            return Err(format!("{}the package does not check; fix the errors above", String::from_utf8_lossy(&out)));
        }
    };
    let package = checked.package.as_ref().expect("a lowered package was loaded");
    let nest = package.nest.as_ref().expect("a lowered package has a model card");
    let dir = weights::locate(weights_dir, nest.repo.as_deref(), nest.revision.as_deref())?;
    let bindings: HashMap<String, String> = package
        .bindings
        .as_ref()
        .map(|b| b.entries.iter().map(|(path, tensor, _)| (path.clone(), tensor.clone())).collect())
        .unwrap_or_default();
    let params = weights::load(&model, &bindings, &dir, &nest.weight_files).map_err(|problems| {
        format!("the weights in {} do not fit `{}`:\n  {}", dir.display(), model.name, problems.join("\n  "))
    })?;
    Ok(Machine::new(model, params))
}
