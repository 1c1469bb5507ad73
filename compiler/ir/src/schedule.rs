//! The order an entry's nodes run in: independent nodes next to each
//! other, so that a backend can launch them together (the GPU's launch
//! groups, `gpu::group`). Lowering writes nodes in the order the source
//! computes them: a layer's four projections of one normed input are
//! interleaved with what each feeds. Here nodes are placed in waves: each
//! wave is every node, among the [`WINDOW`] after the earliest not yet
//! placed, whose reads are placed; its moves (inputs, parameters,
//! states) first, then its computations, then the rest (intrinsics,
//! effects), each part in the order it was written. No node of a wave
//! reads another.
//!
//! Hoisted values (computed once per loaded model, `plan::hoistable`)
//! are in no wave, for nothing launches them together: each is placed as
//! soon as its reads are, in the order written, so that a value is done
//! with (a rope table rounded) before its sibling is computed.
//!
//! The window keeps values from being computed long before they are
//! read (which would hold their memory longer). An assertion stays a
//! barrier: nothing written after it runs before it, so that a call with
//! bad inputs stops at the assertion's message, as it is written.
//! Nodes are pure functions of what they read (a cache write's cache is
//! what it reads): any order that places a node after its reads computes
//! the same values.

use super::{plan, Entry, Model, NodeKind};

/// How far past the earliest unplaced node a wave reaches.
pub const WINDOW: usize = 32;

/// Places every entry's nodes in waves.
pub fn schedule(model: &mut Model) {
    for entry in &mut model.entries {
        let order = waves(entry);
        entry.reorder(&order);
    }
}

/// The nodes of `entry` in waves, as node numbers.
fn waves(entry: &Entry) -> Vec<usize> {
    let count = entry.nodes.len();
    let reads: Vec<Vec<usize>> =
        entry.nodes.iter().map(|node| plan::reads(&node.kind).iter().map(|value| value.index()).collect()).collect();
    let is_move =
        |at: usize| matches!(entry.nodes[at].kind, NodeKind::Input(_) | NodeKind::Param(_) | NodeKind::State(_));
    let asserts: Vec<usize> = (0..count).filter(|&at| matches!(entry.nodes[at].kind, NodeKind::Assert(..))).collect();
    let hoisted = plan::hoistable(entry);
    let once = |at: usize| hoisted[at] && !is_move(at);
    let once: Vec<bool> = (0..count).map(once).collect();
    let mut placed = vec![false; count];
    let mut order = Vec::with_capacity(count);
    // The earliest node not placed: its reads, all earlier, are.
    let mut earliest = 0;
    while earliest < count {
        // Nothing written after the first unplaced assertion runs before it.
        let barrier = asserts.iter().copied().find(|&at| !placed[at]).unwrap_or(usize::MAX);
        let end = (earliest + WINDOW).min(count).min(barrier.saturating_add(1));
        let ready = |placed: &[bool], at: usize| !placed[at] && reads[at].iter().all(|&read| placed[read]);
        // Hoisted values one at a time, each as soon as it can be, so that
        // one feeding the next is done with before a sibling starts.
        while let Some(at) = (earliest..end).find(|&at| once[at] && ready(&placed, at)) {
            order.push(at);
            placed[at] = true;
        }
        let wave: Vec<usize> = (earliest..end).filter(|&at| ready(&placed, at)).collect();
        // Moves, then computations (next to each other, for a backend to
        // launch together), then the rest (intrinsics, effects).
        let rank = |at: usize| match entry.nodes[at].kind {
            _ if is_move(at) => 0,
            NodeKind::Compute(_) => 1,
            _ => 2,
        };
        let mut ranked = wave.clone();
        ranked.sort_by_key(|&at| rank(at));
        order.extend(ranked);
        for &at in &wave {
            placed[at] = true;
        }
        while earliest < count && placed[earliest] {
            earliest += 1;
        }
    }
    order
}

#[cfg(test)]
mod tests {
    use super::waves;
    use crate::dim::Dim;
    use crate::Dtype;
    use crate::{Entry, Input, Node, NodeKind, Scalar, Value};

