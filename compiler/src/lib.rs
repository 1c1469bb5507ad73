//! The Linnet compiler. The frontend reads a package (`package`), parses
//! its modules (`syntax`) and checks names, dims and shapes (`sema`); the
//! checked program is lowered (`lower`) to the tensor IR (`ir`). The
//! executor (`exec`) runs a loaded model on a backend: the reference
//! interpreter (`interp`) or the CPU backend (`codegen`), peers that both
//! hold host tensors (`tensor`), compute with the numerics of record
//! (`numerics`) and run the intrinsics' host kernels (`intrinsics`);
//! `artifact` writes and reads what `linnetc build` produces; `gpu` writes
//! the same IR as GPU kernels, which MLIR lowers to PTX with the `nvptx`
//! feature and the CUDA driver runs with the `cuda` feature.
//! The `driver` runs these phases for the `linnetc` CLI, and `diagnostic`
//! renders what they report.

pub mod artifact;
pub mod codegen;
pub mod diagnostic;
pub mod driver;
pub mod exec;
pub mod gpu;
pub mod interp;
pub mod intrinsics;
pub mod ir;
pub mod lower;
pub mod lsp;
pub mod numerics;
pub mod package;
pub mod sema;
pub mod source;
pub mod syntax;
pub mod tensor;
pub mod tolerance;
