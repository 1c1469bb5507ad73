//! Fusion: a `Compute` value read by exactly one load, in one `Compute`
//! consumer, is inlined into that consumer and no longer stored. Chains of
//! elementwise steps (a gate, a residual add, the rounding between them)
//! become one pass over memory, and the memory plan loses their buffers.
//! So is a *brief* value (its reductions take at most [`BRIEF`] steps in
//! all: a short convolution) read by two loads at one position in one
//! consumer (`x * sigmoid(x)`), computed twice there, from both loads or
//! from neither.
//!
//! A value is inlined only where that computes each of its elements at
//! most once per element it used to be computed for (twice, for a brief
//! value read twice), and changes no result:
//! - the load's positions are distinct indices, each running over exactly
//!   the producer's extent on that axis (so the load is never out of
//!   range), or a constant 0 on an axis of extent 1 (a batch of one row
//!   read as `x[0, i1, i2]`), covering every index in scope but those of
//!   extent 1 (the consumer's axes and the reductions around the load: no
//!   element is recomputed); or, for a producer that reduces, outside the
//!   consumer's reductions, covering the consumer's outer axes `0..m`:
//!   backends compute it once per outer position (`ir::invariant`), which
//!   makes a norm one pass over a row; or, for a producer that is
//!   arithmetic on its indices alone (an `iota`, read as a convolution's
//!   positions inside its reduction over the taps), anywhere: computing it
//!   costs no more than loading it, and the load it was read by becomes a
//!   position that bounds and vectors can see through;
//! - the load is not in a branch of a lazy select (which would skip the
//!   producer's own range checks);
//! - the producer is not hoisted (computed once per loaded model), unless
//!   it is arithmetic on its indices alone; a
//!   contraction (which runs on its own kernel, `ir::contraction`) is
//!   inlined only where the consumer becomes a contraction: a copy of it,
//!   or one with an epilogue, elementwise on the product's outputs, each
//!   from its own total, in the product's kernel (the residual add after
//!   an output projection).
//!
//! The inlined expression is cast to the producer's dtype where its own
//! differs, which is exactly the rounding storing it did.

use super::{plan, Entry, Model, NodeKind, Scalar, UnaryOp, Value};
use crate::dim::Dim;
use std::collections::HashMap;

/// Fuses every entry of `model`.
pub fn fuse(model: &mut Model) {
    for entry in &mut model.entries {
        fuse_entry(entry);
    }
}

/// Loads per value: textual loads in `Compute` nodes count one each; any
/// other read (an intrinsic, a state write, an output) makes a value
/// unfusable, counted as two.
fn load_counts(entry: &Entry) -> Vec<u32> {
    let mut counts = vec![0u32; entry.nodes.len()];
    for node in &entry.nodes {
        match &node.kind {
            NodeKind::Compute(scalar) => {
                let mut loads = Vec::new();
                scalar.loads(&mut loads);
                loads.iter().for_each(|v| counts[v.index()] += 1);
            }
            kind => plan::reads(kind).iter().for_each(|v| counts[v.index()] += 2),
        }
    }
    entry.outputs.iter().for_each(|v| counts[v.index()] += 2);
    counts
}

