//! The CPU backend. `cpu` turns each `Compute` node of an entry into a
//! Cranelift function that reads the entry's dims at run time; `native`
//! puts those functions in memory (JIT) or in an artifact's object file and
//! loads them back; `helpers` is the table of functions they call, and
//! `matmul` the hand-tuned kernel contractions run on, `intrinsics` the
//! kernels of attention and the delta rule, `simd` the vectors both are
//! written in, `threads` the pool they share their work on; `backend` is
//! what the executor drives. Numerics follow `numerics`, the same as the
//! interpreter's, within the tolerances of `docs/language.md`.

pub mod backend;
pub mod cpu;
pub mod expf;
pub mod helpers;
pub mod intrinsics;
pub mod matmul;
pub mod native;
pub(crate) mod simd;
pub mod threads;
