//! Parameters laid out as their products read them. A weight that every
//! read sums over one axis other than its last (`sum[i] x[…, i] * w[i,
//! o]`: GPT-2's `Conv1D`, gpt-oss's experts, stored `[…, in, out]`) is kept
//! with that axis last: its reads take their positions in the new order,
//! and `Param::axes` tells the loaders to lay the checkpoint's tensor out
//! so. The matrix kernels read a weight's rows contiguously along the
//! summed axis, so such products reach them instead of generated loops;
//! every value read, and so every result, is the same. Lowering runs this
//! on every model, after dead values are gone.

use crate::{plan, Entry, Model, NodeKind, ReduceOp, Scalar, Value};

/// Lays out each parameter whose every read sums over one axis but its
/// last with that axis last.
pub fn canonicalize(model: &mut Model) {
    let mut reads = vec![Reads::None; model.params.len()];
    for entry in &model.entries {
        survey(entry, &mut reads);
    }
    for (param, read) in reads.into_iter().enumerate() {
        let Reads::Summed(axis) = read else { continue };
        let info = &model.params[param];
        let rank = info.shape.len();
        if rank < 2 || axis + 1 == rank || info.storage.is_some() || info.axes.is_some() {
            continue;
        }
        let axes: Vec<usize> = (0..rank).filter(|&a| a != axis).chain([axis]).collect();
        lay_out(model, param, axes);
    }
}

/// How a parameter is read, over every read so far.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Reads {
    None,
    /// Each read sums over this axis, and only this one.
    Summed(usize),
    /// Otherwise: whole (an intrinsic's argument, an output), or at other
    /// positions.
    Other,
}

impl Reads {
    fn and(self, read: Reads) -> Reads {
        match (self, read) {
            (Reads::None, read) => read,
            (Reads::Summed(a), Reads::Summed(b)) if a == b => self,
            _ => Reads::Other,
        }
    }
}

fn survey(entry: &Entry, reads: &mut [Reads]) {
    let param_of = |value: Value| match entry.nodes[value.index()].kind {
        NodeKind::Param(param) => Some(param),
        _ => None,
    };
    for node in &entry.nodes {
        if let NodeKind::Compute(scalar) = &node.kind {
            loads(scalar, &mut Vec::new(), &mut |value, positions, summed| {
                if let Some(param) = param_of(value) {
                    reads[param] = reads[param].and(summed_axis(positions, summed));
                }
            });
        } else {
            for value in plan::reads(&node.kind) {
                if let Some(param) = param_of(value) {
                    reads[param] = Reads::Other;
                }
            }
        }
    }
    for &output in &entry.outputs {
        if let Some(param) = param_of(output) {
            reads[param] = Reads::Other;
        }
    }
}

/// What `loads` calls for each load: the value, its positions, and the
/// indices of the sums around it.
type LoadVisit<'v> = dyn FnMut(Value, &[Scalar], &[u32]) + 'v;

/// Calls `visit` on every load in `scalar`.
fn loads(scalar: &Scalar, summed: &mut Vec<u32>, visit: &mut LoadVisit) {
    match scalar {
        Scalar::Reduce { op: ReduceOp::Sum, index, body, .. } => {
            summed.push(*index);
            loads(body, summed, visit);
            summed.pop();
        }
        Scalar::Load(value, positions, _) => {
            visit(*value, positions, summed);
            positions.iter().for_each(|position| loads(position, summed, visit));
        }
        _ => scalar.for_each_child(&mut |child| loads(child, summed, visit)),
    }
}

/// The one position that is a summed index alone, if there is one.
fn summed_axis(positions: &[Scalar], summed: &[u32]) -> Reads {
    let mut found = positions
        .iter()
        .enumerate()
        .filter(|(_, position)| matches!(position, Scalar::Index(k, _) if summed.contains(k)));
    match (found.next(), found.next()) {
        (Some((axis, _)), None) => Reads::Summed(axis),
        _ => Reads::Other,
    }
}

/// `items` (a shape, positions, strides) in the order `axes`: item `j` is
/// `items[axes[j]]`.
pub fn permuted<T: Clone>(items: &[T], axes: &[usize]) -> Vec<T> {
    axes.iter().map(|&axis| items[axis].clone()).collect()
}

