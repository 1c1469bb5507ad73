//! The runtime's errors, by kind: what the caller gave that does not fit
//! (an input, sampling parameters, a grammar), what the model's files hold
//! that cannot be used (weights, a GGUF file, a tokenizer), and what failed
//! inside (the artifact, a backend, a run, a device, the compiler called
//! back). The server answers the first kind as the client's fault and the
//! others as its own; the CLI prints them.

use std::path::PathBuf;

/// Why the runtime could not do what it was asked.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A file or folder the runtime reads or writes.
    #[error("cannot {action} {}: {error}", path.display())]
    Io { action: &'static str, path: PathBuf, error: std::io::Error },
    /// Weights that cannot be found, or that do not fit the model.
    #[error("{0}")]
    Weights(String),
    /// A GGUF file that is malformed, or not the model's.
    #[error("{0}")]
    Gguf(String),
    /// A tokenizer, vocabulary or chat template that cannot be used.
    #[error("{0}")]
    Text(String),
    /// A value the caller gave that does not fit: a tensor or its file,
    /// token ids, sampling parameters, a prompt, a recipe.
    #[error("{0}")]
    Input(String),
    /// A grammar, JSON schema or pattern that does not compile.
    #[error("{0}")]
    Grammar(String),
    /// An artifact that cannot be read.
    #[error(transparent)]
    Artifact(#[from] linnet_artifact::ArtifactError),
    /// An artifact's CPU code that cannot be loaded here.
    #[error(transparent)]
    Code(#[from] linnet_cpu::load::LoadError),
    /// A backend that cannot run the model.
    #[error(transparent)]
    Backend(#[from] linnet_exec::BuildError),
    /// An entry that failed as it ran.
    #[error(transparent)]
    Run(#[from] linnet_exec::RunError),
    /// A GPU that is absent or failing, or a backend this build lacks.
    #[error("{0}")]
    Device(String),
    /// The GPU side: its driver, or kernels it cannot run.
    #[error(transparent)]
    Gpu(#[from] linnet_gpu::GpuError),
    /// An artifact's PTX that cannot be used.
    #[error(transparent)]
    Ptx(#[from] linnet_gpu::PtxError),
    /// What the compiler the runtime called back could not build.
    #[error("{0}")]
    Compile(linnet_artifact::CompilerError),
}

impl Error {
    /// Whether the caller is at fault (an input, a grammar), not the
    /// model's files or the runtime.
    pub fn is_callers(&self) -> bool {
        matches!(self, Error::Input(_) | Error::Grammar(_))
    }
}

/// A function of `path` that makes an [`Error::Io`] of an IO error.
pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> Error {
    let path = path.into();
    move |error| Error::Io { action, path, error }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
