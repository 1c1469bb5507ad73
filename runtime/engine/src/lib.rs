//! The Linnet runtime: a built artifact is loaded, its weights are found
//! and validated (or drawn at random), and its entries run on native code
//! or the reference interpreter; text in and out, sampling, constrained
//! decoding, generation, perplexity, GGUF files read and written. All file
//! IO of running a model is here. It links no compiler: where a
//! checkpoint or a device needs code the artifact lacks, it asks the
//! [`Compiler`] it is given (the CLI's, which builds on demand).

pub mod bench;
mod clock;
pub mod constrain;
mod error;
mod experts;
pub mod gbnf;
pub mod generate;
pub mod gguf;
pub mod init;
pub mod mtp;
mod mxfp4;
pub mod npy;
pub mod perplexity;
pub mod quantize;
pub mod random;
pub mod sampling;
pub mod speculative;
pub mod stops;
pub mod text;
pub mod vocab;
pub mod weights;

pub use error::{Error, Result};
use linnet_artifact::Artifact;
pub use linnet_artifact::{Compiler, CompilerError, Naming};
use linnet_exec::tensor::Tensor;
use linnet_exec::Machine;
use linnet_ir::Model;
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

/// The artifact in `dir` ready to run on `backend` with `weights`, or why
/// not. A quantized checkpoint's formats need code built for them: by
/// `compiler`, or refused without one.
pub fn load(
    dir: &Path,
    weights: &Weights,
    backend: BackendKind,
    compiler: Option<&dyn Compiler>,
) -> Result<Loaded, Error> {
    // The device first, before the weights are read or drawn: a machine
    // without a GPU says so at once.
    let device = if backend == BackendKind::Cuda { Some(open_cuda()?) } else { None };
    let mut built = linnet_artifact::read(dir)?;
    let params = match weights {
        Weights::Random(seed) => random::params(&built.model, *seed)?,
        Weights::Checkpoint { dir: given, non_finite } => {
            let source = built.manifest.weights.clone();
            let found = weights::locate(given.as_deref(), source.repo.as_deref(), source.revision.as_deref())?;
            // GGUF weights are opened once: their formats, parameters and text.
            let gguf_files = if weights::is_gguf(&found) { Some(gguf::Files::open(&found)?) } else { None };
            // A quantized checkpoint's parameters are read in its blocks:
            // the model is built for its formats.
            let formats = match &gguf_files {
                Some(files) => gguf::load::formats(&built.model, &built.naming(), files)?,
                None => weights::formats(&built.model, &built.naming(), &found)?,
            };
            if !formats.is_empty() {
                let compiler = compiler.ok_or_else(|| Error::Weights(format!("{} stores parameters in block formats, and this runtime has no compiler to build `{}` for them: run it with the `linnet` CLI", found.display(), built.model.name)))?;
                built = compiler.stored_variant(&built, &formats).map_err(Error::Compile)?;
            }
            let model = &built.model;
            let naming = built.naming();
            let params = match &gguf_files {
                Some(files) => gguf::load::load(model, &naming, files, *non_finite),
                None => weights::load(model, &naming, &found, *non_finite),
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
            let machine = machine(built, params, backend, device, compiler)?;
            return Ok(Loaded { machine, weights_dir: Some(found), text });
        }
    };
    Ok(Loaded { machine: machine(built, params, backend, device, compiler)?, weights_dir: None, text: None })
}

/// The loaded model on `backend`; `device` is the CUDA device it opened.
fn machine(
    built: Artifact,
    params: Vec<Tensor>,
    backend: BackendKind,
    device: Option<CudaDevice>,
    compiler: Option<&dyn Compiler>,
) -> Result<Machine, Error> {
    match backend {
        BackendKind::Interp => Ok(linnet_exec::interp::machine(built.model, params)),
        BackendKind::Cpu => {
            let code = linnet_cpu::load::from_artifact(&built)?;
            Ok(linnet_cpu::machine(built.model, params, code)?)
        }
        BackendKind::MlirHost => mlir_host(built.model, params),
        BackendKind::Cuda => cuda(built, params, device, compiler),
    }
}

#[cfg(feature = "cuda")]
type CudaDevice = linnet_gpu::cuda::Cuda;

/// No device: a linnet without the cuda backend opens none.
#[cfg(not(feature = "cuda"))]
type CudaDevice = std::convert::Infallible;

/// The first CUDA device, or why there is none.
#[cfg(feature = "cuda")]
fn open_cuda() -> Result<CudaDevice, Error> {
    let device = linnet_gpu::cuda::Cuda::open()?;
    tracing::info!("the cuda backend on {}", device.device());
    Ok(device)
}

#[cfg(not(feature = "cuda"))]
fn open_cuda() -> Result<CudaDevice, Error> {
    Err(Error::Device("this linnet was built without the cuda backend: build it with `--features cuda`".into()))
}

/// The artifact's model on `device` (opened here if not yet), running the
/// artifact's PTX for it (built into it first when absent, by `compiler`).
#[cfg(feature = "cuda")]
fn cuda(
    built: Artifact,
    params: Vec<Tensor>,
    device: Option<CudaDevice>,
    compiler: Option<&dyn Compiler>,
) -> Result<Machine, Error> {
    let device = match device {
        Some(device) => device,
        None => open_cuda()?,
    };
    let arch = device.arch().to_string();
    let (built, set) = match linnet_gpu::PtxSet::of_artifact(&built, &arch)? {
        Some(set) => (built, set),
        None => {
            let compiler = compiler.ok_or_else(|| {
                Error::Device(format!("the artifact {} has no PTX for {arch}, and this runtime has no compiler to build it: build it with `linnetc build PACKAGE --target nvptx --gpu-arch {arch} -o {}`", built.dir.display(), built.dir.display()))
            })?;
            let built = compiler.ptx(built, &arch).map_err(Error::Compile)?;
            let set = linnet_gpu::PtxSet::of_artifact(&built, &arch)?
                .ok_or_else(|| Error::Device("the compiler added no PTX section".into()))?;
            (built, set)
        }
    };
    Ok(Machine::new(built.model, params, device.running(set))?)
}

#[cfg(not(feature = "cuda"))]
fn cuda(_: Artifact, _: Vec<Tensor>, _: Option<CudaDevice>, _: Option<&dyn Compiler>) -> Result<Machine, Error> {
    open_cuda().map(|never| match never {})
}

#[cfg(feature = "nvptx")]
fn mlir_host(model: Model, params: Vec<Tensor>) -> Result<Machine, Error> {
    Ok(Machine::new(model, params, linnet_gpu::host::MlirHost::default())?)
}

#[cfg(not(feature = "nvptx"))]
fn mlir_host(_: Model, _: Vec<Tensor>) -> Result<Machine, Error> {
    Err(Error::Device("this linnet was built without the GPU kernels' host backend: run scripts/install-gpu-tools.sh, then build with `--features nvptx`".into()))
}
