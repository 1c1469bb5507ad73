//! Which `gated_delta_step` nodes may advance their state where it lies.
//!
//! A decoding step reads a recurrent state, steps it, and writes the new
//! state back through a view of the step's rows, as the seed's DeltaNet
//! does: `recurrent = permute(stepped[:, 1:1 + KD, :, :], [0, 2, 1, 3])`.
//! Run as written, that is a new state in the step's rows and a copy of it
//! in the state's layout, for every layer and every token. When
//! - the state is read by the step alone,
//! - the view is exactly the step's state rows in the state's layout
//!   (`stepped[i0, i2 + 1, i1, i3]`, f32, the state's shape), read only by
//!   the state's write, the state's one write in the entry, and
//! - every other reader of the step is a computation that loads its output
//!   row alone (row 0 of axis 1, a constant position) and the step is no
//!   output of the entry,
//!
//! then the step can advance the state in place: after it, the state holds
//! exactly what the write would have made it, and nothing reads the
//! step's state rows, so neither the view nor the write need run. A
//! backend that carries states (`linnet_exec::Backend::carries_delta_states`)
//! does so; the others run the entry as written.

use super::bounds::{self, Ranges};
use super::{BinaryOp, Entry, Intrinsic, NodeKind, Scalar, Value};
use crate::Dtype;
use std::collections::HashMap;

/// The argument of `gated_delta_step` that is its state.
pub const STATE_ARGUMENT: usize = 5;

/// A step that advances its state in place, and the nodes it makes
/// unneeded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Carry {
    /// The `gated_delta_step` node.
    pub step: usize,
    /// The state it advances.
    pub state: usize,
    /// The view of the step's state rows in the state's layout.
    pub view: usize,
    /// The `WriteState` of that view.
    pub write: usize,
}

/// The steps of `entry` that may advance their state in place; `uses` is
/// how many nodes and outputs read each value.
pub fn carries(entry: &Entry, uses: &[u32]) -> Vec<Carry> {
    (0..entry.nodes.len()).filter_map(|step| carry(entry, uses, step)).collect()
}

fn carry(entry: &Entry, uses: &[u32], step: usize) -> Option<Carry> {
    let NodeKind::Intrinsic(Intrinsic::GatedDeltaStep, args) = &entry.nodes[step].kind else { return None };
    let read = args[STATE_ARGUMENT];
    let NodeKind::State(state) = entry.nodes[read.index()].kind else { return None };
    let stepped = Value(step as u32);
    if uses[read.index()] != 1 || entry.outputs.contains(&stepped) {
        return None;
    }
    let mut writes = entry.nodes.iter().enumerate().filter_map(|(at, node)| match node.kind {
        NodeKind::WriteState(k, value) if k == state => Some((at, value.index())),
        _ => None,
    });
    let (Some((write, written)), None) = (writes.next(), writes.next()) else { return None };
    let view = &entry.nodes[written];
    let is_state_rows = match &view.kind {
        NodeKind::Compute(Scalar::Load(source, positions, Dtype::F32)) => {
            source.index() == step && positions.iter().map(offset_index).eq([(0, 0), (2, 1), (1, 0), (3, 0)].map(Some))
        }
        _ => false,
    };
    if !is_state_rows || view.dtype != Dtype::F32 || view.shape != entry.nodes[read.index()].shape || uses[written] != 1
    {
        return None;
    }
    let others_read_outputs_only = entry.nodes.iter().enumerate().all(|(at, node)| match &node.kind {
        _ if at == written => true,
        NodeKind::Compute(scalar) => loads_output_row_only(scalar, stepped),
        NodeKind::Intrinsic(_, args) => !args.contains(&stepped),
        NodeKind::WriteState(_, value) | NodeKind::Assert(value, _) => value.index() != step,
        NodeKind::Input(_) | NodeKind::Param(_) | NodeKind::State(_) => true,
    });
    others_read_outputs_only.then_some(Carry { step, state, view: written, write })
}

/// A position that is index `k` plus a constant, as `(k, constant)`.
fn offset_index(position: &Scalar) -> Option<(u32, i64)> {
    match position {
        Scalar::Index(k, _) => Some((*k, 0)),
        Scalar::Binary(BinaryOp::Add, a, b, _) => match (a.as_ref(), b.as_ref()) {
            (Scalar::Index(k, _), offset) | (offset, Scalar::Index(k, _)) => constant(offset).map(|c| (*k, c)),
            _ => None,
        },
        _ => None,
    }
}

