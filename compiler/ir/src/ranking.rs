//! Rankings: the `Compute` nodes that give each element of a row its rank
//! among the row (0 for the largest, ties to the lower index, as
//! `torch.topk` orders them), which a mixture of experts' router computes
//! before it picks its top k. Written out, a rank compares every pair:
//!
//! ```text
//! rank[r, e] = sum<i32>[j] cast<i32>(x[r, j] > x[r, e] || (x[r, j] == x[r, e] && iota[j] < iota[e]))
//! ```
//!
//! O(n²) per row; backends recognize it here and sort instead (O(n log n)).
//! `iota` must be a value holding its own index. NaN compares false both
//! ways, so a NaN's rank is 0 and a NaN outranks nothing: a kernel that
//! sorts the other elements keeps exactly that meaning.

use super::{BinaryOp, Entry, NodeKind, ReduceOp, Scalar, Value};
use crate::CmpOp;
use crate::Dtype;

/// The ranking node `at` of `entry` is, as the value whose rows it ranks.
pub fn of(entry: &Entry, at: usize) -> Option<Value> {
    let node = &entry.nodes[at];
    let NodeKind::Compute(Scalar::Reduce { op: ReduceOp::Sum, index: other, extent, body, dtype: Dtype::I32 }) =
        &node.kind
    else {
        return None;
    };
    let [_, width] = node.shape.as_slice() else { return None };
    if node.dtype != Dtype::I32 || extent != width {
        return None;
    }
    let Scalar::Cast(test, Dtype::I32) = body.as_ref() else { return None };
    let Scalar::Binary(BinaryOp::Or, greater, tie, _) = test.as_ref() else { return None };
    let Scalar::Binary(BinaryOp::And, equal, before, _) = tie.as_ref() else { return None };
    let scores = compared(greater, CmpOp::Gt, *other)?;
    let order = compared(equal, CmpOp::Eq, *other)?;
    let (Scalar::Binary(BinaryOp::Cmp(CmpOp::Lt), left, right, _), true) = (before.as_ref(), scores == order) else {
        return None;
    };
    let iota = |scalar: &Scalar, axis: u32| match scalar {
        Scalar::Load(value, positions, _) if matches!(positions.as_slice(), [Scalar::Index(k, _)] if *k == axis) => {
            Some(*value)
        }
        _ => None,
    };
    let (Some(ordinals), Some(same)) = (iota(left, *other), iota(right, 1)) else { return None };
    let scored = &entry.nodes[scores.index()];
    let counts = matches!(&entry.nodes[ordinals.index()].kind, NodeKind::Compute(Scalar::Cast(inner, _)) if matches!(inner.as_ref(), Scalar::Index(0, _)))
        || matches!(&entry.nodes[ordinals.index()].kind, NodeKind::Compute(Scalar::Index(0, _)));
    (ordinals == same && counts && scored.shape == node.shape && scored.dtype.is_float()).then_some(scores)
}

/// `x[i0, other] OP x[i0, i1]`: the value compared.
fn compared(scalar: &Scalar, op: CmpOp, other: u32) -> Option<Value> {
    let Scalar::Binary(BinaryOp::Cmp(found), left, right, _) = scalar else { return None };
    let at = |scalar: &Scalar, axis: u32| match scalar {
        Scalar::Load(value, positions, _) => {
            matches!(positions.as_slice(), [Scalar::Index(0, _), Scalar::Index(k, _)] if *k == axis).then_some(*value)
        }
        _ => None,
    };
    let (left, right) = (at(left, other)?, at(right, 1)?);
    (*found == op && left == right).then_some(left)
}

/// Each row's ranks: positions in the order largest first, ties to the
/// lower index, of the row's non-NaN elements; a NaN's rank is 0.
pub fn ranks(rows: &[f32], width: usize) -> Vec<i64> {
    let mut ranks = vec![0i64; rows.len()];
    let mut order: Vec<usize> = Vec::with_capacity(width);
    for (row, out) in rows.chunks(width.max(1)).zip(ranks.chunks_mut(width.max(1))) {
        order.clear();
        order.extend((0..row.len()).filter(|at| !row[*at].is_nan()));
        // Stable: equal scores (0.0 and -0.0 too) keep index order.
        order.sort_by(|a, b| row[*b].partial_cmp(&row[*a]).expect("no NaN among them"));
        for (rank, at) in order.iter().enumerate() {
            out[*at] = rank as i64;
        }
    }
    ranks
}

#[cfg(test)]
mod tests {
    use super::ranks;

    /// The definition, pair by pair, as the interpreter evaluates it.
    fn by_pairs(row: &[f32]) -> Vec<i64> {
        (0..row.len())
            .map(|e| (0..row.len()).filter(|&j| row[j] > row[e] || (row[j] == row[e] && j < e)).count() as i64)
            .collect()
    }

    #[test]
    fn sorting_gives_the_ranks_the_definition_gives() {
        let rows: [&[f32]; 5] = [
            &[0.5, 2.0, -1.0, 2.0, 0.0],
            &[f32::NAN, 1.0, f32::NAN, 1.0, -0.0],
            &[0.0, -0.0, 0.0, f32::INFINITY, f32::NEG_INFINITY],
            &[3.0],
            &[7.0, 7.0, 7.0, 7.0],
        ];
        for row in rows {
            assert_eq!(ranks(row, row.len()), by_pairs(row), "{row:?}");
        }
    }
}
