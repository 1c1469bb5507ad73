//! The CPU backend as the executor drives it: values are host tensors,
//! every `Compute` node runs as native code (an artifact's, or compiled
//! by a JIT when the backend readies a model: [`Code`]), attention and the
//! delta rule run on the kernel library's (`linnet_kernels::intrinsics`),
//! rankings (`ir::ranking`) by sorting, and cache writes on the host's. An
//! entry with a node that has no kernel is refused when the model is
//! loaded, never run another way.

use crate::abi::{self, Compiled, LoadFault, NativeKernel};
use linnet_exec::tensor::{Data, Elements, Tensor};
use linnet_exec::{Backend, BuildError, Machine, NodeError, Site, Values};
use linnet_ir::analysis::Analysis;
use linnet_ir::{Entry, Intrinsic, Model, NodeKind, Param, Value};
use linnet_kernels::{intrinsics, matmul, threads};
use std::collections::HashMap;

/// Where a CPU machine's native code comes from: an artifact's kernels
/// (a map from entry name to its code, taken as the model is readied) or
/// a code generator compiling each entry in process.
pub trait Code: Send {
    /// The code of `entry`; an error names the node at fault, if one is.
    fn entry(&mut self, params: &[Param], entry: &Entry, analysis: &Analysis) -> Result<Compiled, CodeError>;
}

/// Why an entry has no code: the node at fault, if one is, and why.
#[derive(Clone, Debug)]
pub struct CodeError {
    pub node: Option<usize>,
    pub message: String,
}

impl Code for HashMap<String, Compiled> {
    fn entry(&mut self, _: &[Param], entry: &Entry, _: &Analysis) -> Result<Compiled, CodeError> {
        self.remove(&entry.name)
            .ok_or_else(|| CodeError { node: None, message: "the artifact has no code for it".into() })
    }
}

/// Native code for every entry, from a [`Code`].
pub struct Cpu {
    /// Where the code comes from, until `prepare` has every entry's.
    code: Box<dyn Code>,
    /// Per entry, in model order, once prepared.
    entries: Vec<Compiled>,
    /// Per entry and node: the value a ranking node ranks.
    rankings: Vec<Vec<Option<Value>>>,
    /// Memory of released values, for the outputs of later nodes.
    pool: Pool,
}

/// Released f32 buffers by length, up to `POOL_BYTES` in all. A large
/// output taken from here is not faulted in and zeroed page by page again
/// (allocations over glibc's mmap threshold, 32 MiB, are fresh mappings
/// every time: a prefill of thousands of tokens makes many).
#[derive(Default)]
struct Pool {
    free: HashMap<usize, Vec<Vec<f32>>>,
    bytes: usize,
}

/// What the pool holds at most.
const POOL_BYTES: usize = 2 << 30;

impl Pool {
    /// A buffer of `len` floats whose contents are unspecified: for an
    /// output every element of which the kernel writes.
    fn take(&mut self, len: usize) -> Vec<f32> {
        match self.free.get_mut(&len).and_then(Vec::pop) {
            Some(buffer) => {
                self.bytes -= len * 4;
                buffer
            }
            None => vec![0.0; len],
        }
    }

    /// Keeps a released tensor's floats. When they do not fit, what the
    /// pool holds is freed first: shapes change between calls (a new
    /// prompt length), and buffers of lengths no longer computed must not
    /// keep the sizes computed now out.
    fn keep(&mut self, tensor: Tensor) {
        let Data::F32(Elements::Owned(buffer)) = tensor.data else { return };
        let bytes = buffer.len() * 4;
        if bytes > POOL_BYTES {
            return;
        }
        if self.bytes + bytes > POOL_BYTES {
            self.free.clear();
            self.bytes = 0;
        }
        self.bytes += bytes;
        self.free.entry(buffer.len()).or_default().push(buffer);
    }
}

