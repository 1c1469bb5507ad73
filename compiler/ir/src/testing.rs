//! Scalars the passes' unit tests build their entries from.

use super::{BinaryOp, Dtype, Scalar};

/// Index `k`.
pub fn index(k: u32) -> Scalar {
    Scalar::Index(k, Dtype::I64)
}

/// An i64 constant.
pub fn int(value: i64) -> Scalar {
    Scalar::Int(value, Dtype::I64)
}

/// `a + b` of positions.
pub fn plus(a: Scalar, b: Scalar) -> Scalar {
    Scalar::Binary(BinaryOp::Add, Box::new(a), Box::new(b), Dtype::I64)
}
