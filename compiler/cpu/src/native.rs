//! Native code in memory, from either of two places: the JIT (compiled in
//! this process) or an artifact's object file (compiled by `linnetc
//! build`, loaded here). Kernels reach their helpers through a table
//! argument and have no calls between them, so the object file's text
//! needs no relocations: the loader copies it into executable memory and
//! refuses any file that has some, or that was built for another host.

use super::helpers;
pub use super::lowering::KernelRecord;
use super::lowering::{define_kernels, Elementwise};
use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::default_libcall_names;
use cranelift_object::{ObjectBuilder, ObjectModule};
use linnet_ir::analysis::Analysis;
use linnet_ir::{Entry, Model, Param};
use object::{Object, ObjectSection, ObjectSymbol};
use std::collections::HashMap;
use std::rc::Rc;

/// `fn(out, inputs, dims, helpers, error, first_row, end_row) -> status`:
/// `inputs` points at each loaded value's elements, `dims` at the values of
/// the kernel's dims table, `helpers` at [`helpers::table`]; `error`
/// receives (load site, position, size, axis) when the status is 1. An
/// elementwise node computes rows `first_row..end_row` of its first two
/// axes flattened when it has three or more, else of its first (a
/// contraction, or a node without axes, computes everything).
pub type KernelFn =
    unsafe extern "C" fn(*mut u8, *const *const u8, *const i64, *const *const u8, *mut i64, i64, i64) -> i32;

/// Changes whenever the kernel calling convention or the helper table
/// does; an artifact of another version is rebuilt, not run.
pub const ABI_VERSION: u32 = 8;

/// Per entry, its kernels' records.
pub type EntryKernels = std::collections::BTreeMap<String, Vec<KernelRecord>>;

pub struct NativeKernel {
    pub function: KernelFn,
    pub record: KernelRecord,
}

/// A load that fell outside its tensor, as a kernel reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoadFault {
    pub site: usize,
    pub position: i64,
    pub size: i64,
    pub axis: usize,
}

/// The compiled nodes of one entry.
pub struct Compiled {
    /// The JIT module or the mapped text the kernels point into, kept alive.
    _code: Box<dyn std::any::Any>,
    /// Per node: its kernel, if it has one.
    pub kernels: Vec<Option<NativeKernel>>,
}

/// The host's ISA; position-independent code for object files (the JIT
/// wants the other kind).
fn host_isa(position_independent: bool) -> Result<OwnedTargetIsa, String> {
    let mut flags = settings::builder();
    flags.set("opt_level", "speed").map_err(|e| e.to_string())?;
    // Cranelift's IR verifier checks the code generator, not the model: on
    // in debug builds (the tests), off in release, where it took 7% of a
    // build.
    flags.set("enable_verifier", if cfg!(debug_assertions) { "true" } else { "false" }).map_err(|e| e.to_string())?;
    flags.set("is_pic", if position_independent { "true" } else { "false" }).map_err(|e| e.to_string())?;
    let isa = cranelift_native::builder().map_err(|e| format!("this host is not supported by Cranelift: {e}"))?;
    isa.finish(settings::Flags::new(flags)).map_err(|e| e.to_string())
}

/// The host as an artifact records it: code built for one host's
/// features must not run on a host without them.
pub fn host_target() -> Result<String, String> {
    let isa = host_isa(true)?;
    let features: Vec<String> = isa
        .isa_flags()
        .iter()
        .filter_map(|flag| flag.as_bool().filter(|on| *on).map(|_| flag.name.to_string()))
        .collect();
    Ok(format!("{} [{}]", isa.triple(), features.join(" ")))
}

/// Compiles every `Compute` node of `entry` in this process, elementwise
/// nodes as `elementwise` says (an error names no entry: the caller knows
/// it).
pub fn jit(
    params: &[Param],
    entry: &Entry,
    analysis: &Analysis,
    elementwise: Elementwise,
) -> Result<Compiled, EmitError> {
    let builder = JITBuilder::with_isa(host_isa(false).map_err(EmitError::whole)?, default_libcall_names());
    let mut module = JITModule::new(builder);
    let defined = define_kernels(&mut module, params, entry, analysis, "", elementwise)
        .map_err(|(at, message)| EmitError { entry: None, node: Some(at), message })?;
    module.finalize_definitions().map_err(EmitError::whole)?;
    let mut kernels: Vec<Option<NativeKernel>> = (0..entry.nodes.len()).map(|_| None).collect();
    for def in defined {
        let pointer = module.get_finalized_function(def.func);
        // SAFETY: the function was compiled above with the `KernelFn` signature.
        let function = unsafe { std::mem::transmute::<*const u8, KernelFn>(pointer) };
        let node = def.record.node;
        kernels[node] = Some(NativeKernel { function, record: def.record });
    }
    Ok(Compiled { _code: Box::new(module), kernels })
}

/// Why an object file could not be made: the entry (by number) and node
/// at fault, when the fault is theirs.
#[derive(Clone, Debug)]
pub struct EmitError {
    pub entry: Option<usize>,
    pub node: Option<usize>,
    pub message: String,
}

