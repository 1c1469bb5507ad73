//! Build artifacts: what `linnetc build` writes and the runtime loads, the
//! same for every backend. An artifact is a folder of files under one
//! manifest:
//!
//! - `artifact.json`, the manifest: the model's entries with their
//!   signatures, its parameters with the checkpoint tensors they bind to,
//!   shapes and dtypes, its states, the memory plan, where the weights are
//!   found (and how, in llama.cpp's GGUF files: `gguf_names`); the
//!   compiler that built it and the content key of its sources; its code
//!   sections; and the SHA-256 of every other file, under one seal;
//! - `model.ir.json`, the tensor IR the runtime drives (on any backend;
//!   the reference interpreter needs nothing else);
//! - one file per code section ([`CodeSection`]): native code for a
//!   backend and a target (the CPU's object file, PTX for a GPU
//!   architecture), peers under the manifest. Each backend reads its own
//!   section and checks that it was compiled for this host and ABI; this
//!   crate knows none of them.
//!
//! The manifest is written last, so a folder with one is complete. An
//! artifact of another format, or whose files or manifest changed after
//! it was sealed, is refused with a message, never run.

pub mod gguf_names;

use gguf_names::GgufNames;
use linnet_ir::plan::human_bytes;
use linnet_ir::quant::BlockFormat;
use linnet_ir::StoredBlocks;
use linnet_ir::{Dtype, Model};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Bumped whenever the files of an artifact change meaning.
pub const FORMAT_VERSION: u32 = 4;

const MANIFEST: &str = "artifact.json";
const IR: &str = "model.ir.json";

/// Why an artifact cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    #[error("cannot {action} {}: {error}", path.display())]
    Io { action: &'static str, path: PathBuf, error: std::io::Error },
    #[error("{}: not an artifact manifest: {error}", path.display())]
    NotAManifest { path: PathBuf, error: serde_json::Error },
    #[error("the artifact has format {found}; this runtime reads format {FORMAT_VERSION}: rebuild it with `linnetc build` ({})", dir.display())]
    OtherFormat { found: u32, dir: PathBuf },
    #[error("{} was edited after it was written (its seal does not match): rebuild it with `linnetc build`", path.display())]
    Edited { path: PathBuf },
    #[error("{} is not the file this artifact was built with (its SHA-256 differs): rebuild it with `linnetc build`", path.display())]
    FileChanged { path: PathBuf },
    #[error("{}: not a Linnet IR: {error}", path.display())]
    NotAnIr { path: PathBuf, error: serde_json::Error },
    #[error("{}: the IR does not verify: {error}", path.display())]
    Unverified { path: PathBuf, error: linnet_ir::VerifyError },
    #[error("the artifact {} has no {section} code", dir.display())]
    NoSection { section: String, dir: PathBuf },
    #[error("cannot write the manifest: {0}")]
    Serialize(serde_json::Error),
}

fn io(action: &'static str, path: PathBuf) -> impl FnOnce(std::io::Error) -> ArtifactError {
    move |error| ArtifactError::Io { action, path, error }
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Manifest {
    pub format: u32,
    /// The compiler build that wrote it.
    pub compiler: String,
    /// The content key of the sources it was built from.
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
    /// The code sections, by name (`cpu`, `nvptx-sm_90`).
    #[serde(default)]
    pub code: BTreeMap<String, CodeSection>,
    /// The SHA-256 of each other file of the artifact, checked before the
    /// file is used (before its code is mapped).
    #[serde(default)]
    pub files: BTreeMap<String, String>,
    /// The SHA-256 of this manifest written with an empty seal: an edited
    /// field is refused, not trusted.
    #[serde(default)]
    pub seal: String,
}

/// Native code for one backend and target: its file in the artifact, what
/// it was compiled for (a host's triple and features, a GPU architecture)
/// and the ABI it follows, both as its backend names them, and what the
/// backend needs to call it (the CPU's kernel records, say), as the
/// backend writes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CodeSection {
    pub file: String,
    pub target: String,
    pub abi: u32,
    #[serde(default)]
    pub calls: serde_json::Value,
}

/// A digest in lowercase hexadecimal, as manifests and content keys write
/// them.
pub fn hex(digest: impl AsRef<[u8]>) -> String {
    digest.as_ref().iter().map(|byte| format!("{byte:02x}")).collect()
}

