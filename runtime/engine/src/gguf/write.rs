//! Writing a GGUF file: the table is laid out first (every tensor's offset
//! from its size), then each tensor's bytes are streamed in table order,
//! so that a file larger than memory is written a tensor at a time.

use super::{Meta, Storage, DEFAULT_ALIGNMENT, MAGIC, VERSION};
use crate::error::{io, Error};
use std::io::Write;
use std::path::{Path, PathBuf};

/// A tensor to write: its name, shape in Linnet's order, and storage.
pub struct Planned {
    pub name: String,
    pub shape: Vec<u64>,
    pub storage: Storage,
}

pub struct Writer {
    out: std::io::BufWriter<std::fs::File>,
    path: PathBuf,
    /// Each tensor's name and byte length, in order.
    pending: Vec<(String, u64)>,
    next: usize,
}

fn put_string(out: &mut Vec<u8>, text: &str) {
    out.extend((text.len() as u64).to_le_bytes());
    out.extend(text.as_bytes());
}

fn put_value(out: &mut Vec<u8>, value: &Meta) {
    match value {
        Meta::U8(v) => out.push(*v),
        Meta::I8(v) => out.push(*v as u8),
        Meta::U16(v) => out.extend(v.to_le_bytes()),
        Meta::I16(v) => out.extend(v.to_le_bytes()),
        Meta::U32(v) => out.extend(v.to_le_bytes()),
        Meta::I32(v) => out.extend(v.to_le_bytes()),
        Meta::F32(v) => out.extend(v.to_le_bytes()),
        Meta::Bool(v) => out.push(u8::from(*v)),
        Meta::Str(text) => put_string(out, text),
        Meta::Array(items) => {
            out.extend(items.first().map_or(Meta::U8(0).type_id(), Meta::type_id).to_le_bytes());
            out.extend((items.len() as u64).to_le_bytes());
            items.iter().for_each(|item| put_value(out, item));
        }
        Meta::U64(v) => out.extend(v.to_le_bytes()),
        Meta::I64(v) => out.extend(v.to_le_bytes()),
        Meta::F64(v) => out.extend(v.to_le_bytes()),
    }
}

impl Writer {
    /// Creates `path` and writes the header, `metadata` and the table of
    /// `tensors`. A tensor whose rows its storage cannot hold is refused,
    /// by name, and a file larger than the disk's free space, before
    /// anything is written.
    pub fn create(path: &Path, metadata: &[(String, Meta)], tensors: &[Planned]) -> Result<Writer, Error> {
        let alignment = DEFAULT_ALIGNMENT;
        let mut head = Vec::new();
        head.extend(MAGIC);
        head.extend(VERSION.to_le_bytes());
        head.extend((tensors.len() as u64).to_le_bytes());
        head.extend((metadata.len() as u64 + 1).to_le_bytes());
        put_string(&mut head, "general.alignment");
        head.extend(Meta::U32(alignment as u32).type_id().to_le_bytes());
        put_value(&mut head, &Meta::U32(alignment as u32));
        for (key, value) in metadata {
            put_string(&mut head, key);
            head.extend(value.type_id().to_le_bytes());
            put_value(&mut head, value);
        }
        let mut offset = 0u64;
        let mut pending = Vec::with_capacity(tensors.len());
        for tensor in tensors {
            let row = tensor.shape.last().copied().unwrap_or(1);
            let elements: u64 = tensor.shape.iter().product();
            let bytes = tensor.storage.bytes(elements, row).ok_or_else(|| {
                Error::Gguf(format!("`{}`: rows of {row} values are not whole {} blocks", tensor.name, tensor.storage))
            })?;
            let ggml_type = tensor
                .storage
                .ggml_type()
                .ok_or_else(|| Error::Gguf(format!("`{}`: GGUF has no {}", tensor.name, tensor.storage)))?;
            put_string(&mut head, &tensor.name);
            head.extend((tensor.shape.len() as u32).to_le_bytes());
            for dim in tensor.shape.iter().rev() {
                head.extend(dim.to_le_bytes());
            }
            head.extend(ggml_type.to_le_bytes());
            head.extend(offset.to_le_bytes());
            pending.push((tensor.name.clone(), bytes));
            offset += bytes.div_ceil(alignment) * alignment;
        }
        head.resize(head.len().div_ceil(alignment as usize) * alignment as usize, 0);
        let needed = head.len() as u64 + offset;
        let folder = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        if let Some(free) = crate::init::free_bytes(folder) {
            if needed > free {
                return Err(Error::Gguf(format!(
                    "{} would take {needed} bytes and {} has {free} free",
                    path.display(),
                    folder.display()
                )));
            }
        }
        let file = std::fs::File::create(path).map_err(io("create", path))?;
        let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
        out.write_all(&head).map_err(io("write", path))?;
        Ok(Writer { out, path: path.to_path_buf(), pending, next: 0 })
    }

    /// The next tensor's bytes, in table order.
    pub fn write_tensor(&mut self, bytes: &[u8]) -> Result<(), Error> {
        let Some((name, expected)) = self.pending.get(self.next) else {
            return Err(Error::Gguf(format!("{}: more tensors than the table lists", self.path.display())));
        };
        if bytes.len() as u64 != *expected {
            return Err(Error::Gguf(format!("`{name}`: {} bytes where the table says {expected}", bytes.len())));
        }
        let padding = (bytes.len() as u64).div_ceil(DEFAULT_ALIGNMENT) * DEFAULT_ALIGNMENT - bytes.len() as u64;
        let io = |error| Error::Io { action: "write", path: self.path.clone(), error };
        self.out.write_all(bytes).map_err(io)?;
        self.out.write_all(&vec![0; padding as usize]).map_err(io)?;
        self.next += 1;
        Ok(())
    }

    /// Writes the file out to the disk and lets its pages go from the page
    /// cache (`init::finish_weights_file`); every tensor of the table must
    /// have been written.
    pub fn finish(self) -> Result<(), Error> {
        if let Some((name, _)) = self.pending.get(self.next) {
            return Err(Error::Gguf(format!("{}: `{name}` and what follows were never written", self.path.display())));
        }
        crate::init::finish_weights_file(self.out, &self.path)
    }
}
