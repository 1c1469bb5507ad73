//! The CPU kernel library: the hand-written code that native code calls
//! and the CPU backend runs, with no code generator in it. Organised by
//! what varies:
//!
//! - instruction sets: `isa` (what this CPU has, chosen at run time),
//!   `simd` (the f32 lanes every kernel is written in), `amx` (AMX tiles);
//! - weight storages: `matrix` (a contraction's operands), `dequant` (block
//!   formats decoded into lanes), `int8` (integer products over quantized
//!   inputs), `panels` (VNNI panels), `byte_tiles` (AMX byte tiles);
//! - `choice`: the one table of what each format is multiplied with and
//!   the one function that picks a kernel from (storage, ISA, rows);
//! - `matmul`: the contractions, run on the chosen kernel;
//! - `intrinsics`: attention and the gated delta rule;
//! - `threads`: the pool they share their work on; `expf`: the vector
//!   exponential.
//!
//! Numerics follow `linnet_ir::numerics`, as the reference interpreter's,
//! within the tolerances of `docs/language.md`.
//!
//! Unsafe code: every `unsafe fn` states its contract under `# Safety`
//! (pointers and lengths the caller vouches for, and the instruction set
//! the CPU must have: a function compiled with `#[target_feature]` is only
//! called after `Isa::available` found its features); every `unsafe`
//! block says why its contract holds.

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
mod byte_tiles;
pub mod choice;
mod dequant;
pub mod expf;
mod int8;
pub mod intrinsics;
pub mod isa;
pub mod matmul;
pub mod matrix;
mod panels;
mod simd;
pub mod threads;
