//! The CPU backend. `lowering` turns each `Compute` node of an entry into a
//! Cranelift function that reads the entry's dims at run time; `native`
//! puts those functions in memory (JIT) or in an artifact's object file and
//! loads them back; `helpers` is the table of functions they call,
//! `matmul` the hand-tuned kernel contractions run on (`decode`,
//! `int8`, `panels` and `byte_tiles` its products over block formats,
//! `amx` its AMX tiles), `kernels` the
//! kernels of attention and the delta rule, `simd` the vectors both are
//! written in, `threads` the pool they share their work on; `backend` is
//! what the executor drives. Numerics follow `linnet_ir::numerics`, the
//! same as the reference interpreter's, within the tolerances of
//! `docs/language.md`.
//!
//! Depends on the IR and the executor's interface only: the only crate
//! that links Cranelift.

/// `$f::<…, R>(…)` for the const `R` that `$rows` (one to four) is: the
/// block products' kernels are instantiated for each count of input rows.
macro_rules! for_rows {
    ($rows:expr, $f:ident::<$($g:ty),*>($($arg:expr),* $(,)?)) => {
        match $rows {
            1 => $f::<$($g,)* 1>($($arg),*),
            2 => $f::<$($g,)* 2>($($arg),*),
            3 => $f::<$($g,)* 3>($($arg),*),
            4 => $f::<$($g,)* 4>($($arg),*),
            rows => unreachable!("one to four rows at a time, not {rows}"),
        }
    };
}

mod amx;
pub mod backend;
mod byte_tiles;
mod decode;
pub mod expf;
pub mod helpers;
mod int8;
pub mod kernels;
pub mod lowering;
pub mod matmul;
pub mod native;
mod panels;
pub(crate) mod simd;
pub mod threads;
