//! The CUDA backend: a model's PTX set (`ptx_set`, built before, here or
//! elsewhere), loaded into the device through the CUDA driver (cudarc,
//! loaded when the backend starts: a binary built with it runs on machines
//! without CUDA and says so), and run on one stream. Parameters are
//! uploaded once, in their dtype; states, caches and every value an entry
//! computes stay in device memory (released values' memory kept for later
//! values of the same size: `Pool`); only inputs go in and outputs come
//! back. Each launch is a thread per work item (a warp's, where the
//! launch splits items across lanes), as many to a block as the launch
//! says, a node's kernels in order with one scratch buffer (kept, and
//! grown when a node needs more), or a launch group's kernel at its first
//! member, the others' values kept until the executor reaches them; every
//! buffer passed as its memref descriptor
//! (`pipeline`), with the dims table of the call (uploaded once per dims)
//! and one faults table, read back once when the call settles (if a kernel
//! that can raise a fault ran): it names the node the call failed at, so a
//! fault is reported there without a wait after every kernel. An entry's PTX is loaded (compiled by
//! the driver) when the entry is first called.

use super::layout::{loaded, stored};
use super::{GpuError, GroupLaunch, Launch, PtxSet, Role};
use cudarc::driver::{CudaContext, CudaFunction, CudaSlice, CudaStream, LaunchConfig, PushKernelArg};
use linnet_exec::tensor::{Data, Tensor};
use linnet_exec::{shape_value, Backend, BuildError, MemoryError, NodeError, Site, Values};
use linnet_ir::analysis::Analysis;
use linnet_ir::quant::BlockFormat;
use linnet_ir::Dtype;
use linnet_ir::{Entry, Intrinsic, Model};
use std::collections::HashMap;
use std::sync::Arc;

/// A value in device memory: its stored bytes, its type and shape, and
/// the block format a quantized parameter is stored in.
pub struct DeviceBuffer {
    bytes: CudaSlice<u8>,
    dtype: Dtype,
    shape: Vec<usize>,
    blocks: Option<BlockFormat>,
}

impl DeviceBuffer {
    /// The elements of its memref: values, or a quantized parameter's
    /// bytes.
    fn elements(&self) -> usize {
        let values = self.shape.iter().product();
        match self.blocks {
            Some(format) => format.row_bytes(values).expect("blocks are whole when they are loaded"),
            None => values,
        }
    }
}

/// One entry's kernels: its PTX until the entry is first called (the
/// driver compiles PTX as it loads it: only entries that run pay), then
/// loaded.
enum EntryKernels {
    Pending(super::ptx_set::EntryPtx),
    Loaded(LoadedEntry),
}

/// An entry's loaded kernels: per node its launches, in the order they
/// run, with their functions (none for a group's member: its group
/// launches it); its launch groups with theirs, and each grouped node's
/// role.
#[derive(Default)]
struct LoadedEntry {
    kernels: Vec<Vec<(Launch, Option<CudaFunction>)>>,
    groups: Vec<(GroupLaunch, CudaFunction)>,
    roles: HashMap<usize, Role>,
}

/// The backend: a context on one device, its stream, the loaded kernels.
pub struct Cuda {
    context: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// The device's architecture, `sm_90`.
    arch: String,
    /// The PTX it runs, until `prepare` takes it.
    set: Option<PtxSet>,
    entries: Vec<EntryKernels>,
    /// Dims tables already on the device, by their contents.
    dims: HashMap<Vec<i64>, CudaSlice<i64>>,
    faults: CudaSlice<i64>,
    /// Whether a kernel that can raise a fault ran since the faults were
    /// last read.
    unsettled: bool,
    /// The scratch of the nodes that have one: the largest asked for so
    /// far, reused by each (the stream runs one node at a time).
    scratch: Option<CudaSlice<u8>>,
    /// Values a launch group computed before the executor reached their
    /// nodes, by node.
    ahead: HashMap<usize, DeviceBuffer>,
    /// Device memory of released values, for later values of its size.
    pool: Pool,
}

/// Device memory the executor released, by its size in bytes, taken again
/// for a value of the same size: a decode step's values are the last
/// step's sizes, so a step after the first allocates nothing. The stream
/// runs in order, so a buffer taken again is written only after its last
/// reader ran. At most [`Pool::LIMIT`] bytes are kept; past that a
/// released buffer is freed.
#[derive(Default)]
struct Pool {
    free: HashMap<usize, Vec<CudaSlice<u8>>>,
    bytes: usize,
}

impl Pool {
    const LIMIT: usize = 4 << 30;

