//! Views read through: a `Compute` node that reads one element of another
//! value and at most changes its type or its sign (a slice, a reshape, a
//! transpose, a cast, a rotation's negated half) is a view of that value. The `Compute` nodes that load a view
//! load its source instead, at the view's positions with theirs put in,
//! so the view is no pass over memory of its own (a kernel fewer on the
//! GPU, a loop fewer on the CPU) and holds no buffer. Fusion (`fuse`)
//! inlines a value that is read once; a view may be read any number of
//! times, since reading it through repeats nothing but its cast and sign.
//!
//! A view is read through only where that changes no result and no error:
//! - its positions are index arithmetic (no load: a gather's index may
//!   fail, and would be read again; no reduction), each provably inside
//!   its axis of the source ([`super::bounds`]), and the reader's
//!   positions are provably inside the view, so neither the view's checks
//!   nor the reader's can fail; in a select's branch, what its condition
//!   says of an index counts (a concatenation's part at `i - c` where
//!   `i >= c`);
//! - the reader is no ranking, whose kernel is chosen by the loads it
//!   reads (`ir::ranking`); a contraction (`ir::contraction`) is one
//!   still where the view is read through (a reshape of its input rows,
//!   read as `k`'s digits), or keeps the view;
//! - the view is not hoisted (computed once per loaded model).
//!
//! The view stays where something still reads it (an intrinsic, a state
//! write, an output, a reader it was not read through in) and goes where
//! nothing does.

use super::bounds::{self, Ranges};
use super::{plan, Entry, Model, NodeKind, Scalar, UnaryOp, Value};
use crate::dim::Dim;
use std::collections::HashMap;

/// Reads every entry's views through.
pub fn read_through(model: &mut Model) {
    for entry in &mut model.entries {
        read_through_entry(entry);
    }
}

fn read_through_entry(entry: &mut Entry) {
    let hoisted = plan::hoistable(entry);
    // Each value's readers. Reading a view through makes its readers load
    // values before it, so a view's readers are the same when its turn
    // comes as they are now.
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); entry.nodes.len()];
    for (at, node) in entry.nodes.iter().enumerate() {
        plan::reads(&node.kind).iter().for_each(|value| readers[value.index()].push(at));
    }
    // Whether a reader is a ranking, whose kernel is chosen by its loads,
    // once per reader.
    let mut ranking: Vec<Option<bool>> = vec![None; entry.nodes.len()];
    let mut read_through = vec![false; entry.nodes.len()];
    // In order, so that a view of a view is a view of the first's source
    // by the time its own readers are rewritten.
    for view in 0..entry.nodes.len() {
        if hoisted[view] {
            continue;
        }
        let Some(body) = view_body(entry, view) else { continue };
        let (value, dtype, shape) = (Value(view as u32), entry.nodes[view].dtype, entry.nodes[view].shape.clone());
        for &reader in &readers[view] {
            if *ranking[reader].get_or_insert_with(|| super::ranking::of(entry, reader).is_some()) {
                continue;
            }
            // A contraction stays one (a reshape of its input rows is
            // read as their digits), or keeps the view.
            let contraction = super::contraction::of(entry, reader).map(|c| c.epilogue.is_some());
            let before = contraction.is_some().then(|| entry.nodes[reader].kind.clone());
            let scope: HashMap<u32, Dim> =
                entry.nodes[reader].shape.iter().enumerate().map(|(axis, dim)| (axis as u32, dim.clone())).collect();
            let NodeKind::Compute(scalar) = &mut entry.nodes[reader].kind else { continue };
            let through = Through { value, body: &body, dtype, shape: &shape };
            let done = through.rewrite(scalar, &scope, &Ranges::new());
            match before {
                Some(before)
                    if done && super::contraction::of(entry, reader).map(|c| c.epilogue.is_some()) != contraction =>
                {
                    entry.nodes[reader].kind = before
                }
                _ => read_through[view] |= done,
            }
        }
    }
    let mut read = vec![false; entry.nodes.len()];
    for node in &entry.nodes {
        plan::reads(&node.kind).iter().for_each(|value| read[value.index()] = true);
    }
    entry.outputs.iter().for_each(|value| read[value.index()] = true);
    let gone: Vec<bool> = read_through.iter().zip(&read).map(|(through, read)| *through && !read).collect();
    entry.remove_nodes(&gone);
}