fn fuse_entry(entry: &mut Entry) {
    let counts = load_counts(entry);
    let hoisted = plan::hoistable(entry);
    // The consumer of each value loaded once, or twice at one position.
    let mut consumer: HashMap<Value, usize> = HashMap::new();
    for (at, node) in entry.nodes.iter().enumerate() {
        if let NodeKind::Compute(scalar) = &node.kind {
            let mut loads = Vec::new();
            positioned_loads(scalar, &mut loads);
            for (value, positions) in &loads {
                let twice = || {
                    loads
                        .iter()
                        .filter(|(other, read_at)| other == value && super::cse::same(read_at, positions))
                        .count()
                        == 2
                };
                if counts[value.index()] == 1
                    || (counts[value.index()] == 2 && twice() && brief(&entry.nodes[value.index()].kind))
                {
                    consumer.insert(*value, at);
                }
            }
        }
    }
    let mut fused = vec![false; entry.nodes.len()];
    for producer in 0..entry.nodes.len() {
        let value = Value(producer as u32);
        let Some(&at) = consumer.get(&value) else { continue };
        let NodeKind::Compute(body) = &entry.nodes[producer].kind else { continue };
        let free = index_arithmetic(body);
        if hoisted[producer] && !free {
            continue;
        }
        let contraction = super::contraction::of(entry, producer).is_some();
        let (body, dtype, shape) = (body.clone(), entry.nodes[producer].dtype, entry.nodes[producer].shape.clone());
        let consumer_shape = entry.nodes[at].shape.clone();
        let before = (contraction || counts[producer] > 1).then(|| entry.nodes[at].kind.clone());
        let NodeKind::Compute(target) = &mut entry.nodes[at].kind else { continue };
        let scope: Vec<(u32, Dim)> = consumer_shape.iter().enumerate().map(|(k, d)| (k as u32, d.clone())).collect();
        let reduces = super::invariant::reduces(&body);
        let mut inliner = Inliner {
            value,
            body: &body,
            dtype,
            shape: &shape,
            reduces,
            free,
            rank: scope.len(),
            next_index: max_index(target).max(scope.len() as u32) + 1,
            done: false,
        };
        inliner.visit(target, &scope, false);
        fused[producer] = inliner.done;
        // A value read twice goes from both reads or from neither; a
        // contraction only where the consumer is one (its sum, copied or
        // with an epilogue).
        let left = plan::reads(&entry.nodes[at].kind).contains(&value);
        let refused = left || (contraction && super::contraction::of(entry, at).is_none());
        if let Some(before) = before.filter(|_| inliner.done && refused) {
            entry.nodes[at].kind = before;
            fused[producer] = false;
        }
    }
    entry.remove_nodes(&fused);
}

/// The most steps a value read twice by its consumer may reduce over in
/// all, to be computed twice there (a short convolution's taps).
const BRIEF: i64 = 16;

/// Whether a node is cheap enough to compute twice per element: its
/// reductions, if any, take at most [`BRIEF`] steps in all.
fn brief(kind: &NodeKind) -> bool {
    fn steps(scalar: &Scalar) -> Option<i64> {
        let mut inner = 0i64;
        let mut known = true;
        scalar.for_each_child(&mut |child| match steps(child) {
            Some(count) => inner = inner.saturating_add(count),
            None => known = false,
        });
        match scalar {
            _ if !known => None,
            Scalar::Reduce { extent, .. } => extent.as_constant().map(|extent| extent.saturating_mul(inner.max(1))),
            _ => Some(inner),
        }
    }
    matches!(kind, NodeKind::Compute(scalar) if steps(scalar).is_some_and(|count| count <= BRIEF))
}

/// Whether `scalar` is arithmetic on indices and dims alone: it loads
/// nothing, reduces nothing and calls no elementary function.
fn index_arithmetic(scalar: &Scalar) -> bool {
    !scalar.any(&|part| match part {
        Scalar::Load(..) | Scalar::Reduce { .. } => true,
        Scalar::Unary(op, ..) => !matches!(op, UnaryOp::Neg | UnaryOp::Not | UnaryOp::Abs),
        _ => false,
    })
}

/// The loads in `scalar`, with their positions, in order.
fn positioned_loads<'s>(scalar: &'s Scalar, loads: &mut Vec<(Value, &'s [Scalar])>) {
    if let Scalar::Load(value, positions, _) = scalar {
        loads.push((*value, positions));
    }
    scalar.for_each_child(&mut |child| positioned_loads(child, loads));
}

/// Where one of the producer's axes comes from in the consumer.
#[derive(Clone, Copy, PartialEq)]
enum Axis {
    /// The consumer's index of this number.
    Index(u32),
    /// Position 0 of an axis of extent 1.
    Zero,
}

