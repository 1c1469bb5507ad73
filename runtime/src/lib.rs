//! The Linnet runtime: a package is built by the compiler into an artifact
//! (or an artifact is given), its weights are found and validated (or
//! drawn at random), and its entries run on native code or the reference
//! interpreter. All file IO of running a model is here.

pub mod bench;
pub mod cache;
pub mod constrain;
pub mod experts;
pub mod generate;
pub mod gguf;
#[cfg(feature = "cuda")]
mod gpu_ptx;
pub mod init;
pub mod npy;
pub mod perplexity;
pub mod quantize;
pub mod random;
pub mod sampling;
pub mod server;
pub mod stops;
pub mod text;
pub mod vocab;
pub mod weights;

use gguf::load::Naming;
use linnet_artifact::{self as artifact, Artifact};
use linnet_exec::tensor::Tensor;
use linnet_exec::Machine;
use linnet_frontend::diagnostic;
use linnet_frontend::driver;
use linnet_frontend::package::{LoadOptions, Package};
use linnet_ir::Model;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Which backend runs a loaded model's entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// The reference interpreter, the semantics of record.
    Interp,
    /// Native code from the artifact (Cranelift, with the CPU kernels).
    Cpu,
    /// The GPU kernels' bodies, lowered by MLIR for the host and run with
    /// its execution engine (builds with the `nvptx` feature): how the GPU
    /// target's numerics are checked without a GPU.
    MlirHost,
    /// The GPU kernels as PTX on an NVIDIA GPU, through the CUDA driver
    /// (builds with the `cuda` feature; runs where a driver and a device
    /// are found, and says so where not).
    Cuda,
}

/// Where the parameters come from.
#[derive(Clone, Debug)]
pub enum Weights {
    /// A checkpoint folder (`None` looks in the Hugging Face cache), and
    /// what to do with NaN or infinite weights in it.
    Checkpoint { dir: Option<PathBuf>, non_finite: weights::NonFinite },
    /// Drawn in memory from a seeded generator.
    Random(u64),
}

pub struct Loaded {
    pub machine: Machine,
    /// The checkpoint's folder, when there is one.
    pub weights_dir: Option<PathBuf>,
    pub text: Option<text::TextModel>,
}

/// A package checked and lowered, or the rendered reasons why not.
pub fn lower(package: &Path, options: &LoadOptions) -> Result<(Model, Package), String> {
    match driver::lower_package(package, options) {
        Ok((model, checked)) => Ok((model, checked.package.expect("a lowered package was loaded"))),
        Err(checked) => Err(render(&checked)),
    }
}

/// Why a package does not build: its diagnostics, rendered.
fn render(checked: &driver::Checked) -> String {
    let mut out = Vec::new();
    match diagnostic::render_human(&checked.diagnostics, &checked.sources, false, &mut out) {
        Ok(()) => format!("{}the package does not check; fix the errors above", String::from_utf8_lossy(&out)),
        Err(error) => format!("the package does not check, and its diagnostics cannot be rendered: {error}"),
    }
}

/// The package's bindings: parameter path to checkpoint tensor name.
pub fn bindings(package: &Package) -> HashMap<String, String> {
    package
        .bindings
        .as_ref()
        .map(|b| b.entries.iter().map(|(path, tensor, _)| (path.clone(), tensor.clone())).collect())
        .unwrap_or_default()
}

/// A package ready to run on the interpreter, or why not, as text.
pub fn load(package: &Path, options: &LoadOptions, weights: &Weights) -> Result<Loaded, String> {
    load_on(package, options, weights, BackendKind::Interp)
}

