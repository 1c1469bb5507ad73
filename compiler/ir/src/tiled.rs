//! Weights read in the order a checkpoint tiles their columns. llama.cpp
//! stores the value heads of Qwen3-Next's linear attention tiled: where
//! the model reads heads grouped by their key head (`[groups][per_group]
//! [head]`), the file holds them `[per_group][groups][head]`. Along a
//! weight's last axis, the axis its blocks run along, the heads' order
//! cuts through the blocks: put back in the model's order, the weight is
//! no longer blocks, and a step reads it as plain values (the output
//! projection `ssm_out`, four times its blocks' bytes at 4.5 bits).
//!
//! Where the weight is summed over that axis alone, as a contraction's
//! weight, the order can stay the file's: the sum runs over the columns
//! as stored, and the input is read in the same order, through a copy of
//! it with its columns gathered ([`keep_tiled`]). The products and their
//! values are the same; the order they are summed in is the file's.

use crate::contraction;
use crate::dim::Dim;
use crate::{BinaryOp, Dtype, Entry, Model, Node, NodeKind, ReduceOp, Scalar, Value};
use serde::{Deserialize, Serialize};

/// Heads along a weight's last axis stored `[per_group][groups][head]`,
/// which the model reads `[groups][per_group][head]`: the whole axis.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Tiled {
    pub groups: usize,
    pub per_group: usize,
    pub head: usize,
}

impl Tiled {
    /// The columns it reorders.
    pub fn columns(self) -> usize {
        self.groups * self.per_group * self.head
    }

    /// The model's column stored at column `stored`.
    pub fn model_column(self, stored: usize) -> usize {
        let (at, within) = (stored / self.head, stored % self.head);
        let (per_group, group) = (at / self.groups, at % self.groups);
        (group * self.per_group + per_group) * self.head + within
    }

    /// [`Tiled::model_column`] of the i64 `stored` as an expression.
    fn model_column_of(self, stored: Scalar) -> Scalar {
        let [head, groups, per_group] = [self.head, self.groups, self.per_group].map(|n| int(n as i64));
        let at = binary(BinaryOp::Div, stored.clone(), head.clone());
        let within = binary(BinaryOp::Rem, stored, head.clone());
        let per_group_at = binary(BinaryOp::Div, at.clone(), groups.clone());
        let group = binary(BinaryOp::Rem, at, groups);
        let model_head = binary(BinaryOp::Add, binary(BinaryOp::Mul, group, per_group), per_group_at);
        binary(BinaryOp::Add, binary(BinaryOp::Mul, model_head, head), within)
    }
}

/// The i64 constant `value`, a position's.
fn int(value: i64) -> Scalar {
    Scalar::Int(value, Dtype::I64)
}

/// `a op b` of i64 positions.
fn binary(op: BinaryOp, a: Scalar, b: Scalar) -> Scalar {
    Scalar::Binary(op, Box::new(a), Box::new(b), Dtype::I64)
}

/// Why a parameter cannot be kept in its stored column order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NotKept {
    pub why: String,
}

/// Keeps parameter `param` with its last axis in the stored order
/// `tiled`: every contraction that reads it sums over its columns as
/// stored, reading its input through a copy gathered in that order. Only
/// where [`readable_tiled`]; otherwise the model is left as it was.
pub fn keep_tiled(model: &mut Model, param: usize, tiled: Tiled) -> Result<(), NotKept> {
    let gathers = reads(model, param, tiled)?;
    for (entry, products) in model.entries.iter_mut().zip(gathers) {
        gather_inputs(entry, &products, tiled);
    }
    model.params[param].tiled = Some(tiled);
    Ok(())
}

/// Whether `model` can read parameter `param` with its columns in the
/// stored order `tiled`: every read of it is a contraction's weight, its
/// last axis all of `tiled`'s columns, its axes as the checkpoint's.
pub fn readable_tiled(model: &Model, param: usize, tiled: Tiled) -> Result<(), NotKept> {
    reads(model, param, tiled).map(drop)
}