struct Inliner<'a> {
    value: Value,
    body: &'a Scalar,
    dtype: crate::Dtype,
    shape: &'a [Dim],
    /// Whether the producer reduces (and may be computed once per outer
    /// position of the consumer).
    reduces: bool,
    /// Whether the producer is arithmetic on its indices alone, as cheap
    /// to compute as to load.
    free: bool,
    /// The consumer's rank.
    rank: usize,
    /// The first index number unused in the consumer.
    next_index: u32,
    done: bool,
}

impl Inliner<'_> {
    /// Looks for the load in `scalar`, with the indices in `scope`
    /// (number, extent); `lazy` inside a select's branch.
    fn visit(&mut self, scalar: &mut Scalar, scope: &[(u32, Dim)], lazy: bool) {
        match scalar {
            Scalar::Load(value, positions, _) if *value == self.value => {
                if let Some(mapping) = self.mapping(positions, scope, self.rank).filter(|_| !lazy) {
                    let mut inlined = self.body.clone();
                    renumber(&mut inlined, &mapping, &mut self.next_index, &mut HashMap::new());
                    if inlined.dtype() != self.dtype {
                        inlined = Scalar::Cast(Box::new(inlined), self.dtype);
                    }
                    *scalar = inlined;
                    self.done = true;
                }
            }
            Scalar::Load(_, positions, _) => positions.iter_mut().for_each(|p| self.visit(p, scope, lazy)),
            Scalar::Unary(_, a, _) | Scalar::Cast(a, _) => self.visit(a, scope, lazy),
            Scalar::Binary(_, a, b, _) => {
                self.visit(a, scope, lazy);
                self.visit(b, scope, lazy);
            }
            Scalar::Select(c, a, b, _) => {
                self.visit(c, scope, lazy);
                self.visit(a, scope, true);
                self.visit(b, scope, true);
            }
            Scalar::Reduce { index, extent, body, .. } => {
                let mut inner = scope.to_vec();
                inner.push((*index, extent.clone()));
                self.visit(body, &inner, lazy);
            }
            Scalar::Index(..) | Scalar::Dim(_) | Scalar::Float(..) | Scalar::Int(..) | Scalar::Bool(_) => {}
        }
    }

    /// Where each of the producer's axes comes from in the consumer, when
    /// the positions are distinct indices (or 0 on an axis of extent 1)
    /// that match the producer's extents and cover the scope (or need not:
    /// an outer reducing producer's, a free one's).
    fn mapping(&self, positions: &[Scalar], scope: &[(u32, Dim)], rank: usize) -> Option<Vec<Axis>> {
        let one = Dim::constant(1);
        let mut mapping = Vec::with_capacity(positions.len());
        for (position, extent) in positions.iter().zip(self.shape) {
            let axis = match position {
                Scalar::Int(0, _) if *extent == one => Axis::Zero,
                Scalar::Index(index, _) => {
                    let (_, range) = scope.iter().find(|(number, _)| number == index)?;
                    if range != extent || mapping.contains(&Axis::Index(*index)) {
                        return None;
                    }
                    Axis::Index(*index)
                }
                _ => return None,
            };
            mapping.push(axis);
        }
        // Indices of extent 1 repeat nothing when left out.
        let covers = scope.iter().all(|(number, extent)| mapping.contains(&Axis::Index(*number)) || *extent == one);
        // Outer axes `0..m` of the consumer, outside its reductions.
        let outer = self.reduces
            && scope.len() == rank
            && mapping.iter().all(|axis| matches!(axis, Axis::Index(index) if (*index as usize) < mapping.len()));
        (covers || outer || self.free).then_some(mapping)
    }
}

fn max_index(scalar: &Scalar) -> u32 {
    let mut most = match scalar {
        Scalar::Index(index, _) | Scalar::Reduce { index, .. } => *index,
        _ => 0,
    };
    scalar.for_each_child(&mut |child| most = most.max(max_index(child)));
    most
}

