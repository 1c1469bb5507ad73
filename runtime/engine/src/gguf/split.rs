//! A model's GGUF files: one file, or the splits llama.cpp's `gguf-split`
//! writes (`NAME-00001-of-00003.gguf`, …; each a whole GGUF file with its
//! own tensors and `split.count`, the first with the model's metadata),
//! given as any one of the splits or as the folder that holds them.

use super::{read_file, Gguf, Meta, TensorInfo};
use crate::error::{io, Error};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// One file of the set, mapped, and its table.
pub struct Part {
    pub path: PathBuf,
    pub map: Arc<memmap2::Mmap>,
    pub gguf: Gguf,
}

impl Part {
    /// `tensor`'s bytes in this file.
    pub fn bytes(&self, tensor: &TensorInfo) -> &[u8] {
        self.gguf.tensor_bytes(&self.map, tensor)
    }
}

/// Every file of one model, and where each tensor is.
pub struct Files {
    pub parts: Vec<Part>,
    /// Tensor name to (part, index in that part's table).
    index: HashMap<String, (usize, usize)>,
}

/// `NAME-00001-of-00003.gguf` as (`NAME`, 1, 3).
fn split_name(path: &Path) -> Option<(String, usize, usize)> {
    let stem = path.file_name()?.to_str()?.strip_suffix(".gguf")?;
    let (rest, count) = stem.rsplit_once("-of-")?;
    let (prefix, number) = rest.rsplit_once('-')?;
    let digits = |s: &str| s.len() == 5 && s.bytes().all(|b| b.is_ascii_digit());
    if !(digits(number) && digits(count)) {
        return None;
    }
    Some((prefix.to_string(), number.parse().ok()?, count.parse().ok()?))
}

/// The files `path` names: itself, its fellow splits, or the GGUF files
/// of a folder (one model's).
fn paths(path: &Path) -> Result<Vec<PathBuf>, Error> {
    let first = if path.is_dir() {
        let mut found: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(io("read", path))?
            .filter_map(|entry| Some(entry.ok()?.path()))
            .filter(|p| crate::weights::is_gguf_file(p) && p.is_file())
            .collect();
        found.sort();
        match found.len() {
            0 => return Err(Error::Gguf(format!("{} holds no .gguf file", path.display()))),
            1 => return Ok(found),
            _ => found.into_iter().find(|p| split_name(p).is_some_and(|(_, no, _)| no == 1)).ok_or_else(|| {
                Error::Gguf(format!(
                    "{} holds several .gguf files that are not the splits of one model",
                    path.display()
                ))
            })?,
        }
    } else {
        path.to_path_buf()
    };
    let Some((prefix, _, count)) = split_name(&first) else { return Ok(vec![first]) };
    let dir = first.parent().unwrap_or(Path::new("."));
    let all: Vec<PathBuf> = (1..=count).map(|no| dir.join(format!("{prefix}-{no:05}-of-{count:05}.gguf"))).collect();
    let missing: Vec<String> = all.iter().filter(|p| !p.is_file()).map(|p| p.display().to_string()).collect();
    if !missing.is_empty() {
        return Err(Error::Gguf(format!(
            "{} is split {count} ways, and {} is missing",
            first.display(),
            missing.join(", ")
        )));
    }
    Ok(all)
}

impl Files {
    /// The files `path` names (see the module's doc), each read and
    /// checked; a tensor in two of them is an error.
    pub fn open(path: &Path) -> Result<Files, Error> {
        let paths = paths(path)?;
        let count = paths.len();
        let mut parts = Vec::with_capacity(count);
        let mut index = HashMap::new();
        for (at, path) in paths.into_iter().enumerate() {
            let (map, gguf) = read_file(&path)?;
            let declared = gguf.meta("split.count").and_then(Meta::as_u64);
            if count > 1 && declared != Some(count as u64) {
                return Err(Error::Gguf(format!(
                    "{}: `split.count` is {declared:?}, and the set has {count} files",
                    path.display()
                )));
            }
            for (i, tensor) in gguf.tensors.iter().enumerate() {
                if let Some((other, _)) = index.insert(tensor.name.clone(), (at, i)) {
                    let other: &Part = &parts[other];
                    return Err(Error::Gguf(format!(
                        "tensor `{}` is in {} and {}",
                        tensor.name,
                        other.path.display(),
                        path.display()
                    )));
                }
            }
            parts.push(Part { path, map: Arc::new(map), gguf });
        }
        Ok(Files { parts, index })
    }

    /// The first file's path, for messages.
    pub fn path(&self) -> &Path {
        &self.parts[0].path
    }

    /// The model's metadata: the first file's.
    pub fn first(&self) -> &Gguf {
        &self.parts[0].gguf
    }

    /// The file holding tensor `name`, and its entry there.
    pub fn tensor(&self, name: &str) -> Option<(&Part, &TensorInfo)> {
        let &(part, at) = self.index.get(name)?;
        let part = &self.parts[part];
        Some((part, &part.gguf.tensors[at]))
    }
}

#[cfg(test)]
mod tests {
    use super::split_name;
    use std::path::Path;

    #[test]
    fn split_names_are_llama_cpp_s() {
        assert_eq!(split_name(Path::new("/m/q4-00002-of-00003.gguf")), Some(("q4".into(), 2, 3)));
        assert_eq!(split_name(Path::new("a-b-00001-of-00010.gguf")), Some(("a-b".into(), 1, 10)));
        assert_eq!(split_name(Path::new("model.gguf")), None);
        assert_eq!(split_name(Path::new("m-1-of-3.gguf")), None);
        assert_eq!(split_name(Path::new("m-00001-of-00003.safetensors")), None);
    }
}