/// The contractions of each entry that read `param`, where the model can
/// read it tiled.
fn reads(model: &Model, param: usize, tiled: Tiled) -> Result<Vec<Vec<Product>>, NotKept> {
    let info = &model.params[param];
    let not_kept = |why: String| NotKept { why };
    if info.shape.last() != Some(&tiled.columns()) || info.shape.len() < 2 {
        return Err(not_kept(format!("its shape {:?} does not end in {} tiled columns", info.shape, tiled.columns())));
    }
    if info.axes.is_some() {
        return Err(not_kept("the model keeps its axes in another order".into()));
    }
    model.entries.iter().map(|entry| products(entry, param)).collect()
}

/// One contraction that reads the parameter: its node and its input.
struct Product {
    at: usize,
    input: Value,
    /// How many of the input's trailing axes the sum runs over.
    trailing: usize,
}

/// The contractions of `entry` that read parameter `param`, if those are
/// all its reads.
fn products(entry: &Entry, param: usize) -> Result<Vec<Product>, NotKept> {
    let is_param = |value: Value| matches!(entry.nodes[value.index()].kind, NodeKind::Param(p) if p == param);
    let not_kept = |why: String| NotKept { why: format!("in `{}`, {why}", entry.name) };
    if entry.outputs.iter().any(|&output| is_param(output)) {
        return Err(not_kept("the entry returns it".into()));
    }
    let mut found = Vec::new();
    for (at, node) in entry.nodes.iter().enumerate() {
        let reads: Vec<Value> = crate::plan::reads(&node.kind).into_iter().filter(|&value| is_param(value)).collect();
        if reads.is_empty() {
            continue;
        }
        let NodeKind::Compute(expression) = &node.kind else {
            return Err(not_kept(format!("v{at} reads it whole")));
        };
        let contraction = contraction::of(entry, at).filter(|c| is_param(c.weight.value));
        let Some(contraction) = contraction else {
            return Err(not_kept(format!("v{at} reads it other than as a product's weight")));
        };
        if loads_of(expression, contraction.weight.value) != 1 {
            return Err(not_kept(format!("v{at} reads it more than once")));
        }
        let input = contraction.input.value;
        let trailing = entry.nodes[input.index()].shape.len() - contraction.input.rows.len();
        let extents = &entry.nodes[input.index()].shape[contraction.input.rows.len()..];
        if extents.iter().any(|extent| extent.as_constant().is_none()) {
            return Err(not_kept(format!("v{at} sums over axes of its input whose extents are not constants")));
        }
        found.push(Product { at, input, trailing });
    }
    Ok(found)
}

/// How many loads of `value` `scalar` holds.
fn loads_of(scalar: &Scalar, value: Value) -> usize {
    let mut count = usize::from(matches!(scalar, Scalar::Load(v, ..) if *v == value));
    scalar.for_each_child(&mut |child| count += loads_of(child, value));
    count
}

/// Reads each product's input through a copy with its trailing axes'
/// columns in the stored order, placed just before the product.
fn gather_inputs(entry: &mut Entry, products: &[Product], tiled: Tiled) {
    if products.is_empty() {
        return;
    }
    let count = entry.nodes.len();
    let mut before = vec![Vec::new(); count];
    for product in products {
        let gathered = Value(entry.nodes.len() as u32);
        let input = &entry.nodes[product.input.index()];
        let node = Node {
            kind: NodeKind::Compute(gathered_read(product.input, &input.shape, product.trailing, input.dtype, tiled)),
            shape: input.shape.clone(),
            dtype: input.dtype,
            source: entry.nodes[product.at].source.clone(),
        };
        entry.nodes.push(node);
        if let NodeKind::Compute(expression) = &mut entry.nodes[product.at].kind {
            read_input_from(expression, product.input, gathered);
        }
        before[product.at].push(gathered.index());
    }
    let order: Vec<usize> = (0..count).flat_map(|at| before[at].iter().copied().chain([at])).collect();
    entry.reorder(&order);
}

