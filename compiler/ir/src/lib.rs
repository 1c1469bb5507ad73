//! The tensor IR: one instantiated model. Parameters and states have
//! concrete shapes; each entry is a list of nodes in SSA order, node `i`
//! defining value `i`, whose shapes are dims over the entry's own generics
//! (`B`, `S`, `M`), bound from the inputs when the entry is called.
//!
//! Almost everything is a [`NodeKind::Compute`]: a tensor defined by a
//! scalar expression at every index, which may load elements of earlier
//! values, reduce over a new index, and select lazily. Elementwise
//! arithmetic, broadcasting, slices, gathers, reshapes, permutations and
//! concatenations all lower to it; what cannot (the gated delta rule's
//! recurrence) is an [`Intrinsic`]. Backends lower from this one form.

pub mod analysis;
pub mod bounds;
pub mod carry;
mod cmp;
pub mod contraction;
pub mod cse;
pub mod dead;
pub mod dim;
mod dtype;
pub mod fuse;
pub mod invariant;
pub mod layout;
pub mod numerics;
pub mod passes;
pub mod plan;
pub mod quant;
pub mod ranking;
pub mod schedule;
#[cfg(test)]
mod testing;
mod text;
pub mod tiled;
mod verify;
pub mod views;

pub use cmp::CmpOp;
pub use dtype::Dtype;
pub use verify::{verify, VerifyError};

use crate::dim::{Dim, Symbol};
use serde::{Deserialize, Serialize};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Value(pub u32);

impl Value {
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// A weight, bound from the checkpoint at load time.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Param {
    /// `groups.3.linear.1.mlp.gate_up_proj`
    pub path: String,
    pub shape: Vec<usize>,
    pub dtype: Dtype,
    /// The block format the checkpoint stores it in (`quant`), when it is
    /// quantized: its values are then the blocks' dequantized values, and
    /// backends read the blocks where they lie. `None`: `dtype` elements.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<quant::BlockFormat>,
    /// Where the model keeps the checkpoint's axes in another order (its
    /// axis `j` is the checkpoint's axis `axes[j]`, `layout`): the loaders
    /// read the checkpoint's tensor and lay it out so. `None`: as stored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub axes: Option<Vec<usize>>,
    /// Where the model reads its last axis in the checkpoint's tiled order
    /// (`tiled`): the loaders keep the file's order. `None`: the model's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tiled: Option<tiled::Tiled>,
}

impl Param {
    /// Its shape in the checkpoint, before `axes` reorders it.
    pub fn checkpoint_shape(&self) -> Vec<usize> {
        let Some(axes) = &self.axes else { return self.shape.clone() };
        let mut shape = vec![0; self.shape.len()];
        for (kept, &from) in axes.iter().enumerate() {
            shape[from] = self.shape[kept];
        }
        shape
    }

    /// The bytes it takes where it is stored.
    pub fn bytes(&self) -> usize {
        let count = self.shape.iter().product::<usize>();
        match self.storage {
            Some(format) => count / format.block_values() * format.block_bytes(),
            None => count * self.dtype.bytes(),
        }
    }
}

/// A tensor that persists across calls of one loaded model; zero at load.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct State {
    pub path: String,
    pub shape: Vec<usize>,
    pub dtype: Dtype,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Input {
    pub name: String,
    pub shape: Vec<Dim>,
    pub dtype: Dtype,
}

/// A `where` clause of an entry, checked when it is called.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Requirement {
    pub lhs: Dim,
    pub op: CmpOp,
    pub rhs: Dim,
    pub text: String,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Entry {
    pub name: String,
    /// The entry's generics, bound from the input shapes.
    pub dims: Vec<Symbol>,
    pub requires: Vec<Requirement>,
    pub inputs: Vec<Input>,
    pub nodes: Vec<Node>,
    /// The returned values (a tuple is flattened).
    pub outputs: Vec<Value>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Node {
    pub kind: NodeKind,
    pub shape: Vec<Dim>,
    pub dtype: Dtype,
    /// The expression it was lowered from, for messages (a backend that
    /// cannot run it names the place).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<SourceAt>,
}

/// A place in a package's sources, resolved when the model is lowered so
/// that an artifact names it without its sources at hand.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceAt {
    pub file: std::sync::Arc<str>,
    pub line: u32,
    pub column: u32,
}

