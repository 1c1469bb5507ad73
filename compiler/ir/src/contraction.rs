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
//! expert), and both operands' rows are contiguous: `k` is `W`'s last
//! position, and `A`'s trailing positions are `k`'s row-major digits over
//! its trailing axes (`k` on one axis; `k / c, k % c` on two, as a reshape
//! read through reads them: `ir::views`). Each product is an f32 multiply
//! and the sum runs in order in f64, as everywhere, so a kernel that keeps
//! that order per output is bit-identical to the interpreter.
//!
//! A node may also compute a float from the sum, elementwise: an
//! *epilogue* (the residual add after an output projection, a gate's bias), which
//! fusion inlines the sum into (`ir::fuse`). The sum is read once in the
//! node's expression, outside any reduction, lazy branch or position, and
//! the expression holds no other such sum;
//! backends compute the sum's totals as above and the expression from
//! them, each output from its own total, in the same kernel.

use super::{BinaryOp, Entry, Model, NodeKind, ReduceOp, Scalar, Value};
use crate::dim::Dim;
use crate::Dtype;

/// A sum of products with a stored weight that the matrix kernels do not
/// run (it runs as generated loops, slower): what the build reports, so a
/// layout that costs speed is not silent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Missed {
    pub entry: String,
    /// The parameter summed over.
    pub param: usize,
    /// Its axis the sum runs over.
    pub axis: usize,
    pub why: &'static str,
}

/// Every sum over an axis of a parameter (of two or more axes) in
/// `model`'s entries whose node is not a contraction the kernels run.
pub fn missed(model: &Model) -> Vec<Missed> {
    let mut found = Vec::new();
    for entry in &model.entries {
        for (at, node) in entry.nodes.iter().enumerate() {
            let NodeKind::Compute(expression) = &node.kind else { continue };
            if of(entry, at).is_some() {
                continue;
            }
            walk(expression, &mut |scalar| {
                let Scalar::Reduce { op: ReduceOp::Sum, index, body, .. } = scalar else { return };
                walk(body, &mut |operand| {
                    if let Some(missed) = summed_param(entry, operand, *index) {
                        let missed = Missed { entry: entry.name.clone(), ..missed };
                        if !found.contains(&missed) {
                            found.push(missed);
                        }
                    }
                });
            });
        }
    }
    found
}

/// Calls `visit` on `scalar` and everything in it.
fn walk<'s>(scalar: &'s Scalar, visit: &mut dyn FnMut(&'s Scalar)) {
    visit(scalar);
    scalar.for_each_child(&mut |child| walk(child, visit));
}

/// `operand` as a read of a parameter of two or more axes with `index`
/// alone at one of its positions, and why a kernel does not run it.
fn summed_param(entry: &Entry, operand: &Scalar, index: u32) -> Option<Missed> {
    let Scalar::Load(value, positions, _) = operand else { return None };
    let NodeKind::Param(param) = entry.nodes[value.index()].kind else { return None };
    if positions.len() < 2 {
        return None;
    }
    let axis = positions.iter().position(|p| matches!(p, Scalar::Index(k, _) if *k == index))?;
    let why = if axis + 1 == positions.len() {
        "the product is not of the kernels' form `out[…, n] = sum[k] x[…, k] * W[…, n, k]` (f32 products summed in f32, the weight's rows the output's last axis)"
    } else {
        "the sum runs over an axis of the weight other than its last, where the kernels read each of its rows contiguously: a weight stored with the summed axis last, as `[…, out, in]`, takes them"
    };
    Some(Missed { entry: String::new(), param, axis, why })
}

/// One operand: the value and its positions before the contracted axes
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
    /// The sum, in the node's expression.
    pub sum: &'e Scalar,
    /// The node's expression, where it computes more from the sum.
    pub epilogue: Option<&'e Scalar>,
}

/// The contraction node `at` of `entry` is, if it is one.
pub fn of(entry: &Entry, at: usize) -> Option<Contraction<'_>> {
    let node = &entry.nodes[at];
    let NodeKind::Compute(expression) = &node.kind else { return None };
    if node.shape.is_empty() {
        return None;
    }
    if let Some(contraction) = sum_of(entry, at, expression) {
        return (node.dtype == Dtype::F32).then_some(contraction);
    }
    if !node.dtype.is_float() {
        return None;
    }
    let mut sums = Vec::new();
    epilogue_sums(entry, at, expression, &mut sums);
    match sums.as_slice() {
        [contraction] if products(entry, at, expression) == 1 => {
            Some(Contraction { epilogue: Some(expression), ..contraction.clone() })
        }
        _ => None,
    }
}

