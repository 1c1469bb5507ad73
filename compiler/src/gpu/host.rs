//! The GPU kernels' bodies run on the host: the same MLIR `kernel` texts,
//! lowered by MLIR for the CPU (`scf.parallel` as loops) and run with its
//! execution engine, as a backend (`MlirHost`) the executor drives. It is
//! how a wrong index or reduction in a GPU kernel shows without a GPU: its
//! results are held to the interpreter by the contract's tolerances.
//! Intrinsics run through their kernels too. A call's faults are read
//! once, when it settles, as on a device: the same kernels report the
//! same errors.

use super::{Form, Kernel};
use crate::exec::{dim_value, Backend, BuildError, NodeError, Site, Values};
use crate::ir::analysis::Analysis;
use crate::ir::{Entry, Intrinsic, Model};
use super::layout::{loaded, stored};
use crate::tensor::Tensor;
use melior::ExecutionEngine;

/// MLIR's lowering of the kernels for the host (math functions as LLVM
/// intrinsics, `tanh` expanded first: libm has no `rsqrtf` to call).
const HOST_PIPELINE: &str =
    "builtin.module(func.func(math-expand-ops,convert-scf-to-cf),convert-math-to-llvm,convert-to-llvm,reconcile-unrealized-casts)";

/// One entry's kernels, compiled for the host.
struct Compiled {
    /// Per node: its kernels, in launch order (none for nodes that move
    /// values).
    kernels: Vec<Vec<Kernel>>,
    engine: ExecutionEngine,
}

/// The backend: every `Compute` node through its MLIR kernel on the host.
#[derive(Default)]
pub struct MlirHost {
    entries: Vec<Compiled>,
    /// The faults table of the call (`FAULT_SLOTS`), read when it settles,
    /// as the CUDA backend reads its own: the same kernels, the same
    /// errors.
    faults: [i64; super::FAULT_SLOTS],
}

/// A 1-D memref as MLIR's C interface passes it (`StridedMemRefType<T, 1>`).
#[repr(C)]
struct Descriptor {
    allocated: *mut u8,
    aligned: *mut u8,
    offset: i64,
    size: i64,
    stride: i64,
}

impl Descriptor {
    fn of(bytes: &mut [u8], elements: usize) -> Descriptor {
        Descriptor { allocated: bytes.as_mut_ptr(), aligned: bytes.as_mut_ptr(), offset: 0, size: elements as i64, stride: 1 }
    }

    fn of_faults(faults: &mut [i64; super::FAULT_SLOTS]) -> Descriptor {
        let start = faults.as_mut_ptr() as *mut u8;
        Descriptor { allocated: start, aligned: start, offset: 0, size: super::FAULT_SLOTS as i64, stride: 1 }
    }
}

fn compile(model: &Model, entry_number: usize) -> Result<Compiled, BuildError> {
    let entry = &model.entries[entry_number];
    let failed = |node: Option<usize>, message: String| BuildError::new("mlir-host", entry, node, message);
    let kernels = super::entry_kernels(entry, Form::Host, "mlir-host")?;
    let text: Vec<&str> = kernels.iter().flatten().map(|kernel| kernel.text.as_str()).collect();
    let module = format!("module {{\n{}}}\n", text.join("\n"));
    // The engine holds the code it compiled; the module may go.
    let engine = super::pipeline::lowered(&module, HOST_PIPELINE, |lowered| match super::pipeline::unlowered(&lowered.as_operation()) {
        Some(operation) => Err(format!("MLIR's host lowering left `{operation}` (a compiler bug)")),
        None => Ok(ExecutionEngine::new(lowered, 2, &[], false, false)),
    })
    .and_then(|engine| engine)
    .map_err(|message| failed(None, message))?;
    if let Some(kernel) = kernels.iter().flatten().find(|kernel| engine.lookup(&kernel.name).is_null()) {
        return Err(failed(None, format!("MLIR's execution engine did not compile `{}`", kernel.name)));
    }
    Ok(Compiled { kernels, engine })
}

impl Backend for MlirHost {
    type Buffer = Tensor;

