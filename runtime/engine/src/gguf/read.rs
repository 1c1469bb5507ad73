//! Reading a GGUF file's header, metadata and tensor table. Every count,
//! length and offset is checked against the bytes there are before it is
//! used: a truncated file, a count that would overflow, a tensor past the
//! end or overlapping another, an unknown value or tensor type are errors
//! with the byte offset and the tensor's name, never a crash.

use super::{Gguf, GgufError, Meta, Storage, TensorInfo, DEFAULT_ALIGNMENT, MAGIC};
use crate::error::{io, Error};
use linnet_ir::quant::BlockFormat;
use std::path::Path;

/// Bounds what a header may ask for before anything is allocated.
const MAX_DIMS: u32 = 8;
const MAX_ARRAY_DEPTH: u32 = 4;

struct Cursor<'f> {
    bytes: &'f [u8],
    at: usize,
}

impl<'f> Cursor<'f> {
    fn error(&self, message: impl Into<String>) -> GgufError {
        GgufError { at: self.at as u64, message: message.into() }
    }

    fn take(&mut self, len: u64, what: &str) -> Result<&'f [u8], GgufError> {
        let end =
            usize::try_from(len).ok().and_then(|len| self.at.checked_add(len)).filter(|end| *end <= self.bytes.len());
        let Some(end) = end else {
            return Err(self.error(format!(
                "the file ends inside {what} ({len} bytes wanted, {} left)",
                self.bytes.len() - self.at
            )));
        };
        let taken = &self.bytes[self.at..end];
        self.at = end;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], GgufError> {
        Ok(self.take(N as u64, what)?.try_into().expect("N bytes"))
    }

    fn u32(&mut self, what: &str) -> Result<u32, GgufError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, GgufError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    fn string(&mut self, what: &str) -> Result<String, GgufError> {
        let len = self.u64(what)?;
        let start = self.at;
        let bytes = self.take(len, what)?;
        String::from_utf8(bytes.to_vec())
            .map_err(|_| GgufError { at: start as u64, message: format!("{what} is not UTF-8") })
    }

    /// A count of items each at least `min_bytes` long: more than the
    /// bytes left could hold is an error before anything is allocated.
    fn count(&mut self, what: &str, min_bytes: u64) -> Result<usize, GgufError> {
        let count = self.u64(what)?;
        let left = (self.bytes.len() - self.at) as u64;
        if count.checked_mul(min_bytes).is_none_or(|need| need > left) {
            return Err(self.error(format!("{what} is {count}, more than the {left} bytes left can hold")));
        }
        Ok(count as usize)
    }

    fn value(&mut self, type_id: u32, key: &str, depth: u32) -> Result<Meta, GgufError> {
        Ok(match type_id {
            0 => Meta::U8(self.array::<1>(key)?[0]),
            1 => Meta::I8(self.array::<1>(key)?[0] as i8),
            2 => Meta::U16(u16::from_le_bytes(self.array(key)?)),
            3 => Meta::I16(i16::from_le_bytes(self.array(key)?)),
            4 => Meta::U32(self.u32(key)?),
            5 => Meta::I32(i32::from_le_bytes(self.array(key)?)),
            6 => Meta::F32(f32::from_le_bytes(self.array(key)?)),
            7 => match self.array::<1>(key)?[0] {
                0 => Meta::Bool(false),
                1 => Meta::Bool(true),
                other => return Err(self.error(format!("`{key}` is a bool of value {other}"))),
            },
            8 => Meta::Str(self.string(key)?),
            9 if depth >= MAX_ARRAY_DEPTH => {
                return Err(self.error(format!("`{key}` nests arrays deeper than {MAX_ARRAY_DEPTH}")))
            }
            9 => {
                let item_type = self.u32(key)?;
                let count = self.count(&format!("the length of `{key}`"), 1)?;
                let mut items = Vec::with_capacity(count);
                for _ in 0..count {
                    items.push(self.value(item_type, key, depth + 1)?);
                }
                Meta::Array(items)
            }
            10 => Meta::U64(self.u64(key)?),
            11 => Meta::I64(i64::from_le_bytes(self.array(key)?)),
            12 => Meta::F64(f64::from_le_bytes(self.array(key)?)),
            other => return Err(self.error(format!("`{key}` has an unknown value type {other}"))),
        })
    }
}

