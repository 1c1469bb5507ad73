//! The executor: one loaded model run on one backend. It owns the model,
//! its parameters and states (which persist across calls) and each entry's
//! analysis, and drives a [`Backend`] node by node: it binds an entry's dims
//! from its inputs and checks its clauses, computes hoisted values once per
//! loaded model, frees each value after its last read, writes cache states
//! in place, and turns a backend's errors into messages that name inputs,
//! parameters and states. Values stay where the backend computes them;
//! only inputs, outputs and parameters cross.
//!
//! The executor knows no backend: the reference interpreter (`interp`)
//! here, the CPU backend (`linnet-cpu`) and the GPU backends (`linnet-gpu`)
//! implement [`Backend`] beside each other. The crate also holds what they
//! share: host tensors (`tensor`), the reference kernels of the intrinsics
//! (`reference`, the semantics of record that the interpreter runs) and
//! the numerics contract's tolerances (`tolerance`).
//!
//! Depends on the IR only: no parser, no code generator.

pub mod backend;
pub mod interp;
pub mod reference;
pub mod rows;
pub mod tensor;
pub mod tolerance;

pub use backend::{Backend, BuildError, Dims, MemoryError, NodeError, Site, Values};

use crate::tensor::{Data, Tensor};
use linnet_ir::analysis::Analysis;
use linnet_ir::dim::{Atom, Dim};
use linnet_ir::Dtype;
use linnet_ir::{carry, plan, Entry, Model, NodeKind, Value};
use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

#[derive(Clone, Debug, PartialEq)]
pub enum RunError {
    UnknownEntry(String),
    Inputs {
        entry: String,
        message: String,
    },
    Requirement {
        entry: String,
        requirement: String,
    },
    OutOfRange {
        entry: String,
        message: String,
    },
    Assertion {
        entry: String,
        message: String,
    },
    /// The backend's memory failed (a device out of memory).
    Memory(MemoryError),
}

impl fmt::Display for RunError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RunError::UnknownEntry(name) => write!(f, "the model has no entry `{name}`"),
            RunError::Inputs { entry, message } => write!(f, "entry `{entry}`: {message}"),
            RunError::Requirement { entry, requirement } => {
                write!(f, "entry `{entry}` requires {requirement}, which these inputs break")
            }
            RunError::OutOfRange { entry, message } => write!(f, "entry `{entry}`: {message}"),
            RunError::Assertion { entry, message } => write!(f, "entry `{entry}`: {message}"),
            RunError::Memory(error) => write!(f, "the backend's memory: {error}"),
        }
    }
}

impl std::error::Error for RunError {}

/// A shape under an entry's bindings (bound when the entry was called).
pub fn shape_value(shape: &[Dim], dims: &Dims) -> Vec<usize> {
    shape.iter().map(|d| d.value_under(dims).expect("an entry's dims are bound when it is called") as usize).collect()
}

/// Where an entry's time goes, by kind of node, when profiling is on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Profile {
    /// Kind of node (`contraction`, `compute`, an intrinsic's name,
    /// `input`, `output`) → (seconds, nodes run).
    pub kinds: std::collections::BTreeMap<&'static str, (f64, u64)>,
    /// The source place nodes were lowered from, and their kind → what
    /// its nodes took.
    pub places: HashMap<(String, &'static str), PlaceTime>,
}

/// What the nodes lowered from one place took.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PlaceTime {
    pub seconds: f64,
    pub nodes: u64,
    /// Bytes of weights their contractions read, where the backend counts
    /// them.
    pub weight_bytes: u64,
}

