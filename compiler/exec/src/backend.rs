//! The backend interface the executor drives. A backend owns where values
//! live (host memory for the interpreter and the CPU, device memory for a
//! GPU) and how each node runs; the executor owns the model, its
//! parameters and states, and the plan. Values cross between the two only
//! as inputs, outputs, parameters at load and a checked assertion's bool.

use crate::tensor::Tensor;
use linnet_ir::Dtype;
use linnet_ir::{Entry, Intrinsic, Model, SourceAt, Value};
use std::fmt;
use std::sync::Arc;

use linnet_ir::analysis::Analysis;

/// An entry's dims, bound from its inputs when it is called.
pub type Dims = linnet_ir::dim::Generics;

/// The values of an entry while it runs, by node: `None` once freed (or
/// not yet computed).
pub type Values<B> = [Option<Arc<B>>];

/// Where in a model a node runs, and its shape under the call's dims.
#[derive(Clone, Copy)]
pub struct Site<'a> {
    pub entry: &'a Entry,
    /// The entry's number in the model.
    pub entry_number: usize,
    /// The node's number in the entry (its value's).
    pub at: usize,
    pub dims: &'a Dims,
    pub shape: &'a [usize],
}

/// Why a node could not be computed, as data: the executor names the
/// values.
#[derive(Clone, Debug, PartialEq)]
pub enum NodeError {
    /// A load of `value` at `position` on `axis` fell outside `0..size`;
    /// `source` is the value the position was read from directly, if any
    /// (an input holding a token id or a position).
    OutOfRange { value: Value, axis: usize, position: i64, size: i64, source: Option<Value> },
    /// A check an intrinsic makes (a cache write outside its cache).
    Check(String),
}

/// Memory the backend could not give or move (a device out of memory, a
/// driver that failed), in its words.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryError(pub String);

impl fmt::Display for MemoryError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A node a backend cannot run, found when it readies a model.
#[derive(Clone, Debug, PartialEq)]
pub struct BuildError {
    pub backend: &'static str,
    pub entry: String,
    /// The node, if the problem is one node's, and where it was written.
    pub node: Option<usize>,
    pub source: Option<SourceAt>,
    pub message: String,
}

impl BuildError {
    /// A problem with node `node` of `entry` (the whole entry's if `None`).
    pub fn new(backend: &'static str, entry: &Entry, node: Option<usize>, message: String) -> BuildError {
        let source = node.and_then(|at| entry.nodes.get(at)).and_then(|n| n.source.clone());
        BuildError { backend, entry: entry.name.clone(), node, source, message }
    }
}

impl BuildError {
    /// A model's parameters or states the backend could not take.
    pub fn memory(backend: &'static str, error: MemoryError) -> BuildError {
        BuildError { backend, entry: String::new(), node: None, source: None, message: error.0 }
    }
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.entry.is_empty() {
            return write!(f, "the {} backend cannot load the model: {}", self.backend, self.message);
        }
        write!(f, "the {} backend cannot run ", self.backend)?;
        if let Some(node) = self.node {
            write!(f, "v{node} of ")?;
        }
        write!(f, "entry `{}`", self.entry)?;
        if let Some(source) = &self.source {
            write!(f, " (lowered from {source})")?;
        }
        write!(f, ": {}", self.message)
    }
}

impl std::error::Error for BuildError {}

/// A way of running the IR. The interpreter, the CPU backend and a GPU
/// backend implement it side by side; none knows the others.
pub trait Backend {
    /// A tensor where this backend computes.
    type Buffer;

    /// The backend's name in messages: `interp`, `cpu`.
    fn name(&self) -> &'static str;

    /// Readies every entry of `model` (`analyses` in entry order): compiles
    /// it or takes code compiled before. A node it cannot run is an error
    /// here, never a silent fallback later.
    fn prepare(&mut self, model: &Model, analyses: &[Analysis]) -> Result<(), BuildError>;

    /// A host tensor moved to where the backend computes (a bf16
    /// parameter arrives held as its bits: `tensor::holds_bits`).
    fn upload(&mut self, tensor: Tensor) -> Result<Self::Buffer, MemoryError>;

