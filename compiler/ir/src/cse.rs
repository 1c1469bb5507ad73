//! Common subexpressions: a `Compute` node that computes what an earlier
//! one computes (the same dtype, shape and expression, up to the numbering
//! of its reductions' indices) is dropped, and its readers read the
//! earlier value. Inlined library code repeats itself: the DeltaNet layer
//! builds the same window of its convolution's history twice, once to
//! convolve and once to keep.
//!
//! Nodes are pure functions of what they load, so the earlier value is
//! the same tensor, and its range checks run first: results and errors are
//! unchanged. Floats are compared by their bits (0.0 is not -0.0).

use super::{BinaryOp, Entry, Model, NodeKind, ReduceOp, Scalar, UnaryOp, Value};
use crate::dim::Dim;
use crate::Dtype;
use std::collections::HashMap;

/// Drops the repeated nodes of every entry of `model`.
pub fn eliminate(model: &mut Model) {
    for entry in &mut model.entries {
        eliminate_in(entry);
    }
}

fn eliminate_in(entry: &mut Entry) {
    let mut first: HashMap<(Dtype, Vec<Dim>, Vec<Token>), Value> = HashMap::new();
    // The value each node's readers read: its own, or the earlier equal one.
    let mut same_as: Vec<Value> = Vec::with_capacity(entry.nodes.len());
    let mut gone = vec![false; entry.nodes.len()];
    for (at, node) in entry.nodes.iter_mut().enumerate() {
        node.kind.rename_reads(&|value| *value = same_as[value.index()]);
        same_as.push(Value(at as u32));
        let NodeKind::Compute(scalar) = &node.kind else { continue };
        let mut tokens = Vec::new();
        canonical(scalar, &mut Vec::new(), &mut tokens);
        match first.entry((node.dtype, node.shape.clone(), tokens)) {
            std::collections::hash_map::Entry::Occupied(earlier) => {
                same_as[at] = *earlier.get();
                gone[at] = true;
            }
            std::collections::hash_map::Entry::Vacant(slot) => {
                slot.insert(Value(at as u32));
            }
        }
    }
    entry.outputs.iter_mut().for_each(|value| *value = same_as[value.index()]);
    entry.remove_nodes(&gone);
}

/// One piece of an expression's canonical form.
#[derive(PartialEq, Eq, Hash)]
enum Token {
    Index(u32),
    /// A reduction's index, by how many reductions enclose it.
    Bound(usize),
    Dim(Dim),
    Float(u64),
    Int(i64),
    Bool(bool),
    Load(Value, usize),
    Unary(UnaryOp),
    Binary(BinaryOp),
    Select,
    Cast,
    Reduce(ReduceOp, Dim),
    Dtype(Dtype),
}

/// Whether two lists of expressions are the same, index for index (floats
/// by their bits): two loads at one position.
pub(super) fn same(a: &[Scalar], b: &[Scalar]) -> bool {
    let tokens = |scalars: &[Scalar]| {
        let mut out = Vec::new();
        scalars.iter().for_each(|scalar| canonical(scalar, &mut Vec::new(), &mut out));
        out
    };
    a.len() == b.len() && tokens(a) == tokens(b)
}

/// `scalar` in prefix order, its reductions' indices numbered by nesting
/// (`bound` holds the enclosing ones, innermost last), so that two nodes
/// lowered from the same code get the same tokens.
fn canonical(scalar: &Scalar, bound: &mut Vec<u32>, out: &mut Vec<Token>) {
    out.push(Token::Dtype(scalar.dtype()));
    match scalar {
        Scalar::Index(index, _) => out.push(match bound.iter().rposition(|b| b == index) {
            Some(depth) => Token::Bound(depth),
            None => Token::Index(*index),
        }),
        Scalar::Dim(dim) => out.push(Token::Dim(dim.clone())),
        Scalar::Float(value, _) => out.push(Token::Float(value.to_bits())),
        Scalar::Int(value, _) => out.push(Token::Int(*value)),
        Scalar::Bool(value) => out.push(Token::Bool(*value)),
        Scalar::Load(value, positions, _) => out.push(Token::Load(*value, positions.len())),
        Scalar::Unary(op, ..) => out.push(Token::Unary(*op)),
        Scalar::Binary(op, ..) => out.push(Token::Binary(*op)),
        Scalar::Select(..) => out.push(Token::Select),
        Scalar::Cast(..) => out.push(Token::Cast),
        Scalar::Reduce { op, index, extent, body, .. } => {
            out.push(Token::Reduce(*op, extent.clone()));
            bound.push(*index);
            canonical(body, bound, out);
            bound.pop();
            return;
        }
    }
    scalar.for_each_child(&mut |child| canonical(child, bound, out));
}

#[cfg(test)]
mod tests {
    use super::eliminate_in;
    use crate::dim::Dim;
    use crate::testing::index;
    use crate::Dtype;
    use crate::{BinaryOp, Entry, NodeKind, ReduceOp, Scalar, Value};

    fn load(value: u32, positions: Vec<Scalar>) -> Scalar {
        Scalar::Load(Value(value), positions, Dtype::F32)
    }

    fn entry(nodes: Vec<Scalar>) -> Entry {
        crate::testing::entry_of(nodes)
    }

    fn sum(a: Scalar, b: Scalar) -> Scalar {
        Scalar::Binary(BinaryOp::Add, Box::new(a), Box::new(b), Dtype::F32)
    }

    /// A row sum with its reduction index numbered `k`.
    fn row_sum(k: u32) -> Scalar {
        Scalar::Reduce {
            op: ReduceOp::Sum,
            index: k,
            extent: Dim::constant(4),
            body: Box::new(load(0, vec![index(0), index(k)])),
            dtype: Dtype::F32,
        }
    }

    /// A node equal to an earlier one (its reduction index numbered
    /// differently) is dropped, and its reader reads the earlier value.
    #[test]
    fn a_repeated_node_is_computed_once() {
        let mut repeated = entry(vec![
            row_sum(7),
            row_sum(9),
            sum(load(1, vec![index(0), index(1)]), load(2, vec![index(0), index(1)])),
        ]);
        eliminate_in(&mut repeated);
        assert_eq!(repeated.nodes.len(), 3, "{repeated:?}");
        let NodeKind::Compute(Scalar::Binary(_, a, b, _)) = &repeated.nodes[2].kind else { panic!("the sum") };
        assert_eq!((a.direct_load(), b.direct_load()), (Some(Value(1)), Some(Value(1))));
        assert_eq!(repeated.outputs, vec![Value(2)]);
    }

    /// Different constants (0.0 and -0.0 too), reads or indices are
    /// different nodes.
    #[test]
    fn different_nodes_are_kept() {
        let constant = |value: f64| sum(load(0, vec![index(0), index(1)]), Scalar::Float(value, Dtype::F32));
        for (a, b) in [
            (constant(0.0), constant(-0.0)),
            (load(0, vec![index(0), index(1)]), load(0, vec![index(0), Scalar::Int(0, Dtype::I64)])),
            (
                row_sum(7),
                Scalar::Reduce {
                    op: ReduceOp::Max,
                    index: 7,
                    extent: Dim::constant(4),
                    body: Box::new(load(0, vec![index(0), index(7)])),
                    dtype: Dtype::F32,
                },
            ),
        ] {
            let mut kept = entry(vec![a, b, sum(load(1, vec![index(0), index(1)]), load(2, vec![index(0), index(1)]))]);
            eliminate_in(&mut kept);
            assert_eq!(kept.nodes.len(), 4, "{kept:?}");
        }
    }
}
