//! An artifact's PTX (its `ptx/` folder, as `linnetc build --target nvptx
//! -o ARTIFACT` writes it) for the CUDA backend: read when it is there and
//! fits the model and the device; else built into the artifact by a linnet
//! with the `nvptx` feature (MLIR), or refused with the command that
//! builds it.

use linnet_gpu::PtxSet;
use linnet_ir::Model;
use std::path::Path;

/// The PTX set of the artifact in `artifact` for `model` on `arch`.
pub fn for_artifact(model: &Model, artifact: &Path, arch: &str) -> Result<PtxSet, String> {
    let dir = artifact.join("ptx");
    if PtxSet::is_in(&dir) {
        let set = PtxSet::read(&dir)?;
        match set.check(model, arch) {
            Ok(()) => return Ok(set),
            Err(why) if !cfg!(feature = "nvptx") => return Err(format!("{}: {why}", dir.display())),
            Err(why) => tracing::info!("{}: {why}; building it again", dir.display()),
        }
    }
    build(model, artifact, arch)
}

#[cfg(feature = "nvptx")]
fn build(model: &Model, artifact: &Path, arch: &str) -> Result<PtxSet, String> {
    let libdevice = linnet_gpu::default_libdevice();
    if !libdevice.is_file() {
        return Err(format!("libdevice is not at {} (the math functions link it): run scripts/install-gpu-tools.sh, or set LINNET_LIBDEVICE", libdevice.display()));
    }
    let started = std::time::Instant::now();
    let built = linnet_gpu::build(model, arch, Some(&libdevice)).map_err(|e| e.to_string())?;
    if !built.missing.is_empty() {
        let missing: Vec<String> = built.missing.iter().map(ToString::to_string).collect();
        return Err(format!("`{}` has nodes without a GPU kernel:\n  {}", model.name, missing.join("\n  ")));
    }
    let set = PtxSet::of(model, arch, built);
    // Written aside and renamed into place, as the artifact itself.
    let partial = artifact.join(format!("ptx.partial-{}", std::process::id()));
    set.write(&partial)?;
    let dir = artifact.join("ptx");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::rename(&partial, &dir).map_err(|e| format!("cannot move the PTX to {}: {e}", dir.display()))?;
    tracing::info!(ptx = %dir.display(), seconds = started.elapsed().as_secs_f64(), "built PTX");
    Ok(set)
}

#[cfg(not(feature = "nvptx"))]
fn build(model: &Model, artifact: &Path, arch: &str) -> Result<PtxSet, String> {
    Err(format!(
        "the artifact {} has no PTX of `{}` for {arch}: build it with `linnetc build PACKAGE --target nvptx --gpu-arch {arch} -o {}` (a linnetc with the nvptx feature), or run a linnet built with `--features nvptx,cuda`",
        artifact.display(),
        model.name,
        artifact.display()
    ))
}
