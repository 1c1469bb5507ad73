//! Liveness and the memory plan: which values each node reads, when each
//! value is read last, and the most bytes an entry holds at once for given
//! dims (its peak scratch: inputs and computed values, not parameters or
//! states, which are counted apart), and which values are hoisted:
//! computed once per loaded model rather than per call.

use super::{Entry, Model, NodeKind, Scalar, Value};
use crate::dim::Symbol;
use std::collections::HashMap;

/// The values a node reads, each once.
pub fn reads(kind: &NodeKind) -> Vec<Value> {
    let mut used = Vec::new();
    match kind {
        NodeKind::Compute(scalar) => scalar.loads(&mut used),
        NodeKind::Intrinsic(_, args) => used.extend(args.iter().copied()),
        NodeKind::WriteState(_, value) | NodeKind::Assert(value, _) => used.push(*value),
        NodeKind::Input(_) | NodeKind::Param(_) | NodeKind::State(_) => {}
    }
    used.sort_unstable();
    used.dedup();
    used
}

/// For each value, the last node that reads it; `usize::MAX` for outputs
/// and values never read (kept to the end).
pub fn last_reads(entry: &Entry) -> Vec<usize> {
    let mut last = vec![usize::MAX; entry.nodes.len()];
    let mut read = vec![false; entry.nodes.len()];
    for (at, node) in entry.nodes.iter().enumerate() {
        for value in reads(&node.kind) {
            last[value.index()] = at;
            read[value.index()] = true;
        }
    }
    for (at, slot) in last.iter_mut().enumerate() {
        if !read[at] {
            *slot = usize::MAX;
        }
    }
    for output in &entry.outputs {
        last[output.index()] = usize::MAX;
    }
    last
}

/// The peak bytes of inputs and computed values alive at once, freeing
/// each value after its last read; `None` if `dims` leave a shape unknown
/// or the count overflows.
pub fn peak_scratch(entry: &Entry, dims: &HashMap<Symbol, i64>) -> Option<usize> {
    let size = |at: usize| -> Option<usize> {
        let node = &entry.nodes[at];
        let mut count = 1usize;
        for dim in &node.shape {
            count = count.checked_mul(usize::try_from(dim.value_under(dims).ok()?).ok()?)?;
        }
        count.checked_mul(node.dtype.bytes())
    };
    let last = last_reads(entry);
    let mut live = 0usize;
    let mut peak = 0usize;
    // A cache write into a state updates the state in place.
    let in_place = |kind: &NodeKind| match kind {
        NodeKind::Intrinsic(intrinsic, args) => {
            intrinsic.writes_cache() && matches!(entry.nodes[args[0].index()].kind, NodeKind::State(_))
        }
        _ => false,
    };
    for (at, node) in entry.nodes.iter().enumerate() {
        let held = !matches!(
            node.kind,
            NodeKind::Param(_) | NodeKind::State(_) | NodeKind::WriteState(..) | NodeKind::Assert(..)
        );
        if held && !in_place(&node.kind) {
            live = live.checked_add(size(at)?)?;
        }
        peak = peak.max(live);
        for value in reads(&node.kind) {
            let source = &entry.nodes[value.index()].kind;
            let counted = !matches!(source, NodeKind::Param(_) | NodeKind::State(_)) && !in_place(source);
            if last[value.index()] == at && counted {
                live -= size(value.index())?;
            }
        }
    }
    Some(peak)
}

/// Bytes of parameters, of states, and each entry's peak scratch at the
/// given entry dims, as text.
pub fn describe(model: &Model, dims: &HashMap<Symbol, i64>) -> String {
    let mut lines = vec![
        format!("weights: {} bytes in {} parameters", model.param_bytes(), model.params.len()),
        format!("states:  {} bytes in {} states", model.state_bytes(), model.states.len()),
    ];
    for entry in &model.entries {
        let bound: Vec<String> =
            entry.dims.iter().map(|d| format!("{d}={}", dims.get(d).map_or("?".into(), |v| v.to_string()))).collect();
        let peak = peak_scratch(entry, dims)
            .map_or_else(|| "unknown (give its dims in [check])".to_string(), |bytes| format!("{bytes} bytes"));
        lines.push(format!("entry {}<{}>: peak scratch {peak}", entry.name, bound.join(", ")));
    }
    lines.join("\n")
}

/// Per node: whether it depends only on parameters and constants and has
/// a fixed shape, so that it is computed once per loaded model (by the
/// interpreter: backends compile only the other nodes).
pub fn hoistable(entry: &Entry) -> Vec<bool> {
    let mut hoistable = vec![false; entry.nodes.len()];
    for (at, node) in entry.nodes.iter().enumerate() {
        hoistable[at] = match &node.kind {
            NodeKind::Param(_) => true,
            NodeKind::Compute(scalar) => {
                let mut loads = Vec::new();
                scalar.loads(&mut loads);
                node.shape.iter().all(|d| d.as_constant().is_some())
                    && fixed_dims(scalar)
                    && loads.iter().all(|v| hoistable[v.index()])
            }
            _ => false,
        };
    }
    hoistable
}

/// Whether every dim a scalar expression reads is a constant.
fn fixed_dims(scalar: &Scalar) -> bool {
    !scalar.any(&|s| match s {
        Scalar::Dim(dim) | Scalar::Reduce { extent: dim, .. } => dim.as_constant().is_none(),
        _ => false,
    })
}

/// `1.5 GiB`, up to EiB; exact bytes below 1 KiB.
pub fn human_bytes(bytes: u128) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < units.len() {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} B")
    } else {
        format!("{value:.1} {}", units[unit])
    }
}