/// Node `at`'s body, if it is a view whose positions are all inside its
/// source.
fn view_body(entry: &Entry, at: usize) -> Option<Scalar> {
    let node = &entry.nodes[at];
    let NodeKind::Compute(body) = &node.kind else { return None };
    let mut load = body;
    while let Scalar::Cast(inner, _) | Scalar::Unary(UnaryOp::Neg, inner, _) = load {
        load = inner;
    }
    let Scalar::Load(source, positions, _) = load else { return None };
    let extents: HashMap<u32, Dim> =
        node.shape.iter().enumerate().map(|(axis, dim)| (axis as u32, dim.clone())).collect();
    let source_shape = &entry.nodes[source.index()].shape;
    let inside = positions.len() == source_shape.len()
        && positions
            .iter()
            .zip(source_shape)
            .all(|(position, size)| index_arithmetic(position) && bounds::inside(position, size, &extents));
    inside.then(|| body.clone())
}

/// Whether `position` computes from indices, dims and constants alone.
fn index_arithmetic(position: &Scalar) -> bool {
    match position {
        Scalar::Index(..) | Scalar::Int(..) | Scalar::Dim(_) => true,
        Scalar::Binary(_, a, b, _) => index_arithmetic(a) && index_arithmetic(b),
        Scalar::Unary(_, a, _) | Scalar::Cast(a, _) => index_arithmetic(a),
        _ => false,
    }
}

/// A view to read through in a reader's body.
struct Through<'a> {
    value: Value,
    body: &'a Scalar,
    dtype: crate::Dtype,
    shape: &'a [Dim],
}

impl Through<'_> {
    /// Rewrites the loads of the view in `scalar` (with the indices in
    /// `scope`, by number, some known to lie in `ranges`) whose positions
    /// are inside it; whether any was.
    fn rewrite(&self, scalar: &mut Scalar, scope: &HashMap<u32, Dim>, ranges: &Ranges) -> bool {
        match scalar {
            Scalar::Load(value, positions, _) if *value == self.value => {
                let inside = positions
                    .iter()
                    .zip(self.shape)
                    .all(|(position, size)| bounds::inside_within(position, size, scope, ranges));
                if !inside {
                    return positions
                        .iter_mut()
                        .fold(false, |done, position| self.rewrite(position, scope, ranges) | done);
                }
                let mut read = self.body.clone();
                put_positions(&mut read, positions);
                if read.dtype() != self.dtype {
                    read = Scalar::Cast(Box::new(read), self.dtype);
                }
                *scalar = read;
                true
            }
            Scalar::Reduce { index, extent, body, .. } => {
                let mut inner = scope.clone();
                inner.insert(*index, extent.clone());
                self.rewrite(body, &inner, ranges)
            }
            Scalar::Select(condition, then, otherwise, _) => {
                let (then_ranges, otherwise_ranges) = bounds::branch_ranges(condition, scope, ranges);
                let done = self.rewrite(condition, scope, ranges);
                let done = self.rewrite(then, scope, &then_ranges) | done;
                self.rewrite(otherwise, scope, &otherwise_ranges) | done
            }
            _ => {
                let mut done = false;
                scalar.for_each_child_mut(&mut |child| done |= self.rewrite(child, scope, ranges));
                done
            }
        }
    }
}

