//! What an integer position can be, from the extents of the indices it
//! reads: the proof that a load needs no check against its axis, which
//! every backend that compiles loads uses (the CPU's, the GPU's).

use super::{BinaryOp, Scalar};
use crate::dim::Dim;
use crate::CmpOp;
use std::collections::HashMap;

/// Narrower ranges than their extents that some indices are known to lie
/// in (least, most; by index number), as a select's branch knows its
/// condition.
pub type Ranges = HashMap<u32, (i64, i64)>;

/// Whether `position` lies in `0..size` whatever the indices are
/// (`extents`, by index number): an index whose loop runs over exactly
/// that extent, or an expression whose every value is inside a constant
/// size ([`bounds`]: a slice's `i + 512`, a reshape's `i / 128` and
/// `i % 128`, a constant).
pub fn inside(position: &Scalar, size: &Dim, extents: &HashMap<u32, Dim>) -> bool {
    inside_within(position, size, extents, &Ranges::new())
}

/// [`inside`], where some indices lie in `ranges`.
pub fn inside_within(position: &Scalar, size: &Dim, extents: &HashMap<u32, Dim>, ranges: &Ranges) -> bool {
    if let Scalar::Index(k, _) = position {
        if extents.get(k) == Some(size) {
            return true;
        }
    }
    match (bounds(position, extents, ranges), size.as_constant()) {
        (Some((least, most)), Some(size)) => least >= 0 && most < size,
        _ => false,
    }
}

/// What a select's branches know of an index its condition compares with
/// a constant (`i < c`: below `c` in the first, from `c` in the second),
/// added to `ranges`: a concatenation's parts read their source at `i`
/// and at `i - c`. Only for a select that evaluates one branch.
pub fn branch_ranges(condition: &Scalar, scope: &HashMap<u32, Dim>, ranges: &Ranges) -> (Ranges, Ranges) {
    let (mut then, mut otherwise) = (ranges.clone(), ranges.clone());
    let Scalar::Binary(BinaryOp::Cmp(CmpOp::Lt), index, limit, _) = condition else { return (then, otherwise) };
    let (Scalar::Index(k, _), Some((limit, _))) =
        (index.as_ref(), bounds(limit, scope, ranges).filter(|(least, most)| least == most))
    else {
        return (then, otherwise);
    };
    let known = bounds(index, scope, ranges);
    let (least, most) = known.unwrap_or((0, i64::MAX));
    then.insert(*k, (least, most.min(limit.saturating_sub(1))));
    if known.is_some() {
        otherwise.insert(*k, (least.max(limit), most));
    }
    (then, otherwise)
}

/// The least and the most an integer position can be, when the indices
/// it reads run over constant extents (`extents`, by index number) or lie
/// in `ranges`: through sums, differences, products of what is not
/// negative, and division and remainder by positive constants (Euclidean,
/// as the IR's); none on overflow.
pub fn bounds(position: &Scalar, extents: &HashMap<u32, Dim>, ranges: &Ranges) -> Option<(i64, i64)> {
    match position {
        Scalar::Index(k, _) => match ranges.get(k) {
            Some(range) => Some(*range),
            None => extents.get(k)?.as_constant().filter(|extent| *extent > 0).map(|extent| (0, extent - 1)),
        },
        Scalar::Int(value, _) => Some((*value, *value)),
        Scalar::Dim(dim) => dim.as_constant().map(|value| (value, value)),
        Scalar::Binary(op, a, b, _) => {
            let ((a_least, a_most), (b_least, b_most)) = (bounds(a, extents, ranges)?, bounds(b, extents, ranges)?);
            let divisor = (b_least == b_most && b_least > 0).then_some(b_least);
            match op {
                BinaryOp::Add => Some((a_least.checked_add(b_least)?, a_most.checked_add(b_most)?)),
                BinaryOp::Sub => Some((a_least.checked_sub(b_most)?, a_most.checked_sub(b_least)?)),
                BinaryOp::Mul if a_least >= 0 && b_least >= 0 => {
                    Some((a_least.checked_mul(b_least)?, a_most.checked_mul(b_most)?))
                }
                BinaryOp::Div if a_least >= 0 => divisor.map(|d| (a_least / d, a_most / d)),
                BinaryOp::Rem => divisor.map(|d| (0, d - 1)),
                _ => None,
            }
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::{bounds, Ranges};
    use crate::dim::Dim;
    use crate::Dtype;
    use crate::{BinaryOp, Scalar};
    use std::collections::HashMap;

    fn binary(op: BinaryOp, a: Scalar, b: Scalar) -> Scalar {
        Scalar::Binary(op, Box::new(a), Box::new(b), Dtype::I64)
    }

    /// A slice's, a reshape's and a shifted window's positions: what they
    /// can reach, and nothing where an extent is not constant.
    #[test]
    fn positions_are_bounded_through_their_arithmetic() {
        let extents: HashMap<u32, Dim> =
            [(0, Dim::constant(512)), (1, Dim::constant(4096)), (2, Dim::constant(3))].into_iter().collect();
        let (i, j, k, int) =
            (Scalar::Index(0, Dtype::I64), Scalar::Index(1, Dtype::I64), Scalar::Index(2, Dtype::I64), |v| {
                Scalar::Int(v, Dtype::I64)
            });
        assert_eq!(bounds(&binary(BinaryOp::Add, i.clone(), int(512)), &extents, &Ranges::new()), Some((512, 1023)));
        assert_eq!(bounds(&binary(BinaryOp::Sub, i.clone(), k.clone()), &extents, &Ranges::new()), Some((-2, 511)));
        assert_eq!(bounds(&binary(BinaryOp::Div, j.clone(), int(128)), &extents, &Ranges::new()), Some((0, 31)));
        assert_eq!(
            bounds(
                &binary(BinaryOp::Rem, binary(BinaryOp::Sub, i.clone(), int(7)), int(128)),
                &extents,
                &Ranges::new()
            ),
            Some((0, 127))
        );
        assert_eq!(
            bounds(&binary(BinaryOp::Add, binary(BinaryOp::Mul, k, int(128)), i.clone()), &extents, &Ranges::new()),
            Some((0, 767))
        );
        let known: Ranges = [(0, (3, 3))].into_iter().collect();
        assert_eq!(
            bounds(&binary(BinaryOp::Sub, i.clone(), int(3)), &extents, &known),
            Some((0, 0)),
            "a range known (a select's branch)"
        );
        assert_eq!(
            bounds(&binary(BinaryOp::Div, binary(BinaryOp::Sub, i.clone(), int(1)), int(2)), &extents, &Ranges::new()),
            None,
            "a negative dividend"
        );
        assert_eq!(
            bounds(&binary(BinaryOp::Rem, i.clone(), j), &extents, &Ranges::new()),
            None,
            "a divisor that varies"
        );
        assert_eq!(bounds(&Scalar::Index(3, Dtype::I64), &extents, &Ranges::new()), None, "an extent not known");
        assert_eq!(bounds(&binary(BinaryOp::Mul, i, int(i64::MAX)), &extents, &Ranges::new()), None, "an overflow");
    }
}
