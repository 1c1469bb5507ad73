//! The GPU kernels' bodies run on the host: the same MLIR `kernel` texts,
//! lowered by MLIR for the CPU (`scf.parallel` as loops) and run with its
//! execution engine, as a backend (`MlirHost`) the executor drives. It is
//! how a wrong index or reduction in a GPU kernel shows without a GPU: its
//! results are held to the interpreter by the contract's tolerances.
//! Intrinsics run through their kernels too, and launch groups as on the
//! device (the group's kernel at its first member). A call's faults are read
//! once, when it settles, as on a device: the same kernels report the
//! same errors.

use super::layout::{loaded, stored};
use super::{Form, GpuError, Group, Kernel, Role};
use linnet_exec::tensor::{Data, Tensor};
use linnet_exec::{shape_value, Backend, BuildError, NodeError, Site, Values};
use linnet_ir::analysis::Analysis;
use linnet_ir::{Entry, Intrinsic, Model};
use melior::ExecutionEngine;
use std::collections::HashMap;

/// MLIR's lowering of the kernels for the host (math functions as LLVM
/// intrinsics, `tanh` expanded first: libm has no `rsqrtf` to call; bf16
/// conversions expanded into integer operations, rounding to nearest even:
/// on a CPU without AVX-512 BF16, LLVM would call compiler-rt's
/// `__truncsfbf2`, which the execution engine cannot find; for any it
/// still calls, [`provide_runtime_calls`] gives the engine one).
const HOST_PIPELINE: &str =
    "builtin.module(func.func(math-expand-ops,arith-expand{include-bf16=true},convert-scf-to-cf),convert-math-to-llvm,convert-to-llvm,reconcile-unrealized-casts)";

/// compiler-rt's `__truncsfbf2`: f32 to bf16, to nearest even (a NaN
/// stays a NaN, quiet). LLVM calls it for a conversion to bf16 that the
/// host lowering leaves to it on a CPU without AVX-512 BF16, and the
/// execution engine links no compiler-rt. The bf16's bits are returned in
/// the low half of an f32's, where the x86-64 ABI returns a `bfloat`.
#[cfg(target_arch = "x86_64")]
extern "C" fn truncsfbf2(value: f32) -> f32 {
    let bits = value.to_bits();
    let rounded = if value.is_nan() { (bits >> 16) | 0x40 } else { (bits + 0x7fff + ((bits >> 16) & 1)) >> 16 };
    f32::from_bits(rounded)
}

/// Gives `engine` the runtime functions LLVM may call that it cannot find.
fn provide_runtime_calls(engine: &ExecutionEngine) {
    // SAFETY: the function lives as long as the program, and its signature
    // is the one LLVM calls it with.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        engine.register_symbol("__truncsfbf2", truncsfbf2 as *mut ());
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = engine;
}

/// One entry's kernels, compiled for the host.
struct Compiled {
    /// Per node: its kernels, in launch order (none for nodes that move
    /// values).
    kernels: Vec<Vec<Kernel>>,
    /// Its launch groups, and each grouped node's role in them.
    groups: Vec<Group>,
    roles: HashMap<usize, Role>,
    engine: ExecutionEngine,
}

// SAFETY: the engine (MLIR's wrapper of an LLVM ORC JIT and the code it
// holds) is bound to no thread; the backend that owns it is used through
// `&mut self`, so from one thread at a time, wherever its machine moves.
unsafe impl Send for Compiled {}

/// The backend: every `Compute` node through its MLIR kernel on the host.
#[derive(Default)]
pub struct MlirHost {
    entries: Vec<Compiled>,
    /// The faults table of the call (`FAULT_SLOTS`), read when it settles,
    /// as the CUDA backend reads its own: the same kernels, the same
    /// errors.
    faults: [i64; super::FAULT_SLOTS],
    /// Values a launch group computed before the executor reached their
    /// nodes, by node.
    ahead: HashMap<usize, Tensor>,
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
        Descriptor {
            allocated: bytes.as_mut_ptr(),
            aligned: bytes.as_mut_ptr(),
            offset: 0,
            size: elements as i64,
            stride: 1,
        }
    }

    fn of_faults(faults: &mut [i64; super::FAULT_SLOTS]) -> Descriptor {
        let start = faults.as_mut_ptr() as *mut u8;
        Descriptor { allocated: start, aligned: start, offset: 0, size: super::FAULT_SLOTS as i64, stride: 1 }
    }
}