impl std::fmt::Display for SourceAt {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

/// Operations the IR keeps whole. The delta rule has no Linnet body; the
/// others are standard library functions whose Linnet bodies define them,
/// run as kernels: attention skips the keys its mask excludes, and a cache
/// write updates its state in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Intrinsic {
    GatedDeltaRule,
    GatedDeltaStep,
    GroupedAttention,
    GroupedAttentionRows,
    GroupedAttentionSinks,
    WriteAt,
    WriteSpan,
    WriteRows,
    WriteSlots,
}

impl Intrinsic {
    pub fn name(self) -> &'static str {
        match self {
            Intrinsic::GatedDeltaRule => "gated_delta_rule",
            Intrinsic::GatedDeltaStep => "gated_delta_step",
            Intrinsic::GroupedAttention => "grouped_attention",
            Intrinsic::GroupedAttentionRows => "grouped_attention_rows",
            Intrinsic::GroupedAttentionSinks => "grouped_attention_sinks",
            Intrinsic::WriteAt => "write_at",
            Intrinsic::WriteSpan => "write_span",
            Intrinsic::WriteRows => "write_rows",
            Intrinsic::WriteSlots => "write_slots",
        }
    }

    /// The intrinsic an `intrinsic fn` declares.
    pub fn from_name(name: &str) -> Option<Intrinsic> {
        match name {
            "gated_delta_rule" => Some(Intrinsic::GatedDeltaRule),
            "gated_delta_step" => Some(Intrinsic::GatedDeltaStep),
            _ => None,
        }
    }

    /// Whether the first argument is a cache the result replaces.
    pub fn writes_cache(self) -> bool {
        matches!(self, Intrinsic::WriteAt | Intrinsic::WriteSpan | Intrinsic::WriteRows | Intrinsic::WriteSlots)
    }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum NodeKind {
    Input(usize),
    Param(usize),
    /// The state's value when the entry starts.
    State(usize),
    /// Element `[i0, i1, ...]` is the expression with `Index(k)` = `ik`.
    Compute(Scalar),
    Intrinsic(Intrinsic, Vec<Value>),
    /// Makes `value` the state's value for the next call. Has no value of
    /// its own (rank 0, bool).
    WriteState(usize, Value),
    /// Fails the call with the message unless the bool scalar is true.
    Assert(Value, String),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum UnaryOp {
    Neg,
    Not,
    Exp,
    Log,
    Rsqrt,
    Sqrt,
    Cos,
    Sin,
    Tanh,
    Abs,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Max,
    Min,
    And,
    Or,
    Cmp(CmpOp),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ReduceOp {
    Sum,
    Max,
    Min,
}

/// A scalar expression; each node has the element type of its result,
/// and a float result of type bf16 or f16 is rounded to it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Scalar {
    /// The `k`-th index: an axis of the computed tensor, or a reduction's.
    Index(u32, Dtype),
    /// A dim's value (i64), known when the entry is called.
    Dim(Dim),
    Float(f64, Dtype),
    Int(i64, Dtype),
    Bool(bool),
    /// An element of an earlier value; positions are i64.
    Load(Value, Vec<Scalar>, Dtype),
    Unary(UnaryOp, Box<Scalar>, Dtype),
    Binary(BinaryOp, Box<Scalar>, Box<Scalar>, Dtype),
    /// Only the chosen side is evaluated.
    Select(Box<Scalar>, Box<Scalar>, Box<Scalar>, Dtype),
    Cast(Box<Scalar>, Dtype),
    /// Index `index` runs over `0..extent`; floats accumulate in f64 and
    /// round once to `dtype`.
    Reduce {
        op: ReduceOp,
        index: u32,
        extent: Dim,
        body: Box<Scalar>,
        dtype: Dtype,
    },
}

impl Scalar {
    pub fn dtype(&self) -> Dtype {
        match self {
            Scalar::Index(_, dtype)
            | Scalar::Float(_, dtype)
            | Scalar::Int(_, dtype)
            | Scalar::Load(_, _, dtype)
            | Scalar::Unary(_, _, dtype)
            | Scalar::Binary(_, _, _, dtype)
            | Scalar::Select(_, _, _, dtype)
            | Scalar::Cast(_, dtype)
            | Scalar::Reduce { dtype, .. } => *dtype,
            Scalar::Dim(_) => Dtype::I64,
            Scalar::Bool(_) => Dtype::Bool,
        }
    }

    /// Calls `visit` on each direct subexpression, in evaluation order.
    pub fn for_each_child<'s>(&'s self, visit: &mut dyn FnMut(&'s Scalar)) {
        match self {
            Scalar::Load(_, positions, _) => positions.iter().for_each(visit),
            Scalar::Unary(_, a, _) | Scalar::Cast(a, _) => visit(a),
            Scalar::Binary(_, a, b, _) => {
                visit(a);
                visit(b);
            }
            Scalar::Select(c, a, b, _) => {
                visit(c);
                visit(a);
                visit(b);
            }
            Scalar::Reduce { body, .. } => visit(body),
            Scalar::Index(..) | Scalar::Dim(_) | Scalar::Float(..) | Scalar::Int(..) | Scalar::Bool(_) => {}
        }
    }

    /// Calls `visit` on each direct subexpression, to change it.
    pub fn for_each_child_mut(&mut self, visit: &mut dyn FnMut(&mut Scalar)) {
        match self {
            Scalar::Load(_, positions, _) => positions.iter_mut().for_each(visit),
            Scalar::Unary(_, a, _) | Scalar::Cast(a, _) => visit(a),
            Scalar::Binary(_, a, b, _) => {
                visit(a);
                visit(b);
            }
            Scalar::Select(c, a, b, _) => {
                visit(c);
                visit(a);
                visit(b);
            }
            Scalar::Reduce { body, .. } => visit(body),
            Scalar::Index(..) | Scalar::Dim(_) | Scalar::Float(..) | Scalar::Int(..) | Scalar::Bool(_) => {}
        }
    }

    /// Whether `test` holds for this expression or any inside it.
    pub fn any(&self, test: &dyn Fn(&Scalar) -> bool) -> bool {
        let mut found = test(self);
        self.for_each_child(&mut |child| found = found || child.any(test));
        found
    }

    /// The value this position reads directly (through casts), if it is
    /// a load: what an out-of-range position is blamed on.
    pub fn direct_load(&self) -> Option<Value> {
        match self {
            Scalar::Cast(inner, _) => inner.direct_load(),
            Scalar::Load(value, ..) => Some(*value),
            _ => None,
        }
    }

    /// Every value this expression loads.
    pub fn loads(&self, out: &mut Vec<Value>) {
        if let Scalar::Load(value, ..) = self {
            out.push(*value);
        }
        self.for_each_child(&mut |child| child.loads(out));
    }
}

impl NodeKind {
    /// Renames every value this node reads.
    pub fn rename_reads(&mut self, rename: &dyn Fn(&mut Value)) {
        fn in_loads(scalar: &mut Scalar, rename: &dyn Fn(&mut Value)) {
            if let Scalar::Load(value, ..) = scalar {
                rename(value);
            }
            scalar.for_each_child_mut(&mut |child| in_loads(child, rename));
        }
        match self {
            NodeKind::Compute(scalar) => in_loads(scalar, rename),
            NodeKind::Intrinsic(_, args) => args.iter_mut().for_each(rename),
            NodeKind::WriteState(_, value) | NodeKind::Assert(value, _) => rename(value),
            NodeKind::Input(_) | NodeKind::Param(_) | NodeKind::State(_) => {}
        }
    }
}

impl Entry {
    /// Drops the nodes `gone` marks (which nothing left reads) and
    /// renumbers the values after them.
    pub fn remove_nodes(&mut self, gone: &[bool]) {
        let kept: Vec<usize> = (0..self.nodes.len()).filter(|&at| !gone[at]).collect();
        self.reorder(&kept);
    }

    /// Keeps the nodes `order` lists, in that order (each node after the
    /// values it reads), renumbering every value.
    pub fn reorder(&mut self, order: &[usize]) {
        let mut renamed = vec![Value(u32::MAX); self.nodes.len()];
        for (new, &old) in order.iter().enumerate() {
            renamed[old] = Value(new as u32);
        }
        let rename = |value: &mut Value| *value = renamed[value.index()];
        let mut nodes: Vec<Option<Node>> = std::mem::take(&mut self.nodes).into_iter().map(Some).collect();
        for &old in order {
            let mut node = nodes[old].take().expect("a node is kept once");
            node.kind.rename_reads(&rename);
            self.nodes.push(node);
        }
        self.outputs.iter_mut().for_each(rename);
    }
}

/// How a checkpoint stores a parameter the model reads in its blocks:
/// their format, and the tiled order of its columns where the model reads
/// them as the file keeps them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StoredBlocks {
    pub format: quant::BlockFormat,
    pub tiled: Option<tiled::Tiled>,
}