impl Profile {
    fn add(&mut self, kind: &'static str, place: Option<&linnet_ir::SourceAt>, seconds: f64, weight_bytes: u64) {
        let slot = self.kinds.entry(kind).or_default();
        slot.0 += seconds;
        slot.1 += 1;
        if let Some(place) = place {
            let slot = self.places.entry((place.to_string(), kind)).or_default();
            slot.seconds += seconds;
            slot.nodes += 1;
            slot.weight_bytes += weight_bytes;
        }
    }
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total: f64 = self.kinds.values().map(|(seconds, _)| seconds).sum();
        let mut kinds: Vec<_> = self.kinds.iter().collect();
        kinds.sort_by(|a, b| b.1 .0.total_cmp(&a.1 .0));
        let share = |seconds: f64| 100.0 * seconds / total.max(f64::MIN_POSITIVE);
        for (kind, (seconds, count)) in kinds {
            writeln!(f, "{kind:>24}: {seconds:>9.3} s {:>5.1}% in {count} nodes", share(*seconds))?;
        }
        let mut places: Vec<_> = self.places.iter().collect();
        places.sort_by(|a, b| b.1.seconds.total_cmp(&a.1.seconds));
        writeln!(f, "the slowest places:")?;
        for ((place, kind), time) in places.into_iter().take(12) {
            let PlaceTime { seconds, nodes, weight_bytes } = *time;
            let bandwidth = if weight_bytes > 0 {
                format!(", {:.1} GB/s of weights", weight_bytes as f64 / seconds.max(f64::MIN_POSITIVE) / 1e9)
            } else {
                String::new()
            };
            writeln!(f, "  {seconds:>9.3} s {:>5.1}% in {nodes} {kind} nodes{bandwidth}  {place}", share(seconds))?;
        }
        Ok(())
    }
}

/// A loaded model on backend `B`.
pub struct Executor<B: Backend> {
    model: Model,
    backend: B,
    analyses: Vec<Analysis>,
    params: Vec<Arc<B::Buffer>>,
    states: Vec<Arc<B::Buffer>>,
    /// Which states are written at token positions
    /// (`rows::positional_states`), found once.
    positional: Vec<bool>,
    /// Values that depend on no input or state (the rotary tables for
    /// every position), computed on first use, by entry and node.
    hoisted: HashMap<(usize, usize), Arc<B::Buffer>>,
    /// Time by kind of node, when profiling.
    profile: Option<Profile>,
}

impl<B: Backend> Executor<B> {
    /// `params` in the model's parameter order, already validated; the
    /// backend readies every entry first.
    pub fn new(model: Model, params: Vec<Tensor>, mut backend: B) -> Result<Executor<B>, BuildError> {
        let carries = backend.carries_delta_states();
        let analyses: Vec<Analysis> = model
            .entries
            .iter()
            .map(|entry| if carries { Analysis::of(entry) } else { Analysis::of(entry).without_carries() })
            .collect();
        let name = backend.name();
        let whole = |message: String| BuildError::memory(name, MemoryError(message));
        if let Some(param) = model.params.iter().find(|p| p.storage.is_some()).filter(|_| !backend.reads_blocks()) {
            return Err(whole(format!(
                "`{}` is stored as {}, and this backend does not read block formats (run it on the cpu backend or the interpreter)",
                param.path,
                param.storage.expect("found by its storage")
            )));
        }
        if params.len() != model.params.len() {
            return Err(whole(format!("{} parameters given for the model's {}", params.len(), model.params.len())));
        }
        if let Some((tensor, param)) =
            params.iter().zip(&model.params).find(|(tensor, param)| !tensor::holds(tensor, param))
        {
            return Err(whole(format!(
                "`{}` was given a tensor of shape {:?} that is not held as it is stored",
                param.path, tensor.shape
            )));
        }
        backend.prepare(&model, &analyses)?;
        let params = params
            .into_iter()
            .map(|param| backend.upload(param.into_bits()).map(Arc::new))
            .collect::<Result<_, _>>()
            .map_err(|e| BuildError::memory(name, e))?;
        let states = model
            .states
            .iter()
            .map(|s| backend.zeros(s.dtype, &s.shape).map(Arc::new))
            .collect::<Result<_, _>>()
            .map_err(|e| BuildError::memory(name, e))?;
        let positional = rows::positional_states(&model);
        Ok(Executor { model, backend, analyses, params, states, positional, hoisted: HashMap::new(), profile: None })
    }