/// The SHA-256 of `bytes`, in hexadecimal.
pub fn sha256(bytes: &[u8]) -> String {
    hex(Sha256::digest(bytes))
}

impl Manifest {
    /// This manifest with its seal computed, as [`write`] stores it.
    fn sealed(mut self) -> Result<Manifest, ArtifactError> {
        self.seal = String::new();
        self.seal = sha256(&serde_json::to_vec(&self).map_err(ArtifactError::Serialize)?);
        Ok(self)
    }

    /// The file `name` of the artifact in `dir`, if its hash is the one
    /// recorded when it was written.
    fn checked_file(&self, dir: &Path, name: &str) -> Result<Vec<u8>, ArtifactError> {
        let path = dir.join(name);
        let bytes = std::fs::read(&path).map_err(io("read", path.clone()))?;
        match self.files.get(name) {
            Some(hash) if *hash == sha256(&bytes) => Ok(bytes),
            _ => Err(ArtifactError::FileChanged { path }),
        }
    }
}

/// The model card's `[weights]`: where a checkpoint is found.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct WeightSource {
    pub repo: Option<String>,
    pub revision: Option<String>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ParamRecord {
    pub path: String,
    /// The checkpoint tensor `bindings.json` binds it to.
    pub tensor: Option<String>,
    pub shape: Vec<usize>,
    pub dtype: Dtype,
    /// The block format it is stored in, for a quantized checkpoint's
    /// build.
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

/// A code section to write: its name in the manifest, its record, and its
/// file's bytes.
pub struct Section {
    pub name: String,
    pub section: CodeSection,
    pub bytes: Vec<u8>,
}

/// Writes an artifact into `dir` (created if need be): the IR of `model`,
/// each section's file, and `manifest` with those sections, the files'
/// hashes and its seal (whatever `manifest` held of them is replaced).
/// Returns the manifest written.
pub fn write(
    dir: &Path,
    mut manifest: Manifest,
    model: &Model,
    sections: Vec<Section>,
) -> Result<Manifest, ArtifactError> {
    std::fs::create_dir_all(dir).map_err(io("create", dir.to_path_buf()))?;
    let ir = serde_json::to_vec(model).map_err(ArtifactError::Serialize)?;
    std::fs::write(dir.join(IR), &ir).map_err(io("write", dir.join(IR)))?;
    manifest.format = FORMAT_VERSION;
    manifest.files = BTreeMap::from([(IR.to_string(), sha256(&ir))]);
    manifest.code = BTreeMap::new();
    for section in sections {
        write_section(dir, &mut manifest, section)?;
    }
    store_manifest(dir, manifest)
}

fn write_section(dir: &Path, manifest: &mut Manifest, section: Section) -> Result<(), ArtifactError> {
    let path = dir.join(&section.section.file);
    std::fs::write(&path, &section.bytes).map_err(io("write", path))?;
    manifest.files.insert(section.section.file.clone(), sha256(&section.bytes));
    manifest.code.insert(section.name, section.section);
    Ok(())
}

/// The manifest sealed and written, through a file of its own renamed
/// into place: a reader sees the old manifest or the new, never half one.
fn store_manifest(dir: &Path, manifest: Manifest) -> Result<Manifest, ArtifactError> {
    let manifest = manifest.sealed()?;
    let text = serde_json::to_string_pretty(&manifest).map_err(ArtifactError::Serialize)? + "\n";
    let partial = dir.join(format!("{MANIFEST}.partial-{}", std::process::id()));
    std::fs::write(&partial, text).map_err(io("write", partial.clone()))?;
    std::fs::rename(&partial, dir.join(MANIFEST)).map_err(io("write", dir.join(MANIFEST)))?;
    Ok(manifest)
}

/// Whether `dir` holds an artifact.
pub fn is_artifact(dir: &Path) -> bool {
    dir.join(MANIFEST).is_file()
}

/// An artifact read back: its folder, manifest and IR.
#[derive(Clone, Debug)]
pub struct Artifact {
    pub dir: PathBuf,
    pub manifest: Manifest,
    pub model: Model,
}

/// Reads the manifest and IR of the artifact in `dir`, refusing one of
/// another format or changed since it was sealed (a backend checks its
/// own section when it loads it: [`Artifact::code`]).
pub fn read(dir: &Path) -> Result<Artifact, ArtifactError> {
    let path = dir.join(MANIFEST);
    let text = std::fs::read(&path).map_err(io("read", path.clone()))?;
    let manifest: Manifest =
        serde_json::from_slice(&text).map_err(|error| ArtifactError::NotAManifest { path: path.clone(), error })?;
    if manifest.format != FORMAT_VERSION {
        return Err(ArtifactError::OtherFormat { found: manifest.format, dir: dir.to_path_buf() });
    }
    if manifest.clone().sealed()?.seal != manifest.seal {
        return Err(ArtifactError::Edited { path });
    }
    let path = dir.join(IR);
    let model: Model = serde_json::from_slice(&manifest.checked_file(dir, IR)?)
        .map_err(|error| ArtifactError::NotAnIr { path: path.clone(), error })?;
    linnet_ir::verify(&model).map_err(|error| ArtifactError::Unverified { path, error })?;
    Ok(Artifact { dir: dir.to_path_buf(), manifest, model })
}

impl Artifact {
    /// The code section `name` and its file's bytes, checked against the
    /// hash sealed with the manifest.
    pub fn code(&self, name: &str) -> Result<(&CodeSection, Vec<u8>), ArtifactError> {
        let section = self
            .manifest
            .code
            .get(name)
            .ok_or_else(|| ArtifactError::NoSection { section: name.to_string(), dir: self.dir.clone() })?;
        Ok((section, self.manifest.checked_file(&self.dir, &section.file)?))
    }

    /// The artifact with `section` added (or replaced) and the manifest
    /// sealed again: code built for it later, PTX for a device, say.
    pub fn with_section(mut self, section: Section) -> Result<Artifact, ArtifactError> {
        write_section(&self.dir, &mut self.manifest, section)?;
        self.manifest = store_manifest(&self.dir, self.manifest)?;
        Ok(self)
    }

    /// The checkpoint tensor each parameter binds to.
    pub fn bindings(&self) -> HashMap<String, String> {
        self.manifest.params.iter().filter_map(|p| Some((p.path.clone(), p.tensor.clone()?))).collect()
    }

    /// How its parameters are named in checkpoints, as it was built.
    pub fn naming(&self) -> Naming {
        Naming { bindings: self.bindings(), gguf_names: self.manifest.gguf_names.clone() }
    }
}

/// How a model's parameters are named in checkpoints: its bindings
/// (checkpoint tensor names) and, for llama.cpp's GGUF files, its
/// `gguf.json` evaluated for the instance.
#[derive(Clone, Debug, Default)]
pub struct Naming {
    /// Parameter path → the checkpoint's tensor name; a binding may name
    /// alternatives, `A | B` ([`binding_names`]).
    pub bindings: HashMap<String, String>,
    pub gguf_names: Option<GgufNames>,
}

/// The tensor names a binding allows, in order: `lm_head.weight |
/// model.embed_tokens.weight` is the head where the checkpoint has one, else
/// the embeddings (a head tied to them). A loader takes the first the
/// checkpoint holds; a writer writes the first.
pub fn binding_names(binding: &str) -> impl Iterator<Item = &str> {
    binding.split('|').map(str::trim)
}

/// The tensor name a writer gives a parameter bound by `binding`: its first.
pub fn written_name(binding: &str) -> &str {
    binding_names(binding).next().unwrap_or(binding)
}

/// What a runtime may ask of a compiler it does not link, for an artifact:
/// the artifact rebuilt for a checkpoint's block formats, PTX for a device.
/// The runtime takes one where it can be given (the `linnet` CLI gives
/// `linnet_build::Builder`), and without one says which command builds
/// what it lacks.
pub trait Compiler {
    /// The artifact of `base` for a checkpoint that stores the parameters
    /// of `formats` in those block formats (and column orders).
    fn stored_variant(
        &self,
        base: &Artifact,
        formats: &BTreeMap<String, StoredBlocks>,
    ) -> Result<Artifact, CompilerError>;
    /// `artifact` with a PTX section for `arch`.
    fn ptx(&self, artifact: Artifact, arch: &str) -> Result<Artifact, CompilerError>;
}

/// Why a [`Compiler`] could not build what was asked, as it says.
pub type CompilerError = Box<dyn std::error::Error + Send + Sync>;

#[cfg(test)]
mod tests;