/// The view's axes (its indices) become the reader's `positions`.
fn put_positions(scalar: &mut Scalar, positions: &[Scalar]) {
    if let Scalar::Index(axis, dtype) = scalar {
        let position = positions[*axis as usize].clone();
        *scalar = if position.dtype() == *dtype { position } else { Scalar::Cast(Box::new(position), *dtype) };
        return;
    }
    scalar.for_each_child_mut(&mut |child| put_positions(child, positions));
}

#[cfg(test)]
mod tests {
    use super::read_through_entry;
    use crate::dim::Dim;
    use crate::testing::{index, int, plus};
    use crate::CmpOp;
    use crate::Dtype;
    use crate::{BinaryOp, Entry, Input, Node, NodeKind, ReduceOp, Scalar, UnaryOp, Value};

    /// The same expression (the IR compares by its printed form).
    fn same(got: &impl std::fmt::Debug, expected: &impl std::fmt::Debug) {
        assert_eq!(format!("{got:?}"), format!("{expected:?}"));
    }

    fn load(value: u32, positions: Vec<Scalar>, dtype: Dtype) -> Scalar {
        Scalar::Load(Value(value), positions, dtype)
    }

    /// `x: [8; bf16]` (v0), `view` (v1, `[4]`), then `readers` (each
    /// `[4; f32]`, the last the output).
    fn entry(view: Scalar, view_dtype: Dtype, readers: Vec<Scalar>) -> Entry {
        let node = |kind, size: i64, dtype| Node { kind, shape: vec![Dim::constant(size)], dtype, source: None };
        let mut nodes = vec![node(NodeKind::Input(0), 8, Dtype::Bf16), node(NodeKind::Compute(view), 4, view_dtype)];
        nodes.extend(readers.into_iter().map(|reader| node(NodeKind::Compute(reader), 4, Dtype::F32)));
        Entry {
            name: "run".into(),
            dims: Vec::new(),
            requires: Vec::new(),
            inputs: vec![Input { name: "x".into(), shape: vec![Dim::constant(8)], dtype: Dtype::Bf16 }],
            outputs: vec![Value(nodes.len() as u32 - 1)],
            nodes,
        }
    }

    /// `cast<f32>(x[i0 + 4])`: the upper half of x, widened.
    fn upper_half() -> Scalar {
        Scalar::Cast(Box::new(load(0, vec![plus(index(0), int(4))], Dtype::Bf16)), Dtype::F32)
    }

    /// A slice read elementwise and inside a reduction, by two readers:
    /// both read x at the slice's positions, and the slice is gone.
    #[test]
    fn a_slice_read_twice_is_read_through() {
        let sum = Scalar::Reduce {
            op: ReduceOp::Sum,
            index: 1,
            extent: Dim::constant(4),
            body: Box::new(load(1, vec![index(1)], Dtype::F32)),
            dtype: Dtype::F32,
        };
        let scaled =
            Scalar::Binary(BinaryOp::Mul, Box::new(load(1, vec![index(0)], Dtype::F32)), Box::new(sum), Dtype::F32);
        let mut entry = entry(upper_half(), Dtype::F32, vec![scaled, load(1, vec![index(0)], Dtype::F32)]);
        read_through_entry(&mut entry);
        assert_eq!(entry.nodes.len(), 3, "the slice is gone");
        let NodeKind::Compute(Scalar::Binary(_, element, sum, _)) = &entry.nodes[1].kind else { panic!("the product") };
        same(element, &upper_half());
        let Scalar::Reduce { body, .. } = sum.as_ref() else { panic!("the sum") };
        let Scalar::Cast(read, Dtype::F32) = body.as_ref() else { panic!("the widened read: {body:?}") };
        same(read, &load(0, vec![plus(index(1), int(4))], Dtype::Bf16));
        same(&entry.nodes[2].kind, &NodeKind::Compute(upper_half()));
    }