    /// Zeroes every state, as at load.
    pub fn reset(&mut self) -> Result<(), RunError> {
        for (slot, state) in self.states.iter_mut().zip(&self.model.states) {
            *slot = Arc::new(self.backend.zeros(state.dtype, &state.shape).map_err(RunError::Memory)?);
        }
        Ok(())
    }

    pub fn call(&mut self, entry_name: &str, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, RunError> {
        let number = self
            .model
            .entries
            .iter()
            .position(|e| e.name == entry_name)
            .ok_or_else(|| RunError::UnknownEntry(entry_name.to_string()))?;
        let entry = &self.model.entries[number];
        let analysis = &self.analyses[number];
        let dims = bind_dims(entry, &inputs)?;
        // Every dim the entry evaluates, once: a divisor that is zero for
        // these inputs is an error here rather than inside a kernel.
        if let Some(dim) = analysis.dims.iter().find(|dim| dim.value_under(&dims).is_err()) {
            return Err(RunError::Inputs {
                entry: entry.name.clone(),
                message: format!(
                    "the dim `{dim}` cannot be evaluated for these inputs (a division by zero or an overflow)"
                ),
            });
        }
        let shown: Vec<Option<String>> = inputs.iter().map(shown_values).collect();
        let mut inputs: Vec<Option<Tensor>> = inputs.into_iter().map(Some).collect();
        let mut values: Vec<Option<Arc<B::Buffer>>> = Vec::with_capacity(entry.nodes.len());
        let mut writes = Vec::new();
        for (at, node) in entry.nodes.iter().enumerate() {
            let started = self.profile.is_some().then(|| (std::time::Instant::now(), self.backend.weight_bytes_read()));
            // Only nodes a backend runs need their shape (no allocation for
            // the others: parameters, states, effects).
            let shape = match node.kind {
                NodeKind::Compute(_) | NodeKind::Intrinsic(..) => shape_value(&node.shape, &dims),
                _ => Vec::new(),
            };
            let site = Site { entry, entry_number: number, at, dims: &dims, shape: &shape };
            let failed = |error: NodeError| describe(&self.model, entry, at, error, &shown);
            let value = match &node.kind {
                _ if analysis.carried_away[at] => None,
                NodeKind::Input(k) => Some(Arc::new(
                    self.backend
                        .upload(inputs[*k].take().expect("each input is read once"))
                        .map_err(RunError::Memory)?,
                )),
                NodeKind::Param(k) => Some(Arc::clone(&self.params[*k])),
                NodeKind::State(k) => Some(Arc::clone(&self.states[*k])),
                NodeKind::Compute(_) if analysis.hoistable[at] => match self.hoisted.get(&(number, at)) {
                    Some(value) => Some(Arc::clone(value)),
                    None => {
                        let value = Arc::new(self.backend.compute(site, &values).map_err(failed)?);
                        // Kept for every later call: only once it is known
                        // to be whole.
                        settle(&mut self.backend, &self.model, number, &shown)?;
                        self.hoisted.insert((number, at), Arc::clone(&value));
                        Some(value)
                    }
                },
                NodeKind::Compute(_) => Some(Arc::new(self.backend.compute(site, &values).map_err(failed)?)),
                NodeKind::Intrinsic(_, args) if analysis.carried[at].is_some() => {
                    let k = analysis.carried[at].expect("matched as carried");
                    let state_read = args[carry::STATE_ARGUMENT];
                    let mut state = take_state(&mut self.backend, &mut self.states, k, &mut values, state_read)?;
                    let others: Vec<&B::Buffer> = args
                        .iter()
                        .enumerate()
                        .filter(|(argument, _)| *argument != carry::STATE_ARGUMENT)
                        .map(|(_, v)| held(&values, v.index()))
                        .collect();
                    let stepped = self.backend.delta_step_in_place(site, &others, &mut state);
                    self.states[k] = Arc::new(state);
                    Some(Arc::new(stepped.map_err(failed)?))
                }
                NodeKind::Intrinsic(intrinsic, args) if intrinsic.writes_cache() => {
                    let source = args[0].index();
                    let mut cache = match analysis.in_place[at] {
                        Some(k) => take_state(&mut self.backend, &mut self.states, k, &mut values, args[0])?,
                        None => self.backend.copy(held(&values, source)).map_err(RunError::Memory)?,
                    };
                    let rest: Vec<&B::Buffer> = args[1..].iter().map(|v| held(&values, v.index())).collect();
                    let written = self.backend.write_cache(site, *intrinsic, &mut cache, &rest);
                    let cache = Arc::new(cache);
                    // The state always holds a whole cache, even if this
                    // call fails later (then with this write in it).
                    if let Some(k) = analysis.in_place[at] {
                        self.states[k] = Arc::clone(&cache);
                    }
                    written.map_err(failed)?;
                    Some(cache)
                }
                NodeKind::Intrinsic(intrinsic, args) => {
                    let args: Vec<&B::Buffer> = args.iter().map(|v| held(&values, v.index())).collect();
                    Some(Arc::new(self.backend.intrinsic(site, *intrinsic, &args).map_err(failed)?))
                }
                NodeKind::WriteState(k, value) => {
                    let written = values[value.index()].as_ref().expect("a value is read only while it is live");
                    // A state holds floats as f32, even when it takes a
                    // parameter's value (held as stored).
                    let holds_bits = crate::tensor::held_as_stored(&entry.nodes[value.index()], &self.model.params);
                    writes.push((
                        *k,
                        if holds_bits {
                            Arc::new(self.backend.copy(written).map_err(RunError::Memory)?)
                        } else {
                            Arc::clone(written)
                        },
                    ));
                    None
                }
                NodeKind::Assert(value, message) => {
                    settle(&mut self.backend, &self.model, number, &shown)?;
                    if self.backend.download(held(&values, value.index())).map_err(RunError::Memory)?.data
                        != Data::Bool(vec![true])
                    {
                        let message = format!("{message}{}", inputs_behind(entry, at, &shown));
                        return Err(RunError::Assertion { entry: entry.name.clone(), message });
                    }
                    None
                }
            };
            if let (Some(profile), Some((started, bytes_before))) = (self.profile.as_mut(), started) {
                let weight_bytes =
                    self.backend.weight_bytes_read().zip(bytes_before).map_or(0, |(after, before)| after - before);
                let kind = match &node.kind {
                    NodeKind::Compute(_) if analysis.contraction[at] => "contraction",
                    NodeKind::Compute(_) => "compute",
                    NodeKind::Intrinsic(intrinsic, _) => intrinsic.name(),
                    NodeKind::Input(_) => "input",
                    _ => "other",
                };
                profile.add(kind, node.source.as_ref(), started.elapsed().as_secs_f64(), weight_bytes);
            }
            values.push(value);
            // Values read for the last time are released now.
            for read in &analysis.reads[at] {
                if analysis.last_reads[read.index()] == at {
                    if let Some(buffer) = values[read.index()].take().and_then(|value| Arc::try_unwrap(value).ok()) {
                        self.backend.release(buffer);
                    }
                }
            }
        }
        settle(&mut self.backend, &self.model, number, &shown)?;
        let replaced: Vec<Arc<B::Buffer>> =
            writes.into_iter().map(|(state, value)| std::mem::replace(&mut self.states[state], value)).collect();
        let started = self.profile.is_some().then(std::time::Instant::now);
        let outputs = entry
            .outputs
            .iter()
            .map(|v| self.backend.download(held(&values, v.index())))
            .collect::<Result<_, _>>()
            .map_err(RunError::Memory)?;
        if let (Some(profile), Some(started)) = (self.profile.as_mut(), started) {
            profile.add("output", None, started.elapsed().as_secs_f64(), 0);
        }
        // The states' values this call replaced go back to the backend for
        // the next call's (a decode step writes the same states each time),
        // once nothing of the call holds them.
        drop(values);
        for buffer in replaced.into_iter().filter_map(|value| Arc::try_unwrap(value).ok()) {
            self.backend.release(buffer);
        }
        Ok(outputs)
    }
}

/// State `k`, read once as `read`, taken out of the states and the values
/// so that a node can change it where it lies (a copy where something
/// else holds it too); the node puts it back.
fn take_state<B: Backend>(
    backend: &mut B,
    states: &mut [Arc<B::Buffer>],
    k: usize,
    values: &mut Values<B::Buffer>,
    read: Value,
) -> Result<B::Buffer, RunError> {
    values[read.index()] = None;
    let empty = backend.zeros(Dtype::Bool, &[]).map_err(RunError::Memory)?;
    let held = std::mem::replace(&mut states[k], Arc::new(empty));
    match Arc::try_unwrap(held) {
        Ok(state) => Ok(state),
        Err(shared) => {
            let copy = backend.copy(&shared);
            states[k] = shared;
            copy.map_err(RunError::Memory)
        }
    }
}

/// A live value; the plan frees nothing before its last read.
fn held<B>(values: &Values<B>, at: usize) -> &B {
    values[at].as_deref().expect("a value is read only while it is live")
}

/// What `backend` learned of entry `number`'s call only once its work ran
/// (`Backend::settle`), as the error at the node that raised it.
fn settle<B: Backend>(backend: &mut B, model: &Model, number: usize, shown: &[Option<String>]) -> Result<(), RunError> {
    let entry = &model.entries[number];
    backend.settle(entry, number).map_err(|(node, error)| describe(model, entry, node, error, shown))
}

/// A backend's error at node `at`, with the values it names.
fn describe(model: &Model, entry: &Entry, at: usize, error: NodeError, shown: &[Option<String>]) -> RunError {
    match error {
        NodeError::OutOfRange { value, position, size, source, .. } => {
            let what =
                origin(model, entry, value.index()).unwrap_or_else(|| match &entry.nodes[value.index()].source {
                    Some(place) => format!("the value of {place}"),
                    None => format!("v{}", value.0),
                });
            let holder = source.and_then(|s| origin(model, entry, s.index())).filter(|o| o.starts_with("input"));
            let message = match holder {
                Some(input) => {
                    format!("{input} holds {position}, outside 0..{size} (an axis of {what}){}", place(entry, at))
                }
                None => format!("position {position} is outside 0..{size} (an axis of {what}){}", place(entry, at)),
            };
            RunError::OutOfRange { entry: entry.name.clone(), message }
        }
        NodeError::Check(message) => RunError::Assertion {
            entry: entry.name.clone(),
            message: format!("{message}{}", inputs_behind(entry, at, shown)),
        },
    }
}

/// The most elements an input may have for a failed check to show it.
const SHOWN_ELEMENTS: usize = 8;

/// An input's values as a failed check shows them (`64`, `[0, 5]`), if
/// it has at most [`SHOWN_ELEMENTS`].
fn shown_values(input: &Tensor) -> Option<String> {
    let text: Vec<String> = match &input.data {
        _ if input.len() > SHOWN_ELEMENTS => return None,
        Data::I64(values) => values.iter().map(ToString::to_string).collect(),
        Data::F32(values) => values.iter().map(ToString::to_string).collect(),
        Data::Bool(values) => values.iter().map(ToString::to_string).collect(),
        Data::Bf16(_) | Data::Blocks(..) => return None,
    };
    Some(if input.shape.is_empty() { text.concat() } else { format!("[{}]", text.join(", ")) })
}

/// The inputs node `at` depends on, through the values it reads, that
/// are small enough to show: ` (input `pos` holds 64)` after a failed
/// check, so that the message says which call failed it.
fn inputs_behind(entry: &Entry, at: usize, shown: &[Option<String>]) -> String {
    let mut seen = vec![false; at + 1];
    let mut pending = vec![at];
    let mut inputs = Vec::new();
    while let Some(node) = pending.pop() {
        if std::mem::replace(&mut seen[node], true) {
            continue;
        }
        match &entry.nodes[node].kind {
            NodeKind::Input(k) => inputs.push(*k),
            kind => pending.extend(plan::reads(kind).iter().map(|v| v.index())),
        }
    }
    inputs.sort_unstable();
    let named: Vec<String> = inputs
        .into_iter()
        .filter_map(|k| shown[k].as_ref().map(|values| format!("input `{}` holds {values}", entry.inputs[k].name)))
        .collect();
    if named.is_empty() {
        String::new()
    } else {
        format!(" ({})", named.join(", "))
    }
}

/// Where node `at` was lowered from, for messages: `, read at FILE:LINE:COL`.
fn place(entry: &Entry, at: usize) -> String {
    entry.nodes[at].source.as_ref().map_or_else(|| format!(" (at v{at})"), |place| format!(", read at {place}"))
}

/// What a value is, for messages: an input, a parameter, a state.
fn origin(model: &Model, entry: &Entry, at: usize) -> Option<String> {
    match entry.nodes[at].kind {
        NodeKind::Input(k) => Some(format!("input `{}`", entry.inputs[k].name)),
        NodeKind::Param(k) => Some(format!("param `{}`", model.params[k].path)),
        NodeKind::State(k) => Some(format!("state `{}`", model.states[k].path)),
        _ => None,
    }
}

fn shape_text(shape: &[usize]) -> String {
    format!("[{}]", shape.iter().map(ToString::to_string).collect::<Vec<_>>().join(", "))
}

/// The entry's generics from its inputs' shapes, after checking every
/// input's rank, shape and dtype and the entry's `where` clauses.
fn bind_dims(entry: &Entry, inputs: &[Tensor]) -> Result<Dims, RunError> {
    let error = |message: String| RunError::Inputs { entry: entry.name.clone(), message };
    if inputs.len() != entry.inputs.len() {
        return Err(error(format!("takes {} input(s), {} given", entry.inputs.len(), inputs.len())));
    }
    let mut dims = Dims::new();
    for (input, tensor) in entry.inputs.iter().zip(inputs) {
        let expected: Vec<String> = input.shape.iter().map(ToString::to_string).collect();
        if tensor.shape.len() != input.shape.len() {
            return Err(error(format!(
                "`{}` must have shape [{}], found {}",
                input.name,
                expected.join(", "),
                shape_text(&tensor.shape)
            )));
        }
        if tensor.dtype != input.dtype {
            return Err(error(format!(
                "`{}` must be {}, found {}",
                input.name,
                input.dtype.name(),
                tensor.dtype.name()
            )));
        }
        for (dim, &size) in input.shape.iter().zip(&tensor.shape) {
            if let Some(Atom::Generic(name)) = dim.as_atom() {
                dims.entry(name.clone()).or_insert(size as i64);
            }
        }
    }
    for (input, tensor) in entry.inputs.iter().zip(inputs) {
        let fits =
            input.shape.iter().zip(&tensor.shape).all(|(dim, &size)| dim.value_under(&dims).ok() == Some(size as i64));
        if !fits {
            let expected: Vec<String> = input
                .shape
                .iter()
                .map(|d| d.value_under(&dims).ok().map_or_else(|| d.to_string(), |v| v.to_string()))
                .collect();
            return Err(error(format!(
                "`{}` must have shape [{}], found {}",
                input.name,
                expected.join(", "),
                shape_text(&tensor.shape)
            )));
        }
    }
    for requirement in &entry.requires {
        let holds = match (requirement.lhs.value_under(&dims), requirement.rhs.value_under(&dims)) {
            (Ok(lhs), Ok(rhs)) => requirement.op.holds_between(lhs, rhs),
            _ => false,
        };
        if !holds {
            return Err(RunError::Requirement {
                entry: entry.name.clone(),
                requirement: format!("`{}`", requirement.text),
            });
        }
    }
    Ok(dims)
}

/// A loaded model on some backend: what the runtime holds. The backend
/// is chosen when it is made and hidden behind this type.
pub struct Machine {
    run: Box<dyn Run>,
}

/// What the runtime needs of an [`Executor`], whatever its backend: one
/// that can move to another thread (the server's scheduler owns it there).
trait Run: Send {
    fn model(&self) -> &Model;
    fn backend(&self) -> &'static str;
    fn weight_bytes_read(&self) -> Option<u64>;
    fn reset(&mut self) -> Result<(), RunError>;
    fn call(&mut self, entry: &str, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, RunError>;
    fn state_rows(&mut self, row: usize, positions: usize) -> Result<Vec<Tensor>, RunError>;
    fn set_state_rows(&mut self, row: usize, rows: &[Tensor]) -> Result<(), RunError>;
    fn profile(&mut self) -> &mut Option<Profile>;
}

impl<B: Backend + Send + 'static> Run for Executor<B>
where
    B::Buffer: Send + Sync,
{
    fn model(&self) -> &Model {
        &self.model
    }
    fn backend(&self) -> &'static str {
        self.backend.name()
    }
    fn weight_bytes_read(&self) -> Option<u64> {
        self.backend.weight_bytes_read()
    }
    fn reset(&mut self) -> Result<(), RunError> {
        Executor::reset(self)
    }
    fn call(&mut self, entry: &str, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, RunError> {
        Executor::call(self, entry, inputs)
    }
    fn state_rows(&mut self, row: usize, positions: usize) -> Result<Vec<Tensor>, RunError> {
        Executor::state_rows(self, row, positions)
    }
    fn set_state_rows(&mut self, row: usize, rows: &[Tensor]) -> Result<(), RunError> {
        Executor::set_state_rows(self, row, rows)
    }
    fn profile(&mut self) -> &mut Option<Profile> {
        &mut self.profile
    }
}

impl Machine {
    /// `model` with `params` on `backend`, which readies every entry first.
    pub fn new<B: Backend + Send + 'static>(
        model: Model,
        params: Vec<Tensor>,
        backend: B,
    ) -> Result<Machine, BuildError>
    where
        B::Buffer: Send + Sync,
    {
        Ok(Machine { run: Box::new(Executor::new(model, params, backend)?) })
    }

