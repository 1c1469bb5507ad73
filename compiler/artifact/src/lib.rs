//! Build artifacts: what `linnetc build` writes and the runtime loads. An
//! artifact is a folder of three files:
//!
//! - `artifact.json`, the manifest: the model's entries with their
//!   signatures, its parameters with the checkpoint tensors they bind to,
//!   shapes and dtypes, its states, the memory plan, where the weights are
//!   found, and how to call each kernel; also the compiler, kernel ABI and
//!   host it was built by and for, and the content key of its sources;
//! - `model.ir.json`, the tensor IR the runtime drives;
//! - `kernels.o`, the native code (an ELF object from Cranelift).
//!
//! The manifest is written last, so a folder with one is complete. An
//! artifact of another format, ABI or host is refused with a message, never
//! run.

use linnet_cpu::native::{self, Compiled};
use linnet_exec::BuildError;
use linnet_frontend::package::gguf_names::{self, GgufNames};
use linnet_frontend::package::Package;
use linnet_frontend::sema::footprint::human_bytes;
use linnet_frontend::source::SourceMap;
use linnet_ir::analysis::Analysis;
use linnet_ir::dim::Symbol;
use linnet_ir::quant::BlockFormat;
use linnet_ir::Dtype;
use linnet_ir::{plan, Model};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// Bumped whenever the files of an artifact change meaning.
pub const FORMAT_VERSION: u32 = 2;

const MANIFEST: &str = "artifact.json";
const IR: &str = "model.ir.json";
const KERNELS: &str = "kernels.o";

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    pub abi: u32,
    pub compiler: String,
    /// The host the kernels were compiled for: triple and ISA features.
    pub target: String,
    /// The content key of the sources (see [`content_key`]).
    pub key: String,
    pub model: String,
    pub weights: WeightSource,
    pub params: Vec<ParamRecord>,
    /// Where llama.cpp's GGUF files keep the parameters (the package's
    /// `gguf.json`, evaluated for this instance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gguf_names: Option<GgufNames>,
    pub states: Vec<StateRecord>,
    pub entries: Vec<EntrySignature>,
    pub plan: MemoryPlan,
    /// Per entry, its kernels in `kernels.o`.
    pub kernels: native::EntryKernels,
    /// The SHA-256 of each other file of the artifact, checked before the
    /// file is used (before its code is mapped, for `kernels.o`).
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// The SHA-256 of this manifest written with an empty seal: an edited
    /// field is refused, not trusted.
    #[serde(default)]
    pub seal: String,
}

fn sha256(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|byte| format!("{byte:02x}")).collect()
}

impl Manifest {
    /// This manifest with its seal computed, as [`write`] stores it.
    pub fn sealed(mut self) -> Result<Manifest, String> {
        self.seal = String::new();
        self.seal = sha256(&serde_json::to_vec(&self).map_err(|e| e.to_string())?);
        Ok(self)
    }

