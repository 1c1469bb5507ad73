//! The NVPTX target (`linnetc build --target nvptx`): every `Compute` node
//! of every entry as an MLIR kernel (`kernel`), lowered by MLIR's passes
//! through melior to PTX (`pipeline`), or for the host and run there
//! (`host`, the numerics check without a GPU). Intrinsics (attention, the delta
//! rule, cache writes) have no GPU kernels yet: a model that uses them is
//! refused with each missing node named, never half built.

pub mod host;
mod kernel;
mod pipeline;

use crate::exec::BuildError;
use crate::ir::{Model, NodeKind};
use std::path::Path;

pub use kernel::{kernel, Kernel};

/// One entry's kernels and the PTX MLIR made of them.
pub struct EntryPtx {
    pub entry: String,
    pub kernels: Vec<Kernel>,
    pub ptx: Vec<String>,
}

/// What the target made of a model: PTX for every entry's `Compute`
/// nodes, and the nodes it has no kernel for (the model runs only when
/// there are none).
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
        for (at, node) in entry.nodes.iter().enumerate() {
            let refuse = |message: String| BuildError::new("nvptx", entry, Some(at), message);
            match &node.kind {
                NodeKind::Compute(_) => match kernel::kernel(entry, at, &format!("{}_v{at}", entry.name)) {
                    Ok(kernel) => kernels.push(kernel),
                    Err(kernel::Unsupported(why)) => built.missing.push(refuse(format!("no GPU kernel: {why}"))),
                },
                NodeKind::Intrinsic(intrinsic, _) => built.missing.push(refuse(format!("no GPU kernel for `{}` yet", intrinsic.name()))),
                _ => {}
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