    pub fn model(&self) -> &Model {
        self.run.model()
    }

    /// The backend's name: `interp`, `cpu`.
    pub fn backend(&self) -> &'static str {
        self.run.backend()
    }

    /// The bytes of weights the backend's contractions have read so far,
    /// where the backend counts them (`Backend::weight_bytes_read`).
    pub fn weight_bytes_read(&self) -> Option<u64> {
        self.run.weight_bytes_read()
    }

    /// Zeroes every state, as at load.
    pub fn reset(&mut self) -> Result<(), RunError> {
        self.run.reset()
    }

    pub fn call(&mut self, entry: &str, inputs: Vec<Tensor>) -> Result<Vec<Tensor>, RunError> {
        self.run.call(entry, inputs)
    }

    /// Row `row` of every state, the caches written at token positions only
    /// their first `positions` (`rows::positional_states`): what a prompt
    /// of `positions` tokens left in the row.
    pub fn state_rows(&mut self, row: usize, positions: usize) -> Result<Vec<Tensor>, RunError> {
        self.run.state_rows(row, positions)
    }

    /// Row `row` of every recurrent state (those not written at token
    /// positions, `rows::positional_states`), the positional ones empty:
    /// what a row needs put back to return to this moment, since a cache
    /// written at later positions is overwritten before it is read. Given
    /// back by [`Machine::set_state_rows`].
    pub fn recurrent_rows(&mut self, row: usize) -> Result<Vec<Tensor>, RunError> {
        self.run.state_rows(row, 0)
    }

    /// Rows that [`Machine::state_rows`] gave, written back into row `row`
    /// (of this machine or another of the same model).
    pub fn set_state_rows(&mut self, row: usize, rows: &[Tensor]) -> Result<(), RunError> {
        self.run.set_state_rows(row, rows)
    }

    /// Starts timing every node by kind (from empty), or stops.
    pub fn set_profiling(&mut self, on: bool) {
        *self.run.profile() = on.then(Profile::default);
    }

    /// The time by kind of node since profiling started, if it is on.
    pub fn profile(&mut self) -> Option<Profile> {
        self.run.profile().clone()
    }
}