/// The value of a position that reads no index, if it has one.
fn constant(position: &Scalar) -> Option<i64> {
    bounds::bounds(position, &HashMap::new(), &Ranges::new()).and_then(|(least, most)| (least == most).then_some(least))
}

/// Whether every load of `step` in `scalar` is at row 0 of axis 1, a
/// constant position.
fn loads_output_row_only(scalar: &Scalar, step: Value) -> bool {
    !scalar.any(&|part| match part {
        Scalar::Load(source, positions, _) if *source == step => positions.get(1).and_then(constant) != Some(0),
        _ => false,
    })
}

#[cfg(test)]
mod tests {
    use super::{carries, Carry};
    use crate::dim::Dim;
    use crate::testing::{index, int, plus};
    use crate::{BinaryOp, Dtype, Entry, Intrinsic, Node, NodeKind, Scalar, Value};

    fn load(value: u32, positions: Vec<Scalar>) -> Scalar {
        Scalar::Load(Value(value), positions, Dtype::F32)
    }

    /// The state rows in the state's layout: `stepped[i0, i2 + 1, i1, i3]`.
    fn state_rows() -> Scalar {
        load(7, vec![index(0), plus(index(2), int(1)), index(1), index(3)])
    }

    /// A decoding step as the seed writes it (state `[1, 2, 3, 4]`: two
    /// value heads, a key dim of 3, a value dim of 4): v0–v4 and v6 the
    /// step's other arguments, v5 the state, v7 the step, v8 `view`, v9
    /// the output computed by `output`, v10 the state's write of v8.
    fn decode_step(view: Scalar, output: Scalar) -> Entry {
        let node = |kind, shape: &[i64]| Node {
            kind,
            shape: shape.iter().map(|&size| Dim::constant(size)).collect(),
            dtype: Dtype::F32,
            source: None,
        };
        let mut nodes: Vec<Node> = (0..5).map(|k| node(NodeKind::Input(k), &[1, 2, 4])).collect();
        nodes.push(node(NodeKind::State(0), &[1, 2, 3, 4]));
        nodes.push(node(NodeKind::Input(5), &[]));
        let args = (0..7).map(Value).collect();
        nodes.push(node(NodeKind::Intrinsic(Intrinsic::GatedDeltaStep, args), &[1, 4, 2, 4]));
        nodes.push(node(NodeKind::Compute(view), &[1, 2, 3, 4]));
        nodes.push(node(NodeKind::Compute(output), &[1, 1, 2, 4]));
        nodes.push(node(NodeKind::WriteState(0, Value(8)), &[]));
        Entry {
            name: "decode".into(),
            dims: Vec::new(),
            requires: Vec::new(),
            inputs: Vec::new(),
            outputs: vec![Value(9)],
            nodes,
        }
    }

    fn uses(entry: &Entry) -> Vec<u32> {
        crate::analysis::Analysis::of(entry).uses
    }

    fn output_row(row: i64) -> Scalar {
        load(7, vec![index(0), plus(int(0), int(row)), index(2), index(3)])
    }

    #[test]
    fn a_step_written_back_through_its_state_rows_is_carried() {
        let entry = decode_step(state_rows(), output_row(0));
        assert_eq!(carries(&entry, &uses(&entry)), vec![Carry { step: 7, state: 0, view: 8, write: 10 }]);
    }

    /// Nothing is carried when a reader other than the view reads a state
    /// row, when the view is not the state's layout, or when the state is
    /// read twice.
    #[test]
    fn a_step_whose_rows_or_state_are_read_elsewhere_is_not() {
        let entry = decode_step(state_rows(), output_row(1));
        assert_eq!(carries(&entry, &uses(&entry)), Vec::new());
        let swapped = load(7, vec![index(0), plus(index(1), int(1)), index(2), index(3)]);
        let entry = decode_step(swapped, output_row(0));
        assert_eq!(carries(&entry, &uses(&entry)), Vec::new());
        let reads_state = Scalar::Binary(
            BinaryOp::Add,
            Box::new(output_row(0)),
            Box::new(load(5, vec![index(0), index(2), int(0), index(3)])),
            Dtype::F32,
        );
        let entry = decode_step(state_rows(), reads_state);
        assert_eq!(carries(&entry, &uses(&entry)), Vec::new());
    }
}
