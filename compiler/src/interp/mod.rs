//! The reference interpreter: the semantics of record for the tensor IR.
//! It evaluates each node of an entry in order, element by element, with
//! the numerics of `docs/language.md`: a bf16 or f16 value is rounded
//! where it is produced, sums accumulate in f64 and round once, and a
//! position outside a tensor is an error naming the entry. States live in
//! the [`Machine`] and persist across calls. Every later backend is tested
//! against this.

mod eval;
mod intrinsics;
pub mod tensor;

use crate::codegen::native::{self, Compiled, NativeKernel};
use crate::ir::{Entry, Model, NodeKind};
use crate::sema::dim::{Atom, Dim, Symbol};
use crate::sema::ty::Dtype;
use std::collections::HashMap;
use std::fmt;
use std::rc::Rc;
pub use tensor::{Data, Tensor};

#[derive(Clone, Debug, PartialEq)]
pub enum RunError {
    UnknownEntry(String),
    Inputs { entry: String, message: String },
    Requirement { entry: String, requirement: String },
    OutOfRange { entry: String, message: String },
    Assertion { entry: String, message: String },
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::UnknownEntry(name) => write!(f, "the model has no entry `{name}`"),
            RunError::Inputs { entry, message } => write!(f, "entry `{entry}`: {message}"),
            RunError::Requirement { entry, requirement } => write!(f, "entry `{entry}` requires {requirement}, which these inputs break"),
            RunError::OutOfRange { entry, message } => write!(f, "entry `{entry}`: {message}"),
            RunError::Assertion { entry, message } => write!(f, "entry `{entry}`: {message}"),
        }
    }
}

impl std::error::Error for RunError {}

/// Which executes `Compute` nodes: the interpreter (the semantics of
/// record) or native code compiled by Cranelift, bit-identical to it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Interp,
    Cpu,
}

/// A loaded model: its IR, its parameters, and its states.
pub struct Machine {
    model: Model,
    backend: Backend,
    /// Compiled entries, by name: from an artifact, or compiled here on
    /// their first call.
    compiled: HashMap<String, Compiled>,
    params: Vec<Rc<Tensor>>,
    states: Vec<Rc<Tensor>>,
    /// Per entry: each value's use count and whether it is hoisted.
    plans: HashMap<String, Plan>,
    /// Values that depend on no input or state, computed on first use
    /// (the rotary tables for every position, say), by entry and node.
    hoisted: HashMap<(String, usize), Rc<Tensor>>,
}

/// What the machine knows of an entry before running it.
struct Plan {
    uses: Vec<u32>,
    /// The node after which each value is freed (see `ir::plan`).
    last_reads: Vec<usize>,
    /// Depends only on parameters and constants, and has a fixed shape.
    hoistable: Vec<bool>,
}

impl Plan {
    fn new(entry: &Entry) -> Plan {
        Plan { uses: use_counts(entry), last_reads: crate::ir::plan::last_reads(entry), hoistable: crate::ir::plan::hoistable(entry) }
    }
}

impl Machine {
    /// `params` in the model's parameter order, already validated; bf16
    /// parameters not yet held as bits are packed (`tensor::holds_bits`).
    pub fn new(model: Model, params: Vec<Tensor>) -> Machine {
        let states = model.states.iter().map(|s| Rc::new(Tensor::zeros(s.dtype, s.shape.clone()))).collect();
        let plans = model.entries.iter().map(|entry| (entry.name.clone(), Plan::new(entry))).collect();
        Machine {
            model,
            backend: Backend::Interp,
            compiled: HashMap::new(),
            params: params.into_iter().map(|param| Rc::new(param.into_bits())).collect(),
            states,
            plans,
            hoisted: HashMap::new(),
        }
    }

    pub fn with_backend(mut self, backend: Backend) -> Machine {
        self.backend = backend;
        self
    }

