//! Lowering a checked package to the tensor IR: the root block is
//! instantiated with the model card's generics, every `sub`, `param` and
//! `state` gets its path, `static for` is unrolled, functions are inlined,
//! and index definitions and tensor operations become `Compute` nodes.
//! Entry generics stay symbolic in shapes and are bound at call time.
//! Lowering runs only on a package that checked clean; what it still
//! cannot express is an error with a span, never a silent fallback.

mod expr;
mod library;

use crate::code::Code;
use crate::diagnostic::Diagnostic;
use crate::sema::program::{ItemRef, Program};
use crate::sema::ty::{SubTy, Subst, Ty};
use crate::source::{FileId, SourceMap, Span};
use linnet_ir::dim::{Dim, Symbol};
use linnet_ir::Dtype;
use linnet_ir::{self as ir, Entry, Input, Model, Node, NodeKind, Requirement, Scalar, SourceAt, Value};
use std::collections::HashMap;
use std::sync::Arc;

/// Lowering stops at the first construct it cannot express.
pub type Result<T> = std::result::Result<T, Box<Diagnostic>>;

pub(crate) fn unsupported(span: Span, what: impl Into<String>) -> Box<Diagnostic> {
    Box::new(Diagnostic::error(Code::Unsupported, span, what.into()).with_label("the IR cannot express this yet"))
}

/// A block as instantiated: which block, its generics' values, the path
/// prefix of its members (`groups.3.linear.1.`), and, where it was given
/// for a block generic, the trait that bounds it (whose defaults it has).
#[derive(Clone, Debug)]
pub struct Instance {
    pub block: usize,
    pub env: Subst,
    pub path: String,
    pub bound: Option<Box<Bound>>,
}

/// The trait an instance is seen through, with the trait's generics'
/// values: what a default method's body is lowered with.
#[derive(Clone, Debug)]
pub struct Bound {
    pub trait_block: usize,
    pub env: Subst,
}

/// A value during lowering.
#[derive(Clone, Debug)]
pub enum Val {
    Tensor(Value),
    /// A literal not yet given a type: `0.0`, `1`.
    Literal(f64, bool),
    Dim(Dim),
    Tuple(Vec<Val>),
    Option(Option<Box<Val>>),
    Sub(Box<Instance>),
    /// The elements' block instance (without index) and the array's path.
    SubArray(Box<Instance>, usize),
    Unit,
}

/// Choices that change how, not what, the model computes.
#[derive(Clone, Copy, Debug)]
pub struct Lowering {
    /// Run the standard library's attention and cache writes as kernels
    /// (`library::kernel_of`) instead of inlining their Linnet bodies.
    pub library_kernels: bool,
    /// Run the IR's optimizing passes (`ir::passes::OPTIMIZE`: inline
    /// values read once into their consumer, compute what is left only
    /// once, read views where they lie, place independent nodes together).
    /// Off, the IR is the source's as written: the reference that the
    /// passes are held to. Either way the IR is verified
    /// (`ir::passes::Checking`).
    pub optimize: bool,
}

impl Default for Lowering {
    fn default() -> Lowering {
        Lowering { library_kernels: true, optimize: true }
    }
}

/// Lowers the root block named by the model card.
pub fn lower(
    program: &Program,
    sources: &SourceMap,
    model_name: &str,
    lowering: Lowering,
) -> std::result::Result<Model, Vec<Diagnostic>> {
    let mut diagnostics = Vec::new();
    let Some((root, values)) = crate::sema::instantiate::root_instance(program, &mut diagnostics) else {
        return Err(diagnostics);
    };
    let instance = Instance { block: root, env: values.to_subst(), path: String::new(), bound: None };
    let mut lowerer = Lowerer {
        program,
        sources,
        files: HashMap::new(),
        model: Model { name: model_name.to_string(), params: Vec::new(), states: Vec::new(), entries: Vec::new() },
        params: HashMap::new(),
        states: HashMap::new(),
        lowering,
    };
    lowerer.collect(&instance).map_err(|d| vec![*d])?;
    let mut ids: Vec<usize> = program.blocks[root].fns.values().copied().collect();
    ids.sort_unstable();
    for fn_id in ids.into_iter().filter(|id| program.fns[*id].is_entry()) {
        let entry = lowerer.entry(&instance, fn_id).map_err(|d| vec![*d])?;
        lowerer.model.entries.push(entry);
    }
    let mut model = lowerer.model;
    ir::dead::eliminate(&mut model);
    ir::layout::canonicalize(&mut model);
    let passes = if lowering.optimize { ir::passes::OPTIMIZE } else { &[] };
    if let Err(failure) = ir::passes::run(&mut model, passes, ir::passes::Checking::default_for_build()) {
        let span = program.blocks[root].decl.name.span;
        let message = format!("the compiler made an IR that does not verify, {failure}");
        let diagnostic = Diagnostic::error(Code::InvalidIr, span, message)
            .with_label("while lowering this model")
            .with_note("this is a bug in Linnet, not in the package: please report it with the package");
        return Err(vec![diagnostic]);
    }
    Ok(model)
}