/// The producer's axes become what `axes` says (the consumer's indices, or
/// 0); its reductions get fresh numbers.
fn renumber(scalar: &mut Scalar, axes: &[Axis], next: &mut u32, reductions: &mut HashMap<u32, u32>) {
    match scalar {
        Scalar::Index(index, dtype) => match reductions.get(index) {
            Some(fresh) => *index = *fresh,
            None => match axes[*index as usize] {
                Axis::Index(number) => *index = number,
                Axis::Zero => *scalar = Scalar::Int(0, *dtype),
            },
        },
        Scalar::Reduce { index, .. } => {
            reductions.insert(*index, *next);
            *index = *next;
            *next += 1;
        }
        _ => {}
    }
    scalar.for_each_child_mut(&mut |child| renumber(child, axes, next, reductions));
}

#[cfg(test)]
mod tests {
    use super::fuse_entry;
    use crate::dim::Dim;
    use crate::testing::index;
    use crate::Dtype;
    use crate::{BinaryOp, Entry, Input, Node, NodeKind, ReduceOp, Scalar, UnaryOp, Value};

    /// `x: [1, 4]`, `y[i0, i1] = exp(x[i0, i1])` (`[first, 4]`),
    /// `z[i0, i1] = y[at, i1] + 1` (`[1, 4]`), fused.
    fn fused(first: i64, at: Scalar) -> Entry {
        let node = |kind, rows: i64| Node {
            kind,
            shape: vec![Dim::constant(rows), Dim::constant(4)],
            dtype: Dtype::F32,
            source: None,
        };
        let load = |value: u32, positions: Vec<Scalar>| Scalar::Load(Value(value), positions, Dtype::F32);
        let exp = Scalar::Unary(UnaryOp::Exp, Box::new(load(0, vec![index(0), index(1)])), Dtype::F32);
        let sum = Scalar::Binary(
            BinaryOp::Add,
            Box::new(load(1, vec![at, index(1)])),
            Box::new(Scalar::Float(1.0, Dtype::F32)),
            Dtype::F32,
        );
        let mut entry = Entry {
            name: "run".into(),
            dims: Vec::new(),
            requires: Vec::new(),
            inputs: vec![Input {
                name: "x".into(),
                shape: vec![Dim::constant(1), Dim::constant(4)],
                dtype: Dtype::F32,
            }],
            nodes: vec![
                node(NodeKind::Input(0), 1),
                node(NodeKind::Compute(exp), first),
                node(NodeKind::Compute(sum), 1),
            ],
            outputs: vec![Value(2)],
        };
        fuse_entry(&mut entry);
        entry
    }

    /// A read at position 0 of an axis of extent 1 is inlined as a read at
    /// an index is, the producer's index on that axis becoming 0.
    #[test]
    fn a_read_at_zero_of_an_axis_of_one_is_inlined() {
        for at in [index(0), Scalar::Int(0, Dtype::I64)] {
            let entry = fused(1, at.clone());
            assert_eq!(entry.nodes.len(), 2, "the exponential is inlined");
            let NodeKind::Compute(Scalar::Binary(_, sum, _, _)) = &entry.nodes[1].kind else { panic!("the sum") };
            let Scalar::Unary(UnaryOp::Exp, read, _) = sum.as_ref() else {
                panic!("the exponential, inlined: {sum:?}")
            };
            let Scalar::Load(Value(0), positions, _) = read.as_ref() else { panic!("a read of the input: {read:?}") };
            assert_eq!(format!("{positions:?}"), format!("{:?}", [at, index(1)]));
        }
    }

    /// Position 0 of a longer axis reads one element of several: not
    /// inlined.
    #[test]
    fn a_read_at_zero_of_a_longer_axis_is_not_inlined() {
        assert_eq!(fused(3, Scalar::Int(0, Dtype::I64)).nodes.len(), 3);
    }