    /// The file `name` of the artifact in `dir`, if its hash is the one
    /// recorded when it was written.
    fn checked_file(&self, dir: &Path, name: &str) -> Result<Vec<u8>, String> {
        let path = dir.join(name);
        let bytes = std::fs::read(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
        match self.files.get(name) {
            Some(hash) if *hash == sha256(&bytes) => Ok(bytes),
            _ => Err(format!("{} is not the file this artifact was built with (its SHA-256 differs): rebuild it with `linnetc build`", path.display())),
        }
    }
}

/// The model card's `[weights]`: where a checkpoint is found.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct WeightSource {
    pub repo: Option<String>,
    pub revision: Option<String>,
    pub files: Vec<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ParamRecord {
    pub path: String,
    /// The checkpoint tensor `bindings.json` binds it to.
    pub tensor: Option<String>,
    pub shape: Vec<usize>,
    pub dtype: Dtype,
    /// The block format it is stored in, for a quantized checkpoint's
    /// build (`write_variant`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage: Option<BlockFormat>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StateRecord {
    pub path: String,
    pub shape: Vec<usize>,
    pub dtype: Dtype,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct TensorSignature {
    pub name: Option<String>,
    pub shape: Vec<String>,
    pub dtype: Dtype,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct EntrySignature {
    pub name: String,
    pub dims: Vec<String>,
    pub requires: Vec<String>,
    pub inputs: Vec<TensorSignature>,
    pub outputs: Vec<TensorSignature>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct MemoryPlan {
    pub weight_bytes: usize,
    pub state_bytes: usize,
    /// The entry dims the scratch figures are for (the card's `[check]`).
    pub at: BTreeMap<String, i64>,
    /// Per entry, the most bytes of intermediate values alive at once;
    /// `None` where `[check]` does not give every dim the entry has.
    pub peak_scratch: BTreeMap<String, Option<usize>>,
}

impl MemoryPlan {
    pub fn describe(&self) -> String {
        let mut lines = vec![
            format!("weights: {} ({} bytes)", human_bytes(self.weight_bytes as u128), self.weight_bytes),
            format!("states:  {} ({} bytes)", human_bytes(self.state_bytes as u128), self.state_bytes),
        ];
        let at: Vec<String> = self.at.iter().map(|(name, value)| format!("{name}={value}")).collect();
        for (entry, peak) in &self.peak_scratch {
            let peak = peak.map_or_else(
                || "unknown (give its dims in [check])".to_string(),
                |bytes| format!("{} ({bytes} bytes)", human_bytes(bytes as u128)),
            );
            lines.push(format!("scratch: {entry} at {}: {peak}", at.join(", ")));
        }
        lines.join("\n")
    }
}

/// This build of the compiler: its version and a hash of its sources.
pub fn compiler_build() -> String {
    format!("{} ({})", env!("CARGO_PKG_VERSION"), env!("LINNET_COMPILER_SOURCE_HASH"))
}

/// The key an artifact is cached by: the compiler build, the kernel ABI,
/// the host, and every text the compilation read (modules, standard library,
/// model card, bindings, `--set` values), with its path.
pub fn content_key(sources: &SourceMap) -> Result<String, String> {
    let mut hash = Sha256::new();
    for part in
        [&compiler_build(), &native::ABI_VERSION.to_string(), &FORMAT_VERSION.to_string(), &native::host_target()?]
    {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part.as_bytes());
    }
    for (_, file) in sources.iter() {
        let path = file.path.to_string_lossy();
        for part in [path.as_bytes(), file.text.as_bytes()] {
            hash.update((part.len() as u64).to_le_bytes());
            hash.update(part);
        }
    }
    Ok(hash.finalize().iter().map(|byte| format!("{byte:02x}")).collect())
}

/// The key of a variant of the artifact keyed `base`: the same sources
/// built with what `parts` says (a parameter's block format each).
pub fn variant_key(base: &str, parts: &[(&str, &str)]) -> String {
    let mut hash = Sha256::new();
    hash.update(base.as_bytes());
    for (name, value) in parts {
        for part in [name, value] {
            hash.update((part.len() as u64).to_le_bytes());
            hash.update(part.as_bytes());
        }
    }
    hash.finalize().iter().map(|byte| format!("{byte:02x}")).collect()
}

fn manifest(
    model: &Model,
    package: &Package,
    key: String,
    kernels: native::EntryKernels,
    files: BTreeMap<String, String>,
) -> Result<Manifest, String> {
    let bindings: HashMap<&str, &str> = package
        .bindings
        .iter()
        .flat_map(|b| &b.entries)
        .map(|(path, tensor, _)| (path.as_str(), tensor.as_str()))
        .collect();
    let nest = package.nest.as_ref();
    let dims: HashMap<Symbol, i64> = linnet_frontend::driver::check_dims(package);
    let tensor = |name: Option<&str>, shape: Vec<String>, dtype: Dtype| TensorSignature {
        name: name.map(str::to_string),
        shape,
        dtype,
    };
    let entries = model
        .entries
        .iter()
        .map(|entry| EntrySignature {
            name: entry.name.clone(),
            dims: entry.dims.iter().map(ToString::to_string).collect(),
            requires: entry.requires.iter().map(|r| r.text.clone()).collect(),
            inputs: entry
                .inputs
                .iter()
                .map(|i| tensor(Some(&i.name), i.shape.iter().map(ToString::to_string).collect(), i.dtype))
                .collect(),
            outputs: entry
                .outputs
                .iter()
                .map(|v| {
                    let node = &entry.nodes[v.index()];
                    tensor(None, node.shape.iter().map(ToString::to_string).collect(), node.dtype)
                })
                .collect(),
        })
        .collect();
    Manifest {
        format: FORMAT_VERSION,
        abi: native::ABI_VERSION,
        compiler: compiler_build(),
        target: native::host_target()?,
        key,
        model: model.name.clone(),
        weights: WeightSource {
            repo: nest.and_then(|n| n.repo.clone()),
            revision: nest.and_then(|n| n.revision.clone()),
            files: nest.map(|n| n.weight_files.clone()).unwrap_or_default(),
        },
        gguf_names: match (&package.gguf_names, gguf_names::of_package(package, &mut Vec::new())) {
            (Some(_), None) => return Err(format!("{}: gguf.json does not evaluate: run `linnetc check`", model.name)),
            (_, names) => names,
        },
        params: model
            .params
            .iter()
            .map(|p| ParamRecord {
                path: p.path.clone(),
                tensor: bindings.get(p.path.as_str()).map(|t| t.to_string()),
                shape: p.shape.clone(),
                dtype: p.dtype,
                storage: p.storage,
            })
            .collect(),
        states: model
            .states
            .iter()
            .map(|s| StateRecord { path: s.path.clone(), shape: s.shape.clone(), dtype: s.dtype })
            .collect(),
        entries,
        plan: MemoryPlan {
            weight_bytes: model.param_bytes(),
            state_bytes: model.state_bytes(),
            at: dims.iter().map(|(name, value)| (name.to_string(), *value)).collect(),
            peak_scratch: model.entries.iter().map(|e| (e.name.clone(), plan::peak_scratch(e, &dims))).collect(),
        },
        kernels,
        files,
        seal: String::new(),
    }
    .sealed()
}

/// Compiles `model` and writes its artifact into `dir` (created if need
/// be). Returns the manifest written.
pub fn write(model: &Model, package: &Package, key: String, dir: &Path) -> Result<Manifest, String> {
    let (ir, object, kernels) = compile(model)?;
    let files = BTreeMap::from([(IR.to_string(), sha256(&ir)), (KERNELS.to_string(), sha256(&object))]);
    let manifest = manifest(model, package, key, kernels, files)?;
    store(dir, &ir, &object, manifest)
}

/// Compiles `model`, `base`'s model with its parameters stored as a
/// checkpoint stores them (`Model::stored_as`), and writes its artifact,
/// `base`'s manifest with the new code, storage and weight bytes, into
/// `dir` under `key`.
pub fn write_variant(base: &Artifact, model: &Model, key: String, dir: &Path) -> Result<Manifest, String> {
    let (ir, object, kernels) = compile(model)?;
    let mut manifest = base.manifest.clone();
    manifest.key = key;
    manifest.kernels = kernels;
    manifest.files = BTreeMap::from([(IR.to_string(), sha256(&ir)), (KERNELS.to_string(), sha256(&object))]);
    for (record, param) in manifest.params.iter_mut().zip(&model.params) {
        record.storage = param.storage;
    }
    manifest.plan.weight_bytes = model.param_bytes();
    store(dir, &ir, &object, manifest.sealed()?)
}

/// The IR's JSON, the object file, and the records of its kernels.
fn compile(model: &Model) -> Result<(Vec<u8>, Vec<u8>, native::EntryKernels), String> {
    let analyses: Vec<Analysis> = model.entries.iter().map(Analysis::of).collect();
    let (object, kernels) = native::emit_object(model, &analyses).map_err(|error| match error.entry {
        Some(entry) => BuildError::new("cpu", &model.entries[entry], error.node, error.message).to_string(),
        None => format!("the cpu backend cannot compile `{}`: {}", model.name, error.message),
    })?;
    let ir = serde_json::to_vec(model).map_err(|e| e.to_string())?;
    Ok((ir, object, kernels))
}

/// Writes an artifact's files into `dir` (created if need be).
fn store(dir: &Path, ir: &[u8], object: &[u8], manifest: Manifest) -> Result<Manifest, String> {
    let io = |what: &str, error: std::io::Error| format!("cannot write {}: {error}", dir.join(what).display());
    std::fs::create_dir_all(dir).map_err(|e| io("", e))?;
    std::fs::write(dir.join(IR), ir).map_err(|e| io(IR, e))?;
    std::fs::write(dir.join(KERNELS), object).map_err(|e| io(KERNELS, e))?;
    let text = serde_json::to_string_pretty(&manifest).map_err(|e| e.to_string())?;
    std::fs::write(dir.join(MANIFEST), text + "\n").map_err(|e| io(MANIFEST, e))?;
    Ok(manifest)
}

/// Whether `dir` holds an artifact.
pub fn is_artifact(dir: &Path) -> bool {
    dir.join(MANIFEST).is_file()
}

/// An artifact read back: its manifest and IR.
pub struct Artifact {
    pub manifest: Manifest,
    pub model: Model,
}

/// Reads the manifest and IR of the artifact in `dir`, refusing one that
/// this runtime cannot read (its CPU code is checked against the host
/// when it is loaded: [`Artifact::kernels`]).
pub fn read(dir: &Path) -> Result<Artifact, String> {
    let read = |name: &str| {
        std::fs::read(dir.join(name)).map_err(|e| format!("cannot read {}: {e}", dir.join(name).display()))
    };
    let manifest: Manifest = serde_json::from_slice(&read(MANIFEST)?)
        .map_err(|e| format!("{}: not an artifact manifest: {e}", dir.join(MANIFEST).display()))?;
    let rebuild = format!("rebuild it with `linnetc build` ({})", dir.display());
    if manifest.format != FORMAT_VERSION || manifest.abi != native::ABI_VERSION {
        return Err(format!(
            "the artifact has format {} and kernel ABI {}; this runtime reads format {FORMAT_VERSION}, ABI {}: {rebuild}",
            manifest.format,
            manifest.abi,
            native::ABI_VERSION
        ));
    }
    if manifest.clone().sealed()?.seal != manifest.seal {
        return Err(format!(
            "{} was edited after it was written (its seal does not match): {rebuild}",
            dir.join(MANIFEST).display()
        ));
    }
    let model: Model = serde_json::from_slice(&manifest.checked_file(dir, IR)?)
        .map_err(|e| format!("{}: not a Linnet IR: {e}", dir.join(IR).display()))?;
    linnet_ir::verify(&model).map_err(|e| format!("{}: the IR does not verify: {e}", dir.join(IR).display()))?;
    Ok(Artifact { manifest, model })
}

impl Artifact {
    /// The native code of every entry, loaded from `kernels.o`: code for
    /// the host it was compiled on (its IR runs anywhere, on the other
    /// backends).
    pub fn kernels(&self, dir: &Path) -> Result<HashMap<String, Compiled>, String> {
        let host = native::host_target()?;
        if self.manifest.target != host {
            return Err(format!("the artifact's CPU code was compiled for {}, and this host is {host}: rebuild it with `linnetc build` ({})", self.manifest.target, dir.display()));
        }
        let object = self.manifest.checked_file(dir, KERNELS)?;
        native::load_object(&object, &self.model, &self.manifest.kernels)
    }

    /// The checkpoint tensor each parameter binds to.
    pub fn bindings(&self) -> HashMap<String, String> {
        self.manifest.params.iter().filter_map(|p| Some((p.path.clone(), p.tensor.clone()?))).collect()
    }
}