impl Cpu {
    pub fn new(code: impl Code + 'static) -> Cpu {
        Cpu { code: Box::new(code), entries: Vec::new(), rankings: Vec::new(), pool: Pool::default() }
    }
}

/// `model` with `params` on the CPU backend, its code from `code`.
pub fn machine(model: Model, params: Vec<Tensor>, code: impl Code + 'static) -> Result<Machine, BuildError> {
    Machine::new(model, params, Cpu::new(code))
}

fn host(tensor: &Tensor) -> *const u8 {
    match &tensor.data {
        Data::F32(x) => x.as_ptr() as *const u8,
        Data::Bf16(x) => x.as_ptr() as *const u8,
        Data::Blocks(_, x) => x.as_ptr(),
        Data::I64(x) => x.as_ptr() as *const u8,
        Data::Bool(x) => x.as_ptr() as *const u8,
    }
}

impl Backend for Cpu {
    type Buffer = Tensor;

    fn name(&self) -> &'static str {
        "cpu"
    }

    fn prepare(&mut self, model: &Model, analyses: &[Analysis]) -> Result<(), BuildError> {
        for (entry, analysis) in model.entries.iter().zip(analyses) {
            let failed = |node: Option<usize>, message: String| BuildError::new("cpu", entry, node, message);
            let compiled =
                self.code.entry(&model.params, entry, analysis).map_err(|error| failed(error.node, error.message))?;
            for (at, node) in entry.nodes.iter().enumerate() {
                if matches!(node.kind, NodeKind::Compute(_)) && compiled.kernels.get(at).is_none_or(Option::is_none) {
                    return Err(failed(Some(at), "no kernel was compiled for this node".into()));
                }
            }
            self.entries.push(compiled);
            self.rankings.push(analysis.ranking.clone());
        }
        Ok(())
    }

    linnet_exec::tensor::host_memory!();

    fn compute(&mut self, site: Site<'_>, values: &Values<Tensor>) -> Result<Tensor, NodeError> {
        if let Some(scores) = self.rankings[site.entry_number][site.at] {
            let scores = values[scores.index()].as_deref().expect("a ranked value is live");
            let widened = linnet_exec::reference::widened(&[scores]);
            let rows = widened[0].as_f32().expect("widened scores are f32");
            let width = site.shape.last().copied().unwrap_or(1);
            return Ok(Tensor::from_i64(
                site.entry.nodes[site.at].dtype,
                site.shape.to_vec(),
                linnet_ir::ranking::ranks(rows, width),
            ));
        }
        let kernel =
            self.entries[site.entry_number].kernels[site.at].as_ref().expect("`prepare` found a kernel for every node");
        run(kernel, site, values, &mut self.pool)
    }

    fn intrinsic(&mut self, site: Site<'_>, intrinsic: Intrinsic, args: &[&Tensor]) -> Result<Tensor, NodeError> {
        let args = linnet_exec::reference::widened(args);
        let args: Vec<&Tensor> = args.iter().map(|arg| arg.as_ref()).collect();
        let out = self.pool.take(site.shape.iter().product());
        Ok(intrinsics::run(intrinsic, &args, site.shape.to_vec(), out))
    }

    fn carries_delta_states(&self) -> bool {
        true
    }

    fn delta_step_in_place(
        &mut self,
        site: Site<'_>,
        args: &[&Tensor],
        state: &mut Tensor,
    ) -> Result<Tensor, NodeError> {
        let args = linnet_exec::reference::widened(args);
        let args: Vec<&Tensor> = args.iter().map(|arg| arg.as_ref()).collect();
        let out = self.pool.take(site.shape.iter().product());
        Ok(intrinsics::delta_step_in_place(&args, state, site.shape.to_vec(), out))
    }

    fn write_cache(
        &mut self,
        _: Site<'_>,
        intrinsic: Intrinsic,
        cache: &mut Tensor,
        args: &[&Tensor],
    ) -> Result<(), NodeError> {
        linnet_exec::reference::write_cache_widened(intrinsic, cache, args)
    }

    fn release(&mut self, buffer: Tensor) {
        self.pool.keep(buffer);
    }

    fn reads_blocks(&self) -> bool {
        true
    }

    fn weight_bytes_read(&self) -> Option<u64> {
        Some(matmul::weight_bytes_read())
    }
}