    fn take(&mut self, bytes: usize) -> Option<CudaSlice<u8>> {
        let slice = self.free.get_mut(&bytes)?.pop()?;
        self.bytes -= bytes;
        Some(slice)
    }

    fn keep(&mut self, slice: CudaSlice<u8>) {
        let bytes = slice.len();
        if self.bytes + bytes <= Self::LIMIT {
            self.bytes += bytes;
            self.free.entry(bytes).or_default().push(slice);
        }
    }
}

/// A driver error as text.
fn driver(what: &str, error: cudarc::driver::DriverError) -> String {
    format!("{what}: {error:?}")
}

impl Cuda {
    /// The first device, through the CUDA driver; without a driver or a
    /// device, the reason.
    pub fn open() -> Result<Cuda, GpuError> {
        // SAFETY: only probes for the driver library.
        if !unsafe { cudarc::driver::sys::is_culib_present() } {
            return Err(GpuError::Driver("no CUDA driver on this machine (libcuda was not found): the cuda backend needs an NVIDIA GPU and its driver".into()));
        }
        let context = CudaContext::new(0).map_err(|e| GpuError::Driver(driver("no CUDA device could be opened", e)))?;
        let (major, minor) =
            context.compute_capability().map_err(|e| GpuError::Driver(driver("the device's compute capability", e)))?;
        let stream = context.default_stream();
        let faults = stream
            .alloc_zeros::<i64>(super::FAULT_SLOTS)
            .map_err(|e| GpuError::Driver(driver("device memory for the faults table", e)))?;
        Ok(Cuda {
            context,
            stream,
            arch: format!("sm_{major}{minor}"),
            set: None,
            entries: Vec::new(),
            dims: HashMap::new(),
            faults,
            unsettled: false,
            scratch: None,
            ahead: HashMap::new(),
            pool: Pool::default(),
        })
    }

    /// The device's architecture, `sm_90`: what its PTX is built for.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    /// The backend running `set` (checked against the model when it is
    /// readied).
    pub fn running(self, set: PtxSet) -> Cuda {
        Cuda { set: Some(set), ..self }
    }

    /// The device, in words: `NVIDIA H200 (sm_90, 139.8 GiB)`.
    pub fn device(&self) -> String {
        let name = self.context.name().unwrap_or_else(|_| "an unnamed device".into());
        let memory = self
            .context
            .total_mem()
            .map(|bytes| format!(", {:.1} GiB", bytes as f64 / (1u64 << 30) as f64))
            .unwrap_or_default();
        format!("{name} ({}{memory})", self.arch)
    }

    /// Device memory for a value of `dtype` and `shape`: zeroed, or left
    /// as it is for a value that is written whole before it is read. A
    /// released buffer of the same size is taken first ([`Pool`]).
    fn allocate(&mut self, dtype: Dtype, shape: &[usize], zeroed: bool) -> Result<DeviceBuffer, MemoryError> {
        // At least one byte: a zero-sized value still has an address.
        let bytes = (shape.iter().product::<usize>() * dtype.bytes()).max(1);
        let failed = |e| MemoryError(driver(&format!("device memory for {bytes} bytes"), e));
        let slice = match self.pool.take(bytes) {
            Some(mut slice) => {
                if zeroed {
                    self.stream.memset_zeros(&mut slice).map_err(failed)?;
                }
                slice
            }
            None if zeroed => self.stream.alloc_zeros::<u8>(bytes).map_err(failed)?,
            // SAFETY: bytes, which the caller writes whole before they are read.
            None => unsafe { self.stream.alloc::<u8>(bytes) }.map_err(failed)?,
        };
        Ok(DeviceBuffer { bytes: slice, dtype, shape: shape.to_vec(), blocks: None })
    }

    /// Device memory for node `site`'s value, which its kernel writes whole
    /// (each element is a work item's, or in a delta rule item's column).
    fn output(&mut self, site: &Site<'_>) -> Result<DeviceBuffer, NodeError> {
        self.allocate(site.entry.nodes[site.at].dtype, site.shape, false).map_err(|e| NodeError::Check(e.0))
    }

