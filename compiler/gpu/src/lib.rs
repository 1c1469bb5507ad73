//! The GPU target. Every `Compute` node of every entry is MLIR kernels
//! (`kernel`; a contraction, warps that read its weights' rows together:
//! `contraction`), every intrinsic too (attention: `attention`; the delta
//! rule: `delta`; cache writes: `intrinsic`), all written with `emit`. Most nodes
//! are one kernel; an expert product and attention are several, launched
//! in order, sharing a scratch. With the `nvptx`
//! feature, MLIR (through melior) lowers them to PTX (`pipeline`, for
//! `linnetc build --target nvptx`) or for the host, where they run
//! (`host`, the numerics check without a GPU). The PTX and how to launch
//! each kernel are written beside an artifact's CPU code (`ptx_set`); with
//! the `cuda` feature, the CUDA driver runs them (`cuda`). A node with no
//! kernel (a shape the kernels do not take) is refused by name, never half
//! built.

mod attention;
mod contraction;
#[cfg(feature = "cuda")]
pub mod cuda;
mod delta;
mod dequant;
mod emit;
mod group;
#[cfg(feature = "nvptx")]
pub mod host;
mod intrinsic;
mod kernel;
#[cfg(any(feature = "nvptx", feature = "cuda"))]
mod layout;
#[cfg(feature = "nvptx")]
mod pipeline;
mod ptx_set;

#[cfg(feature = "nvptx")]
use linnet_exec::BuildError;
#[cfg(feature = "nvptx")]
use linnet_ir::Model;
use linnet_ir::NodeKind;

pub use emit::{
    Check, Fault, Form, Kernel, Member, ModelEntry, Scratch, Unsupported, FAULT_SLOTS, THREADS, WARP_LANES,
};
#[cfg(any(feature = "nvptx", feature = "cuda"))]
use emit::{CHECK_SLOT, OWNER_SLOT, REQUEST_SLOT};
pub use group::{groups, roles, Group, Role};
pub use ptx_set::{section_name, GroupLaunch, Launch, PtxError, PtxSet};

/// Why the GPU side failed, by where: MLIR refused the kernels or their
/// lowering, a value the kernels do not hold, the CUDA driver or device,
/// or PTX that does not fit its model.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error("{0}")]
    Mlir(String),
    #[error("{0}")]
    Layout(String),
    #[error("{0}")]
    Driver(String),
    #[error("{0}")]
    Unfit(String),
}

/// The kernels of node `at` of `entry`, in launch order (most nodes take
/// one), if it is a `Compute` node or an intrinsic (other nodes move
/// values and need none).
pub fn node_kernels(entry: ModelEntry<'_>, at: usize, form: Form) -> Option<Result<Vec<Kernel>, Unsupported>> {
    match &entry.nodes[at].kind {
        NodeKind::Compute(_) => Some(match linnet_ir::contraction::of(&entry, at) {
            Some(contraction) => contraction::contraction_kernels(entry, at, form, &contraction),
            None => kernel::kernel(entry, at, form).map(|kernel| vec![kernel]),
        }),
        NodeKind::Intrinsic(..) => Some(intrinsic::intrinsic_kernels(entry, at, form)),
        _ => None,
    }
}

/// Where libdevice (`libdevice.10.bc`, linked for the math functions) is:
/// `$LINNET_LIBDEVICE`, else where `scripts/install-gpu-tools.sh` puts it
/// (under `$LINNET_CUDA_HOME`, default `/opt/linnet-cuda`).
pub fn default_libdevice() -> std::path::PathBuf {
    if let Some(path) = std::env::var_os("LINNET_LIBDEVICE") {
        return path.into();
    }
    let home = std::env::var_os("LINNET_CUDA_HOME").unwrap_or_else(|| "/opt/linnet-cuda".into());
    std::path::Path::new(&home).join("nvidia/cuda_nvcc/nvvm/libdevice/libdevice.10.bc")
}

/// Every node's kernels in `entry` (none for nodes that need none), for
/// backend `backend` to run: a node with no kernel, or of a type the
/// kernels' buffers do not hold (f16), is an error.
#[cfg(feature = "nvptx")]
fn entry_kernels(entry: ModelEntry<'_>, form: Form, backend: &'static str) -> Result<Vec<Vec<Kernel>>, BuildError> {
    let mut kernels = Vec::with_capacity(entry.nodes.len());
    for (at, node) in entry.nodes.iter().enumerate() {
        let node_kernels = node_kernels(entry, at, form)
            .transpose()
            .map_err(|why| BuildError::new(backend, &entry, Some(at), why.0))?
            .unwrap_or_default();
        if !node_kernels.is_empty() && node.dtype == linnet_ir::Dtype::F16 {
            return Err(BuildError::new(
                backend,
                &entry,
                Some(at),
                "f16 values are not held by the GPU kernels' buffers".into(),
            ));
        }
        kernels.push(node_kernels);
    }
    Ok(kernels)
}

/// The MLIR functions of an entry's `kernels` (per node) and launch
/// `groups`: each kernel no group runs, and each group's.
#[cfg(feature = "nvptx")]
fn functions<'k>(kernels: &'k [Vec<Kernel>], groups: &'k [Group]) -> Vec<&'k str> {
    let grouped = roles(groups.iter().map(|group| group.members.as_slice()));
    kernels
        .iter()
        .flatten()
        .filter(|kernel| !grouped.contains_key(&kernel.node))
        .map(|kernel| kernel.text.as_str())
        .chain(groups.iter().map(|group| group.text.as_str()))
        .collect()
}