fn compile(model: &Model, entry_number: usize, analysis: &Analysis) -> Result<Compiled, BuildError> {
    let entry = &model.entries[entry_number];
    let failed = |node: Option<usize>, message: String| BuildError::new("mlir-host", entry, node, message);
    let program = super::ModelEntry { entry, params: &model.params };
    let kernels = super::entry_kernels(program, Form::Host, "mlir-host")?;
    let groups = super::groups(program, &kernels, &analysis.hoistable, Form::Host);
    let roles = super::roles(groups.iter().map(|group| group.members.as_slice()));
    let module = format!("module {{\n{}}}\n", super::functions(&kernels, &groups).join("\n"));
    // The engine holds the code it compiled; the module may go.
    let engine = super::pipeline::lowered(&module, HOST_PIPELINE, |lowered| {
        match super::pipeline::unlowered(&lowered.as_operation()) {
            Some(operation) => Err(GpuError::Mlir(format!("MLIR's host lowering left `{operation}` (a compiler bug)"))),
            None => Ok(ExecutionEngine::new(lowered, 2, &[], false, false)),
        }
    })
    .and_then(|engine| engine)
    .map_err(|error| failed(None, error.to_string()))?;
    provide_runtime_calls(&engine);
    let called = kernels
        .iter()
        .flatten()
        .filter(|kernel| !roles.contains_key(&kernel.node))
        .map(|kernel| &kernel.name)
        .chain(groups.iter().map(|group| &group.name));
    if let Some(name) = called.into_iter().find(|name| engine.lookup(name).is_null()) {
        return Err(failed(None, format!("MLIR's execution engine did not compile `{name}`")));
    }
    Ok(Compiled { kernels, groups, roles, engine })
}

impl Backend for MlirHost {
    type Buffer = Tensor;

    fn name(&self) -> &'static str {
        "mlir-host"
    }

    fn prepare(&mut self, model: &Model, analyses: &[Analysis]) -> Result<(), BuildError> {
        self.entries =
            (0..model.entries.len()).map(|entry| compile(model, entry, &analyses[entry])).collect::<Result<_, _>>()?;
        Ok(())
    }

    linnet_exec::tensor::host_memory!();

    /// Quantized parameters are uploaded as their blocks, which the
    /// kernels decode where they read them.
    fn reads_blocks(&self) -> bool {
        true
    }

    fn compute(&mut self, site: Site<'_>, values: &Values<Tensor>) -> Result<Tensor, NodeError> {
        match self.entries[site.entry_number].roles.get(&site.at) {
            Some(Role::Follows) => {
                return Ok(self.ahead.remove(&site.at).expect("a group's first member computed the rest"))
            }
            Some(&Role::Leads(group)) => return self.launch_group(&site, group, values),
            None => {}
        }
        let kernel = &self.kernels(&site)[0];
        let args: Vec<&Tensor> = kernel
            .loads
            .iter()
            .map(|value| values[value.index()].as_deref().expect("a loaded value is live"))
            .collect();
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

    fn write_cache(
        &mut self,
        site: Site<'_>,
        _: Intrinsic,
        cache: &mut Tensor,
        args: &[&Tensor],
    ) -> Result<(), NodeError> {
        let dtype = site.entry.nodes[site.at].dtype;
        let mut cells = stored(cache, dtype).map_err(|error| NodeError::Check(error.to_string()))?;
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
        let mut inputs = stored_loads(site, &kernels[0].loads, args)?;
        let scratch_elements = kernels[0].scratch.as_ref().map(|scratch| {
            (
                scratch.elements.value_under(site.dims).expect("an entry's dims are bound") as usize,
                scratch.dtype.bytes(),
            )
        });
        let mut scratch = vec![0u8; scratch_elements.map_or(0, |(elements, bytes)| elements * bytes)];
        for kernel in kernels {
            let mut descriptors = vec![Descriptor::of(out, out_elements)];
            descriptors.extend(inputs.iter_mut().map(|(bytes, elements)| Descriptor::of(bytes, *elements)));
            if let Some((elements, _)) = scratch_elements {
                descriptors.push(Descriptor::of(&mut scratch, elements));
            }
            call(
                &self.entries[site.entry_number].engine,
                &kernel.name,
                descriptors,
                &kernel.dims,
                site,
                &mut self.faults,
            )?;
        }
        Ok(())
    }

    /// Runs launch group `group` of the site's entry (the site its first
    /// member): gives the site's value and keeps the other members'.
    fn launch_group(&mut self, site: &Site<'_>, group: usize, values: &Values<Tensor>) -> Result<Tensor, NodeError> {
        let compiled = &self.entries[site.entry_number];
        let group = &compiled.groups[group];
        let args: Vec<&Tensor> =
            group.loads.iter().map(|value| values[value.index()].as_deref().expect("a loaded value is live")).collect();
        let mut inputs = stored_loads(site, &group.loads, &args)?;
        let mut outputs: Vec<(Vec<u8>, Vec<usize>)> = group
            .members
            .iter()
            .map(|&member| {
                let shape = shape_value(&site.entry.nodes[member].shape, site.dims);
                (vec![0u8; shape.iter().product::<usize>() * site.entry.nodes[member].dtype.bytes()], shape)
            })
            .collect();
        let mut descriptors: Vec<Descriptor> =
            outputs.iter_mut().map(|(bytes, shape)| Descriptor::of(bytes, shape.iter().product())).collect();
        descriptors.extend(inputs.iter_mut().map(|(bytes, elements)| Descriptor::of(bytes, *elements)));
        call(&compiled.engine, &group.name, descriptors, &group.dims, site, &mut self.faults)?;
        let mut values = group
            .members
            .iter()
            .zip(outputs)
            .map(|(&member, (bytes, shape))| (member, loaded(&bytes, site.entry.nodes[member].dtype, shape)));
        let (_, first) = values.next().expect("a group has members");
        self.ahead.extend(values);
        Ok(first)
    }
}

