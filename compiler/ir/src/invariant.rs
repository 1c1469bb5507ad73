//! Loop-invariant reductions: the parts of a `Compute` expression that
//! reduce and read only the outer axes of the node, so that a backend
//! computes them once per outer position instead of once per element. A
//! norm fused into its consumer (`x[i, k] * rsqrt(sum[j] x[i, j]² / D)`)
//! is then one pass over each row: the sum, then the scaled row, while the
//! row is still in cache.
//!
//! Only parts outside lazy select branches and outside the node's own
//! reductions are taken, so that evaluating them early changes nothing.

use super::Scalar;

/// A subexpression to compute once per position of the axes before
/// `level`.
pub struct Invariant<'s> {
    pub scalar: &'s Scalar,
    pub level: u32,
}

/// The largest invariant parts of a node's expression, for a node of
/// `rank` axes: each contains a reduction and reads only axes below its
/// level, which is below `rank`.
pub fn invariants(scalar: &Scalar, rank: u32) -> Vec<Invariant<'_>> {
    let mut out = Vec::new();
    collect(scalar, rank, &mut out);
    out
}

fn collect<'s>(scalar: &'s Scalar, rank: u32, out: &mut Vec<Invariant<'s>>) {
    if reduces(scalar) {
        let level = outer_axes(scalar, rank);
        if level < rank {
            out.push(Invariant { scalar, level });
            return;
        }
    }
    match scalar {
        // Branches are lazy, and a reduction's body varies with its index.
        Scalar::Select(c, _, _, _) => collect(c, rank, out),
        Scalar::Reduce { .. } => {}
        _ => scalar.for_each_child(&mut |child| collect(child, rank, out)),
    }
}

/// Whether `scalar` contains a reduction.
pub fn reduces(scalar: &Scalar) -> bool {
    scalar.any(&|s| matches!(s, Scalar::Reduce { .. }))
}

/// One past the last of the node's axes (indices below `rank`) that
/// `scalar` reads; reduction indices are bound inside it.
fn outer_axes(scalar: &Scalar, rank: u32) -> u32 {
    let mut level = match scalar {
        Scalar::Index(index, _) if *index < rank => index + 1,
        _ => 0,
    };
    scalar.for_each_child(&mut |child| level = level.max(outer_axes(child, rank)));
    level
}