    /// Loads the PTX of `site`'s entry, if it is not yet.
    fn load(&mut self, site: &Site<'_>) -> Result<(), NodeError> {
        let EntryKernels::Pending(ptx) = &self.entries[site.entry_number] else { return Ok(()) };
        let failed = |what: &str, e| NodeError::Check(driver(&format!("{what} of entry `{}`", site.entry.name), e));
        let module = self
            .context
            .load_module(cudarc::nvrtc::Ptx::from_src(ptx.ptx.clone()))
            .map_err(|e| failed("the driver refused the PTX", e))?;
        let function =
            |name: &str| module.load_function(name).map_err(|e| failed(&format!("no `{name}` in the PTX"), e));
        let roles = super::roles(ptx.groups.iter().map(|group| group.members.as_slice()));
        let mut kernels: Vec<Vec<(Launch, Option<CudaFunction>)>> =
            (0..site.entry.nodes.len()).map(|_| Vec::new()).collect();
        for launch in &ptx.launches {
            let function = if roles.contains_key(&launch.node) { None } else { Some(function(&launch.name)?) };
            kernels[launch.node].push((launch.clone(), function));
        }
        let groups = ptx
            .groups
            .iter()
            .map(|group| Ok((group.clone(), function(&group.name)?)))
            .collect::<Result<_, NodeError>>()?;
        self.entries[site.entry_number] = EntryKernels::Loaded(LoadedEntry { kernels, groups, roles });
        Ok(())
    }

    /// The site's entry, loaded.
    fn loaded(&self, site: &Site<'_>) -> &LoadedEntry {
        let EntryKernels::Loaded(loaded) = &self.entries[site.entry_number] else {
            panic!("an entry's PTX is loaded before its kernels run")
        };
        loaded
    }

    /// The site's launches, in the order they run; they read the same
    /// loads.
    fn kernels(&self, site: &Site<'_>) -> &[(Launch, Option<CudaFunction>)] {
        let kernels = &self.loaded(site).kernels[site.at];
        assert!(!kernels.is_empty(), "a kernel for every compute and intrinsic node");
        kernels
    }

    /// The dims table `dims` on the device, uploaded the first time.
    fn dims_table(&mut self, dims: &[i64]) -> Result<(), NodeError> {
        if !self.dims.contains_key(dims) {
            // At least one element: an empty table still has an address.
            let values = if dims.is_empty() { vec![0] } else { dims.to_vec() };
            let table =
                self.stream.clone_htod(&values).map_err(|e| NodeError::Check(driver("uploading a dims table", e)))?;
            self.dims.insert(dims.to_vec(), table);
        }
        Ok(())
    }

    /// Scratch of at least `bytes`: the one kept, grown if it is smaller.
    fn scratch_of(&mut self, bytes: usize) -> Result<(), NodeError> {
        if self.scratch.as_ref().is_none_or(|scratch| scratch.len() < bytes) {
            self.scratch = None;
            // SAFETY: a node's first kernel writes what its later ones read.
            let scratch = unsafe { self.stream.alloc::<u8>(bytes.max(1)) }
                .map_err(|e| NodeError::Check(driver(&format!("device memory for {bytes} bytes of scratch"), e)))?;
            self.scratch = Some(scratch);
        }
        Ok(())
    }

    /// Launches the site's kernels writing `out` from `args` (its loads'
    /// values, in order); the faults they raise are read when the call
    /// settles.
    fn launch(&mut self, site: &Site<'_>, out: &DeviceBuffer, args: &[&DeviceBuffer]) -> Result<(), NodeError> {
        self.load(site)?;
        let bound = |dim: &linnet_ir::dim::Dim| dim.value_under(site.dims).expect("an entry's dims are bound");
        let scratch =
            self.kernels(site)[0].0.scratch.as_ref().map(|scratch| (bound(&scratch.elements), scratch.dtype.bytes()));
        if let Some((elements, bytes)) = scratch {
            self.scratch_of(elements as usize * bytes)?;
        }
        for stage in 0..self.kernels(site).len() {
            let (threads, dims) = {
                let (launch, _) = &self.kernels(site)[stage];
                (
                    launch.work.iter().map(bound).product::<i64>() * i64::from(launch.lanes),
                    launch.dims.iter().map(bound).collect::<Vec<i64>>(),
                )
            };
            self.dims_table(&dims)?;
            let (launch, function) = &self.kernels(site)[stage];
            let function = function.as_ref().expect("a node launched alone has its functions");
            let buffers: Vec<(&CudaSlice<u8>, usize)> = std::iter::once(out)
                .chain(args.iter().copied())
                .map(|buffer| (&buffer.bytes, buffer.elements()))
                .chain(scratch.and_then(|(elements, _)| Some((self.scratch.as_ref()?, elements as usize))))
                .collect();
            self.run(function, &launch.name, &buffers, &dims, threads, launch.threads)?;
            let faults = launch.faults;
            self.unsettled |= faults;
        }
        Ok(())
    }