/// The stored bytes of `loads` (values of the site's entry), given as
/// `args`, and their element counts.
fn stored_loads(
    site: &Site<'_>,
    loads: &[linnet_ir::Value],
    args: &[&Tensor],
) -> Result<Vec<(Vec<u8>, usize)>, NodeError> {
    loads
        .iter()
        .zip(args)
        .map(|(value, tensor)| {
            let elements = match &tensor.data {
                Data::Blocks(_, blocks) => blocks.len(),
                _ => tensor.len(),
            };
            stored(tensor, site.entry.nodes[value.index()].dtype)
                .map(|bytes| (bytes, elements))
                .map_err(|error| NodeError::Check(error.to_string()))
        })
        .collect()
}

/// Calls function `name` of `engine` with `buffers`' descriptors, then its
/// dims table (`dims` bound by the site's call) and the faults table.
fn call(
    engine: &ExecutionEngine,
    name: &str,
    mut descriptors: Vec<Descriptor>,
    dims: &[linnet_ir::dim::Dim],
    site: &Site<'_>,
    faults: &mut [i64; super::FAULT_SLOTS],
) -> Result<(), NodeError> {
    let mut table: Vec<u8> = dims
        .iter()
        .flat_map(|dim| dim.value_under(site.dims).expect("an entry's dims are bound").to_le_bytes())
        .collect();
    descriptors.push(Descriptor::of(&mut table, dims.len()));
    descriptors.push(Descriptor::of_faults(faults));
    // The C interface takes a pointer to each memref's descriptor; the
    // packed call, a pointer to each of those.
    let mut pointers: Vec<*mut Descriptor> = descriptors.iter_mut().map(|d| d as *mut Descriptor).collect();
    let mut arguments: Vec<*mut ()> = pointers.iter_mut().map(|p| p as *mut *mut Descriptor as *mut ()).collect();
    // SAFETY: the function takes one 1-D memref per argument, in this
    // order, each descriptor pointing at a live buffer of its length.
    unsafe { engine.invoke_packed(name, &mut arguments) }.map_err(|e| NodeError::Check(e.to_string()))
}