    /// `x: [8]`, `steps[i0] = producer` (`[4; i64]`), `out[i0] = sum[i1 <
    /// 4] x[steps[i0] + i1]`, fused: a convolution's positions.
    fn positions_in_a_sum(producer: Scalar) -> Entry {
        let node = |kind, size: i64, dtype| Node { kind, shape: vec![Dim::constant(size)], dtype, source: None };
        let position = Scalar::Binary(
            BinaryOp::Add,
            Box::new(Scalar::Load(Value(1), vec![index(0)], Dtype::I64)),
            Box::new(index(1)),
            Dtype::I64,
        );
        let sum = Scalar::Reduce {
            op: ReduceOp::Sum,
            index: 1,
            extent: Dim::constant(4),
            body: Box::new(Scalar::Load(Value(0), vec![position], Dtype::F32)),
            dtype: Dtype::F32,
        };
        let mut entry = Entry {
            name: "run".into(),
            dims: Vec::new(),
            requires: Vec::new(),
            inputs: vec![Input { name: "x".into(), shape: vec![Dim::constant(8)], dtype: Dtype::F32 }],
            nodes: vec![
                node(NodeKind::Input(0), 8, Dtype::F32),
                node(NodeKind::Compute(producer), 4, Dtype::I64),
                node(NodeKind::Compute(sum), 4, Dtype::F32),
            ],
            outputs: vec![Value(2)],
        };
        fuse_entry(&mut entry);
        entry
    }

    /// An `iota` read inside a reduction is inlined though the reduction
    /// reads it once per tap (it costs no more than its load), so the
    /// input is read at `i0 + i1`; a producer that loads is not.
    #[test]
    fn index_arithmetic_is_inlined_inside_a_reduction() {
        let entry = positions_in_a_sum(index(0));
        assert_eq!(entry.nodes.len(), 2, "the iota is inlined");
        let NodeKind::Compute(Scalar::Reduce { body, .. }) = &entry.nodes[1].kind else { panic!("the sum") };
        let Scalar::Load(Value(0), positions, _) = body.as_ref() else { panic!("a read of the input: {body:?}") };
        let expected = Scalar::Binary(BinaryOp::Add, Box::new(index(0)), Box::new(index(1)), Dtype::I64);
        assert_eq!(format!("{positions:?}"), format!("{:?}", [expected]));
        let loaded = Scalar::Cast(Box::new(Scalar::Load(Value(0), vec![index(0)], Dtype::F32)), Dtype::I64);
        assert_eq!(positions_in_a_sum(loaded).nodes.len(), 3, "a producer that loads is recomputed nowhere");
    }

    /// `x: [1, 4]`, `y[i0, i1] = producer` (`[1, 4]`), `z = y[i0, i1] *
    /// y[i0, second]` (in a select's branch where `lazy`), fused.
    fn read_twice(producer: Scalar, second: Scalar, lazy: bool) -> Entry {
        let node =
            |kind| Node { kind, shape: vec![Dim::constant(1), Dim::constant(4)], dtype: Dtype::F32, source: None };
        let load = |positions: Vec<Scalar>| Scalar::Load(Value(1), positions, Dtype::F32);
        let mut other = load(vec![index(0), second]);
        if lazy {
            other = Scalar::Select(
                Box::new(Scalar::Bool(true)),
                Box::new(other),
                Box::new(Scalar::Float(0.0, Dtype::F32)),
                Dtype::F32,
            );
        }
        let product =
            Scalar::Binary(BinaryOp::Mul, Box::new(load(vec![index(0), index(1)])), Box::new(other), Dtype::F32);
        let mut entry = Entry {
            name: "run".into(),
            dims: Vec::new(),
            requires: Vec::new(),
            inputs: vec![Input {
                name: "x".into(),
                shape: vec![Dim::constant(1), Dim::constant(4)],
                dtype: Dtype::F32,
            }],
            nodes: vec![node(NodeKind::Input(0)), node(NodeKind::Compute(producer)), node(NodeKind::Compute(product))],
            outputs: vec![Value(2)],
        };
        fuse_entry(&mut entry);
        entry
    }

