//! Code generation. `cpu` compiles each `Compute` node of an entry, with
//! the entry's dims bound, to native code through Cranelift; the reference
//! interpreter's numerics are kept to the bit (floats in f64, rounded to
//! each value's type where it is produced, with the same library calls for
//! what hardware does not do exactly alike).

pub mod cpu;