impl std::fmt::Display for StoredBlocks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.tiled {
            None => write!(f, "{}", self.format),
            Some(tiled) => {
                write!(f, "{}, columns tiled {}x{}x{}", self.format, tiled.per_group, tiled.groups, tiled.head)
            }
        }
    }
}

impl From<quant::BlockFormat> for StoredBlocks {
    fn from(format: quant::BlockFormat) -> StoredBlocks {
        StoredBlocks { format, tiled: None }
    }
}

/// A model, instantiated with its card's generics.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Model {
    pub name: String,
    pub params: Vec<Param>,
    pub states: Vec<State>,
    pub entries: Vec<Entry>,
}

impl Model {
    pub fn entry(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|entry| entry.name == name)
    }

    pub fn param_bytes(&self) -> usize {
        self.params.iter().map(Param::bytes).sum()
    }

    /// The model with the parameters named in `formats` stored in those
    /// block formats (the checkpoint's, known when it is opened), the
    /// tiled ones read in the file's column order (`tiled::keep_tiled`), or
    /// every reason it cannot be: a parameter the model lacks, one that is
    /// not a float, one whose rows the block does not divide, or one the
    /// model cannot read tiled.
    pub fn stored_as(
        mut self,
        formats: &std::collections::BTreeMap<String, StoredBlocks>,
    ) -> Result<Model, Vec<String>> {
        let mut problems = Vec::new();
        for (path, stored) in formats {
            let Some(at) = self.params.iter().position(|p| &p.path == path) else {
                problems.push(format!("the model has no parameter `{path}`"));
                continue;
            };
            let (param, format) = (&mut self.params[at], stored.format);
            let row = param.shape.last().copied().unwrap_or(1);
            if !param.dtype.is_float() {
                problems.push(format!("`{path}` is {}, and only floats are stored in blocks", param.dtype.name()));
            } else if format.row_bytes(row).is_none() {
                problems.push(format!(
                    "`{path}` has rows of {row} values, not a whole number of {format} blocks ({} values)",
                    format.block_values()
                ));
            } else {
                param.storage = Some(format);
                if let Some(tiled) = stored.tiled {
                    if let Err(not_kept) = tiled::keep_tiled(&mut self, at, tiled) {
                        problems.push(format!("`{path}` cannot be read in its tiled order: {}", not_kept.why));
                    }
                }
            }
        }
        if problems.is_empty() {
            Ok(self)
        } else {
            Err(problems)
        }
    }

    /// The model's parameters as its checkpoint stores them (the shape
    /// before `axes`, no `axes`), its states, and no entries: what the
    /// readers and writers of checkpoint files see, not a model to run.
    pub fn as_stored(&self) -> Model {
        let params = self
            .params
            .iter()
            .map(|param| Param { shape: param.checkpoint_shape(), axes: None, tiled: None, ..param.clone() })
            .collect();
        Model { name: self.name.clone(), params, states: self.states.clone(), entries: Vec::new() }
    }

    pub fn state_bytes(&self) -> usize {
        self.states.iter().map(|s| s.shape.iter().product::<usize>() * s.dtype.bytes()).sum()
    }
}
