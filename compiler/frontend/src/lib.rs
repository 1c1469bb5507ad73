//! The Linnet frontend: from a package on disk to a checked program and its
//! tensor IR. `package` reads the package (the only file IO), `syntax`
//! parses its modules, `sema` checks names, dims and shapes under the
//! `where` clauses, and `lower` turns the checked program into a
//! [`linnet_ir::Model`]. `driver` runs these phases in order, and
//! `diagnostic` is what every phase reports, rendered for people or editors.
//!
//! Depends on the IR, never the reverse: no backend links this crate.

pub mod builtin;
pub mod code;
pub mod diagnostic;
pub mod driver;
pub mod lower;
pub mod package;
pub mod sema;
pub mod source;
pub mod syntax;