/// `input` (of `shape`) at the same leading positions and, over its last
/// `trailing` axes, at the model's column of each stored one.
fn gathered_read(input: Value, shape: &[Dim], trailing: usize, dtype: Dtype, tiled: Tiled) -> Scalar {
    let lead = shape.len() - trailing;
    let extents: Vec<i64> = shape[lead..].iter().map(|extent| extent.as_constant().unwrap_or(1)).collect();
    let strides: Vec<i64> = (0..trailing).map(|j| extents[j + 1..].iter().product()).collect();
    let index = |axis: usize| Scalar::Index(axis as u32, Dtype::I64);
    let stored = (0..trailing)
        .map(|j| binary(BinaryOp::Mul, index(lead + j), int(strides[j])))
        .reduce(|flat, term| binary(BinaryOp::Add, flat, term))
        .unwrap_or_else(|| int(0));
    let column = tiled.model_column_of(stored);
    let digits = (0..trailing).map(|j| {
        let quotient =
            if strides[j] == 1 { column.clone() } else { binary(BinaryOp::Div, column.clone(), int(strides[j])) };
        if j == 0 {
            quotient
        } else {
            binary(BinaryOp::Rem, quotient, int(extents[j]))
        }
    });
    Scalar::Load(input, (0..lead).map(index).chain(digits).collect(), dtype)
}

/// Makes the product in `scalar` that reads `input` read `gathered`.
fn read_input_from(scalar: &mut Scalar, input: Value, gathered: Value) {
    if let Scalar::Reduce { op: ReduceOp::Sum, body, .. } = scalar {
        if let Scalar::Binary(BinaryOp::Mul, x, y, _) = body.as_mut() {
            for operand in [x.as_mut(), y.as_mut()] {
                let loaded = match operand {
                    Scalar::Cast(inner, _) => inner.as_mut(),
                    other => other,
                };
                if let Scalar::Load(value, ..) = loaded {
                    if *value == input {
                        *value = gathered;
                        return;
                    }
                }
            }
        }
    }
    scalar.for_each_child_mut(&mut |child| read_input_from(child, input, gathered));
}

#[cfg(test)]
mod tests {
    use super::{keep_tiled, readable_tiled, Tiled};
    use crate::dim::Dim;
    use crate::testing::index;
    use crate::{contraction, BinaryOp, Dtype, Entry, Input, Model, Node, NodeKind, Param, ReduceOp, Scalar, Value};

    /// Two key heads, three value heads each, of two values.
    const TILED: Tiled = Tiled { groups: 2, per_group: 3, head: 2 };

    fn node(kind: NodeKind, shape: &[i64]) -> Node {
        Node { kind, shape: shape.iter().map(|&d| Dim::constant(d)).collect(), dtype: Dtype::F32, source: None }
    }

    fn binary(op: BinaryOp, a: Scalar, b: Scalar, dtype: Dtype) -> Scalar {
        Scalar::Binary(op, Box::new(a), Box::new(b), dtype)
    }

    /// `y[n, o] = sum[k < 12] x[n, k / 2, k % 2] * w[o, k]`: `x` is `[n, 6
    /// heads, 2]`, read as its 12 columns; `w: [5, 12]`; `also`, another
    /// node reading `w`, beside it.
    fn model(also: Option<Scalar>) -> Model {
        let int = |value| Scalar::Int(value, Dtype::I64);
        let load = |value, positions| Scalar::Load(Value(value), positions, Dtype::F32);
        let heads = binary(BinaryOp::Div, index(2), int(2), Dtype::I64);
        let within = binary(BinaryOp::Rem, index(2), int(2), Dtype::I64);
        let product = binary(
            BinaryOp::Mul,
            load(0, vec![index(0), heads, within]),
            load(1, vec![index(1), index(2)]),
            Dtype::F32,
        );
        let sum = Scalar::Reduce {
            op: ReduceOp::Sum,
            index: 2,
            extent: Dim::constant(12),
            body: Box::new(product),
            dtype: Dtype::F32,
        };
        let mut nodes = vec![
            node(NodeKind::Input(0), &[3, 6, 2]),
            node(NodeKind::Param(0), &[5, 12]),
            node(NodeKind::Compute(sum), &[3, 5]),
        ];
        let mut outputs = vec![Value(2)];
        if let Some(also) = also {
            nodes.push(node(NodeKind::Compute(also), &[5, 12]));
            outputs.push(Value(3));
        }
        let x = Input { name: "x".into(), shape: [3, 6, 2].map(Dim::constant).to_vec(), dtype: Dtype::F32 };
        let entry =
            Entry { name: "run".into(), dims: Vec::new(), requires: Vec::new(), inputs: vec![x], nodes, outputs };
        let w =
            Param { path: "w".into(), shape: vec![5, 12], dtype: Dtype::F32, storage: None, axes: None, tiled: None };
        Model { name: "m".into(), params: vec![w], states: Vec::new(), entries: vec![entry] }
    }

