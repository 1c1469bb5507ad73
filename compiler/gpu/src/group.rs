//! Launch groups (horizontal fusion): `Compute` nodes that sit together in
//! an entry (`ir::schedule` places independent nodes so) and read nothing
//! the group computes are one launch. A layer's projections of one normed
//! input, or the small gates beside them, each a kernel of a few blocks,
//! become one kernel of all their blocks.
//!
//! The group's kernel is a dispatch: each member's units (its threads on
//! the device, rounded up to a whole warp so that no warp spans two
//! members; its items on the host) follow the previous member's, and a
//! unit runs its member's body ([`Kernel::member`], inlined, its values
//! renamed apart) with its number within the member. Every member
//! computes exactly what it computes alone. The executor still meets the
//! members one at a time: the first launches the group ([`Role::Leads`]),
//! the others take what it wrote, which the backend keeps until then
//! ([`Role::Follows`]).
//!
//! A member has one kernel and no scratch, is computed every call (not
//! hoisted), reads only values computed before the group's first member
//! (so that they are there when it launches), and its dims table is a
//! prefix of the group's (they share one). At most one member can raise
//! a fault: the call then fails at the node it would fail at alone.

use super::emit::{Emitter, Member, ModelEntry};
use super::{Form, Kernel, WARP_LANES};
use linnet_ir::dim::Dim;
use linnet_ir::{NodeKind, Value};
use std::collections::HashMap;
use std::fmt::Write;

/// The most members a group takes.
const MAX_MEMBERS: usize = 16;

/// One launch of several nodes' kernels.
pub struct Group {
    /// `ENTRY_gNODE`, after its first member.
    pub name: String,
    /// The nodes it computes, in the entry's order.
    pub members: Vec<usize>,
    /// What it reads: every member's loads, each once.
    pub loads: Vec<Value>,
    /// Its dims table.
    pub dims: Vec<Dim>,
    /// Its units: on the device, threads (its launch's work); on the host,
    /// items.
    pub units: Dim,
    /// Whether a member can raise a fault.
    pub faults: bool,
    /// Its kernel: the dispatch, the members' bodies inlined.
    pub text: String,
}

/// The launch groups of `entry`, whose nodes' kernels are `kernels` (in
/// `form`) and whose hoisted nodes `hoisted` marks.
pub fn groups(entry: ModelEntry<'_>, kernels: &[Vec<Kernel>], hoisted: &[bool], form: Form) -> Vec<Group> {
    let mut groups = Vec::new();
    let mut members: Vec<usize> = Vec::new();
    let mut table: Vec<Dim> = Vec::new();
    let mut close = |members: &mut Vec<usize>, table: &mut Vec<Dim>| {
        if members.len() > 1 {
            groups.push(group(entry, kernels, members, std::mem::take(table), form));
        }
        members.clear();
        table.clear();
    };
    for (at, node) in entry.nodes.iter().enumerate() {
        match &node.kind {
            NodeKind::Compute(_) if kernels[at].len() == 1 && kernels[at][0].scratch.is_none() && !hoisted[at] => {
                let kernel = &kernels[at][0];
                let joins = members.first().is_some_and(|&first| {
                    let faults = members.iter().any(|&member| kernels[member][0].faults);
                    members.len() < MAX_MEMBERS
                        && kernel.loads.iter().all(|value| value.index() < first)
                        && (kernel.dims.starts_with(&table) || table.starts_with(&kernel.dims))
                        && !(faults && kernel.faults)
                });
                if !joins {
                    close(&mut members, &mut table);
                }
                members.push(at);
                if kernel.dims.len() > table.len() {
                    table = kernel.dims.clone();
                }
            }
            // Nodes that launch nothing leave the group open.
            NodeKind::Input(_) | NodeKind::Param(_) | NodeKind::State(_) | NodeKind::WriteState(..) => {}
            _ => close(&mut members, &mut table),
        }
    }
    close(&mut members, &mut table);
    groups
}