/// How many sums of a contraction over node `at`'s axes `scalar` holds,
/// wherever they are: an epilogue computes no other product.
fn products(entry: &Entry, at: usize, scalar: &Scalar) -> usize {
    let mut count = usize::from(matches!(scalar, Scalar::Reduce { .. }) && sum_of(entry, at, scalar).is_some());
    scalar.for_each_child(&mut |child| count += products(entry, at, child));
    count
}

/// The sums of a contraction over node `at`'s axes in `scalar`, where an
/// epilogue may read them: not inside a reduction, a select's branch or a
/// position.
fn epilogue_sums<'e>(entry: &'e Entry, at: usize, scalar: &'e Scalar, sums: &mut Vec<Contraction<'e>>) {
    match scalar {
        Scalar::Reduce { .. } => sums.extend(sum_of(entry, at, scalar)),
        Scalar::Select(condition, ..) => epilogue_sums(entry, at, condition, sums),
        Scalar::Load(..) => {}
        _ => scalar.for_each_child(&mut |child| epilogue_sums(entry, at, child, sums)),
    }
}

/// `scalar` as a contraction over node `at`'s axes, the last its columns.
fn sum_of<'e>(entry: &'e Entry, at: usize, scalar: &'e Scalar) -> Option<Contraction<'e>> {
    let node = &entry.nodes[at];
    let Scalar::Reduce { op: ReduceOp::Sum, index, extent, body, dtype: Dtype::F32 } = scalar else { return None };
    let Scalar::Binary(BinaryOp::Mul, x, y, Dtype::F32) = body.as_ref() else { return None };
    let output_axis = node.shape.len() as u32 - 1;
    let columns = &node.shape[node.shape.len() - 1];
    let reads = |positions: &[Scalar], axis: u32| positions.iter().any(|p| reads_index(p, axis));
    let input_of = |operand| {
        let (value, positions) = loaded(entry, operand)?;
        let trailing = digits_of(positions, &entry.nodes[value.index()].shape, *index, extent)?;
        let rows = &positions[..positions.len() - trailing];
        (!reads(rows, output_axis) && !reads(rows, *index)).then_some(Operand { value, rows })
    };
    let weight_of = |operand| {
        let (value, positions) = loaded(entry, operand)?;
        let shape = &entry.nodes[value.index()].shape;
        let (last, positions) = positions.split_last()?;
        let (column, rows) = positions.split_last()?;
        let contiguous = matches!(last, Scalar::Index(k, _) if *k == *index) && shape.last() == Some(extent);
        let fits = matches!(column, Scalar::Index(n, _) if *n == output_axis)
            && shape.len() >= 2
            && &shape[shape.len() - 2] == columns;
        (contiguous && fits && !reads(rows, output_axis) && !reads(rows, *index)).then_some(Operand { value, rows })
    };
    let (input, weight) = match (input_of(x), weight_of(y)) {
        (Some(input), Some(weight)) => (input, weight),
        _ => (input_of(y)?, weight_of(x)?),
    };
    Some(Contraction { depth: extent, input, weight, sum: scalar, epilogue: None })
}

/// A float operand (under an optional `cast<f32>`) loaded: its value and
/// positions.
fn loaded<'e>(entry: &Entry, operand: &'e Scalar) -> Option<(Value, &'e [Scalar])> {
    let operand = match operand {
        Scalar::Cast(inner, Dtype::F32) => inner.as_ref(),
        other => other,
    };
    let Scalar::Load(value, positions, _) = operand else { return None };
    let float = matches!(entry.nodes[value.index()].dtype, Dtype::F32 | Dtype::Bf16 | Dtype::F16);
    float.then_some((*value, positions.as_slice()))
}

