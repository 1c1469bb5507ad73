//! Contractions: the `Compute` nodes that are a matrix–vector product per
//! output row, which backends run with a hand-tuned kernel instead of
//! generated loops (as IREE's microkernels and XLA's runtime calls do).
//!
//! The shape recognized is the `Linear` product and the expert products:
//!
//! ```text
//! out[o…, n] = sum<f32>[k] A[a(o…), k] * W[w(o…), n, k]      (f32 result)
//! ```
//!
//! where each operand may be wrapped in `cast<f32>`, `a(o…)` and `w(o…)`
//! are any positions that read neither `n` nor `k` (a gather picks an
//! expert), and both operands' rows are contiguous (`k` is their last
//! axis). Each product is an f32 multiply and the sum runs in order in
//! f64, as everywhere, so a kernel that keeps that order per output is
//! bit-identical to the interpreter.

use super::{BinaryOp, Entry, NodeKind, ReduceOp, Scalar, Value};
use crate::sema::dim::Dim;
use crate::sema::ty::Dtype;

/// One operand: the value and its positions before the contracted axis
/// (for `W`, also before the output axis).
#[derive(Clone, Debug)]
pub struct Operand<'e> {
    pub value: Value,
    pub rows: &'e [Scalar],
}

#[derive(Clone, Debug)]
pub struct Contraction<'e> {
    /// The contracted length.
    pub depth: &'e Dim,
    pub input: Operand<'e>,
    pub weight: Operand<'e>,
}

/// The contraction node `at` of `entry` is, if it is one.
pub fn of(entry: &Entry, at: usize) -> Option<Contraction<'_>> {
    let node = &entry.nodes[at];
    let NodeKind::Compute(Scalar::Reduce { op: ReduceOp::Sum, index, extent, body, dtype: Dtype::F32 }) = &node.kind else { return None };
    let Scalar::Binary(BinaryOp::Mul, x, y, Dtype::F32) = body.as_ref() else { return None };
    if node.dtype != Dtype::F32 || node.shape.is_empty() {
        return None;
    }
    let output_axis = node.shape.len() as u32 - 1;
    let columns = &node.shape[node.shape.len() - 1];
    let reads = |positions: &[Scalar], axis: u32| positions.iter().any(|p| reads_index(p, axis));
    let input_of = |operand| {
        let (value, rows) = loaded(entry, operand, *index, extent)?;
        (!reads(rows, output_axis) && !reads(rows, *index)).then_some(Operand { value, rows })
    };
    let weight_of = |operand| {
        let (value, positions) = loaded(entry, operand, *index, extent)?;
        let (column, rows) = positions.split_last()?;
        let shape = &entry.nodes[value.index()].shape;
        let fits = matches!(column, Scalar::Index(n, _) if *n == output_axis) && shape.len() >= 2 && &shape[shape.len() - 2] == columns;
        (fits && !reads(rows, output_axis) && !reads(rows, *index)).then_some(Operand { value, rows })
    };
    let (input, weight) = match (input_of(x), weight_of(y)) {
        (Some(input), Some(weight)) => (input, weight),
        _ => (input_of(y)?, weight_of(x)?),
    };
    Some(Contraction { depth: extent, input, weight })
}

/// A float operand (under an optional `cast<f32>`) loaded with `index`
/// last over a last axis of `extent`: its value and the other positions.
fn loaded<'e>(entry: &Entry, operand: &'e Scalar, index: u32, extent: &Dim) -> Option<(Value, &'e [Scalar])> {
    let operand = match operand {
        Scalar::Cast(inner, Dtype::F32) => inner.as_ref(),
        other => other,
    };
    let Scalar::Load(value, positions, _) = operand else { return None };
    let source = &entry.nodes[value.index()];
    let float = matches!(source.dtype, Dtype::F32 | Dtype::Bf16 | Dtype::F16);
    let (last, rows) = positions.split_last()?;
    let contiguous = matches!(last, Scalar::Index(k, _) if *k == index) && source.shape.last() == Some(extent);
    (float && contiguous).then_some((*value, rows))
}

/// Whether index `axis` occurs in `scalar`.
pub fn reads_index(scalar: &Scalar, axis: u32) -> bool {
    scalar.any(&|s| matches!(s, Scalar::Index(index, _) | Scalar::Reduce { index, .. } if *index == axis))
}
