//! Dead values: a computed node (a `Compute` or an intrinsic) whose value
//! no output, state write, assertion or other live node reads is removed,
//! with what only it read. Lowering runs this on every entry, so a value a
//! program computes and never uses (a hook's argument that the default
//! ignores, a position table a model does not read) costs nothing, and
//! the reference interpreter and the optimized pipeline see the same nodes.

use crate::{plan, Entry, Model, NodeKind};

/// Removes the dead nodes of every entry.
pub fn eliminate(model: &mut Model) {
    for entry in &mut model.entries {
        eliminate_in(entry);
    }
}

fn eliminate_in(entry: &mut Entry) {
    let mut live = vec![false; entry.nodes.len()];
    for output in &entry.outputs {
        live[output.index()] = true;
    }
    for at in (0..entry.nodes.len()).rev() {
        let kind = &entry.nodes[at].kind;
        let computed = matches!(kind, NodeKind::Compute(_) | NodeKind::Intrinsic(..));
        if computed && !live[at] {
            continue;
        }
        live[at] = true;
        for read in plan::reads(kind) {
            live[read.index()] = true;
        }
    }
    let gone: Vec<bool> = live.iter().map(|keep| !keep).collect();
    if gone.iter().any(|&dead| dead) {
        entry.remove_nodes(&gone);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Dtype, Node, Scalar, Value};

    fn node(kind: NodeKind, dtype: Dtype) -> Node {
        Node { kind, shape: Vec::new(), dtype, source: None }
    }

    fn load(value: u32) -> Scalar {
        Scalar::Load(Value(value), Vec::new(), Dtype::F32)
    }

    #[test]
    fn what_nothing_reads_goes_with_what_only_it_read() {
        let nodes = vec![
            node(NodeKind::Input(0), Dtype::F32),
            // Read only by the dead node 2: dead too.
            node(NodeKind::Compute(load(0)), Dtype::F32),
            node(NodeKind::Compute(load(1)), Dtype::F32),
            // The output.
            node(NodeKind::Compute(load(0)), Dtype::F32),
            // An assertion's operand lives.
            node(NodeKind::Compute(Scalar::Bool(true)), Dtype::Bool),
            node(NodeKind::Assert(Value(4), "holds".into()), Dtype::Bool),
        ];
        let mut entry = Entry {
            name: "run".into(),
            dims: Vec::new(),
            requires: Vec::new(),
            inputs: Vec::new(),
            nodes,
            outputs: vec![Value(3)],
        };
        eliminate_in(&mut entry);
        let kinds: Vec<String> = entry.nodes.iter().map(|node| format!("{:?}", node.kind)).collect();
        assert_eq!(entry.nodes.len(), 4, "{kinds:?}");
        assert_eq!(entry.outputs, vec![Value(1)]);
        assert!(matches!(entry.nodes[3].kind, NodeKind::Assert(Value(2), _)), "{kinds:?}");
    }
}