/// Reads the metadata and tensor table of a whole file's bytes, and checks
/// that every tensor lies inside the file, aligned, apart from the others.
pub fn read(bytes: &[u8]) -> Result<Gguf, GgufError> {
    let mut cursor = Cursor { bytes, at: 0 };
    if cursor.take(4, "the magic")? != MAGIC {
        return Err(GgufError { at: 0, message: "not a GGUF file (it does not start with `GGUF`)".into() });
    }
    let version = cursor.u32("the version")?;
    if !(2..=3).contains(&version) {
        return Err(cursor.error(format!("GGUF version {version}; versions 2 and 3 are read")));
    }
    let tensor_count = cursor.count("the tensor count", 24)?;
    let meta_count = cursor.count("the metadata count", 12)?;
    let mut metadata = Vec::with_capacity(meta_count);
    for _ in 0..meta_count {
        let key = cursor.string("a metadata key")?;
        let type_id = cursor.u32(&key)?;
        let value = cursor.value(type_id, &key, 0)?;
        metadata.push((key, value));
    }
    let alignment = match metadata.iter().find(|(key, _)| key == "general.alignment") {
        None => DEFAULT_ALIGNMENT,
        Some((_, value)) => match value.as_u64() {
            Some(alignment) if alignment.is_power_of_two() => alignment,
            _ => return Err(cursor.error(format!("`general.alignment` is {value:?}, not a power of two"))),
        },
    };
    let mut tensors = Vec::with_capacity(tensor_count);
    for _ in 0..tensor_count {
        let name = cursor.string("a tensor name")?;
        let rank = cursor.u32(&name)?;
        if rank == 0 || rank > MAX_DIMS {
            return Err(cursor.error(format!("tensor `{name}` has {rank} dims (1 to {MAX_DIMS})")));
        }
        let mut dims = Vec::with_capacity(rank as usize);
        for _ in 0..rank {
            dims.push(cursor.u64(&name)?);
        }
        let type_id = cursor.u32(&name)?;
        let storage = Storage::from_ggml_type(type_id).ok_or_else(|| {
            let formats: Vec<&str> = BlockFormat::ALL.iter().map(|format| format.name()).collect();
            cursor.error(format!(
                "tensor `{name}` is of GGML type {type_id}, which Linnet does not read (it reads f32, f16, bf16, i32, i64 and {})",
                formats.join(", ")
            ))
        })?;
        let offset = cursor.u64(&name)?;
        let elements = dims.iter().try_fold(1u64, |n, d| n.checked_mul(*d));
        let bytes = elements.and_then(|elements| storage.bytes(elements, dims[0]));
        let Some(bytes) = bytes else {
            return Err(cursor.error(format!(
                "tensor `{name}` of dims {dims:?} cannot be stored as {storage} (its rows of {} are not whole blocks, or its size overflows)",
                dims[0]
            )));
        };
        if offset % alignment != 0 {
            return Err(cursor.error(format!("tensor `{name}` starts at {offset}, not a multiple of {alignment}")));
        }
        tensors.push(TensorInfo { name, dims, storage, offset, bytes });
    }
    let data_offset = (cursor.at as u64).div_ceil(alignment) * alignment;
    let data_len = (bytes.len() as u64).saturating_sub(data_offset);
    let mut spans: Vec<(u64, u64, &str)> = Vec::with_capacity(tensors.len());
    for tensor in &tensors {
        let end = tensor.offset.checked_add(tensor.bytes).filter(|end| *end <= data_len);
        let Some(end) = end else {
            return Err(GgufError {
                at: bytes.len() as u64,
                message: format!(
                    "tensor `{}` ({} bytes at {}) runs past the end of the file: truncated?",
                    tensor.name,
                    tensor.bytes,
                    data_offset.saturating_add(tensor.offset)
                ),
            });
        };
        spans.push((tensor.offset, end, &tensor.name));
    }
    spans.sort_unstable();
    for pair in spans.windows(2) {
        if pair[1].0 < pair[0].1 {
            return Err(GgufError {
                at: data_offset + pair[1].0,
                message: format!("tensors `{}` and `{}` overlap", pair[0].2, pair[1].2),
            });
        }
    }
    let mut names: Vec<&str> = tensors.iter().map(|t| t.name.as_str()).collect();
    names.sort_unstable();
    if let Some(pair) = names.windows(2).find(|pair| pair[0] == pair[1]) {
        return Err(GgufError { at: 0, message: format!("tensor `{}` is listed twice", pair[0]) });
    }
    Ok(Gguf { metadata, tensors, data_offset, alignment })
}

/// Maps a file and reads its table; errors name the file.
pub fn read_file(path: &Path) -> Result<(memmap2::Mmap, Gguf), Error> {
    let file = std::fs::File::open(path).map_err(io("open", path))?;
    // SAFETY: the map is read-only; a file changed underneath while mapped
    // is outside what any reader of weights can guard against.
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io("map", path))?;
    let gguf = read(&map).map_err(|e| Error::Gguf(format!("{}: {e}", path.display())))?;
    Ok((map, gguf))
}