    /// Launches group `group` of the site's entry (the site its first
    /// member): gives the site's value and keeps the other members'.
    fn launch_group(
        &mut self,
        site: &Site<'_>,
        group: usize,
        values: &Values<DeviceBuffer>,
    ) -> Result<DeviceBuffer, NodeError> {
        let bound = |dim: &linnet_ir::dim::Dim| dim.value_under(site.dims).expect("an entry's dims are bound");
        let (members, threads, dims) = {
            let (launch, _) = &self.loaded(site).groups[group];
            (launch.members.clone(), bound(&launch.work), launch.dims.iter().map(bound).collect::<Vec<i64>>())
        };
        let outputs = members
            .iter()
            .map(|&member| {
                self.allocate(
                    site.entry.nodes[member].dtype,
                    &shape_value(&site.entry.nodes[member].shape, site.dims),
                    false,
                )
                .map_err(|e| NodeError::Check(e.0))
            })
            .collect::<Result<Vec<DeviceBuffer>, NodeError>>()?;
        self.dims_table(&dims)?;
        let (launch, function) = &self.loaded(site).groups[group];
        let loads: Vec<std::sync::Arc<DeviceBuffer>> =
            launch.loads.iter().map(|&value| values[value].clone().expect("a loaded value is live")).collect();
        let buffers: Vec<(&CudaSlice<u8>, usize)> = outputs
            .iter()
            .chain(loads.iter().map(|load| load.as_ref()))
            .map(|buffer| (&buffer.bytes, buffer.elements()))
            .collect();
        self.run(function, &launch.name, &buffers, &dims, threads, launch.threads)?;
        let faults = launch.faults;
        self.unsettled |= faults;
        let mut outputs = members.into_iter().zip(outputs);
        let (_, first) = outputs.next().expect("a group has members");
        self.ahead.extend(outputs);
        Ok(first)
    }

    /// Launches `function` (`name`, for messages) as `threads` threads,
    /// `block` to a block, given `buffers` (device memory and its
    /// elements, in the kernel's argument order), then the dims table
    /// `dims` (on the device: [`Cuda::dims_table`]) and the faults table.
    fn run(
        &self,
        function: &CudaFunction,
        name: &str,
        buffers: &[(&CudaSlice<u8>, usize)],
        dims: &[i64],
        threads: i64,
        block: u32,
    ) -> Result<(), NodeError> {
        if threads == 0 {
            return Ok(());
        }
        let blocks = u32::try_from((threads + i64::from(block) - 1) / i64::from(block))
            .map_err(|_| NodeError::Check(format!("{threads} threads are more than one launch holds")))?;
        // Each memref's descriptor after its two pointers (allocated and
        // aligned, the same): offset 0, size, stride 1.
        let descriptor = |elements: usize| [0, elements as i64, 1];
        let sizes: Vec<[i64; 3]> = buffers.iter().map(|(_, elements)| descriptor(*elements)).collect();
        let (table, table_size, faults_size) =
            (&self.dims[dims], descriptor(dims.len()), descriptor(super::FAULT_SLOTS));
        let mut launch = self.stream.launch_builder(function);
        for ((bytes, _), size) in buffers.iter().zip(&sizes) {
            launch.arg(*bytes).arg(*bytes).arg(&size[0]).arg(&size[1]).arg(&size[2]);
        }
        launch.arg(table).arg(table).arg(&table_size[0]).arg(&table_size[1]).arg(&table_size[2]);
        launch.arg(&self.faults).arg(&self.faults).arg(&faults_size[0]).arg(&faults_size[1]).arg(&faults_size[2]);
        let config = LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (block, 1, 1), shared_mem_bytes: 0 };
        // SAFETY: the kernel's parameters are these descriptors, in this
        // order (`emit`'s convention as `pipeline` lowers it), each
        // pointing at a live device buffer of its size.
        unsafe { launch.launch(config) }.map_err(|e| NodeError::Check(driver(&format!("launching `{name}`"), e)))?;
        Ok(())
    }
}

impl Backend for Cuda {
    type Buffer = DeviceBuffer;

    /// Quantized parameters are uploaded as their blocks, which the
    /// kernels decode where they read them.
    fn reads_blocks(&self) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn prepare(&mut self, model: &Model, _: &[Analysis]) -> Result<(), BuildError> {
        let whole = |message: String| BuildError {
            backend: "cuda",
            entry: model.name.clone(),
            node: None,
            source: None,
            message,
        };
        let set = self.set.take().ok_or_else(|| whole("no PTX to run: the backend was given none".into()))?;
        set.check(model, &self.arch).map_err(|error| whole(error.to_string()))?;
        let mut by_name = set.entries;
        self.entries = model
            .entries
            .iter()
            .map(|entry| match by_name.remove(&entry.name) {
                Some(ptx) => EntryKernels::Pending(ptx),
                // An entry of no kernels (`check` made sure it needs none).
                None => EntryKernels::Loaded(LoadedEntry::default()),
            })
            .collect();
        Ok(())
    }

