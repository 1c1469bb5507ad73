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

pub use emit::{Fault, Kernel, Unsupported};

/// The kernel of node `at` of `entry`, if it is a `Compute` node or an
/// intrinsic (other nodes move values and need none), named after the
/// entry and the node.
pub fn node_kernel(entry: &Entry, at: usize) -> Option<Result<Kernel, Unsupported>> {
    let name = format!("{}_v{at}", entry.name);
    match &entry.nodes[at].kind {
        NodeKind::Compute(_) => Some(kernel::kernel(entry, at, &name)),
        NodeKind::Intrinsic(..) => Some(intrinsic::intrinsic_kernel(entry, at, &name)),
        _ => None,
    }
}

/// One entry's kernels and the PTX MLIR made of them.
pub struct EntryPtx {
    pub entry: String,
    pub kernels: Vec<Kernel>,
    pub ptx: Vec<String>,
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
            match node_kernel(entry, at) {
                Some(Ok(kernel)) => kernels.push(kernel),
                Some(Err(Unsupported(why))) => built.missing.push(BuildError::new("nvptx", entry, Some(at), format!("no GPU kernel: {why}"))),
                None => {}
            }
        }
        if kernels.is_empty() {
            continue;
        }
        let module: String = kernels.iter().map(|kernel| kernel.text.as_str()).collect::<Vec<_>>().join("\n");
        let ptx = pipeline::ptx(&format!("module {{\n{module}}}\n"), arch, libdevice).map_err(|message| BuildError::new("nvptx", entry, None, message))?;
        built.entries.push(EntryPtx { entry: entry.name.clone(), kernels, ptx });
    }
    Ok(built)
}