/// A package or artifact ready to run on `backend`, or why not, as text.
/// A package is built into the artifact cache first, unless an artifact of
/// the same content is there already.
pub fn load_on(
    package: &Path,
    options: &LoadOptions,
    weights: &Weights,
    backend: BackendKind,
) -> Result<Loaded, String> {
    // The device first, before the weights are read or drawn: a machine
    // without a GPU says so at once.
    let device = if backend == BackendKind::Cuda { Some(open_cuda()?) } else { None };
    let mut dir = cache::artifact_for(package, options)?;
    let mut built = artifact::read(&dir)?;
    let params = match weights {
        Weights::Random(seed) => random::params(&built.model, *seed)?,
        Weights::Checkpoint { dir: given, non_finite } => {
            let source = built.manifest.weights.clone();
            let found = weights::locate(given.as_deref(), source.repo.as_deref(), source.revision.as_deref())?;
            // GGUF weights are opened once: their formats, parameters and text.
            let gguf_files = if weights::is_gguf(&found) { Some(gguf::Files::open(&found)?) } else { None };
            if let Some(files) = &gguf_files {
                // A quantized file's parameters are read in its blocks: the
                // model is built for its formats.
                let formats = gguf::load::formats(&built.model, &Naming::of_artifact(&built), files)?;
                if !formats.is_empty() {
                    dir = cache::stored_variant(&built, &formats)?;
                    built = artifact::read(&dir)?;
                }
            }
            let model = &built.model;
            let naming = Naming::of_artifact(&built);
            let params = match &gguf_files {
                Some(files) => gguf::load::load(model, &naming, files, *non_finite),
                None => weights::load(model, &naming, &found, &source.files, *non_finite),
            }
            .map_err(|problems| weights::unfit(&found, model, &problems))?;
            // A GGUF file's own vocabulary, else the tokenizer files beside it.
            let text = match &gguf_files {
                Some(files) => match text::TextModel::of_gguf(files)? {
                    Some(text) => Some(text),
                    None => text::TextModel::load(found.parent().unwrap_or(&found))?,
                },
                None => text::TextModel::load(&found)?,
            };
            let machine = machine(&built, &dir, params, backend, device)?;
            return Ok(Loaded { machine, weights_dir: Some(found), text });
        }
    };
    Ok(Loaded { machine: machine(&built, &dir, params, backend, device)?, weights_dir: None, text: None })
}

/// The loaded model on `backend`; `device` is the CUDA device it opened.
fn machine(
    built: &Artifact,
    dir: &Path,
    params: Vec<Tensor>,
    backend: BackendKind,
    device: Option<CudaDevice>,
) -> Result<Machine, String> {
    match backend {
        BackendKind::Interp => Ok(linnet_exec::interp::machine(built.model.clone(), params)),
        BackendKind::Cpu => linnet_cpu::backend::machine(built.model.clone(), params, Some(built.kernels(dir)?))
            .map_err(|e| e.to_string()),
        BackendKind::MlirHost => mlir_host(built.model.clone(), params),
        BackendKind::Cuda => cuda(built, dir, params, device),
    }
}

#[cfg(feature = "cuda")]
type CudaDevice = linnet_gpu::cuda::Cuda;

/// No device: a linnet without the cuda backend opens none.
#[cfg(not(feature = "cuda"))]
type CudaDevice = std::convert::Infallible;

/// The first CUDA device, or why there is none.
#[cfg(feature = "cuda")]
fn open_cuda() -> Result<CudaDevice, String> {
    let device = linnet_gpu::cuda::Cuda::open()?;
    tracing::info!("the cuda backend on {}", device.device());
    Ok(device)
}

#[cfg(not(feature = "cuda"))]
fn open_cuda() -> Result<CudaDevice, String> {
    Err("this linnet was built without the cuda backend: build it with `--features cuda`".into())
}

/// The artifact's model on `device` (opened here if not yet), running the
/// artifact's PTX (built into it first when absent, by a linnet with
/// `nvptx`).
#[cfg(feature = "cuda")]
fn cuda(built: &Artifact, dir: &Path, params: Vec<Tensor>, device: Option<CudaDevice>) -> Result<Machine, String> {
    let device = match device {
        Some(device) => device,
        None => open_cuda()?,
    };
    let set = gpu_ptx::for_artifact(&built.model, dir, device.arch())?;
    Machine::new(built.model.clone(), params, device.running(set)).map_err(|e| e.to_string())
}

#[cfg(not(feature = "cuda"))]
fn cuda(_: &Artifact, _: &Path, _: Vec<Tensor>, _: Option<CudaDevice>) -> Result<Machine, String> {
    open_cuda().map(|never| match never {})
}

#[cfg(feature = "nvptx")]
fn mlir_host(model: Model, params: Vec<Tensor>) -> Result<Machine, String> {
    Machine::new(model, params, linnet_gpu::host::MlirHost::default()).map_err(|e| e.to_string())
}

#[cfg(not(feature = "nvptx"))]
fn mlir_host(_: Model, _: Vec<Tensor>) -> Result<Machine, String> {
    Err("this linnet was built without the GPU kernels' host backend: run scripts/install-gpu-tools.sh, then build with `--features nvptx`".into())
}