/// Keeps `param`'s checkpoint axes in the order `axes`, its reads with it.
fn lay_out(model: &mut Model, param: usize, axes: Vec<usize>) {
    let info = &mut model.params[param];
    info.shape = permuted(&info.shape, &axes);
    for entry in &mut model.entries {
        let reads_it: Vec<bool> =
            entry.nodes.iter().map(|node| matches!(node.kind, NodeKind::Param(p) if p == param)).collect();
        for (node, &is_it) in entry.nodes.iter_mut().zip(&reads_it) {
            if is_it {
                node.shape = permuted(&node.shape, &axes);
            } else if let NodeKind::Compute(scalar) = &mut node.kind {
                reorder(scalar, &reads_it, &axes);
            }
        }
    }
    model.params[param].axes = Some(axes);
}

fn reorder(scalar: &mut Scalar, reads_it: &[bool], axes: &[usize]) {
    if let Scalar::Load(value, positions, _) = scalar {
        if reads_it[value.index()] {
            *positions = permuted(positions, axes);
        }
    }
    scalar.for_each_child_mut(&mut |child| reorder(child, reads_it, axes));
}

#[cfg(test)]
mod tests {
    use super::canonicalize;
    use crate::dim::Dim;
    use crate::testing::index;
    use crate::{contraction, BinaryOp, Dtype, Entry, Input, Model, Node, NodeKind, Param, ReduceOp, Scalar, Value};

    fn node(kind: NodeKind, shape: &[i64]) -> Node {
        Node { kind, shape: shape.iter().map(|&d| Dim::constant(d)).collect(), dtype: Dtype::F32, source: None }
    }

    /// `y[n, o] = sum[k < 3] x[n, k] * w[k, o]` with `w: [3, 4]` stored
    /// `[in, out]`, and `also` another read of `w` beside it.
    fn model(also: Option<Scalar>) -> Model {
        let load = |value, positions| Scalar::Load(Value(value), positions, Dtype::F32);
        let product = Scalar::Binary(
            BinaryOp::Mul,
            Box::new(load(0, vec![index(0), index(2)])),
            Box::new(load(1, vec![index(2), index(1)])),
            Dtype::F32,
        );
        let sum = Scalar::Reduce {
            op: ReduceOp::Sum,
            index: 2,
            extent: Dim::constant(3),
            body: Box::new(product),
            dtype: Dtype::F32,
        };
        let mut nodes = vec![
            node(NodeKind::Input(0), &[2, 3]),
            node(NodeKind::Param(0), &[3, 4]),
            node(NodeKind::Compute(sum), &[2, 4]),
        ];
        let mut outputs = vec![Value(2)];
        if let Some(also) = also {
            nodes.push(node(NodeKind::Compute(also), &[3, 4]));
            outputs.push(Value(3));
        }
        let x = Input { name: "x".into(), shape: vec![Dim::constant(2), Dim::constant(3)], dtype: Dtype::F32 };
        let entry =
            Entry { name: "run".into(), dims: Vec::new(), requires: Vec::new(), inputs: vec![x], nodes, outputs };
        let w =
            Param { path: "w".into(), shape: vec![3, 4], dtype: Dtype::F32, storage: None, axes: None, tiled: None };
        Model { name: "m".into(), params: vec![w], states: Vec::new(), entries: vec![entry] }
    }

    #[test]
    fn a_weight_summed_over_its_first_axis_is_kept_with_it_last_and_reaches_the_kernels() {
        let mut model = model(None);
        assert!(contraction::of(&model.entries[0], 2).is_none());
        canonicalize(&mut model);
        let w = &model.params[0];
        assert_eq!((w.shape.clone(), w.axes.clone(), w.checkpoint_shape()), (vec![4, 3], Some(vec![1, 0]), vec![3, 4]));
        assert_eq!(model.entries[0].nodes[1].shape, vec![Dim::constant(4), Dim::constant(3)]);
        assert!(contraction::of(&model.entries[0], 2).is_some(), "{:?}", model.entries[0].nodes[2]);
        assert!(contraction::missed(&model).is_empty());
    }

    #[test]
    fn a_weight_read_otherwise_too_keeps_its_layout() {
        let copy = Scalar::Load(Value(1), vec![index(0), index(1)], Dtype::F32);
        let mut model = model(Some(copy));
        canonicalize(&mut model);
        assert_eq!((model.params[0].shape.clone(), model.params[0].axes.clone()), (vec![3, 4], None));
    }
}