pub(crate) struct Lowerer<'p, 'a> {
    pub program: &'p Program<'a>,
    pub sources: &'p SourceMap,
    /// Each source file's path, once.
    files: HashMap<FileId, Arc<str>>,
    pub model: Model,
    pub params: HashMap<String, usize>,
    pub states: HashMap<String, usize>,
    pub lowering: Lowering,
}

impl Lowerer<'_, '_> {
    /// The instance of `sub` inside `parent`.
    pub fn sub_instance(&self, parent: &Instance, sub: usize, path: String) -> Option<Instance> {
        let declared = self.program.blocks[parent.block].subs[sub].target.as_ref()?;
        let target = parent.env.sub(declared);
        let bound = declared.generic.as_ref().map(|_| {
            let arguments = SubTy::concrete(declared.block, declared.args.clone());
            Box::new(Bound { trait_block: declared.block, env: parent.env.sub(&arguments).args })
        });
        Some(Instance { block: target.block, env: target.args, path, bound })
    }

    /// The function `name` of `instance`: its block's own, or else the
    /// default of the trait it is seen through.
    pub fn method(&self, instance: &Instance, name: &str) -> Option<usize> {
        let own = self.program.blocks[instance.block].fns.get(name);
        let default = || instance.bound.as_ref().and_then(|bound| self.program.blocks[bound.trait_block].fns.get(name));
        own.or_else(default).copied()
    }

    fn concrete(dims: &[Dim], span: Span) -> Result<Vec<usize>> {
        dims.iter()
            .map(|dim| dim.as_constant().and_then(|c| usize::try_from(c).ok()))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| unsupported(span, "a parameter or state shape depends on an entry's generics"))
    }

    /// Every parameter and state under `instance`, in declaration order.
    fn collect(&mut self, instance: &Instance) -> Result<()> {
        let block = &self.program.blocks[instance.block];
        for (name, ty, span) in &block.params {
            let (shape, dtype) = self.tensor_type(ty, &instance.env, *span)?;
            let path = format!("{}{name}", instance.path);
            self.params.insert(path.clone(), self.model.params.len());
            self.model.params.push(ir::Param {
                path,
                shape: Self::concrete(&shape, *span)?,
                dtype,
                storage: None,
                axes: None,
                tiled: None,
            });
        }
        for (name, ty, span) in &block.states {
            let (shape, dtype) = self.tensor_type(ty, &instance.env, *span)?;
            let path = format!("{}{name}", instance.path);
            self.states.insert(path.clone(), self.model.states.len());
            self.model.states.push(ir::State { path, shape: Self::concrete(&shape, *span)?, dtype });
        }
        for (at, sub) in block.subs.iter().enumerate() {
            match &sub.ty {
                Ty::SubArray(_, count) => {
                    let count = instance.env.dim(count).as_constant().unwrap_or(0);
                    for index in 0..count {
                        let path = format!("{}{}.{index}.", instance.path, sub.name);
                        let child = self
                            .sub_instance(instance, at, path)
                            .ok_or_else(|| unsupported(sub.span, "unresolved sub"))?;
                        self.collect(&child)?;
                    }
                }
                _ => {
                    let path = format!("{}{}.", instance.path, sub.name);
                    let child =
                        self.sub_instance(instance, at, path).ok_or_else(|| unsupported(sub.span, "unresolved sub"))?;
                    self.collect(&child)?;
                }
            }
        }
        Ok(())
    }

    pub fn tensor_type(&self, ty: &Ty, env: &Subst, span: Span) -> Result<(Vec<Dim>, Dtype)> {
        match ty {
            Ty::Tensor(tensor) => {
                let shape = env
                    .shape(tensor)
                    .ok_or_else(|| unsupported(span, format!("the shape of `{ty}` is not known here")))?;
                let dtype = env
                    .dtype(&tensor.elem)
                    .ok_or_else(|| unsupported(span, format!("the element type of `{ty}` is not known here")))?;
                Ok((shape, dtype))
            }
            other => Err(unsupported(span, format!("`{other}` is not a tensor"))),
        }
    }

    fn entry(&mut self, root: &Instance, fn_id: usize) -> Result<Entry> {
        let function = &self.program.fns[fn_id];
        let mut env = root.env.clone();
        let dims: Vec<Symbol> = function.generics.iter().map(|g| g.name.clone()).collect();
        for name in &dims {
            env.dims.insert(name.clone(), Dim::atom(linnet_ir::dim::Atom::Generic(Arc::clone(name))));
        }
        let mut inputs = Vec::new();
        let mut builder = Builder::default();
        let mut locals = HashMap::new();
        for (at, (name, ty, span)) in function.params.iter().enumerate() {
            let (shape, dtype) = self.tensor_type(ty, &env, *span)?;
            let value = builder.push(Node { kind: NodeKind::Input(at), shape: shape.clone(), dtype, source: None });
            inputs.push(Input { name: name.clone(), shape, dtype });
            locals.insert(name.clone(), Val::Tensor(value));
        }
        let requires = function
            .clauses
            .iter()
            .map(|clause| Requirement {
                lhs: env.dim(&clause.lhs),
                op: clause.op,
                rhs: env.dim(&clause.rhs),
                text: clause.text.clone(),
            })
            .collect();
        let instance = Instance { env: env.clone(), ..root.clone() };
        let result = {
            let mut frame = expr::Frame::new(self, &mut builder, Some(instance), function.module, env, locals);
            frame.body(function.decl.body.as_deref().unwrap_or_default())?
        };
        let mut outputs = Vec::new();
        flatten(result, &mut builder, &mut outputs, function.decl.name.span)?;
        builder.finish_states();
        for (node, span) in builder.nodes.iter_mut().zip(&builder.spans) {
            node.source = span.map(|span| self.locate(span));
        }
        Ok(Entry { name: function.name.clone(), dims, requires, inputs, nodes: builder.nodes, outputs })
    }

    /// A span as a place in the sources, with the file's path shared.
    fn locate(&mut self, span: Span) -> SourceAt {
        let file = self.sources.get(span.file);
        let (line, column) = file.line_column(span.start as usize);
        let path = self
            .files
            .entry(span.file)
            .or_insert_with(|| Arc::from(self.sources.path(span.file).display().to_string()));
        SourceAt { file: Arc::clone(path), line: line as u32, column: column as u32 }
    }

    pub fn scope_item(&self, module: usize, name: &str) -> Option<ItemRef> {
        self.program.scopes[module].get(name).copied()
    }
}