    /// A brief value read twice at one position is computed twice in its
    /// reader: an exponential, a sum of 16 steps. Not a sum of 17, nor a
    /// value read at two positions, nor one of whose reads is lazy (both
    /// reads stay).
    #[test]
    fn a_brief_value_read_twice_at_one_position_is_inlined() {
        let x = |k: u32| Scalar::Load(Value(0), vec![index(0), index(k)], Dtype::F32);
        let sum = |steps: i64| Scalar::Reduce {
            op: ReduceOp::Sum,
            index: 2,
            extent: Dim::constant(steps),
            body: Box::new(x(1)),
            dtype: Dtype::F32,
        };
        let exp = Scalar::Unary(UnaryOp::Exp, Box::new(x(1)), Dtype::F32);
        assert_eq!(read_twice(exp.clone(), index(1), false).nodes.len(), 2);
        assert_eq!(read_twice(sum(16), index(1), false).nodes.len(), 2);
        assert_eq!(read_twice(sum(17), index(1), false).nodes.len(), 3);
        let reversed =
            Scalar::Binary(BinaryOp::Sub, Box::new(Scalar::Int(3, Dtype::I64)), Box::new(index(1)), Dtype::I64);
        assert_eq!(read_twice(exp.clone(), reversed, false).nodes.len(), 3);
        let lazy = read_twice(exp, index(1), true);
        assert_eq!(lazy.nodes.len(), 3);
        assert_eq!(crate::plan::reads(&lazy.nodes[2].kind), [Value(1)], "both reads stay");
    }

    /// `a: [2, 8]` and `w: [3, 8]` (inputs), `y[i0, i1] = sum[i2] a[i0,
    /// i2] * w[i1, i2]` (`[2, 3]`), then `consumer` of y (`[columns]` or
    /// `[2, columns]`, the output), fused.
    fn after_product(consumer: Scalar, shape: &[i64]) -> Entry {
        let dims = |sizes: &[i64]| sizes.iter().map(|&d| Dim::constant(d)).collect::<Vec<_>>();
        let load = |value: u32, positions: Vec<Scalar>| Scalar::Load(Value(value), positions, Dtype::F32);
        let product = Scalar::Binary(
            BinaryOp::Mul,
            Box::new(load(0, vec![index(0), index(2)])),
            Box::new(load(1, vec![index(1), index(2)])),
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
            Input { name: "a".into(), shape: dims(&[2, 8]), dtype: Dtype::F32 },
            Input { name: "w".into(), shape: dims(&[3, 8]), dtype: Dtype::F32 },
        ];
        let node = |kind, shape: &[i64]| Node { kind, shape: dims(shape), dtype: Dtype::F32, source: None };
        let nodes = vec![
            node(NodeKind::Input(0), &[2, 8]),
            node(NodeKind::Input(1), &[3, 8]),
            node(NodeKind::Compute(sum), &[2, 3]),
            node(NodeKind::Compute(consumer), shape),
        ];
        let mut entry = Entry {
            name: "run".into(),
            dims: Vec::new(),
            requires: Vec::new(),
            inputs,
            nodes,
            outputs: vec![Value(3)],
        };
        fuse_entry(&mut entry);
        entry
    }

    /// A contraction read elementwise is inlined: its consumer is the
    /// contraction, with an epilogue (or none, where it copies it). Read
    /// otherwise (summed over its columns), it stays on its own.
    #[test]
    fn a_contraction_is_inlined_only_as_an_epilogue() {
        let read = Scalar::Load(Value(2), vec![index(0), index(1)], Dtype::F32);
        let gated = Scalar::Unary(UnaryOp::Exp, Box::new(read.clone()), Dtype::F32);
        let entry = after_product(gated, &[2, 3]);
        assert_eq!(entry.nodes.len(), 3, "the product is inlined");
        assert!(crate::contraction::of(&entry, 2).and_then(|c| c.epilogue).is_some());

        let copied = after_product(read.clone(), &[2, 3]);
        assert_eq!(copied.nodes.len(), 3, "a copy of the product is the product");
        assert!(crate::contraction::of(&copied, 2).is_some_and(|c| c.epilogue.is_none()));

        let summed = Scalar::Reduce {
            op: ReduceOp::Sum,
            index: 1,
            extent: Dim::constant(3),
            body: Box::new(read),
            dtype: Dtype::F32,
        };
        let entry = after_product(summed, &[2]);
        assert_eq!(entry.nodes.len(), 4, "the product stays");
        assert!(crate::contraction::of(&entry, 2).is_some_and(|c| c.epilogue.is_none()));
    }
}