    fn name(&self) -> &'static str {
        "mlir-host"
    }

    fn prepare(&mut self, model: &Model, _: &[Analysis]) -> Result<(), BuildError> {
        self.entries = (0..model.entries.len()).map(|entry| compile(model, entry)).collect::<Result<_, _>>()?;
        Ok(())
    }

    crate::tensor::host_memory!();

    fn compute(&mut self, site: Site<'_>, values: &Values<Tensor>) -> Result<Tensor, NodeError> {
        let kernel = &self.kernels(&site)[0];
        let args: Vec<&Tensor> = kernel.loads.iter().map(|value| values[value.index()].as_deref().expect("a loaded value is live")).collect();
        let node = &site.entry.nodes[site.at];
        let mut out = vec![0u8; site.shape.iter().product::<usize>() * node.dtype.bytes()];
        self.invoke(&site, &mut out, &args)?;
        Ok(loaded(&out, node.dtype, site.shape.to_vec()))
    }

    fn intrinsic(&mut self, site: Site<'_>, _: Intrinsic, args: &[&Tensor]) -> Result<Tensor, NodeError> {
        let node = &site.entry.nodes[site.at];
        let mut out = vec![0u8; site.shape.iter().product::<usize>() * node.dtype.bytes()];
        self.invoke(&site, &mut out, args)?;
        Ok(loaded(&out, node.dtype, site.shape.to_vec()))
    }

    fn settle(&mut self, entry: &Entry, entry_number: usize) -> Result<(), (usize, NodeError)> {
        let faults = std::mem::take(&mut self.faults);
        let kernels = &self.entries[entry_number].kernels;
        match super::raised(&faults, entry, |node, stage| Some(kernels.get(node)?.get(stage)?.checks.as_slice())) {
            Some(error) => Err(error),
            None => Ok(()),
        }
    }

    fn write_cache(&mut self, site: Site<'_>, _: Intrinsic, cache: &mut Tensor, args: &[&Tensor]) -> Result<(), NodeError> {
        let dtype = site.entry.nodes[site.at].dtype;
        let mut cells = stored(cache, dtype).map_err(NodeError::Check)?;
        self.invoke(&site, &mut cells, args)?;
        *cache = loaded(&cells, dtype, cache.shape.clone());
        Ok(())
    }
}

impl MlirHost {
    /// The site's kernels, in launch order; they read the same loads.
    fn kernels(&self, site: &Site<'_>) -> &[Kernel] {
        let kernels = &self.entries[site.entry_number].kernels[site.at];
        assert!(!kernels.is_empty(), "a kernel for every compute and intrinsic node");
        kernels
    }

    /// Runs the site's kernels in order into `out` (its stored bytes) from
    /// `args` (its loads' values, in order), with the node's scratch and
    /// the call's faults table.
    fn invoke(&mut self, site: &Site<'_>, out: &mut [u8], args: &[&Tensor]) -> Result<(), NodeError> {
        let kernels = &self.entries[site.entry_number].kernels[site.at];
        let out_elements = out.len() / site.entry.nodes[site.at].dtype.bytes();
        let mut inputs = kernels[0]
            .loads
            .iter()
            .zip(args)
            .map(|(value, tensor)| stored(tensor, site.entry.nodes[value.index()].dtype).map(|bytes| (bytes, tensor.len())).map_err(NodeError::Check))
            .collect::<Result<Vec<_>, _>>()?;
        let scratch_elements = kernels[0].scratch.as_ref().map(|scratch| (dim_value(&scratch.elements, site.dims).expect("an entry's dims are bound") as usize, scratch.dtype.bytes()));
        let mut scratch = vec![0u8; scratch_elements.map_or(0, |(elements, bytes)| elements * bytes)];
        for kernel in kernels {
            let mut dims: Vec<u8> = kernel.dims.iter().flat_map(|dim| dim_value(dim, site.dims).expect("an entry's dims are bound").to_le_bytes()).collect();
            let mut descriptors = vec![Descriptor::of(out, out_elements)];
            descriptors.extend(inputs.iter_mut().map(|(bytes, elements)| Descriptor::of(bytes, *elements)));
            if let Some((elements, _)) = scratch_elements {
                descriptors.push(Descriptor::of(&mut scratch, elements));
            }
            descriptors.push(Descriptor::of(&mut dims, kernel.dims.len()));
            descriptors.push(Descriptor::of_faults(&mut self.faults));
            // The C interface takes a pointer to each memref's descriptor; the
            // packed call, a pointer to each of those.
            let mut pointers: Vec<*mut Descriptor> = descriptors.iter_mut().map(|d| d as *mut Descriptor).collect();
            let mut arguments: Vec<*mut ()> = pointers.iter_mut().map(|p| p as *mut *mut Descriptor as *mut ()).collect();
            let engine = &self.entries[site.entry_number].engine;
            // SAFETY: the kernel takes one 1-D memref per argument, in this
            // order, each descriptor pointing at a live buffer of its length.
            unsafe { engine.invoke_packed(&kernel.name, &mut arguments) }.map_err(|e| NodeError::Check(e.to_string()))?;
        }
        Ok(())
    }
}
