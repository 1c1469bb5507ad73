//! The frontend as one call: load a package, parse, check, and return the
//! sources with the diagnostics, sorted. The CLI and the tests use this.

use crate::diagnostic::{self, Diagnostic};
use crate::package::{self, LoadOptions, Package};
use crate::source::SourceMap;
use std::path::Path;

pub struct Checked {
    pub sources: SourceMap,
    pub diagnostics: Vec<Diagnostic>,
    pub package: Option<Package>,
    /// What the checker learned, for editors.
    pub index: crate::sema::SourceIndex,
}

impl Checked {
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }
}

pub fn check_package(dir: &Path, options: &LoadOptions) -> Checked {
    let mut sources = SourceMap::default();
    let mut diagnostics = Vec::new();
    let package = package::load(dir, options, &mut sources, &mut diagnostics);
    let index = match &package {
        Some(package) => crate::sema::check(package, &mut diagnostics),
        None => crate::sema::SourceIndex::default(),
    };
    diagnostic::sort(&mut diagnostics);
    Checked { sources, diagnostics, package, index }
}

/// Checks the package and, when it is clean, lowers it to the IR.
pub fn lower_package(dir: &Path, options: &LoadOptions) -> Result<(linnet_ir::Model, Checked), Box<Checked>> {
    lower_package_with(dir, options, crate::lower::Lowering::default())
}

pub fn lower_package_with(
    dir: &Path,
    options: &LoadOptions,
    lowering: crate::lower::Lowering,
) -> Result<(linnet_ir::Model, Checked), Box<Checked>> {
    lower_checked(check_package(dir, options), lowering)
}

/// Lowers a package already checked; a package with errors comes back.
pub fn lower_checked(
    mut checked: Checked,
    lowering: crate::lower::Lowering,
) -> Result<(linnet_ir::Model, Checked), Box<Checked>> {
    if checked.has_errors() {
        return Err(Box::new(checked));
    }
    let Some(package) = &checked.package else { return Err(Box::new(checked)) };
    let mut diagnostics = Vec::new();
    let program = crate::sema::program::Program::build(package, &mut diagnostics);
    let name =
        package.nest.as_ref().and_then(|nest| nest.model_name.clone()).unwrap_or_else(|| package.name().to_string());
    match crate::lower::lower(&program, &checked.sources, &name, lowering) {
        Ok(model) => Ok((model, checked)),
        Err(errors) => {
            checked.diagnostics.extend(errors);
            Err(Box::new(checked))
        }
    }
}

/// The entry dims of the model card's `[check]` table, at which memory
/// plans are reported.
pub fn check_dims(package: &Package) -> std::collections::HashMap<linnet_ir::dim::Symbol, i64> {
    let mut dims = std::collections::HashMap::new();
    for entry in package.nest.iter().flat_map(|nest| &nest.check) {
        if let package::NestValue::Int(value) = entry.value {
            dims.insert(std::sync::Arc::from(entry.name.as_str()), value);
        }
    }
    dims
}
