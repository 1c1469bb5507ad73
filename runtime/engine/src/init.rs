//! `linnet init-weights`: a random checkpoint laid out as the package's
//! `bindings.json` says, as sharded safetensors with an index, so a model
//! can be tried without downloading it.

use crate::error::{io, Error};
use crate::random;
use linnet_ir::Dtype;
use linnet_ir::{Model, Param};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::Path;

/// Values as little-endian elements of `dtype` (bf16 and f16 rounded to
/// nearest; any other dtype f32).
pub(crate) fn bytes(values: &[f32], dtype: Dtype) -> Vec<u8> {
    match dtype {
        Dtype::Bf16 => values.iter().flat_map(|v| half::bf16::from_f32(*v).to_le_bytes()).collect(),
        Dtype::F16 => values.iter().flat_map(|v| half::f16::from_f32(*v).to_le_bytes()).collect(),
        _ => values.iter().flat_map(|v| v.to_le_bytes()).collect(),
    }
}

fn file_dtype(dtype: Dtype) -> safetensors::Dtype {
    match dtype {
        Dtype::Bf16 => safetensors::Dtype::BF16,
        Dtype::F16 => safetensors::Dtype::F16,
        _ => safetensors::Dtype::F32,
    }
}

/// The text side a package may ship, copied beside the weights.
pub const TEXT_FILES: [&str; 4] =
    ["tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"];

/// Copies the package's tokenizer files (those it has) into `dir`.
pub fn copy_text_files(package: &Path, dir: &Path) -> Result<(), Error> {
    for name in TEXT_FILES {
        let from = package.join(name);
        if from.exists() {
            std::fs::copy(&from, dir.join(name)).map_err(io("copy", &from))?;
        }
    }
    Ok(())
}

/// Every parameter has a tensor name in `bindings`, or the error naming
/// those that have none.
pub fn every_param_bound(model: &Model, bindings: &HashMap<String, String>) -> Result<(), Error> {
    let missing: Vec<&str> =
        model.params.iter().filter(|p| !bindings.contains_key(&p.path)).map(|p| p.path.as_str()).collect();
    if missing.is_empty() {
        Ok(())
    } else {
        Err(Error::Weights(format!("bindings.json names no tensor for: {}", missing.join(", "))))
    }
}

/// The bytes free on the file system that holds `dir`.
pub(crate) fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut stats = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is a NUL-terminated string and `stats` is written by
    // statvfs before it is read, only when it succeeds.
    let stats = unsafe {
        if libc::statvfs(path.as_ptr(), stats.as_mut_ptr()) != 0 {
            return None;
        }
        stats.assume_init()
    };
    Some(stats.f_bavail.saturating_mul(stats.f_frsize))
}

/// Writes `file` (at `path`) out to the disk and lets its pages go from the
/// page cache, as a writer of weights ends.
///
/// Pages a write leaves in the cache are small, and a model mapped from
/// them decodes slower than one mapped from the large pages (two MiB,
/// contiguous) that reading the file fills the cache with: a decode step
/// streams its weights, and streams them faster from contiguous memory.
/// Released here, the first load reads the file from the disk once, in
/// large pages.
pub(crate) fn finish_weights_file(mut file: std::io::BufWriter<std::fs::File>, path: &Path) -> Result<(), Error> {
    let io = |error| Error::Io { action: "write", path: path.to_path_buf(), error };
    file.flush().map_err(io)?;
    let file = file.get_ref();
    // Only pages on the disk can leave the cache.
    file.sync_all().map_err(io)?;
    release_cached_pages(file);
    Ok(())
}

/// Asks the kernel to drop `file`'s pages from the page cache: a hint,
/// which leaves the file as it is whether or not the kernel takes it.
#[cfg(target_os = "linux")]
fn release_cached_pages(file: &std::fs::File) {
    use std::os::fd::AsRawFd;
    // SAFETY: advice on an open descriptor's whole length; it changes no
    // memory of this process.
    unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
}

#[cfg(not(target_os = "linux"))]
fn release_cached_pages(_: &std::fs::File) {}

