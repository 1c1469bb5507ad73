//! Code generation. `cpu` turns each `Compute` node of an entry into a
//! Cranelift function that reads the entry's dims at run time; `native`
//! puts those functions in memory (JIT) or in an artifact's object file and
//! loads them back; `helpers` is the table of functions they call, and
//! `matmul` the hand-tuned kernel contractions run on. The
//! reference interpreter's numerics are kept to the bit (floats in f64,
//! rounded to each value's type where it is produced, with the same
//! library calls for what hardware does not do exactly alike).

pub mod cpu;
pub mod helpers;
pub mod matmul;
pub mod native;