    /// The value of a position expression at `indices`.
    fn position(scalar: &Scalar, indices: &[i64]) -> i64 {
        match scalar {
            Scalar::Index(k, _) => indices[*k as usize],
            Scalar::Int(value, _) => *value,
            Scalar::Binary(op, a, b, _) => {
                let (a, b) = (position(a, indices), position(b, indices));
                match op {
                    BinaryOp::Add => a + b,
                    BinaryOp::Mul => a * b,
                    BinaryOp::Div => a / b,
                    BinaryOp::Rem => a % b,
                    other => panic!("{other:?} in a position"),
                }
            }
            other => panic!("{other:?} in a position"),
        }
    }

    #[test]
    fn the_model_column_of_each_stored_one_undoes_the_files_tiling() {
        // The file stores head `g * per_group + p` at `p * groups + g`.
        let mut stored = vec![usize::MAX; TILED.columns()];
        for g in 0..TILED.groups {
            for p in 0..TILED.per_group {
                for d in 0..TILED.head {
                    stored[(p * TILED.groups + g) * TILED.head + d] = (g * TILED.per_group + p) * TILED.head + d;
                }
            }
        }
        let columns: Vec<usize> = (0..TILED.columns()).map(|k| TILED.model_column(k)).collect();
        assert_eq!(columns, stored);
    }

    #[test]
    fn a_tiled_weight_is_summed_as_stored_over_its_input_gathered_in_that_order() {
        let mut model = model(None);
        keep_tiled(&mut model, 0, TILED).unwrap();
        assert_eq!(model.params[0].tiled, Some(TILED));
        let entry = &model.entries[0];
        assert_eq!(entry.nodes.len(), 4, "{:?}", entry.nodes);
        // The gather, then the product reading it: still the kernels' form.
        let NodeKind::Compute(Scalar::Load(Value(0), positions, Dtype::F32)) = &entry.nodes[2].kind else {
            panic!("{:?}", entry.nodes[2])
        };
        assert_eq!(entry.nodes[2].shape, entry.nodes[0].shape);
        let product = contraction::of(entry, 3).expect("the product reaches the kernels");
        assert_eq!((product.input.value, product.weight.value), (Value(2), Value(1)));
        assert_eq!(entry.outputs, vec![Value(3)]);
        crate::verify(&model).unwrap();
        // Column k of the gather is the input's model column of stored k.
        for n in 0..3 {
            for k in 0..12 {
                let indices = [n, k as i64 / 2, k as i64 % 2];
                let read: Vec<i64> = positions.iter().map(|p| position(p, &indices)).collect();
                let column = TILED.model_column(k);
                assert_eq!(read, vec![n, column as i64 / 2, column as i64 % 2], "column {k}");
            }
        }
    }

    #[test]
    fn a_weight_read_otherwise_than_as_a_products_weight_keeps_the_models_order() {
        let copy = Scalar::Load(Value(1), vec![index(0), index(1)], Dtype::F32);
        let mut model = model(Some(copy));
        let refused = readable_tiled(&model, 0, TILED).unwrap_err();
        assert!(refused.why.contains("other than as a product's weight"), "{refused:?}");
        assert!(keep_tiled(&mut model, 0, TILED).is_err());
        assert_eq!((model.params[0].tiled, model.entries[0].nodes.len()), (None, 4));
        let wrong = Tiled { groups: 2, per_group: 2, head: 2 };
        assert!(readable_tiled(&self::model(None), 0, wrong).unwrap_err().why.contains("does not end in 8"));
    }
}
