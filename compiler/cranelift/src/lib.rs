//! The CPU code generator: `lowering` turns each `Compute` node of an
//! entry into a Cranelift function of the kernel ABI (`linnet_cpu::abi`)
//! that reads the entry's dims at run time; here those functions are put in
//! memory (the JIT, [`Jit`]) or in an object file for an artifact
//! ([`emit_object`]), compiled for exactly the features `linnet_cpu::host`
//! detects. The only crate that links Cranelift.

mod lowering;

pub use lowering::Elementwise;

use cranelift_codegen::isa::OwnedTargetIsa;
use cranelift_codegen::settings::{self, Configurable};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::default_libcall_names;
use cranelift_object::{ObjectBuilder, ObjectModule};
use linnet_cpu::abi::{Compiled, EntryKernels, KernelFn, NativeKernel};
use linnet_cpu::{Code, CodeError};
use linnet_exec::tensor::Tensor;
use linnet_exec::{BuildError, Machine};
use linnet_ir::analysis::Analysis;
use linnet_ir::{Entry, Model, Param};
use lowering::define_kernels;

/// Why code could not be generated: the entry (by number) and node at
/// fault, when the fault is theirs.
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

/// The host's ISA with the features `linnet_cpu::host` detects (those an
/// artifact records); position-independent code for object files (the
/// JIT wants the other kind).
fn host_isa(position_independent: bool) -> Result<OwnedTargetIsa, EmitError> {
    let mut flags = settings::builder();
    flags.set("opt_level", "speed").map_err(EmitError::whole)?;
    // Cranelift's IR verifier checks the code generator, not the model: on
    // in debug builds (the tests), off in release, where it took 7% of a
    // build.
    flags.set("enable_verifier", if cfg!(debug_assertions) { "true" } else { "false" }).map_err(EmitError::whole)?;
    flags.set("is_pic", if position_independent { "true" } else { "false" }).map_err(EmitError::whole)?;
    let mut isa = cranelift_native::builder_with_options(false)
        .map_err(|e| EmitError::whole(format!("this host is not supported by Cranelift: {e}")))?;
    for feature in linnet_cpu::host::features() {
        isa.enable(feature).map_err(EmitError::whole)?;
    }
    isa.finish(settings::Flags::new(flags)).map_err(EmitError::whole)
}

/// A JIT module, kept alive while its functions may run. It is only
/// dropped, never used, once its definitions are finalized.
struct JitCode {
    _module: JITModule,
}

// SAFETY: the module is not touched after `finalize_definitions`; it owns
// the executable memory the kernels point into, which any thread may run
// and the last owner frees.
unsafe impl Send for JitCode {}

/// Compiles every `Compute` node of `entry` in this process, elementwise
/// nodes as `elementwise` says (an error names no entry: the caller knows
/// it).
pub fn jit(
    params: &[Param],
    entry: &Entry,
    analysis: &Analysis,
    elementwise: Elementwise,
) -> Result<Compiled, EmitError> {
    let builder = JITBuilder::with_isa(host_isa(false)?, default_libcall_names());
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
    Ok(Compiled { code: Box::new(JitCode { _module: module }), kernels })
}

/// Code compiled in process as a CPU machine readies each entry.
#[derive(Clone, Copy, Debug, Default)]
pub struct Jit(pub Elementwise);

impl Code for Jit {
    fn entry(&mut self, params: &[Param], entry: &Entry, analysis: &Analysis) -> Result<Compiled, CodeError> {
        jit(params, entry, analysis, self.0).map_err(|error| CodeError { node: error.node, message: error.message })
    }
}

/// `model` with `params` on the CPU backend, compiled here with elementwise
/// nodes as `elementwise` says.
pub fn jit_machine(model: Model, params: Vec<Tensor>, elementwise: Elementwise) -> Result<Machine, BuildError> {
    linnet_cpu::machine(model, params, Jit(elementwise))
}

/// An object file with the kernels of every entry (`analyses` in entry
/// order), and per entry the records that say how to call them.
pub fn emit_object(model: &Model, analyses: &[Analysis]) -> Result<(Vec<u8>, EntryKernels), EmitError> {
    let isa = host_isa(true)?;
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

#[cfg(test)]
mod tests {
    /// The code generator takes every feature the host reports by the
    /// name the host module gives it.
    #[test]
    fn the_host_features_are_the_code_generators_flags() {
        let isa = super::host_isa(true).unwrap();
        let enabled: Vec<String> = isa
            .isa_flags()
            .iter()
            .filter_map(|flag| flag.as_bool().filter(|on| *on).map(|_| flag.name.to_string()))
            .collect();
        assert_eq!(enabled, linnet_cpu::host::features());
        assert_eq!(isa.triple().to_string(), linnet_cpu::host::TRIPLE);
    }
}
