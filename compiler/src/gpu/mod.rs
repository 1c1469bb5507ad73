//! The NVPTX target (`linnetc build --target nvptx`): every `Compute` node
//! of every entry as an MLIR kernel (`kernel`), every intrinsic (attention,
//! the delta rule, cache writes) as one too (`intrinsic`), both written
//! with `emit`; lowered by MLIR's passes through melior to PTX
//! (`pipeline`), or for the host and run there (`host`, the numerics check
//! without a GPU). A node with no kernel (a shape the kernels do not take)
//! is refused by name, never half built.

mod emit;
pub mod host;
mod intrinsic;
mod kernel;
mod pipeline;

use crate::exec::BuildError;
use crate::ir::{Entry, Model, NodeKind};
use std::path::Path;

pub use emit::{Fault, Form, Kernel, Unsupported, THREADS};

/// The kernel of node `at` of `entry`, if it is a `Compute` node or an
/// intrinsic (other nodes move values and need none).
pub fn node_kernel(entry: &Entry, at: usize, form: Form) -> Option<Result<Kernel, Unsupported>> {
    match &entry.nodes[at].kind {
        NodeKind::Compute(_) => Some(kernel::kernel(entry, at, form)),
        NodeKind::Intrinsic(..) => Some(intrinsic::intrinsic_kernel(entry, at, form)),
        _ => None,
    }
}

/// One entry's kernels and the PTX MLIR made of them (one module).
pub struct EntryPtx {
    pub entry: String,
    pub kernels: Vec<Kernel>,
    pub ptx: String,
}

/// What the target made of a model: PTX for every entry's kernels, and
/// the nodes it has no kernel for (the model runs only when there are none).
pub struct Built {
    pub entries: Vec<EntryPtx>,
    pub missing: Vec<BuildError>,
}

/// Every entry of `model` as PTX for `arch` (`sm_90`), linking
/// `libdevice` for the math functions when given. An error is MLIR's
/// failure to lower kernels it was given (a compiler bug).
pub fn build(model: &Model, arch: &str, libdevice: Option<&Path>) -> Result<Built, BuildError> {
    let mut built = Built { entries: Vec::new(), missing: Vec::new() };
    for entry in &model.entries {
        let mut kernels = Vec::new();
        for at in 0..entry.nodes.len() {
            match node_kernel(entry, at, Form::Device) {
                Some(Ok(kernel)) => kernels.push(kernel),
                Some(Err(Unsupported(why))) => built.missing.push(BuildError::new("nvptx", entry, Some(at), format!("no GPU kernel: {why}"))),
                None => {}
            }
        }
        if kernels.is_empty() {
            continue;
        }
        let module: String = kernels.iter().map(|kernel| kernel.text.as_str()).collect::<Vec<_>>().join("\n");
        let module = format!("module attributes {{ gpu.container_module }} {{\ngpu.module @{} {{\n{module}}}\n}}\n", entry.name);
        let mut ptx = pipeline::ptx(&module, arch, libdevice).map_err(|message| BuildError::new("nvptx", entry, None, message))?;
        if ptx.len() != 1 {
            return Err(BuildError::new("nvptx", entry, None, format!("MLIR made {} PTX modules of one `gpu.module`", ptx.len())));
        }
        let ptx = ptx.remove(0);
        built.entries.push(EntryPtx { entry: entry.name.clone(), kernels, ptx });
    }
    Ok(built)
}

/// How the runtime launches one kernel, as `kernels.json` lists it: the
/// kernel's PTX entry (in `ENTRY.ptx`), the node it computes (its
/// output; for a cache write, the cache it changes in place), the values
/// it reads, the dims table it is given, and its work: one thread per
/// item, [`THREADS`] to a block, as many items as the product of `work`.
/// Every buffer is passed as a memref descriptor (`pipeline`).
#[derive(serde::Serialize, serde::Deserialize)]
pub struct Launch {
    pub name: String,
    pub node: usize,
    pub loads: Vec<usize>,
    pub dims: Vec<crate::sema::dim::Dim>,
    pub work: Vec<crate::sema::dim::Dim>,
    pub threads: u32,
}

impl Built {
    /// Writes each entry's PTX as `dir/ENTRY.ptx` and the launches of
    /// every kernel as `dir/kernels.json` (entry name to its launches);
    /// the bytes of PTX written.
    pub fn write(&self, dir: &Path) -> Result<usize, String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let mut written = 0;
        let mut launches = serde_json::Map::new();
        for entry in &self.entries {
            let path = dir.join(format!("{}.ptx", entry.entry));
            std::fs::write(&path, &entry.ptx).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
            written += entry.ptx.len();
            let launch: Vec<Launch> = entry
                .kernels
                .iter()
                .map(|kernel| Launch {
                    name: kernel.name.clone(),
                    node: kernel.node,
                    loads: kernel.loads.iter().map(|value| value.index()).collect(),
                    dims: kernel.dims.clone(),
                    work: kernel.work.clone(),
                    threads: THREADS,
                })
                .collect();
            launches.insert(entry.entry.clone(), serde_json::to_value(launch).expect("launches serialize"));
        }
        let path = dir.join("kernels.json");
        let text = serde_json::to_string_pretty(&launches).expect("launches serialize");
        std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
        Ok(written)
    }
}