    /// Runs on the CPU backend with these compiled entries (an artifact's);
    /// an entry without them is compiled on its first call.
    pub fn with_compiled(mut self, compiled: HashMap<String, Compiled>) -> Machine {
        self.backend = Backend::Cpu;
        self.compiled = compiled;
        self
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub fn model(&self) -> &Model {
        &self.model
    }

    /// Zeroes every state, as at load.
    pub fn reset(&mut self) {
        for (slot, state) in self.states.iter_mut().zip(&self.model.states) {
            *slot = Rc::new(Tensor::zeros(state.dtype, state.shape.clone()));
        }
    }

    pub fn call(&mut self, entry_name: &str, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, RunError> {
        let model = &self.model;
        let entry = model.entry(entry_name).ok_or_else(|| RunError::UnknownEntry(entry_name.to_string()))?;
        let dims = bind_dims(entry, &inputs)?;
        let mut values: Vec<Rc<Tensor>> = Vec::with_capacity(entry.nodes.len());
        let mut inputs: Vec<Option<Tensor>> = inputs.into_iter().map(Some).collect();
        let mut writes = Vec::new();
        let freed = Rc::new(Tensor::zeros(Dtype::Bool, Vec::new()));
        let plan = &self.plans[&entry.name];
        let compiled = match self.backend {
            Backend::Cpu => {
                if !self.compiled.contains_key(&entry.name) {
                    let compiled = native::jit(entry, &plan.hoistable).map_err(|message| RunError::Inputs {
                        entry: entry.name.clone(),
                        message: format!("code generation failed: {message}"),
                    })?;
                    self.compiled.insert(entry.name.clone(), compiled);
                }
                self.compiled.get(&entry.name)
            }
            Backend::Interp => None,
        };
        let origins: Vec<Option<Rc<str>>> = entry
            .nodes
            .iter()
            .map(|node| match node.kind {
                NodeKind::Input(k) => Some(Rc::from(format!("input `{}`", entry.inputs[k].name))),
                NodeKind::Param(k) => Some(Rc::from(format!("param `{}`", model.params[k].path))),
                NodeKind::State(k) => Some(Rc::from(format!("state `{}`", model.states[k].path))),
                _ => None,
            })
            .collect();
        for (at, node) in entry.nodes.iter().enumerate() {
            let value = match &node.kind {
                NodeKind::Input(k) => Rc::new(inputs[*k].take().expect("each input is read once")),
                NodeKind::Param(k) => Rc::clone(&self.params[*k]),
                NodeKind::State(k) => Rc::clone(&self.states[*k]),
                NodeKind::Compute(_) if plan.hoistable[at] && self.hoisted.contains_key(&(entry.name.clone(), at)) => {
                    Rc::clone(&self.hoisted[&(entry.name.clone(), at)])
                }
                NodeKind::Compute(scalar) => {
                    let shape = eval::shape(&node.shape, &dims);
                    let native = compiled.and_then(|c| c.kernels[at].as_ref());
                    let computed = match native {
                        Some(kernel) => run_native(kernel, &values, &dims, node.dtype, shape.clone()),
                        None => None,
                    };
                    let value = match computed {
                        Some(tensor) => Rc::new(tensor),
                        // The interpreter evaluates what is not compiled,
                        // and names what a failed native load read.
                        None => Rc::new(eval::compute(scalar, shape, node.dtype, &values, &origins, &dims).map_err(|message| {
                            RunError::OutOfRange { entry: entry.name.clone(), message: format!("{message} (at v{at})") }
                        })?),
                    };
                    if plan.hoistable[at] {
                        self.hoisted.insert((entry.name.clone(), at), Rc::clone(&value));
                    }
                    value
                }
                NodeKind::Intrinsic(intrinsic, args) if intrinsic.writes_cache() => {
                    // In place when the cache is a state read only here.
                    let source = args[0];
                    let state = match entry.nodes[source.index()].kind {
                        NodeKind::State(k) if plan.uses[source.index()] == 1 => Some(k),
                        _ => None,
                    };
                    let mut cache = match state {
                        Some(k) => {
                            values[source.index()] = Rc::new(Tensor::zeros(Dtype::Bool, Vec::new()));
                            let held = std::mem::replace(&mut self.states[k], Rc::new(Tensor::zeros(Dtype::Bool, Vec::new())));
                            Rc::try_unwrap(held).unwrap_or_else(|shared| shared.as_ref().clone())
                        }
                        None => values[source.index()].as_ref().clone(),
                    };
                    let rest: Vec<_> = args[1..].iter().map(|v| values[v.index()].widened()).collect();
                    let rest: Vec<&Tensor> = rest.iter().map(|arg| arg.as_ref()).collect();
                    let written = intrinsics::write_cache(*intrinsic, &mut cache, &rest);
                    let cache = Rc::new(cache);
                    // The state always holds a whole cache, even if this
                    // call fails later (then with this write in it).
                    if let Some(k) = state {
                        self.states[k] = Rc::clone(&cache);
                    }
                    written.map_err(|message| RunError::Assertion { entry: entry.name.clone(), message })?;
                    cache
                }
                NodeKind::Intrinsic(intrinsic, args) => {
                    let args: Vec<_> = args.iter().map(|v| values[v.index()].widened()).collect();
                    let args: Vec<&Tensor> = args.iter().map(|arg| arg.as_ref()).collect();
                    Rc::new(intrinsics::run(*intrinsic, &args, eval::shape(&node.shape, &dims)))
                }
                NodeKind::WriteState(k, value) => {
                    // A state holds f32, even when it takes a parameter's value.
                    let written = &values[value.index()];
                    writes.push((*k, if matches!(written.data, Data::Bf16(_)) { Rc::new(written.widened().into_owned()) } else { Rc::clone(written) }));
                    Rc::new(Tensor::zeros(Dtype::Bool, Vec::new()))
                }
                NodeKind::Assert(value, message) => {
                    if values[value.index()].data != Data::Bool(vec![true]) {
                        return Err(RunError::Assertion { entry: entry.name.clone(), message: message.clone() });
                    }
                    Rc::new(Tensor::zeros(Dtype::Bool, Vec::new()))
                }
            };
            values.push(value);
            // Values read for the last time are freed now.
            for read in crate::ir::plan::reads(&node.kind) {
                if plan.last_reads[read.index()] == at {
                    values[read.index()] = Rc::clone(&freed);
                }
            }
        }
        for (state, value) in writes {
            self.states[state] = value;
        }
        Ok(entry.outputs.iter().map(|v| values[v.index()].widened().into_owned()).collect())
    }
}

/// Runs a compiled node; `None` when a load fell outside its tensor (the
/// interpreter then reports it with names).
fn run_native(kernel: &NativeKernel, values: &[Rc<Tensor>], dims: &HashMap<Symbol, i64>, dtype: Dtype, shape: Vec<usize>) -> Option<Tensor> {
    let mut out = Tensor::zeros(dtype, shape);
    let table: Vec<i64> = kernel.dims.iter().map(|d| eval::dim(d, dims).expect("an entry's dims are bound when it is called")).collect();
    let pointers: Vec<*const u8> = kernel
        .loads
        .iter()
        .map(|v| match &values[v.index()].data {
            Data::F32(x) => x.as_ptr() as *const u8,
            Data::Bf16(x) => x.as_ptr() as *const u8,
            Data::I64(x) => x.as_ptr() as *const u8,
            Data::Bool(x) => x.as_ptr() as *const u8,
        })
        .collect();
    let target = match &mut out.data {
        Data::F32(x) => x.as_mut_ptr() as *mut u8,
        Data::I64(x) => x.as_mut_ptr() as *mut u8,
        Data::Bool(x) => x.as_mut_ptr() as *mut u8,
        Data::Bf16(_) => unreachable!("computed values are held as f32"),
    };
    // SAFETY: the kernel was compiled for these values' shapes and dtypes,
    // its dims table is evaluated under the call's dims, it checks every
    // position before it loads, and writes exactly the output's elements.
    unsafe { native::call(kernel, target, &pointers, &table) }.then_some(out)
}

/// How many times each value is used by later nodes and the outputs.
fn use_counts(entry: &Entry) -> Vec<u32> {
    let mut uses = vec![0u32; entry.nodes.len()];
    for node in &entry.nodes {
        for value in crate::ir::plan::reads(&node.kind) {
            uses[value.index()] += 1;
        }
    }
    for output in &entry.outputs {
        uses[output.index()] += 1;
    }
    uses
}

fn shape_text(shape: &[usize]) -> String {
    format!("[{}]", shape.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))
}

/// The entry's generics from its inputs' shapes, after checking every
/// input's rank, shape and dtype and the entry's `where` clauses.
fn bind_dims(entry: &Entry, inputs: &[Tensor]) -> Result<HashMap<Symbol, i64>, RunError> {
    let error = |message: String| RunError::Inputs { entry: entry.name.clone(), message };
    if inputs.len() != entry.inputs.len() {
        return Err(error(format!("takes {} input(s), {} given", entry.inputs.len(), inputs.len())));
    }
    let mut dims: HashMap<Symbol, i64> = HashMap::new();
    for (input, tensor) in entry.inputs.iter().zip(inputs) {
        let expected: Vec<String> = input.shape.iter().map(ToString::to_string).collect();
        if tensor.shape.len() != input.shape.len() {
            return Err(error(format!("`{}` must have shape [{}], found {}", input.name, expected.join(", "), shape_text(&tensor.shape))));
        }
        if tensor.dtype != input.dtype {
            return Err(error(format!("`{}` must be {}, found {}", input.name, input.dtype.name(), tensor.dtype.name())));
        }
        for (dim, &size) in input.shape.iter().zip(&tensor.shape) {
            if let Some(Atom::Generic(name)) = dim.as_atom() {
                dims.entry(name.clone()).or_insert(size as i64);
            }
        }
    }
    for (input, tensor) in entry.inputs.iter().zip(inputs) {
        let fits = input.shape.iter().zip(&tensor.shape).all(|(dim, &size)| eval::dim(dim, &dims) == Some(size as i64));
        if !fits {
            let expected: Vec<String> = input.shape.iter().map(|d| eval::dim(d, &dims).map_or_else(|| d.to_string(), |v| v.to_string())).collect();
            return Err(error(format!("`{}` must have shape [{}], found {}", input.name, expected.join(", "), shape_text(&tensor.shape))));
        }
    }
    for requirement in &entry.requires {
        let (lhs, rhs) = (eval::dim(&requirement.lhs, &dims), eval::dim(&requirement.rhs, &dims));
        let holds = match (lhs, rhs) {
            (Some(lhs), Some(rhs)) => crate::sema::holds(lhs, requirement.op, rhs),
            _ => false,
        };
        if !holds {
            return Err(RunError::Requirement { entry: entry.name.clone(), requirement: format!("`{}`", requirement.text) });
        }
    }
    Ok(dims)
}

/// A dim's value under the entry's bindings.
pub fn dim_value(dim: &Dim, dims: &HashMap<Symbol, i64>) -> Option<i64> {
    eval::dim(dim, dims)
}