    fn node(kind: NodeKind) -> Node {
        Node { kind, shape: vec![Dim::constant(4)], dtype: Dtype::F32, source: None }
    }

    /// `2 * v` at every index, as a node.
    fn double(value: u32) -> Node {
        let load = Scalar::Load(Value(value), vec![Scalar::Index(0, Dtype::I64)], Dtype::F32);
        node(NodeKind::Compute(Scalar::Binary(
            crate::BinaryOp::Mul,
            Box::new(load),
            Box::new(Scalar::Float(2.0, Dtype::F32)),
            Dtype::F32,
        )))
    }

    fn entry(nodes: Vec<Node>) -> Entry {
        let last = Value(nodes.len() as u32 - 1);
        Entry {
            name: "run".into(),
            dims: Vec::new(),
            requires: Vec::new(),
            inputs: vec![Input { name: "x".into(), shape: vec![Dim::constant(4)], dtype: Dtype::F32 }],
            nodes,
            outputs: vec![last],
        }
    }

    /// Two nodes that read only the input run together, before what
    /// reads the first; a parameter read later runs with its wave, before
    /// its computations (hoisted: placed as soon as it can be).
    #[test]
    fn independent_nodes_run_together_after_their_moves() {
        let nodes =
            vec![node(NodeKind::Input(0)), double(0), double(1), node(NodeKind::Param(0)), double(3), double(0)];
        assert_eq!(waves(&entry(nodes)), [0, 3, 4, 1, 5, 2]);
    }

    /// A wave's computations are next to each other: an effect written
    /// between two of them comes after both.
    #[test]
    fn computations_come_before_effects() {
        let nodes = vec![node(NodeKind::Input(0)), double(0), node(NodeKind::WriteState(0, Value(0))), double(0)];
        assert_eq!(waves(&entry(nodes)), [0, 1, 3, 2]);
    }

    /// A chain stays in order, and the order renumbers its values.
    #[test]
    fn a_chain_keeps_its_order_and_values_are_renumbered() {
        let mut chain = entry(vec![node(NodeKind::Input(0)), double(0), double(1), double(0)]);
        let order = waves(&chain);
        assert_eq!(order, [0, 1, 3, 2]);
        chain.reorder(&order);
        let NodeKind::Compute(scalar) = &chain.nodes[3].kind else { panic!("a computation") };
        assert_eq!(crate::plan::reads(&chain.nodes[3].kind), [Value(1)], "{scalar:?}");
        assert_eq!(chain.outputs, [Value(2)]);
    }

    /// Nothing after an assertion runs before it, though it could.
    #[test]
    fn an_assertion_is_a_barrier() {
        let nodes = vec![
            node(NodeKind::Input(0)),
            double(0),
            double(1),
            node(NodeKind::Assert(Value(2), "checked".into())),
            double(0),
        ];
        assert_eq!(waves(&entry(nodes)), [0, 1, 2, 3, 4]);
    }

    /// Values hoisted from a parameter (a table and its rounding, twice)
    /// are placed one by one as written, each as soon as it can be: the
    /// first rounded before the second table, not with it in a wave.
    #[test]
    fn hoisted_values_are_placed_as_soon_as_they_can_be() {
        let nodes = vec![
            node(NodeKind::Input(0)),
            node(NodeKind::Param(0)),
            double(1),
            double(2),
            double(1),
            double(4),
            double(0),
        ];
        assert_eq!(waves(&entry(nodes)), [0, 1, 2, 3, 4, 5, 6]);
    }

    /// A node past the window waits for a later wave.
    #[test]
    fn a_wave_reaches_a_window_past_its_first_node() {
        let mut nodes = vec![node(NodeKind::Input(0))];
        nodes.extend((0..super::WINDOW).map(|at| double(at as u32)));
        nodes.push(double(0));
        let order = waves(&entry(nodes));
        assert_eq!(order[..4], [0, 1, 2, super::WINDOW + 1], "{order:?}");
        assert_eq!(order.len(), super::WINDOW + 2);
    }
}
