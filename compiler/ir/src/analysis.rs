//! The analysis of a verified entry, computed once when a model is loaded
//! (or built) and read by the executor and every backend: what each node
//! reads, how often and for the last time each value is read (liveness),
//! what is hoisted (computed once per loaded model), which nodes are
//! contractions (run on a matrix kernel) or rankings (sorted), which
//! intrinsic writes its cache state in place, and which delta step may
//! advance its state in place (`carry`).

use super::{carry, contraction, plan, ranking, Entry, NodeKind, Scalar, Value};
use crate::dim::Dim;

#[derive(Clone, Debug)]
pub struct Analysis {
    /// Per node: the values it reads, each once.
    pub reads: Vec<Vec<Value>>,
    /// Per value: how many nodes and outputs read it.
    pub uses: Vec<u32>,
    /// Per value: the node after which it is dead (`usize::MAX`: kept).
    pub last_reads: Vec<usize>,
    /// Per node: depends on no input or state and has a fixed shape.
    pub hoistable: Vec<bool>,
    /// Per node: a contraction (`ir::contraction`).
    pub contraction: Vec<bool>,
    /// Per node: a ranking (`ir::ranking`), as the value it ranks.
    pub ranking: Vec<Option<Value>>,
    /// Per node: a cache write whose cache is a state read nowhere else,
    /// which therefore updates that state in place.
    pub in_place: Vec<Option<usize>>,
    /// Per node: a `gated_delta_step` that may advance this state in
    /// place (`carry`), for a backend that carries states.
    pub carried: Vec<Option<usize>>,
    /// Per node: a view of a carried step's state rows, or its state
    /// write, that the step carried in place makes unneeded.
    pub carried_away: Vec<bool>,
    /// Every dim the entry evaluates at run time (shapes, dims in
    /// expressions, reduction extents) that is not a constant, once.
    pub dims: Vec<Dim>,
}

impl Analysis {
    pub fn of(entry: &Entry) -> Analysis {
        let reads: Vec<Vec<Value>> = entry.nodes.iter().map(|node| plan::reads(&node.kind)).collect();
        let mut uses = vec![0u32; entry.nodes.len()];
        for value in reads.iter().flatten().chain(&entry.outputs) {
            uses[value.index()] += 1;
        }
        let in_place = entry
            .nodes
            .iter()
            .map(|node| match &node.kind {
                NodeKind::Intrinsic(intrinsic, args) if intrinsic.writes_cache() => {
                    match entry.nodes[args[0].index()].kind {
                        NodeKind::State(k) if uses[args[0].index()] == 1 => Some(k),
                        _ => None,
                    }
                }
                _ => None,
            })
            .collect();
        let (mut carried, mut carried_away) = (vec![None; entry.nodes.len()], vec![false; entry.nodes.len()]);
        for carry in carry::carries(entry, &uses) {
            carried[carry.step] = Some(carry.state);
            carried_away[carry.view] = true;
            carried_away[carry.write] = true;
        }
        let mut dims = Vec::new();
        for node in &entry.nodes {
            dims.extend(node.shape.iter().cloned());
            if let NodeKind::Compute(scalar) = &node.kind {
                dims_read(scalar, &mut dims);
            }
        }
        dims.retain(|dim| dim.as_constant().is_none());
        dims.sort_by_cached_key(ToString::to_string);
        dims.dedup();
        Analysis {
            dims,
            reads,
            uses,
            last_reads: plan::last_reads(entry),
            hoistable: plan::hoistable(entry),
            contraction: (0..entry.nodes.len()).map(|at| contraction::of(entry, at).is_some()).collect(),
            ranking: (0..entry.nodes.len()).map(|at| ranking::of(entry, at)).collect(),
            in_place,
            carried,
            carried_away,
        }
    }

    /// The analysis for a backend that runs every step as written.
    pub fn without_carries(mut self) -> Analysis {
        self.carried.fill(None);
        self.carried_away.fill(false);
        self
    }
}

/// The dims a scalar expression evaluates.
fn dims_read(scalar: &Scalar, out: &mut Vec<Dim>) {
    if let Scalar::Dim(dim) | Scalar::Reduce { extent: dim, .. } = scalar {
        out.push(dim.clone());
    }
    scalar.for_each_child(&mut |child| dims_read(child, out));
}