impl EmitError {
    fn whole(message: impl ToString) -> EmitError {
        EmitError { entry: None, node: None, message: message.to_string() }
    }
}

/// An object file with the kernels of every entry (`analyses` in entry
/// order), and per entry the records that say how to call them.
pub fn emit_object(model: &Model, analyses: &[Analysis]) -> Result<(Vec<u8>, EntryKernels), EmitError> {
    let isa = host_isa(true).map_err(EmitError::whole)?;
    let builder =
        ObjectBuilder::new(isa, model.name.as_bytes().to_vec(), default_libcall_names()).map_err(EmitError::whole)?;
    let mut module = ObjectModule::new(builder);
    let mut records = EntryKernels::new();
    for (number, (entry, analysis)) in model.entries.iter().zip(analyses).enumerate() {
        let defined = define_kernels(
            &mut module,
            &model.params,
            entry,
            analysis,
            &format!("linnet_e{number}_"),
            Elementwise::Lanes,
        )
        .map_err(|(at, message)| EmitError { entry: Some(number), node: Some(at), message })?;
        records.insert(entry.name.clone(), defined.into_iter().map(|def| def.record).collect());
    }
    let bytes = module.finish().emit().map_err(EmitError::whole)?;
    Ok((bytes, records))
}

/// Loads an object file written by [`emit_object`]: its text copied into
/// executable memory, each entry's kernels found by symbol.
pub fn load_object(bytes: &[u8], model: &Model, records: &EntryKernels) -> Result<HashMap<String, Compiled>, String> {
    let file = object::File::parse(bytes).map_err(|e| format!("the kernels are not an object file: {e}"))?;
    let text = file.section_by_name(".text").ok_or("the kernels' object file has no .text section")?;
    for section in file.sections() {
        if section.relocations().next().is_some() {
            return Err(format!(
                "the kernels' object file has relocations in {}, which kernels never need",
                section.name().unwrap_or("?")
            ));
        }
    }
    let code = text.data().map_err(|e| e.to_string())?;
    let mut memory =
        memmap2::MmapMut::map_anon(code.len().max(1)).map_err(|e| format!("cannot map memory for the kernels: {e}"))?;
    memory[..code.len()].copy_from_slice(code);
    let memory = Rc::new(memory.make_exec().map_err(|e| format!("cannot make the kernels executable: {e}"))?);
    let symbols: HashMap<&str, u64> = file
        .symbols()
        .filter(|symbol| symbol.section_index() == Some(text.index()))
        .filter_map(|symbol| Some((symbol.name().ok()?, symbol.address() - text.address())))
        .collect();
    let mut compiled = HashMap::new();
    for entry in &model.entries {
        let mut kernels: Vec<Option<NativeKernel>> = (0..entry.nodes.len()).map(|_| None).collect();
        for record in records.get(&entry.name).map(Vec::as_slice).unwrap_or_default() {
            let offset = *symbols
                .get(record.symbol.as_str())
                .ok_or_else(|| format!("the kernels' object file lacks `{}`", record.symbol))?;
            if offset as usize >= code.len() || record.node >= entry.nodes.len() {
                return Err(format!("kernel `{}` does not fit its object file or entry", record.symbol));
            }
            // SAFETY: the symbol is a function in the copied text, compiled
            // with the `KernelFn` signature by `emit_object` for this host.
            let function = unsafe { std::mem::transmute::<*const u8, KernelFn>(memory.as_ptr().add(offset as usize)) };
            kernels[record.node] = Some(NativeKernel { function, record: record.clone() });
        }
        compiled.insert(entry.name.clone(), Compiled { _code: Box::new(Rc::clone(&memory)), kernels });
    }
    Ok(compiled)
}

/// Runs a kernel over `rows` (see [`KernelFn`]; a contraction or a node
/// without axes computes everything, whatever is given); the load
/// that fell outside its tensor, if one did.
///
/// # Safety
/// `inputs` must point at the kernel's loads, `out` at room for the
/// node's elements, and `dims` at the values of its dims table, all with
/// the shapes and dtypes the kernel was compiled for; `rows` lies within
/// the node's rows (see [`KernelFn`]).
pub unsafe fn call(
    kernel: &NativeKernel,
    out: *mut u8,
    inputs: &[*const u8],
    dims: &[i64],
    rows: std::ops::Range<usize>,
) -> Result<(), LoadFault> {
    let table = helpers::table();
    let mut error = [0i64; 4];
    // SAFETY: as the caller promises; the helper table is in slot order.
    let status = unsafe {
        (kernel.function)(
            out,
            inputs.as_ptr(),
            dims.as_ptr(),
            table.as_ptr(),
            error.as_mut_ptr(),
            rows.start as i64,
            rows.end as i64,
        )
    };
    match status {
        0 => Ok(()),
        _ => Err(LoadFault { site: error[0] as usize, position: error[1], size: error[2], axis: error[3] as usize }),
    }
}
