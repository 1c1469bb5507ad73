//! The unused-import lint: a name a module's `use` brings in and nothing in
//! the module refers to. A reference is what the checker recorded for go
//! to definition (a use of the item's declaration from the module's file),
//! so a module whose check failed is left alone: its broken expressions
//! may not have recorded theirs.

use super::SourceIndex;
use crate::code::Code;
use crate::diagnostic::{Applicability, Diagnostic};
use crate::package::Package;
use crate::source::Span;

/// A warning for each imported name the module never refers to, with the
/// fix that removes it (the whole `use` where none of its names is used).
pub fn report_unused(package: &Package, index: &SourceIndex, diagnostics: &mut Vec<Diagnostic>) {
    for module in &package.modules {
        let failed = diagnostics.iter().any(|d| d.is_error() && d.primary.span.file == module.file);
        if failed {
            continue;
        }
        // Another `use` of the same item is not a use of it.
        let imports: Vec<Span> = module.ast.uses.iter().flat_map(|item| item.names.iter().map(|n| n.span)).collect();
        for item in &module.ast.uses {
            let unused: Vec<usize> = (0..item.names.len())
                .filter(|&at| {
                    let import = item.names[at].span;
                    let Some(declared) = index.definitions.iter().find(|(from, _)| *from == import).map(|(_, to)| *to)
                    else {
                        return false;
                    };
                    !index
                        .definitions
                        .iter()
                        .any(|(from, to)| *to == declared && from.file == module.file && !imports.contains(from))
                })
                .collect();
            if unused.is_empty() {
                continue;
            }
            if unused.len() == item.names.len() {
                let names: Vec<String> = item.names.iter().map(|n| format!("`{}`", n.name)).collect();
                diagnostics.push(
                    Diagnostic::warning(
                        Code::UnusedImport,
                        item.span,
                        format!("{} {} never used", names.join(", "), if names.len() == 1 { "is" } else { "are" }),
                    )
                    .with_label("imported here; nothing in this module refers to it")
                    .with_suggestion(
                        "remove the `use`",
                        item.span,
                        "",
                        Applicability::MachineApplicable,
                    ),
                );
                continue;
            }
            for &at in &unused {
                let name = &item.names[at];
                // The name and the comma that separates it from a neighbour.
                let removed = match item.names.get(at + 1) {
                    Some(next) => Span { end: next.span.start, ..name.span },
                    None => Span { start: item.names[at - 1].span.end, ..name.span },
                };
                diagnostics.push(
                    Diagnostic::warning(Code::UnusedImport, name.span, format!("`{}` is never used", name.name))
                        .with_label("imported here; nothing in this module refers to it")
                        .with_suggestion(
                            format!("remove `{}`", name.name),
                            removed,
                            "",
                            Applicability::MachineApplicable,
                        ),
                );
            }
        }
    }
}