/// Elements at or above which an elementwise node's rows are shared among
/// the kernels' threads.
const PARALLEL_ELEMENTS: usize = 1 << 16;

/// One kernel call's pointers, shared by the threads that run its rows.
struct Call<'k> {
    kernel: &'k NativeKernel,
    target: *mut u8,
    pointers: Vec<*const u8>,
    table: Vec<i64>,
}

// SAFETY: threads read the same inputs and write disjoint rows of the
// output (`run` gives each its own range).
unsafe impl Sync for Call<'_> {}

impl Call<'_> {
    fn rows(&self, rows: std::ops::Range<usize>) -> Result<(), LoadFault> {
        // SAFETY: the kernel was compiled for these values' shapes and
        // dtypes, its dims table is evaluated under the call's dims, it
        // checks every position before it loads, and writes exactly these
        // rows of the output.
        unsafe { abi::call(self.kernel, self.target, &self.pointers, &self.table, rows) }
    }
}

/// Runs a node's kernel on the values it loads: an elementwise node's
/// rows shared among threads when it is large, as chunks whose first
/// fault (in row order) is the one a single pass would report.
fn run(kernel: &NativeKernel, site: Site<'_>, values: &Values<Tensor>, pool: &mut Pool) -> Result<Tensor, NodeError> {
    let node = &site.entry.nodes[site.at];
    // Every kernel writes every element of its output (an elementwise
    // node all its rows, a contraction all its rows' columns), so a float
    // output may start as any memory of its size.
    let mut out = match node.dtype {
        dtype if dtype.is_float() => {
            Tensor { dtype, shape: site.shape.to_vec(), data: Data::F32(pool.take(site.shape.iter().product()).into()) }
        }
        dtype => Tensor::zeros(dtype, site.shape.to_vec()),
    };
    let target = match &mut out.data {
        Data::F32(x) => x.as_mut_ptr() as *mut u8,
        Data::I64(x) => x.as_mut_ptr() as *mut u8,
        Data::Bool(x) => x.as_mut_ptr() as *mut u8,
        Data::Bf16(_) | Data::Blocks(..) => unreachable!("computed values are held as f32"),
    };
    let call = Call {
        kernel,
        target,
        pointers: kernel
            .record
            .loads
            .iter()
            .map(|v| host(values[v.index()].as_deref().expect("a loaded value is live")))
            .collect(),
        table: kernel
            .record
            .dims
            .iter()
            .map(|d| d.value_under(site.dims).expect("an entry's dims are bound when it is called"))
            .collect(),
    };
    // An elementwise kernel's rows: its first two axes flattened when it
    // has three or more, else its first.
    let rows = match site.shape {
        [] => 1,
        [first] | [first, _] => *first,
        [first, second, ..] => first * second,
    };
    let threads = threads::threads();
    let result = if kernel.record.splits_rows && threads > 1 && rows > 1 && out.len() >= PARALLEL_ELEMENTS {
        let chunk = rows.div_ceil(threads * 4);
        let faults =
            threads::map(rows.div_ceil(chunk), &|part| call.rows(part * chunk..((part + 1) * chunk).min(rows)));
        faults.into_iter().find(Result::is_err).unwrap_or(Ok(()))
    } else {
        call.rows(0..rows)
    };
    match result {
        Ok(()) => Ok(out),
        Err(fault) => {
            let load = &kernel.record.sites[fault.site];
            let source = load.sources.get(fault.axis).copied().flatten();
            Err(NodeError::OutOfRange {
                value: load.value,
                axis: fault.axis,
                position: fault.position,
                size: fault.size,
                source,
            })
        }
    }
}
