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
    if let Some(package) = &package {
        crate::sema::check(package, &mut diagnostics);
    }
    diagnostic::sort(&mut diagnostics);
    Checked { sources, diagnostics, package }
}