    /// A value brought back to the host, floats as f32.
    fn download(&mut self, buffer: &Self::Buffer) -> Result<Tensor, MemoryError>;

    /// A tensor of zeros (a state at load).
    fn zeros(&mut self, dtype: Dtype, shape: &[usize]) -> Result<Self::Buffer, MemoryError>;

    /// A copy the executor may change (a cache written where it is read
    /// again), held as computed values are: floats as f32.
    fn copy(&mut self, buffer: &Self::Buffer) -> Result<Self::Buffer, MemoryError>;

    /// A `Compute` node.
    fn compute(&mut self, site: Site<'_>, values: &Values<Self::Buffer>) -> Result<Self::Buffer, NodeError>;

    /// An intrinsic that makes a new value (attention, the delta rule).
    fn intrinsic(
        &mut self,
        site: Site<'_>,
        intrinsic: Intrinsic,
        args: &[&Self::Buffer],
    ) -> Result<Self::Buffer, NodeError>;

    /// A cache write into `cache`, in place.
    fn write_cache(
        &mut self,
        site: Site<'_>,
        intrinsic: Intrinsic,
        cache: &mut Self::Buffer,
        args: &[&Self::Buffer],
    ) -> Result<(), NodeError>;

    /// Whether it advances a delta rule's state where it lies when the
    /// entry allows it (`Analysis::carried`, `linnet_ir::carry`); if not,
    /// the executor runs the step, the view and the state's write as the
    /// entry has them.
    fn carries_delta_states(&self) -> bool {
        false
    }

    /// A `gated_delta_step` carried in place, asked only of a backend that
    /// carries delta states: `args` are the step's without its state (q,
    /// k, v, decay, beta, scale), `state` is advanced where it lies to the
    /// state the step computes, and the value returned is the step's with
    /// its output row (row 0 of axis 1) as `intrinsic` computes it; its
    /// state rows are unspecified, since nothing reads them.
    fn delta_step_in_place(
        &mut self,
        site: Site<'_>,
        args: &[&Self::Buffer],
        state: &mut Self::Buffer,
    ) -> Result<Self::Buffer, NodeError> {
        let _ = (site, args, state);
        Err(NodeError::Check(format!("the {} backend does not carry delta states", self.name())))
    }

    /// Row `row` (axis 0) of a state on the host, only its first `length`
    /// along axis 2 where given (`rows::read_row`).
    fn read_row(&mut self, buffer: &Self::Buffer, row: usize, length: Option<usize>) -> Result<Tensor, MemoryError> {
        crate::rows::read_row(&self.download(buffer)?, row, length)
    }

    /// A row as [`Backend::read_row`] gives it, written over row `row` of a
    /// state.
    fn write_row(&mut self, buffer: &mut Self::Buffer, row: usize, part: &Tensor) -> Result<(), MemoryError> {
        let mut whole = self.download(buffer)?;
        crate::rows::write_row(&mut whole, row, part)?;
        *buffer = self.upload(whole)?;
        Ok(())
    }

    /// A value the executor holds no more: the backend may keep its memory
    /// for a later value (by default it is freed).
    fn release(&mut self, buffer: Self::Buffer) {
        drop(buffer);
    }

    /// The error of a call of `entry` (number `entry_number`) that the
    /// backend learns of only once the work it queued has run (a GPU's
    /// faults, read once per call): the node that raised it first, and the
    /// error. The executor asks before it checks an assertion, before it
    /// keeps a hoisted value, and once the call's nodes have all run,
    /// before states change and outputs come back: the call fails at the
    /// node it would have stopped at. A
    /// backend that checks every node as it runs it has nothing to say.
    fn settle(&mut self, entry: &Entry, entry_number: usize) -> Result<(), (usize, NodeError)> {
        let _ = (entry, entry_number);
        Ok(())
    }

    /// The bytes of weights this backend's contraction kernels have read
    /// so far, where it counts them (profiles turn them into bandwidth).
    fn weight_bytes_read(&self) -> Option<u64> {
        None
    }

    /// Whether it reads parameters stored in block formats (`Param::
    /// storage`) where they lie; a model with such parameters is refused
    /// by a backend that does not.
    fn reads_blocks(&self) -> bool {
        false
    }
}