fn flatten(value: Val, builder: &mut Builder, out: &mut Vec<Value>, span: Span) -> Result<()> {
    match value {
        Val::Tensor(value) => out.push(value),
        Val::Tuple(items) => {
            for item in items {
                flatten(item, builder, out, span)?;
            }
        }
        Val::Literal(value, is_float) => {
            let scalar =
                if is_float { Scalar::Float(value, Dtype::F32) } else { Scalar::Int(value as i64, Dtype::I64) };
            out.push(builder.compute(Vec::new(), scalar));
        }
        other => return Err(unsupported(span, format!("an entry cannot return {other:?}"))),
    }
    Ok(())
}

/// The nodes of one entry as they are built, and the states' current values.
#[derive(Default)]
pub(crate) struct Builder {
    pub nodes: Vec<Node>,
    pub param_nodes: HashMap<usize, Value>,
    /// Each state's value now, once read or written.
    pub state_values: HashMap<usize, Value>,
    pub written: Vec<usize>,
    /// Index numbers handed out for index definitions and reductions;
    /// they start high so as not to meet a node's own axes.
    pub next_index: u32,
    /// The expression being lowered, and each node's.
    pub span: Option<Span>,
    spans: Vec<Option<Span>>,
}

pub(crate) const FIRST_FREE_INDEX: u32 = 1 << 16;

impl Builder {
    pub fn push(&mut self, node: Node) -> Value {
        self.nodes.push(node);
        self.spans.push(self.span);
        Value(self.nodes.len() as u32 - 1)
    }

    pub fn compute(&mut self, shape: Vec<Dim>, scalar: Scalar) -> Value {
        let dtype = scalar.dtype();
        self.push(Node { kind: NodeKind::Compute(scalar), shape, dtype, source: None })
    }

    /// The node reading a parameter or a state: one per entry for a
    /// parameter; for a state, its current value (written ones included).
    pub fn member(&mut self, kind: NodeKind, shape: &[usize], dtype: Dtype) -> Value {
        let (slot, is_param) = match kind {
            NodeKind::Param(k) => (k, true),
            NodeKind::State(k) => (k, false),
            _ => unreachable!("only parameters and states are members"),
        };
        let cache = if is_param { &mut self.param_nodes } else { &mut self.state_values };
        if let Some(value) = cache.get(&slot) {
            return *value;
        }
        let shape = shape.iter().map(|d| Dim::constant(*d as i64)).collect();
        let value = self.push(Node { kind, shape, dtype, source: None });
        let cache = if is_param { &mut self.param_nodes } else { &mut self.state_values };
        cache.insert(slot, value);
        value
    }

    pub fn fresh_index(&mut self) -> u32 {
        self.next_index += 1;
        FIRST_FREE_INDEX + self.next_index
    }

    pub fn shape(&self, value: Value) -> &[Dim] {
        &self.nodes[value.index()].shape
    }

    pub fn dtype(&self, value: Value) -> Dtype {
        self.nodes[value.index()].dtype
    }

    /// Writes every assigned state's final value back.
    fn finish_states(&mut self) {
        for state in std::mem::take(&mut self.written) {
            let value = self.state_values[&state];
            let node =
                Node { kind: NodeKind::WriteState(state, value), shape: Vec::new(), dtype: Dtype::Bool, source: None };
            self.push(node);
        }
    }
}