    /// A view stored narrower than it computes is read through rounded as
    /// storing it rounded.
    #[test]
    fn a_view_is_read_through_in_its_own_type() {
        let mut entry = entry(upper_half(), Dtype::Bf16, vec![load(1, vec![index(0)], Dtype::Bf16)]);
        read_through_entry(&mut entry);
        same(&entry.nodes[1].kind, &NodeKind::Compute(Scalar::Cast(Box::new(upper_half()), Dtype::Bf16)));
    }

    /// A negated half (a rotation's) is a view; an exponential is not.
    #[test]
    fn a_view_may_negate_but_not_compute() {
        let unary = |op| Scalar::Unary(op, Box::new(upper_half()), Dtype::F32);
        let mut negated = entry(unary(UnaryOp::Neg), Dtype::F32, vec![load(1, vec![index(0)], Dtype::F32)]);
        read_through_entry(&mut negated);
        assert_eq!(negated.nodes.len(), 2, "the negated half is gone");
        same(&negated.nodes[1].kind, &NodeKind::Compute(unary(UnaryOp::Neg)));
        let mut exponential = entry(unary(UnaryOp::Exp), Dtype::F32, vec![load(1, vec![index(0)], Dtype::F32)]);
        read_through_entry(&mut exponential);
        assert_eq!(exponential.nodes.len(), 3, "the exponential stays");
    }

    /// A reader whose position may fall outside the view (`i0 + 1` over
    /// 4) keeps its read, and its failure: the view stays.
    #[test]
    fn a_read_that_may_fall_outside_the_view_keeps_it() {
        let mut entry = entry(upper_half(), Dtype::F32, vec![load(1, vec![plus(index(0), int(1))], Dtype::F32)]);
        read_through_entry(&mut entry);
        assert_eq!(entry.nodes.len(), 3);
        same(&entry.nodes[2].kind, &NodeKind::Compute(load(1, vec![plus(index(0), int(1))], Dtype::F32)));
    }

    /// A select reads the view at `i0 + 2` where `i0 < c` and at `i0 - 2`
    /// where `i0 >= c` (a concatenation's parts): read through when both
    /// are inside the view, kept when one may not be.
    #[test]
    fn a_select_branch_knows_its_condition() {
        let concatenated = |split: i64| {
            let below = Scalar::Binary(BinaryOp::Cmp(CmpOp::Lt), Box::new(index(0)), Box::new(int(split)), Dtype::Bool);
            let shifted = Scalar::Binary(BinaryOp::Sub, Box::new(index(0)), Box::new(int(2)), Dtype::I64);
            Scalar::Select(
                Box::new(below),
                Box::new(load(1, vec![plus(index(0), int(2))], Dtype::F32)),
                Box::new(load(1, vec![shifted], Dtype::F32)),
                Dtype::F32,
            )
        };
        let mut inside = entry(upper_half(), Dtype::F32, vec![concatenated(2)]);
        read_through_entry(&mut inside);
        assert_eq!(inside.nodes.len(), 2, "i0 + 2 is in 2..4 where i0 < 2, i0 - 2 in 0..2 where i0 >= 2");
        let mut outside = entry(upper_half(), Dtype::F32, vec![concatenated(1)]);
        read_through_entry(&mut outside);
        assert_eq!(outside.nodes.len(), 3, "i0 - 2 is -1 at i0 = 1");
    }

    /// A view whose own positions may fall outside its source (`i0 + 5`
    /// over 8), or that gathers (a position read from a value), is no
    /// view to read through.
    #[test]
    fn a_view_that_may_fail_or_gathers_is_kept() {
        let outside = Scalar::Cast(Box::new(load(0, vec![plus(index(0), int(5))], Dtype::Bf16)), Dtype::F32);
        let gather = Scalar::Cast(
            Box::new(load(
                0,
                vec![Scalar::Cast(Box::new(load(0, vec![index(0)], Dtype::Bf16)), Dtype::I64)],
                Dtype::Bf16,
            )),
            Dtype::F32,
        );
        for view in [outside, gather] {
            let mut entry = entry(view, Dtype::F32, vec![load(1, vec![index(0)], Dtype::F32)]);
            read_through_entry(&mut entry);
            assert_eq!(entry.nodes.len(), 3);
        }
    }