/// One entry's kernels, its launch groups and the PTX MLIR made of them
/// (one module).
#[cfg(feature = "nvptx")]
pub struct BuiltEntry {
    pub entry: String,
    pub kernels: Vec<Kernel>,
    pub groups: Vec<Group>,
    /// Per node: whether it is hoisted (`ir::plan::hoistable`).
    pub hoisted: Vec<bool>,
    pub ptx: String,
}

/// What the target made of a model: PTX for every entry's kernels, and
/// the nodes it has no kernel for (the model runs only when there are none).
#[cfg(feature = "nvptx")]
pub struct Built {
    pub entries: Vec<BuiltEntry>,
    pub missing: Vec<BuildError>,
}

/// Every entry of `model` as PTX for `arch` (`sm_90`), linking
/// `libdevice` for the math functions when given, its independent nodes
/// launched in groups (`group`). MLIR lowers the entries' modules in
/// parallel, each in its own context. An error is MLIR's failure to lower
/// kernels it was given (a compiler bug).
#[cfg(feature = "nvptx")]
pub fn build(model: &Model, arch: &str, libdevice: Option<&std::path::Path>) -> Result<Built, BuildError> {
    use rayon::prelude::*;
    let mut missing = Vec::new();
    let mut modules = Vec::new();
    for entry in &model.entries {
        let program = ModelEntry { entry, params: &model.params };
        let mut kernels = Vec::with_capacity(entry.nodes.len());
        for at in 0..entry.nodes.len() {
            kernels.push(match node_kernels(program, at, Form::Device) {
                Some(Ok(node_kernels)) => node_kernels,
                Some(Err(Unsupported(why))) => {
                    missing.push(BuildError::new("nvptx", entry, Some(at), format!("no GPU kernel: {why}")));
                    Vec::new()
                }
                None => Vec::new(),
            });
        }
        if kernels.iter().any(|node_kernels| !node_kernels.is_empty()) {
            let hoisted = linnet_ir::plan::hoistable(entry);
            let groups = groups(program, &kernels, &hoisted, Form::Device);
            modules.push((entry, kernels, groups, hoisted));
        }
    }
    // Kernels hold dims, which stay on this thread: only the texts go.
    let texts: Vec<String> = modules
        .iter()
        .map(|(entry, kernels, groups, _)| {
            let module = functions(kernels, groups).join("\n");
            format!("module attributes {{ gpu.container_module }} {{\ngpu.module @{} {{\n{module}}}\n}}\n", entry.name)
        })
        .collect();
    let lowered: Vec<Result<Vec<String>, GpuError>> =
        texts.par_iter().map(|module| pipeline::ptx(module, arch, libdevice)).collect();
    let mut entries = Vec::with_capacity(modules.len());
    for ((entry, kernels, groups, hoisted), ptx) in modules.into_iter().zip(lowered) {
        let mut ptx = ptx.map_err(|error| BuildError::new("nvptx", entry, None, error.to_string()))?;
        if ptx.len() != 1 {
            return Err(BuildError::new(
                "nvptx",
                entry,
                None,
                format!("MLIR made {} PTX modules of one `gpu.module`", ptx.len()),
            ));
        }
        entries.push(BuiltEntry {
            entry: entry.name.clone(),
            kernels: kernels.into_iter().flatten().collect(),
            groups,
            hoisted,
            ptx: ptx.remove(0),
        });
    }
    Ok(Built { entries, missing })
}

/// The error a call of `entry` failed with, from its faults table
/// `faults`, if a kernel raised one: the node that raised it first (the
/// table's owner) and the error as the CPU backend reports it: a load
/// outside its axis with the check's value and axis, the position and the
/// size (`checks(node, stage)`: the axes that kernel's loads check); an
/// intrinsic's as the reference words it (`linnet_exec::reference`).
#[cfg(any(feature = "nvptx", feature = "cuda"))]
fn raised<'k>(
    faults: &[i64; FAULT_SLOTS],
    entry: &linnet_ir::Entry,
    checks: impl Fn(usize, usize) -> Option<&'k [Check]>,
) -> Option<(usize, linnet_exec::NodeError)> {
    use linnet_exec::NodeError;
    use linnet_ir::Intrinsic;
    let (node, stage) = emit::owned_by(faults[OWNER_SLOT])?;
    let intrinsic = match entry.nodes.get(node).map(|node| &node.kind) {
        Some(NodeKind::Intrinsic(intrinsic, _)) => Some(*intrinsic),
        _ => None,
    };
    let raised = |fault: Fault| faults[fault as usize] != 0;
    let writer = intrinsic.map(Intrinsic::name).unwrap_or("a kernel");
    let error = if raised(Fault::PositionOutsideAxis) {
        let [number, position, size] = [faults[CHECK_SLOT], faults[CHECK_SLOT + 1], faults[CHECK_SLOT + 2]];
        match usize::try_from(number).ok().and_then(|number| checks(node, stage)?.get(number)) {
            Some(check) => {
                NodeError::OutOfRange { value: check.value, axis: check.axis, position, size, source: check.source }
            }
            None => NodeError::Check(format!(
                "kernel {stage} of node v{node} raised a fault for check {number}, which it does not have"
            )),
        }
    } else if raised(Fault::OutsideCache) {
        let what = match intrinsic {
            Some(Intrinsic::WriteAt) => "position",
            Some(Intrinsic::WriteRows) => "a position",
            Some(Intrinsic::WriteSlots) => "a start",
            _ => "span",
        };
        NodeError::Check(format!("{writer}: {what} outside the cache"))
    } else if raised(Fault::RequestOutsideX) {
        NodeError::Check(format!(
            "{writer}: position {} is outside 0..{}",
            faults[REQUEST_SLOT],
            faults[REQUEST_SLOT + 1]
        ))
    } else {
        NodeError::Check(format!("kernel {stage} of node v{node} owns the faults table but raised no fault it names"))
    };
    Some((node, error))
}
