//! MLIR's passes through melior: a `gpu.module` of kernels lowered to NVVM
//! and serialized to PTX (`gpu-module-to-binary{format=isa}`), with libdevice
//! linked for the math functions when it is given. Messages MLIR reports
//! come back as the error.

use super::GpuError;
use melior::dialect::DialectRegistry;
use melior::ir::operation::OperationLike;
use melior::ir::{BlockLike, Module, RegionLike};
use melior::pass::PassManager;
use melior::utility::{
    parse_pass_pipeline, register_all_dialects, register_all_llvm_translations, register_all_passes,
};
use melior::Context;
use std::cell::RefCell;
use std::path::Path;
use std::rc::Rc;

/// The pass pipeline from a `gpu.module` of kernels to PTX for `arch`
/// (`sm_90`). A kernel's parameters are its memrefs' descriptors, in its
/// arguments' order, each as five: the allocated and aligned pointers,
/// then the offset, size and stride as 64-bit integers.
fn pipeline(arch: &str, libdevice: Option<&Path>) -> String {
    let link = libdevice.map(|path| format!(" l={}", path.display())).unwrap_or_default();
    format!(
        "builtin.module(nvvm-attach-target{{chip={arch}{link}}},\
         gpu.module(convert-scf-to-cf,convert-gpu-to-nvvm,canonicalize),\
         reconcile-unrealized-casts,gpu-module-to-binary{{format=isa}})"
    )
}

/// Parses `module` (MLIR text), runs `pipeline` on it and gives the result
/// to `then`; MLIR's own messages make the error.
pub(super) fn lowered<R>(module: &str, pipeline: &str, then: impl FnOnce(&Module) -> R) -> Result<R, GpuError> {
    let registry = DialectRegistry::new();
    register_all_dialects(&registry);
    let context = Context::new();
    context.append_dialect_registry(&registry);
    context.load_all_available_dialects();
    register_all_llvm_translations(&context);
    // The passes' registry is the process's: registered once, whichever
    // thread lowers first.
    static PASSES: std::sync::Once = std::sync::Once::new();
    PASSES.call_once(register_all_passes);
    let messages = Rc::new(RefCell::new(Vec::new()));
    let heard = messages.clone();
    context.attach_diagnostic_handler(move |diagnostic| {
        heard.borrow_mut().push(format!("{diagnostic}"));
        true
    });
    let failed = |what: &str| {
        let said = messages.borrow().join("\n");
        GpuError::Mlir(format!("{what}: {}", if said.is_empty() { "MLIR gave no reason".to_string() } else { said }))
    };
    let mut parsed = Module::parse(&context, module).ok_or_else(|| failed("the kernels do not parse as MLIR"))?;
    let manager = PassManager::new(&context);
    parse_pass_pipeline(manager.as_operation_pass_manager(), pipeline).map_err(|e| GpuError::Mlir(e.to_string()))?;
    manager.run(&mut parsed).map_err(|_| failed("MLIR's lowering failed"))?;
    Ok(then(&parsed))
}

/// The first operation in `operation` (itself or nested) outside the LLVM
/// dialect, by name: what MLIR's execution engine cannot compile (it fails
/// without saying so), left by a host lowering that missed it.
pub(super) fn unlowered<'c: 'a, 'a>(operation: &impl OperationLike<'c, 'a>) -> Option<String> {
    let name = operation.name();
    let name = name.as_string_ref().as_str().unwrap_or("an operation");
    if !name.starts_with("llvm.") && name != "builtin.module" {
        return Some(name.to_string());
    }
    for region in operation.regions() {
        let mut block = region.first_block();
        while let Some(current) = block {
            let mut nested = current.first_operation();
            while let Some(inner) = nested {
                if let Some(found) = unlowered(&inner) {
                    return Some(found);
                }
                nested = inner.next_in_block();
            }
            block = current.next_in_region();
        }
    }
    None
}

/// The PTX of `module` (MLIR text of a `gpu.module` of kernels): one text
/// per `gpu.module`.
pub fn ptx(module: &str, arch: &str, libdevice: Option<&Path>) -> Result<Vec<String>, GpuError> {
    let objects = lowered(module, &pipeline(arch, libdevice), |lowered| assembly(&lowered.as_operation().to_string()))?;
    if objects.is_empty() {
        return Err(GpuError::Mlir("MLIR's lowering produced no PTX".into()));
    }
    Ok(objects)
}

/// The `assembly = "…"` strings of the `#gpu.object`s in printed MLIR,
/// unescaped (`\0A`, `\09`, `\22`, `\5C`: two hex digits after `\`).
fn assembly(printed: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut rest = printed;
    while let Some(at) = rest.find("assembly = \"") {
        rest = &rest[at + "assembly = \"".len()..];
        let mut text = Vec::new();
        let mut bytes = rest.bytes();
        let mut used = 0;
        while let Some(byte) = bytes.next() {
            used += 1;
            match byte {
                b'"' => break,
                b'\\' => {
                    let digits: Vec<u8> = bytes.by_ref().take(2).collect();
                    used += digits.len();
                    let hex = std::str::from_utf8(&digits).ok().and_then(|d| u8::from_str_radix(d, 16).ok());
                    text.push(hex.unwrap_or(b'?'));
                }
                other => text.push(other),
            }
        }
        rest = &rest[used..];
        found.push(String::from_utf8_lossy(&text).into_owned());
    }
    found
}

#[cfg(test)]
mod tests {
    #[test]
    fn assembly_strings_are_unescaped() {
        let printed = r#"gpu.binary @k [#gpu.object<#nvvm.target, properties = {}, assembly = "//\0A.version 7.8\0A\09ld \22x\22">]"#;
        assert_eq!(super::assembly(printed), ["//\n.version 7.8\n\tld \"x\""]);
    }
}