/// How many trailing `positions` (over the trailing axes of `shape`)
/// are the row-major digits of index `k` over `0..extent`, if some are:
/// the axes hold `extent` elements, the last position is `k % c` (or
/// `k` itself, alone), the first `k / s` (or `(k / s) % c`), those
/// between `(k / s) % c`, where `c` is the axis's extent and `s` the
/// elements of the axes after it.
fn digits_of(positions: &[Scalar], shape: &[Dim], k: u32, extent: &Dim) -> Option<usize> {
    let most = positions.len().min(shape.len());
    (1..=most).find(|&count| {
        let (axes, digits) = (&shape[shape.len() - count..], &positions[positions.len() - count..]);
        let elements = axes.iter().fold(Dim::constant(1), |product, axis| product.mul(axis));
        elements == *extent
            && digits.iter().enumerate().all(|(j, digit)| {
                let stride = axes[j + 1..].iter().fold(Dim::constant(1), |product, axis| product.mul(axis));
                is_digit(digit, k, &stride, &axes[j], j == 0)
            })
    })
}

/// Whether `digit` is `(k / stride) % size`, where dividing by 1 may be
/// left out and, on the `leading` axis, so may the remainder.
fn is_digit(digit: &Scalar, k: u32, stride: &Dim, size: &Dim, leading: bool) -> bool {
    let quotient = |scalar: &Scalar| match scalar {
        Scalar::Index(index, _) => *index == k && stride.as_constant() == Some(1),
        Scalar::Binary(BinaryOp::Div, a, b, _) => {
            matches!(a.as_ref(), Scalar::Index(index, _) if *index == k) && is_dim(b, stride)
        }
        _ => false,
    };
    match digit {
        Scalar::Binary(BinaryOp::Rem, a, b, _) if is_dim(b, size) => quotient(a),
        other => leading && quotient(other),
    }
}

/// Whether `scalar` is the constant or dim `dim`.
fn is_dim(scalar: &Scalar, dim: &Dim) -> bool {
    match scalar {
        Scalar::Dim(value) => value == dim,
        Scalar::Int(value, _) => dim.as_constant() == Some(*value),
        _ => false,
    }
}

/// Whether index `axis` occurs in `scalar`.
pub fn reads_index(scalar: &Scalar, axis: u32) -> bool {
    scalar.any(&|s| matches!(s, Scalar::Index(index, _) | Scalar::Reduce { index, .. } if *index == axis))
}

#[cfg(test)]
mod tests {
    use super::of;
    use crate::dim::Dim;
    use crate::testing::{index, int};
    use crate::CmpOp;
    use crate::Dtype;
    use crate::{BinaryOp, Entry, Input, Node, NodeKind, ReduceOp, Scalar, Value};

    fn binary(op: BinaryOp, a: Scalar, b: Scalar, dtype: Dtype) -> Scalar {
        Scalar::Binary(op, Box::new(a), Box::new(b), dtype)
    }

    fn widened(value: u32, positions: Vec<Scalar>, dtype: Dtype) -> Scalar {
        Scalar::Cast(Box::new(Scalar::Load(Value(value), positions, dtype)), Dtype::F32)
    }

    /// `sum<f32>[i2 < 8] a[i0, d0, d1] * w[i1, i2]` over `[2, 3]`, where
    /// `a: [2, 2, 4; f32]` (v0) is read at `digits` of `i2` and
    /// `w: [3, 8; bf16]` (v1).
    fn product(digits: [Scalar; 2]) -> Scalar {
        let [high, low] = digits;
        let body = binary(
            BinaryOp::Mul,
            widened(0, vec![index(0), high, low], Dtype::F32),
            widened(1, vec![index(1), index(2)], Dtype::Bf16),
            Dtype::F32,
        );
        Scalar::Reduce {
            op: ReduceOp::Sum,
            index: 2,
            extent: Dim::constant(8),
            body: Box::new(body),
            dtype: Dtype::F32,
        }
    }

    /// The digits of `i2` over `[2, 4]`.
    fn digits() -> [Scalar; 2] {
        [binary(BinaryOp::Div, index(2), int(4), Dtype::I64), binary(BinaryOp::Rem, index(2), int(4), Dtype::I64)]
    }