/// The group of `members` sharing dims table `table`: its dispatch.
fn group(entry: ModelEntry<'_>, kernels: &[Vec<Kernel>], members: &[usize], table: Vec<Dim>, form: Form) -> Group {
    let first = members[0];
    let mut e = Emitter::new(entry, first, 0, form).with_dims(table);
    let member_kernels: Vec<&Kernel> = members.iter().map(|&member| &kernels[member][0]).collect();
    // Each member's loads, as the group's arguments.
    let arguments: Vec<Vec<String>> =
        member_kernels.iter().map(|kernel| kernel.loads.iter().map(|&value| e.argument(value)).collect()).collect();
    let warp = Dim::constant(i64::from(WARP_LANES));
    let member_units: Vec<Dim> = member_kernels
        .iter()
        .map(|kernel| {
            let items = kernel.work.iter().fold(Dim::constant(1), |count, dim| count.mul(dim));
            match form {
                Form::Host => items,
                Form::Device => {
                    items.scale(i64::from(kernel.lanes)).add(&warp).sub(&Dim::constant(1)).div(&warp).mul(&warp)
                }
            }
        })
        .collect();
    let units = member_units.iter().fold(Dim::constant(0), |total, units| total.add(units));
    let total = e.dim_index(&units);
    e.units(&total, |e, unit| {
        let start = e.index_constant(0);
        dispatch(e, &member_kernels, &arguments, &member_units, 0, unit, start);
    });
    let name = format!("{}_g{first}", entry.name);
    let outputs: Vec<_> = members.iter().map(|&member| entry.nodes[member].dtype).collect();
    let (text, loads, dims) = e.finish_group(&name, &outputs);
    let faults = member_kernels.iter().any(|kernel| kernel.faults);
    Group { name, members: members.to_vec(), loads, dims, units, faults, text }
}

/// Runs the member whose units hold `unit` (an index): member `k` of
/// `kernels` (each with its `arguments` and `units`) begins at `start`,
/// the next where it ends; its body runs with the unit's number within it.
fn dispatch(
    e: &mut Emitter<'_>,
    kernels: &[&Kernel],
    arguments: &[Vec<String>],
    units: &[Dim],
    k: usize,
    unit: &str,
    start: String,
) {
    let Some(kernel) = kernels.get(k) else { return };
    let count = e.dim_index(&units[k]);
    let end = e.add(&start, &count);
    let inside = e.op(format!("arith.cmpi ult, {unit}, {end} : index"));
    e.when_else(
        &inside,
        |e| {
            let within = e.op(format!("arith.subi {unit}, {start} : index"));
            let body = inlined(&kernel.member, k, &arguments[k], &within);
            e.lines(&body);
        },
        |e| dispatch(e, kernels, arguments, units, k + 1, unit, end),
    );
}

/// Member `k`'s body, inlined: its output is the group's `%outK`, its
/// loads the group's `arguments` (in the order of its own), its unit
/// `within`, and its own values renamed apart (`%mK_NAME`).
fn inlined(member: &Member, k: usize, arguments: &[String], within: &str) -> String {
    let mut text = String::with_capacity(member.body.len() * 5 / 4);
    let mut rest = member.body.as_str();
    while let Some(at) = rest.find('%') {
        text.push_str(&rest[..at]);
        let name_end = rest[at + 1..]
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .map_or(rest.len(), |end| at + 1 + end);
        let name = &rest[at..name_end];
        let load = name.strip_prefix("%in").and_then(|number| number.parse::<usize>().ok());
        match (name, load) {
            ("%out", _) => write!(text, "%out{k}"),
            ("%dims" | "%error", _) => write!(text, "{name}"),
            (_, Some(load)) => write!(text, "{}", arguments[load]),
            _ if name == member.unit => write!(text, "{within}"),
            _ => write!(text, "%m{k}_{}", &name[1..]),
        }
        .expect("writing to a string");
        rest = &rest[name_end..];
    }
    text.push_str(rest);
    text
}

/// A node's part in its entry's launch groups.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// It launches group `k` (the entry's `k`th), computing every member.
    Leads(usize),
    /// Its group's launch, which ran before it, computed it.
    Follows,
}

/// The role of each grouped node, by node, of groups of `members`.
pub fn roles<'g>(members: impl Iterator<Item = &'g [usize]>) -> HashMap<usize, Role> {
    let mut roles = HashMap::new();
    for (k, members) in members.enumerate() {
        for (place, &member) in members.iter().enumerate() {
            roles.insert(member, if place == 0 { Role::Leads(k) } else { Role::Follows });
        }
    }
    roles
}

#[cfg(test)]
mod tests {
    use super::{groups, Group};
    use crate::{node_kernels, Form, ModelEntry};
    use linnet_ir::dim::Dim;
    use linnet_ir::CmpOp;
    use linnet_ir::Dtype;
    use linnet_ir::{BinaryOp, Entry, Input, Node, NodeKind, Param, Scalar, Value};

    fn node(kind: NodeKind, length: i64, dtype: Dtype) -> Node {
        Node { kind, shape: vec![Dim::constant(length)], dtype, source: None }
    }

    fn index() -> Scalar {
        Scalar::Index(0, Dtype::I64)
    }

    /// `2 * v[i]` over 4 elements.
    fn double(value: u32) -> Node {
        let load = Scalar::Load(Value(value), vec![index()], Dtype::F32);
        node(
            NodeKind::Compute(Scalar::Binary(
                BinaryOp::Mul,
                Box::new(load),
                Box::new(Scalar::Float(2.0, Dtype::F32)),
                Dtype::F32,
            )),
            4,
            Dtype::F32,
        )
    }

