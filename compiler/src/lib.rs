//! The Linnet compiler. The frontend reads a package (`package`), parses
//! its modules (`syntax`) and checks names, dims and shapes (`sema`); the
//! `driver` runs these phases for the `linnetc` CLI, and `diagnostic`
//! renders what they report.

pub mod codegen;
pub mod diagnostic;
pub mod driver;
pub mod interp;
pub mod ir;
pub mod lower;
pub mod lsp;
pub mod package;
pub mod sema;
pub mod source;
pub mod syntax;
