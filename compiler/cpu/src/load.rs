//! Native code from an artifact's `cpu` section: an object file compiled
//! by `linnetc build` for a host's features, with its kernels' records.
//! Kernels reach their helpers through a table argument and have no calls
//! between them, so the object file's text needs no relocations: the
//! loader copies it into executable memory and refuses any file that has
//! some, or that was compiled for another host or ABI.

use crate::abi::{Compiled, EntryKernels, KernelFn, NativeKernel, ABI_VERSION};
use linnet_artifact::{Artifact, ArtifactError, CodeSection, Section};
use linnet_ir::Model;
use object::{Object, ObjectSection, ObjectSymbol};
use std::collections::HashMap;
use std::sync::Arc;

/// The section's name in an artifact's manifest.
pub const SECTION: &str = "cpu";

/// The `cpu` section of an object file compiled for this host, whose
/// kernels `records` describes.
pub fn section(object: Vec<u8>, records: &EntryKernels) -> Section {
    Section {
        name: SECTION.to_string(),
        section: CodeSection {
            file: "kernels.o".to_string(),
            target: crate::host::target(),
            abi: ABI_VERSION,
            calls: serde_json::to_value(records).expect("kernel records serialize"),
        },
        bytes: object,
    }
}

/// The native code of every entry of `artifact`, from its `cpu` section:
/// code for the host it was compiled on (its IR runs anywhere, on the
/// other backends).
pub fn from_artifact(artifact: &Artifact) -> Result<HashMap<String, Compiled>, LoadError> {
    let rebuild = || artifact.dir.display().to_string();
    let section = artifact.manifest.code.get(SECTION).ok_or_else(|| LoadError::NoCode(rebuild()))?;
    if section.abi != ABI_VERSION {
        return Err(LoadError::OtherAbi { found: section.abi, dir: rebuild() });
    }
    let host = crate::host::target();
    if section.target != host {
        return Err(LoadError::OtherHost { built_for: section.target.clone(), host, dir: rebuild() });
    }
    let records = records(section)?;
    let (_, object) = artifact.code(SECTION)?;
    load_object(&object, &artifact.model, &records)
}

/// The kernel records of a `cpu` section.
pub fn records(section: &CodeSection) -> Result<EntryKernels, LoadError> {
    serde_json::from_value(section.calls.clone()).map_err(|e| LoadError::NotRecords(e.to_string()))
}

/// Why an artifact's kernels cannot be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("the artifact has no CPU code: rebuild it with `linnetc build` ({0})")]
    NoCode(String),
    #[error("the artifact's CPU code follows kernel ABI {found}; this runtime calls ABI {ABI_VERSION}: rebuild it with `linnetc build` ({dir})")]
    OtherAbi { found: u32, dir: String },
    #[error("the artifact's CPU code was compiled for {built_for}, and this host is {host}: rebuild it with `linnetc build` ({dir})")]
    OtherHost { built_for: String, host: String, dir: String },
    #[error("the artifact's kernel records do not read: {0}")]
    NotRecords(String),
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    #[error("the kernels are not an object file: {0}")]
    NotAnObject(String),
    #[error("the kernels' object file has no .text section")]
    NoText,
    #[error("the kernels' object file has relocations in {0}, which kernels never need")]
    Relocations(String),
    #[error("the kernels' object file lacks `{0}`")]
    MissingKernel(String),
    #[error("kernel `{0}` does not fit its object file or entry")]
    Misplaced(String),
    #[error("cannot map executable memory for the kernels: {0}")]
    Memory(#[from] std::io::Error),
}

/// Loads an object file of kernels (`linnet-cranelift`'s): its text
/// copied into executable memory, each entry's kernels found by symbol.
pub fn load_object(
    bytes: &[u8],
    model: &Model,
    records: &EntryKernels,
) -> Result<HashMap<String, Compiled>, LoadError> {
    let file = object::File::parse(bytes).map_err(|e| LoadError::NotAnObject(e.to_string()))?;
    let text = file.section_by_name(".text").ok_or(LoadError::NoText)?;
    for section in file.sections() {
        if section.relocations().next().is_some() {
            return Err(LoadError::Relocations(section.name().unwrap_or("?").to_string()));
        }
    }
    let code = text.data().map_err(|e| LoadError::NotAnObject(e.to_string()))?;
    let mut memory = memmap2::MmapMut::map_anon(code.len().max(1))?;
    memory[..code.len()].copy_from_slice(code);
    let memory = Arc::new(memory.make_exec()?);
    let symbols: HashMap<&str, u64> = file
        .symbols()
        .filter(|symbol| symbol.section_index() == Some(text.index()))
        .filter_map(|symbol| Some((symbol.name().ok()?, symbol.address() - text.address())))
        .collect();
    let mut compiled = HashMap::new();
    for entry in &model.entries {
        let mut kernels: Vec<Option<NativeKernel>> = (0..entry.nodes.len()).map(|_| None).collect();
        for record in records.get(&entry.name).map(Vec::as_slice).unwrap_or_default() {
            let offset =
                *symbols.get(record.symbol.as_str()).ok_or_else(|| LoadError::MissingKernel(record.symbol.clone()))?;
            if offset as usize >= code.len() || record.node >= entry.nodes.len() {
                return Err(LoadError::Misplaced(record.symbol.clone()));
            }
            // SAFETY: the symbol is a function in the copied text, compiled
            // with the `KernelFn` signature for this host (the artifact's
            // target was checked against it before its code was read).
            let function = unsafe { std::mem::transmute::<*const u8, KernelFn>(memory.as_ptr().add(offset as usize)) };
            kernels[record.node] = Some(NativeKernel { function, record: record.clone() });
        }
        compiled.insert(entry.name.clone(), Compiled { code: Box::new(Arc::clone(&memory)), kernels });
    }
    Ok(compiled)
}
