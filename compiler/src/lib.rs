//! The Linnet compiler. The frontend reads a package (`package`), parses
//! its modules (`syntax`) and checks names, dims and shapes (`sema`); the
//! checked program is lowered (`lower`) to the tensor IR (`ir`), which the
//! reference interpreter (`interp`) runs and the CPU backend (`codegen`)
//! compiles; `artifact` writes and reads what `linnetc build` produces.
//! The `driver` runs these phases for the `linnetc` CLI, and `diagnostic`
//! renders what they report.

pub mod artifact;
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