    fn upload(&mut self, tensor: Tensor) -> Result<DeviceBuffer, MemoryError> {
        let bytes = stored(&tensor, tensor.dtype).map_err(|e| MemoryError(e.to_string()))?;
        let slice = self
            .stream
            .clone_htod(&if bytes.is_empty() { vec![0] } else { bytes })
            .map_err(|e| MemoryError(driver("uploading to the device", e)))?;
        let blocks = match tensor.data {
            Data::Blocks(format, _) => Some(format),
            _ => None,
        };
        Ok(DeviceBuffer { bytes: slice, dtype: tensor.dtype, shape: tensor.shape, blocks })
    }

    fn download(&mut self, buffer: &DeviceBuffer) -> Result<Tensor, MemoryError> {
        if let Some(format) = buffer.blocks {
            return Err(MemoryError(format!("a parameter stored in {format} blocks is not read back from the device")));
        }
        let mut bytes =
            self.stream.clone_dtoh(&buffer.bytes).map_err(|e| MemoryError(driver("reading from the device", e)))?;
        bytes.truncate(buffer.elements() * buffer.dtype.bytes());
        Ok(loaded(&bytes, buffer.dtype, buffer.shape.clone()))
    }

    fn zeros(&mut self, dtype: Dtype, shape: &[usize]) -> Result<DeviceBuffer, MemoryError> {
        self.allocate(dtype, shape, true)
    }

    fn release(&mut self, buffer: DeviceBuffer) {
        self.pool.keep(buffer.bytes);
    }

    fn copy(&mut self, buffer: &DeviceBuffer) -> Result<DeviceBuffer, MemoryError> {
        if let Some(format) = buffer.blocks {
            return Err(MemoryError(format!("a parameter stored in {format} blocks is not copied on the device")));
        }
        let mut copy = self.allocate(buffer.dtype, &buffer.shape, false)?;
        self.stream
            .memcpy_dtod(&buffer.bytes, &mut copy.bytes)
            .map_err(|e| MemoryError(driver("copying on the device", e)))?;
        Ok(copy)
    }

    fn compute(&mut self, site: Site<'_>, values: &Values<DeviceBuffer>) -> Result<DeviceBuffer, NodeError> {
        self.load(&site)?;
        match self.loaded(&site).roles.get(&site.at) {
            Some(Role::Follows) => {
                return Ok(self.ahead.remove(&site.at).expect("a group's first member computed the rest"))
            }
            Some(&Role::Leads(group)) => return self.launch_group(&site, group, values),
            None => {}
        }
        let out = self.output(&site)?;
        let loads: Vec<std::sync::Arc<DeviceBuffer>> = self.kernels(&site)[0]
            .0
            .loads
            .iter()
            .map(|&value| values[value].clone().expect("a loaded value is live"))
            .collect();
        let args: Vec<&DeviceBuffer> = loads.iter().map(|load| load.as_ref()).collect();
        self.launch(&site, &out, &args)?;
        Ok(out)
    }

    fn intrinsic(&mut self, site: Site<'_>, _: Intrinsic, args: &[&DeviceBuffer]) -> Result<DeviceBuffer, NodeError> {
        let out = self.output(&site)?;
        self.launch(&site, &out, args)?;
        Ok(out)
    }

    fn settle(&mut self, entry: &Entry, entry_number: usize) -> Result<(), (usize, NodeError)> {
        if !std::mem::take(&mut self.unsettled) {
            return Ok(());
        }
        let failed = |what: &str, e| (0, NodeError::Check(driver(what, e)));
        let faults = self.stream.clone_dtoh(&self.faults).map_err(|e| failed("reading the faults table", e))?;
        let faults: [i64; super::FAULT_SLOTS] = faults.try_into().expect("a whole faults table");
        let EntryKernels::Loaded(loaded) = &self.entries[entry_number] else { return Ok(()) };
        let Some(error) = super::raised(&faults, entry, |node, stage| {
            Some(loaded.kernels.get(node)?.get(stage)?.0.checks.as_slice())
        }) else {
            return Ok(());
        };
        self.stream.memset_zeros(&mut self.faults).map_err(|e| failed("clearing the faults table", e))?;
        Err(error)
    }

    fn write_cache(
        &mut self,
        site: Site<'_>,
        _: Intrinsic,
        cache: &mut DeviceBuffer,
        args: &[&DeviceBuffer],
    ) -> Result<(), NodeError> {
        self.launch(&site, cache, args)
    }
}