    /// The two inputs, then `node: [2, 3; dtype]`.
    fn entry(node: Scalar, dtype: Dtype) -> Entry {
        let input = |name: &str, shape: &[i64], dtype| Input {
            name: name.into(),
            shape: shape.iter().map(|&d| Dim::constant(d)).collect(),
            dtype,
        };
        let inputs = vec![input("a", &[2, 2, 4], Dtype::F32), input("w", &[3, 8], Dtype::Bf16)];
        let mut nodes: Vec<Node> = inputs
            .iter()
            .enumerate()
            .map(|(k, input)| Node {
                kind: NodeKind::Input(k),
                shape: input.shape.clone(),
                dtype: input.dtype,
                source: None,
            })
            .collect();
        nodes.push(Node {
            kind: NodeKind::Compute(node),
            shape: vec![Dim::constant(2), Dim::constant(3)],
            dtype,
            source: None,
        });
        Entry { name: "run".into(), dims: Vec::new(), requires: Vec::new(), inputs, nodes, outputs: vec![Value(2)] }
    }

    /// An input row read through a reshape (`a[i0, i2 / 4, i2 % 4]`) is
    /// a row of `a`'s first axis; digits in another order are no row.
    #[test]
    fn a_reshaped_input_row_is_read_as_its_digits() {
        let reshaped = entry(product(digits()), Dtype::F32);
        let contraction = of(&reshaped, 2).expect("a contraction");
        assert_eq!(contraction.input.value, Value(0));
        assert_eq!(contraction.input.rows.len(), 1, "the row is a's first axis");
        assert!(contraction.epilogue.is_none());
        let swapped =
            [binary(BinaryOp::Rem, index(2), int(2), Dtype::I64), binary(BinaryOp::Div, index(2), int(2), Dtype::I64)];
        assert!(of(&entry(product(swapped), Dtype::F32), 2).is_none());
    }

    /// A float computed from the sum (rounded, plus another value) is the
    /// sum's epilogue; the sum in a lazy branch, two sums (one in another
    /// reduction, too), or a bool computed from it are not.
    #[test]
    fn an_epilogue_reads_the_sum_once_outside_branches() {
        let rounded = |sum: Scalar| Scalar::Cast(Box::new(sum), Dtype::Bf16);
        let residual = Scalar::Load(Value(1), vec![index(1), index(0)], Dtype::Bf16);
        let added = binary(BinaryOp::Add, rounded(product(digits())), residual.clone(), Dtype::Bf16);
        let fused = entry(added, Dtype::Bf16);
        let contraction = of(&fused, 2).expect("a contraction with an epilogue");
        let NodeKind::Compute(expression) = &fused.nodes[2].kind else { unreachable!() };
        assert!(std::ptr::eq(contraction.epilogue.expect("an epilogue"), expression));
        let Scalar::Binary(_, cast, _, _) = expression else { unreachable!() };
        let Scalar::Cast(sum, _) = cast.as_ref() else { unreachable!() };
        assert!(std::ptr::eq(contraction.sum, sum.as_ref()), "the sum is the one in the expression");

        let positive = binary(BinaryOp::Cmp(CmpOp::Gt), product(digits()), Scalar::Float(0.0, Dtype::F32), Dtype::Bool);
        let above = binary(BinaryOp::Cmp(CmpOp::Gt), residual.clone(), Scalar::Float(0.0, Dtype::Bf16), Dtype::Bool);
        let lazy = Scalar::Select(
            Box::new(above),
            Box::new(rounded(product(digits()))),
            Box::new(residual.clone()),
            Dtype::Bf16,
        );
        let twice = binary(BinaryOp::Add, rounded(product(digits())), rounded(product(digits())), Dtype::Bf16);
        let summed = Scalar::Reduce {
            op: ReduceOp::Sum,
            index: 3,
            extent: Dim::constant(2),
            body: Box::new(product(digits())),
            dtype: Dtype::F32,
        };
        let nested = binary(BinaryOp::Add, rounded(product(digits())), rounded(summed), Dtype::Bf16);
        for (expression, dtype) in
            [(lazy, Dtype::Bf16), (twice, Dtype::Bf16), (nested, Dtype::Bf16), (positive, Dtype::Bool)]
        {
            assert!(of(&entry(expression.clone(), dtype), 2).is_none(), "{expression:?}");
        }
    }
}
