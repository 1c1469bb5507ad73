//! The artifact cache: `linnet run PACKAGE` builds the package on demand
//! and keeps the artifact under the content key of its sources, so an
//! unchanged package is checked (milliseconds) but not lowered or compiled
//! again. The cache is `$LINNET_CACHE_DIR`, else `$XDG_CACHE_HOME/linnet`,
//! else `~/.cache/linnet`.

use crate::CompileError;
use linnet_artifact::{Artifact, Manifest};
use linnet_frontend::driver;
use linnet_frontend::package::LoadOptions;
use linnet_ir::StoredBlocks;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub fn cache_dir() -> Result<PathBuf, CompileError> {
    if let Some(dir) = std::env::var_os("LINNET_CACHE_DIR") {
        return Ok(PathBuf::from(dir));
    }
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
        return Ok(PathBuf::from(dir).join("linnet"));
    }
    match std::env::var_os("HOME") {
        Some(home) => Ok(PathBuf::from(home).join(".cache/linnet")),
        None => Err(CompileError::NoCache),
    }
}

/// The artifact to run for `path`: the folder itself when it is an
/// artifact, else the package's artifact in the cache, built if absent.
pub fn artifact_for(path: &Path, options: &LoadOptions) -> Result<PathBuf, CompileError> {
    artifact_in(None, path, options)
}

/// As [`artifact_for`], with the cache in `cache` rather than [`cache_dir`].
pub fn artifact_in(cache: Option<&Path>, path: &Path, options: &LoadOptions) -> Result<PathBuf, CompileError> {
    if linnet_artifact::is_artifact(path) {
        if options.nest.is_some() || !options.overrides.is_empty() || options.drafter {
            return Err(CompileError::OptionsForAnArtifact(path.to_path_buf()));
        }
        return Ok(path.to_path_buf());
    }
    let checked = driver::check_package(path, options);
    let mut key = crate::content_key(&checked.sources);
    if options.drafter {
        // The same texts may build the model or its drafter.
        key = crate::variant_key(&key, &[("root", "drafter")]);
    }
    let dir = match cache {
        Some(cache) => cache.join(&key),
        None => cache_dir()?.join(&key),
    };
    if linnet_artifact::is_artifact(&dir) {
        tracing::info!(artifact = %dir.display(), "cached build");
        return Ok(dir);
    }
    let (model, checked) = driver::lower_checked(checked, linnet_frontend::lower::Lowering::default())
        .map_err(|checked| CompileError::Diagnostics(crate::render(&checked)))?;
    let package = checked.package.as_ref().expect("a lowered package was loaded");
    build_into(dir, |partial| crate::write(&model, package, key, partial))
}

/// An artifact written by `write` beside `dir`, then renamed into place,
/// so that a reader never sees half an artifact; when another process got
/// there first, its copy is kept.
fn build_into(
    dir: PathBuf,
    write: impl FnOnce(&Path) -> Result<Manifest, CompileError>,
) -> Result<PathBuf, CompileError> {
    // Unique to this build: another thread or process may build the same.
    static BUILDS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let build = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let partial = dir.with_extension(format!("partial-{}-{build}", std::process::id()));
    let started = std::time::Instant::now();
    write(&partial)?;
    if std::fs::rename(&partial, &dir).is_err() {
        let _ = std::fs::remove_dir_all(&partial);
        if !linnet_artifact::is_artifact(&dir) {
            return Err(CompileError::Place(dir));
        }
    }
    tracing::info!(artifact = %dir.display(), seconds = started.elapsed().as_secs_f64(), "built");
    Ok(dir)
}

/// The artifact of `base` for a checkpoint that stores the parameters of
/// `formats` in those block formats: built in the cache on first use,
/// keyed by `base`'s key and the formats, so that each quantization of a
/// model has its own code.
pub fn stored_variant(base: &Artifact, formats: &BTreeMap<String, StoredBlocks>) -> Result<PathBuf, CompileError> {
    let stored: Vec<(&str, String)> =
        formats.iter().map(|(path, stored)| (path.as_str(), stored.to_string())).collect();
    let parts: Vec<(&str, &str)> = stored.iter().map(|(path, stored)| (*path, stored.as_str())).collect();
    let key = crate::variant_key(&base.manifest.key, &parts);
    let variant = cache_dir()?.join(&key);
    if linnet_artifact::is_artifact(&variant) {
        return Ok(variant);
    }
    let model = base.model.clone().stored_as(formats).map_err(CompileError::Storage)?;
    build_into(variant, |partial| crate::write_variant(base, &model, key, partial))
}