    /// `x` (v0, `source` elements of bf16), its view `v1: [1, 8]`, `w:
    /// [3, 8; bf16]` (v2), and the contraction `v3[i0, i1] = sum[i2]
    /// v1[i0, i2] * w[i1, i2]` (`[1, 3]`), views read through.
    fn product_of_view(source: &[i64], view: Scalar) -> Entry {
        let dims = |sizes: &[i64]| sizes.iter().map(|&d| Dim::constant(d)).collect::<Vec<_>>();
        let widened = |value: u32, positions: Vec<Scalar>| {
            Scalar::Cast(Box::new(load(value, positions, Dtype::Bf16)), Dtype::F32)
        };
        let product = Scalar::Binary(
            BinaryOp::Mul,
            Box::new(widened(1, vec![index(0), index(2)])),
            Box::new(widened(2, vec![index(1), index(2)])),
            Dtype::F32,
        );
        let sum = Scalar::Reduce {
            op: ReduceOp::Sum,
            index: 2,
            extent: Dim::constant(8),
            body: Box::new(product),
            dtype: Dtype::F32,
        };
        let inputs = vec![
            Input { name: "x".into(), shape: dims(source), dtype: Dtype::Bf16 },
            Input { name: "w".into(), shape: dims(&[3, 8]), dtype: Dtype::Bf16 },
        ];
        let node = |kind, shape: &[i64], dtype| Node { kind, shape: dims(shape), dtype, source: None };
        let nodes = vec![
            node(NodeKind::Input(0), source, Dtype::Bf16),
            node(NodeKind::Compute(view), &[1, 8], Dtype::Bf16),
            node(NodeKind::Input(1), &[3, 8], Dtype::Bf16),
            node(NodeKind::Compute(sum), &[1, 3], Dtype::F32),
        ];
        let mut entry = Entry {
            name: "run".into(),
            dims: Vec::new(),
            requires: Vec::new(),
            inputs,
            nodes,
            outputs: vec![Value(3)],
        };
        read_through_entry(&mut entry);
        entry
    }

    /// A reshape of a contraction's input rows (`x: [1, 2, 4]` as `[1,
    /// 8]`) is read through: the contraction reads x's rows as the digits
    /// of its sum's index. A transpose (`x: [8, 1]` as `[1, 8]`) would make
    /// it no contraction: the view stays.
    #[test]
    fn a_contraction_reads_a_reshape_through_but_not_a_transpose() {
        let by = |op| Scalar::Binary(op, Box::new(index(1)), Box::new(int(4)), Dtype::I64);
        let reshape = load(0, vec![index(0), by(BinaryOp::Div), by(BinaryOp::Rem)], Dtype::Bf16);
        let entry = product_of_view(&[1, 2, 4], reshape);
        assert_eq!(entry.nodes.len(), 3, "the reshape is gone");
        let contraction = crate::contraction::of(&entry, 2).expect("still a contraction");
        assert_eq!(contraction.input.value, Value(0));

        let transpose = load(0, vec![index(1), index(0)], Dtype::Bf16);
        let entry = product_of_view(&[8, 1], transpose);
        assert_eq!(entry.nodes.len(), 4, "the transpose stays");
        assert_eq!(crate::contraction::of(&entry, 3).expect("still a contraction").input.value, Value(1));
    }

    /// A view that is also an output is read through by its readers and
    /// kept for the output.
    #[test]
    fn a_view_something_else_reads_stays() {
        let mut entry = entry(upper_half(), Dtype::F32, vec![load(1, vec![index(0)], Dtype::F32)]);
        entry.outputs.push(Value(1));
        read_through_entry(&mut entry);
        assert_eq!(entry.nodes.len(), 3);
        same(&entry.nodes[2].kind, &NodeKind::Compute(upper_half()));
    }
}
