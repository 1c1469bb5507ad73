//! Scalars the passes' unit tests build their entries from.

use super::dim::Dim;
use super::{BinaryOp, Dtype, Entry, Input, Node, NodeKind, Scalar, Value};

/// Index `k`.
pub fn index(k: u32) -> Scalar {
    Scalar::Index(k, Dtype::I64)
}

/// An i64 constant.
pub fn int(value: i64) -> Scalar {
    Scalar::Int(value, Dtype::I64)
}

/// `a + b` of positions.
pub fn plus(a: Scalar, b: Scalar) -> Scalar {
    Scalar::Binary(BinaryOp::Add, Box::new(a), Box::new(b), Dtype::I64)
}

/// An entry `run` of one input `x: [2, 4]`, then `nodes` (each a `[2, 4]`
/// f32 `Compute`), the last one its output.
pub fn entry_of(nodes: Vec<Scalar>) -> Entry {
    let node = |kind| Node { kind, shape: vec![Dim::constant(2), Dim::constant(4)], dtype: Dtype::F32, source: None };
    let count = nodes.len() as u32;
    Entry {
        name: "run".into(),
        dims: Vec::new(),
        requires: Vec::new(),
        inputs: vec![Input { name: "x".into(), shape: vec![Dim::constant(2), Dim::constant(4)], dtype: Dtype::F32 }],
        nodes: std::iter::once(node(NodeKind::Input(0)))
            .chain(nodes.into_iter().map(|s| node(NodeKind::Compute(s))))
            .collect(),
        outputs: vec![Value(count)],
    }
}