    /// `x[ids[i]]`: a gather whose positions come from an input, checked
    /// (it can fault).
    fn gather() -> Node {
        let id = Scalar::Cast(Box::new(Scalar::Load(Value(1), vec![index()], Dtype::I32)), Dtype::I64);
        node(NodeKind::Compute(Scalar::Load(Value(0), vec![id], Dtype::F32)), 4, Dtype::F32)
    }

    /// `x: [4]`, `ids: [4; i32]`, a parameter `w: [4]`, then `computed`.
    fn entry(computed: Vec<Node>) -> Entry {
        let mut nodes = vec![
            node(NodeKind::Input(0), 4, Dtype::F32),
            node(NodeKind::Input(1), 4, Dtype::I32),
            node(NodeKind::Param(0), 4, Dtype::F32),
        ];
        nodes.extend(computed);
        Entry {
            name: "run".into(),
            dims: Vec::new(),
            requires: Vec::new(),
            inputs: vec![
                Input { name: "x".into(), shape: vec![Dim::constant(4)], dtype: Dtype::F32 },
                Input { name: "ids".into(), shape: vec![Dim::constant(4)], dtype: Dtype::I32 },
            ],
            outputs: vec![Value(nodes.len() as u32 - 1)],
            nodes,
        }
    }

    /// The parameter `w: [4]` every entry of these tests has.
    static PARAMS: std::sync::LazyLock<[Param; 1]> = std::sync::LazyLock::new(|| {
        [Param { path: "w".into(), shape: vec![4], dtype: Dtype::F32, storage: None, axes: None, tiled: None }]
    });

    /// `entry` as its kernels are written from it.
    fn program(entry: &Entry) -> ModelEntry<'_> {
        ModelEntry { entry, params: &*PARAMS }
    }

    fn grouped(entry: &Entry) -> Vec<Group> {
        let kernels: Vec<_> = (0..entry.nodes.len())
            .map(|at| {
                node_kernels(program(entry), at, Form::Device)
                    .map(|kernels| kernels.expect("a kernel"))
                    .unwrap_or_default()
            })
            .collect();
        let hoisted = linnet_ir::plan::hoistable(entry);
        groups(program(entry), &kernels, &hoisted, Form::Device)
    }

    /// A node that reads the one before it starts a launch, which the
    /// next node, reading only the input, joins; a hoisted node (it reads
    /// only a parameter) does not.
    #[test]
    fn independent_nodes_are_one_launch() {
        let entry = entry(vec![double(0), double(3), double(0), double(2)]);
        let found = grouped(&entry);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].members, [4, 5]);
        assert_eq!(found[0].loads, [Value(3), Value(0)]);
        // Four threads each, rounded up to a warp.
        assert_eq!(found[0].units, Dim::constant(64));
        assert!(found[0].text.contains("%out1") && found[0].text.contains("%m1_"), "{}", found[0].text);
    }

    /// `x` rotated by two: `select(i < 2, x[i + 2], x[i - 2])`, each read
    /// inside `x` where its branch is taken.
    fn rotated() -> Node {
        let shifted = |op| {
            Scalar::Load(
                Value(0),
                vec![Scalar::Binary(op, Box::new(index()), Box::new(Scalar::Int(2, Dtype::I64)), Dtype::I64)],
                Dtype::F32,
            )
        };
        let below = Scalar::Binary(
            BinaryOp::Cmp(CmpOp::Lt),
            Box::new(index()),
            Box::new(Scalar::Int(2, Dtype::I64)),
            Dtype::Bool,
        );
        node(
            NodeKind::Compute(Scalar::Select(
                Box::new(below),
                Box::new(shifted(BinaryOp::Add)),
                Box::new(shifted(BinaryOp::Sub)),
                Dtype::F32,
            )),
            4,
            Dtype::F32,
        )
    }

    /// A select's branches read where their condition keeps them inside:
    /// nothing is checked, so two such nodes are one launch.
    #[test]
    fn reads_a_branch_keeps_inside_are_not_checked() {
        let entry = entry(vec![rotated(), rotated()]);
        let kernels = node_kernels(program(&entry), 3, Form::Device).expect("a compute node").expect("a kernel");
        assert!(!kernels[0].faults && kernels[0].checks.is_empty());
        assert_eq!(grouped(&entry).iter().map(|group| group.members.clone()).collect::<Vec<_>>(), [vec![3, 4]]);
    }

    /// Two nodes that can each fault are not one launch: the call fails
    /// at the first, as alone.
    #[test]
    fn two_nodes_that_can_fault_are_not_one_launch() {
        let entry = entry(vec![gather(), gather(), double(0)]);
        let found = grouped(&entry);
        assert_eq!(found.iter().map(|group| group.members.clone()).collect::<Vec<_>>(), [vec![4, 5]]);
        assert!(found[0].faults);
    }
}
