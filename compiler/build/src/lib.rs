//! From packages to artifacts: a package checked and lowered by the
//! frontend, its code generated for each backend (the CPU's object file by
//! `linnet-cranelift`, PTX by `linnet-gpu` with the `nvptx` feature), and
//! written with its manifest as one artifact (`linnet-artifact`); the
//! artifact cache that builds a package on demand (`cache`); and
//! [`Builder`], the `linnet_artifact::Compiler` the runtime calls back when
//! a checkpoint or a device needs code the artifact lacks. What `linnetc
//! build` and the `linnet` CLI call; the runtime library never links this
//! crate, nor this crate the runtime.

pub mod cache;

use linnet_artifact::gguf_names::GgufNames;
use linnet_artifact::{
    Artifact, ArtifactError, Compiler, CompilerError, EntrySignature, Manifest, MemoryPlan, Naming, ParamRecord,
    Section, StateRecord, TensorSignature, WeightSource,
};
use linnet_frontend::diagnostic;
use linnet_frontend::driver::{self, Checked};
use linnet_frontend::package::{LoadOptions, Package};
use linnet_frontend::source::SourceMap;
use linnet_ir::analysis::Analysis;
use linnet_ir::dim::Symbol;
use linnet_ir::{plan, Dtype, Model, StoredBlocks};
use sha2::{Digest, Sha256};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Why a package or a model could not be built into an artifact.
#[derive(Debug, thiserror::Error)]
pub enum CompileError {
    /// The package does not check or lower: its diagnostics, rendered.
    #[error("{0}")]
    Diagnostics(String),
    /// The code generator refused a node (named) or the whole model.
    #[error("{0}")]
    Codegen(String),
    #[error("{0}: gguf.json does not evaluate: run `linnetc check`")]
    GgufNames(String),
    #[error("the checkpoint's block formats do not fit the model:\n  {}", .0.join("\n  "))]
    Storage(Vec<String>),
    #[error(transparent)]
    Artifact(#[from] ArtifactError),
    #[error("no artifact cache: set LINNET_CACHE_DIR (neither XDG_CACHE_HOME nor HOME is set)")]
    NoCache,
    #[error("{} is a built artifact: `--nest` and `--set` apply when building a package", .0.display())]
    OptionsForAnArtifact(PathBuf),
    #[error("cannot move the built artifact to {}", .0.display())]
    Place(PathBuf),
    /// PTX could not be built (or this build has no MLIR to build it).
    #[error("{0}")]
    Ptx(String),
}

/// This build of the compiler: its version and a hash of its sources.
pub fn compiler_build() -> String {
    format!("{} ({})", env!("CARGO_PKG_VERSION"), env!("LINNET_COMPILER_SOURCE_HASH"))
}

/// The key an artifact is cached by: the compiler build, the kernel ABI,
/// the artifact format, the host, and every text the compilation read
/// (modules, standard library, model card, bindings, `--set` values), with
/// its path.
pub fn content_key(sources: &SourceMap) -> String {
    let mut hash = Sha256::new();
    let abi = linnet_cpu::abi::ABI_VERSION.to_string();
    let format = linnet_artifact::FORMAT_VERSION.to_string();
    for part in [&compiler_build(), &abi, &format, &linnet_cpu::host::target()] {
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
    linnet_artifact::hex(hash.finalize())
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
    linnet_artifact::hex(hash.finalize())
}

/// Why a package does not build: its diagnostics, rendered.
pub fn render(checked: &Checked) -> String {
    let mut out = Vec::new();
    match diagnostic::render_human(&checked.diagnostics, &checked.sources, false, &mut out) {
        Ok(()) => format!("{}the package does not check; fix the errors above", String::from_utf8_lossy(&out)),
        Err(error) => format!("the package does not check, and its diagnostics cannot be rendered: {error}"),
    }
}

/// A package checked and lowered, or its diagnostics rendered.
pub fn lower(package: &Path, options: &LoadOptions) -> Result<(Model, Package), CompileError> {
    match driver::lower_package(package, options) {
        Ok((model, checked)) => Ok((model, checked.package.expect("a lowered package was loaded"))),
        Err(checked) => Err(CompileError::Diagnostics(render(&checked))),
    }
}

/// The package's bindings for its instance: parameter path to checkpoint
/// tensor name (`linnet_frontend::sema::instantiate::bindings`).
pub fn bindings(package: &Package) -> HashMap<String, String> {
    linnet_frontend::sema::instantiate::bindings(package)
}

/// How a package's parameters are named in checkpoints, for its instance.
pub fn naming(package: &Package) -> Naming {
    let (bindings, gguf_names) = linnet_frontend::sema::instantiate::names(package);
    Naming { bindings, gguf_names }
}

/// `names`, the package's `gguf.json` for its instance, or the error that
/// it has one that does not evaluate.
fn gguf_names_of(
    model: &Model,
    package: &Package,
    names: Option<GgufNames>,
) -> Result<Option<GgufNames>, CompileError> {
    match (&package.gguf_names, names) {
        (Some(_), None) => Err(CompileError::GgufNames(model.name.clone())),
        (_, names) => Ok(names),
    }
}

/// The manifest of `model`, lowered from `package`, without its code
/// sections (`linnet_artifact::write` adds them).
fn manifest(model: &Model, package: &Package, key: String) -> Result<Manifest, CompileError> {
    let Naming { bindings, gguf_names } = naming(package);
    let nest = package.nest.as_ref();
    let dims: HashMap<Symbol, i64> = driver::check_dims(package);
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
    Ok(Manifest {
        format: linnet_artifact::FORMAT_VERSION,
        compiler: compiler_build(),
        key,
        model: model.name.clone(),
        weights: WeightSource {
            repo: nest.and_then(|n| n.repo.clone()),
            revision: nest.and_then(|n| n.revision.clone()),
        },
        gguf_names: gguf_names_of(model, package, gguf_names)?,
        params: model
            .params
            .iter()
            .map(|p| ParamRecord {
                path: p.path.clone(),
                tensor: bindings.get(&p.path).cloned(),
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
        code: BTreeMap::new(),
        files: BTreeMap::new(),
        seal: String::new(),
    })
}

/// The CPU section of `model`: its object file and kernel records.
fn cpu_section(model: &Model) -> Result<Section, CompileError> {
    let analyses: Vec<Analysis> = model.entries.iter().map(Analysis::of).collect();
    let (object, records) = linnet_cranelift::emit_object(model, &analyses).map_err(|error| {
        CompileError::Codegen(match error.entry {
            Some(entry) => {
                linnet_exec::BuildError::new("cpu", &model.entries[entry], error.node, error.message).to_string()
            }
            None => format!("the cpu backend cannot compile `{}`: {}", model.name, error.message),
        })
    })?;
    Ok(linnet_cpu::load::section(object, &records))
}

/// Compiles `model` (lowered from `package`) and writes its artifact into
/// `dir` (created if need be). Returns the manifest written.
pub fn write(model: &Model, package: &Package, key: String, dir: &Path) -> Result<Manifest, CompileError> {
    let manifest = manifest(model, package, key)?;
    Ok(linnet_artifact::write(dir, manifest, model, vec![cpu_section(model)?])?)
}

/// Compiles `model`, `base`'s model with its parameters stored as a
/// checkpoint stores them (`Model::stored_as`), and writes its artifact,
/// `base`'s manifest with the new code, storage and weight bytes, into
/// `dir` under `key`.
pub fn write_variant(base: &Artifact, model: &Model, key: String, dir: &Path) -> Result<Manifest, CompileError> {
    let mut manifest = base.manifest.clone();
    manifest.key = key;
    for (record, param) in manifest.params.iter_mut().zip(&model.params) {
        record.storage = param.storage;
    }
    manifest.plan.weight_bytes = model.param_bytes();
    Ok(linnet_artifact::write(dir, manifest, model, vec![cpu_section(model)?])?)
}

/// The kernels of `artifact`'s model as PTX for `arch`, added to it as its
/// `nvptx-ARCH` section, with the set built.
#[cfg(feature = "nvptx")]
pub fn add_ptx(
    artifact: Artifact,
    arch: &str,
    libdevice: &Path,
) -> Result<(Artifact, linnet_gpu::PtxSet), CompileError> {
    if !libdevice.is_file() {
        return Err(CompileError::Ptx(format!(
            "libdevice is not at {} (the math functions link it): run scripts/install-gpu-tools.sh, or set LINNET_LIBDEVICE",
            libdevice.display()
        )));
    }
    let model = &artifact.model;
    let built = linnet_gpu::build(model, arch, Some(libdevice)).map_err(|e| CompileError::Ptx(e.to_string()))?;
    if !built.missing.is_empty() {
        let missing: Vec<String> = built.missing.iter().map(ToString::to_string).collect();
        return Err(CompileError::Ptx(format!(
            "`{}` cannot be compiled for nvptx yet: {} node(s) without a GPU kernel:\n  {}",
            model.name,
            missing.len(),
            missing.join("\n  ")
        )));
    }
    let set = linnet_gpu::PtxSet::of(model, arch, built);
    let artifact = artifact.with_section(set.to_section())?;
    Ok((artifact, set))
}

/// The compiler the runtime calls back: a stored variant built into the
/// artifact cache, PTX built into the artifact (with the `nvptx` feature).
#[derive(Clone, Copy, Debug, Default)]
pub struct Builder;

impl Compiler for Builder {
    fn stored_variant(
        &self,
        base: &Artifact,
        formats: &BTreeMap<String, StoredBlocks>,
    ) -> Result<Artifact, CompilerError> {
        let dir = cache::stored_variant(base, formats)?;
        Ok(linnet_artifact::read(&dir)?)
    }

    fn ptx(&self, artifact: Artifact, arch: &str) -> Result<Artifact, CompilerError> {
        #[cfg(feature = "nvptx")]
        {
            let started = std::time::Instant::now();
            let (artifact, _) = add_ptx(artifact, arch, &linnet_gpu::default_libdevice())?;
            tracing::info!(artifact = %artifact.dir.display(), arch, seconds = started.elapsed().as_secs_f64(), "built PTX");
            Ok(artifact)
        }
        #[cfg(not(feature = "nvptx"))]
        Err(Box::new(CompileError::Ptx(format!(
            "the artifact {} has no PTX of `{}` for {arch}: build it with `linnetc build PACKAGE --target nvptx --gpu-arch {arch} -o {}` (a linnetc with the nvptx feature), or run a linnet built with `--features nvptx,cuda`",
            artifact.dir.display(),
            artifact.model.name,
            artifact.dir.display()
        ))))
    }
}
