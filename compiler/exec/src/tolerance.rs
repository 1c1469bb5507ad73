//! The tolerances that hold a compiled backend to the reference
//! interpreter (`docs/language.md`, "Numerics"), as XLA's `ErrorSpec` and
//! IREE's `expect_almost_eq` hold theirs. A backend may reorder and split
//! sums, fuse multiply-adds and accumulate in f32, so its floats differ
//! from the reference's by rounding; integers and bools must be equal.
//!
//! Floats are compared over a whole tensor, relative to its scale: the
//! largest difference divided by the largest magnitude of the reference
//! (so a sum that cancels to near zero is not held to a relative bound it
//! cannot meet). Infinities and NaNs must sit at the same places.

use crate::tensor::{Data, Tensor};
use linnet_ir::Dtype;
use std::fmt;

/// The largest difference a backend may show, relative to the
/// reference tensor's scale, for values of `dtype`:
///
/// - f32: 1e-4. Reordered f32 sums of the model's lengths (up to a few
///   thousand terms) stay near `sqrt(n)·2⁻²⁴` of their scale, some 1e-6;
///   the margin covers their growth through a model's layers.
/// - f16: 4e-3, eight units in the last place (2⁻¹¹): a sum that lands
///   on the other side of a rounding boundary moves one unit, and later
///   operations carry it.
/// - bf16: 3e-2, eight units in the last place (2⁻⁸), for the same reason.
pub fn of(dtype: Dtype) -> f64 {
    match dtype {
        Dtype::F16 => 4e-3,
        Dtype::Bf16 => 3e-2,
        _ => 1e-4,
    }
}

/// How a tensor fails the contract.
#[derive(Clone, Debug, PartialEq)]
pub enum Mismatch {
    Shape {
        reference: Vec<usize>,
        candidate: Vec<usize>,
    },
    Dtype {
        reference: Dtype,
        candidate: Dtype,
    },
    /// An integer, bool, infinity or NaN that differs.
    Exact {
        at: usize,
        reference: String,
        candidate: String,
    },
    /// Floats farther apart than the tolerance, relative to the scale.
    Float {
        at: usize,
        reference: f32,
        candidate: f32,
        relative: f64,
        tolerance: f64,
    },
}

impl fmt::Display for Mismatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mismatch::Shape { reference, candidate } => {
                write!(f, "shape {candidate:?}, the reference's is {reference:?}")
            }
            Mismatch::Dtype { reference, candidate } => {
                write!(f, "dtype {}, the reference's is {}", candidate.name(), reference.name())
            }
            Mismatch::Exact { at, reference, candidate } => {
                write!(f, "element {at} is {candidate}, the reference's is {reference}")
            }
            Mismatch::Float { at, reference, candidate, relative, tolerance } => {
                write!(f, "element {at} is {candidate:e}, the reference's is {reference:e}: {relative:.2e} of the scale, over {tolerance:.0e}")
            }
        }
    }
}

/// Whether `candidate` meets the contract against `reference`; the
/// largest relative difference when it does.
pub fn compare(reference: &Tensor, candidate: &Tensor) -> Result<f64, Mismatch> {
    if reference.shape != candidate.shape {
        return Err(Mismatch::Shape { reference: reference.shape.clone(), candidate: candidate.shape.clone() });
    }
    if reference.dtype != candidate.dtype {
        return Err(Mismatch::Dtype { reference: reference.dtype, candidate: candidate.dtype });
    }
    let (reference_floats, candidate_floats) = (reference.widened(), candidate.widened());
    let exact = |at: usize, r: &dyn fmt::Debug, c: &dyn fmt::Debug| Mismatch::Exact {
        at,
        reference: format!("{r:?}"),
        candidate: format!("{c:?}"),
    };
    match (&reference_floats.data, &candidate_floats.data) {
        (Data::F32(r), Data::F32(c)) => {
            let tolerance = of(reference.dtype);
            let scale = r.iter().filter(|v| v.is_finite()).fold(0f64, |m, v| m.max(f64::from(v.abs())));
            let mut worst = 0f64;
            for (at, (&r, &c)) in r.iter().zip(c.iter()).enumerate() {
                if !r.is_finite() || !c.is_finite() {
                    let same = (r.is_nan() && c.is_nan()) || r == c;
                    if !same {
                        return Err(exact(at, &r, &c));
                    }
                    continue;
                }
                let difference = f64::from((r - c).abs());
                if difference == 0.0 {
                    continue;
                }
                let relative = if scale == 0.0 { f64::INFINITY } else { difference / scale };
                if relative > tolerance {
                    return Err(Mismatch::Float { at, reference: r, candidate: c, relative, tolerance });
                }
                worst = worst.max(relative);
            }
            Ok(worst)
        }
        (Data::I64(r), Data::I64(c)) => {
            r.iter().zip(c).position(|(a, b)| a != b).map_or(Ok(0.0), |at| Err(exact(at, &r[at], &c[at])))
        }
        (Data::Bool(r), Data::Bool(c)) => {
            r.iter().zip(c).position(|(a, b)| a != b).map_or(Ok(0.0), |at| Err(exact(at, &r[at], &c[at])))
        }
        _ => unreachable!("tensors of one dtype hold one kind of data"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_are_held_relative_to_the_scale() {
        let reference = Tensor::from_f32(Dtype::F32, vec![3], vec![100.0, -0.001, 5.0]);
        let close = Tensor::from_f32(Dtype::F32, vec![3], vec![100.0, -0.0015, 5.005]);
        assert!(compare(&reference, &close).is_ok());
        let far = Tensor::from_f32(Dtype::F32, vec![3], vec![100.0, -0.001, 5.1]);
        assert!(matches!(compare(&reference, &far), Err(Mismatch::Float { at: 2, .. })));
        let nan = Tensor::from_f32(Dtype::F32, vec![3], vec![100.0, f32::NAN, 5.0]);
        assert!(matches!(compare(&reference, &nan), Err(Mismatch::Exact { at: 1, .. })));
        let bf16 = Tensor::from_f32(Dtype::Bf16, vec![3], vec![100.0, -0.001, 5.0]);
        assert!(matches!(compare(&reference, &bf16), Err(Mismatch::Dtype { .. })));
    }

    #[test]
    fn integers_are_exact() {
        let reference = Tensor::from_i64(Dtype::I64, vec![2], vec![1, 2]);
        assert!(compare(&reference, &reference).is_ok());
        assert!(compare(&reference, &Tensor::from_i64(Dtype::I64, vec![2], vec![1, 3])).is_err());
    }
}