/// One shard's safetensors header: each tensor's dtype, shape and place,
/// padded with spaces to a multiple of 8 bytes, as the format asks.
fn shard_header(tensors: &[(&str, &Param)]) -> Result<(String, u64), Error> {
    let mut header = serde_json::Map::new();
    let mut offset = 0u64;
    for (name, param) in tensors {
        let bytes = param
            .shape
            .iter()
            .try_fold(param.dtype.bytes() as u64, |total, axis| total.checked_mul(*axis as u64))
            .ok_or_else(|| Error::Weights(format!("`{}` has more bytes than a file can hold", param.path)))?;
        let end = offset
            .checked_add(bytes)
            .ok_or_else(|| Error::Weights("the checkpoint has more bytes than a file can hold".into()))?;
        let dtype = serde_json::to_value(file_dtype(param.dtype)).expect("a dtype's name");
        header.insert(
            name.to_string(),
            serde_json::json!({ "dtype": dtype, "shape": param.shape, "data_offsets": [offset, end] }),
        );
        offset = end;
    }
    let mut text = serde_json::to_string(&header).expect("JSON");
    text.extend(std::iter::repeat_n(' ', (8 - text.len() % 8) % 8));
    Ok((text, offset))
}

/// Writes `shards` files and `model.safetensors.index.json` into `dir`;
/// returns the bytes written. Each tensor is drawn and written a chunk at a
/// time, so a checkpoint larger than memory can be written; one larger
/// than the disk's free space is refused before anything is written.
pub fn write(
    model: &Model,
    bindings: &HashMap<String, String>,
    seed: u64,
    shards: usize,
    dir: &Path,
) -> Result<usize, Error> {
    std::fs::create_dir_all(dir).map_err(io("create", dir))?;
    every_param_bound(model, bindings)?;
    let shards = shards.clamp(1, model.params.len().max(1));
    let per_shard = model.params.len().div_ceil(shards).max(1);
    let mut headers = Vec::new();
    for params in model.params.chunks(per_shard) {
        let tensors: Vec<(&str, &Param)> =
            params.iter().map(|p| (linnet_artifact::written_name(&bindings[&p.path]), p)).collect();
        headers.push(shard_header(&tensors)?);
    }
    let needed = headers.iter().try_fold(0u64, |total, (text, data)| total.checked_add(8 + text.len() as u64 + data));
    let needed = needed.ok_or_else(|| Error::Weights("the checkpoint has more bytes than a disk can hold".into()))?;
    if let Some(free) = free_bytes(dir) {
        if needed > free {
            return Err(Error::Weights(format!(
                "the checkpoint takes {needed} bytes and {} has {free} free: give a smaller model or another folder",
                dir.display()
            )));
        }
    }
    let progress = indicatif::ProgressBar::new(needed);
    let mut weight_map = BTreeMap::new();
    let mut chunk = Vec::new();
    for (shard, (params, (header, _))) in model.params.chunks(per_shard).zip(&headers).enumerate() {
        let name = format!("model-{:05}-of-{:05}.safetensors", shard + 1, shards);
        let path = dir.join(&name);
        let failed = |error| Error::Io { action: "write", path: path.clone(), error };
        let mut file = std::io::BufWriter::new(std::fs::File::create(&path).map_err(failed)?);
        file.write_all(&(header.len() as u64).to_le_bytes()).map_err(failed)?;
        file.write_all(header.as_bytes()).map_err(failed)?;
        for (at, param) in params.iter().enumerate() {
            let mut draw = random::Draw::new(param, seed, shard * per_shard + at);
            loop {
                draw.next_chunk(1 << 20, &mut chunk);
                if chunk.is_empty() {
                    break;
                }
                let raw = bytes(&chunk, param.dtype);
                file.write_all(&raw).map_err(failed)?;
                progress.inc(raw.len() as u64);
            }
            weight_map.insert(linnet_artifact::written_name(&bindings[&param.path]).to_string(), name.clone());
        }
        finish_weights_file(file, &path)?;
    }
    progress.finish_and_clear();
    let index = serde_json::json!({ "metadata": { "total_size": needed }, "weight_map": weight_map });
    let index_path = dir.join("model.safetensors.index.json");
    std::fs::write(&index_path, serde_json::to_string_pretty(&index).expect("JSON"))
        .map_err(io("write", &index_path))?;
    Ok(needed as usize)
}
