//! GGUF, the container llama.cpp keeps weights in: a header, typed
//! metadata (`general.architecture`, `tokenizer.ggml.tokens`, …), a table
//! of tensors (name, dims, GGML type, offset), then the tensors' bytes,
//! aligned. [`read`] parses a file's table and metadata without trusting
//! any count or offset in it; [`Writer`] writes one, streaming each tensor
//! as it is made; [`load`] binds a file's tensors to a model's parameters.
//! Version 3, little-endian.
//!
//! GGUF lists a tensor's dims fastest-varying first (`ne[0]` is a row's
//! length): `[In, Out]` for a matrix that safetensors and Linnet call
//! `[Out, In]`. [`TensorInfo::shape`] gives Linnet's order.

pub mod load;
mod read;
mod split;
mod write;

pub use read::{read, read_file};
pub use split::{Files, Part};
pub use write::{Planned, Writer};

use linnet_ir::quant::BlockFormat;
use linnet_ir::Dtype;
use std::fmt;

pub const MAGIC: &[u8; 4] = b"GGUF";
pub const VERSION: u32 = 3;
/// `general.alignment` when a file does not say.
pub const DEFAULT_ALIGNMENT: u64 = 32;

/// How a tensor's elements are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    /// One element after another.
    Plain(Dtype),
    /// In blocks.
    Blocks(BlockFormat),
}

impl Storage {
    /// GGML's type id (GGML has no bool).
    pub fn ggml_type(self) -> Option<u32> {
        Some(match self {
            Storage::Plain(Dtype::F32) => 0,
            Storage::Plain(Dtype::F16) => 1,
            Storage::Plain(Dtype::Bf16) => 30,
            Storage::Plain(Dtype::I32) => 26,
            Storage::Plain(Dtype::I64) => 27,
            Storage::Plain(Dtype::Bool) => return None,
            Storage::Blocks(format) => format.ggml_type(),
        })
    }

    pub fn from_ggml_type(id: u32) -> Option<Storage> {
        Some(match id {
            0 => Storage::Plain(Dtype::F32),
            1 => Storage::Plain(Dtype::F16),
            30 => Storage::Plain(Dtype::Bf16),
            26 => Storage::Plain(Dtype::I32),
            27 => Storage::Plain(Dtype::I64),
            other => Storage::Blocks(BlockFormat::from_ggml_type(other)?),
        })
    }

    /// Bytes of `elements` elements whose rows are `row` long, if the
    /// format stores such rows.
    pub fn bytes(self, elements: u64, row: u64) -> Option<u64> {
        match self {
            Storage::Plain(dtype) => elements.checked_mul(dtype.bytes() as u64),
            Storage::Blocks(format) => {
                format.row_bytes(usize::try_from(row).ok()?)?;
                (elements / format.block_values() as u64).checked_mul(format.block_bytes() as u64)
            }
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Storage::Plain(dtype) => dtype.name(),
            Storage::Blocks(format) => format.name(),
        }
    }
}

impl fmt::Display for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Meta {
    U8(u8),
    I8(i8),
    U16(u16),
    I16(i16),
    U32(u32),
    I32(i32),
    F32(f32),
    Bool(bool),
    Str(String),
    Array(Vec<Meta>),
    U64(u64),
    I64(i64),
    F64(f64),
}

impl Meta {
    /// GGUF's value type id.
    fn type_id(&self) -> u32 {
        match self {
            Meta::U8(_) => 0,
            Meta::I8(_) => 1,
            Meta::U16(_) => 2,
            Meta::I16(_) => 3,
            Meta::U32(_) => 4,
            Meta::I32(_) => 5,
            Meta::F32(_) => 6,
            Meta::Bool(_) => 7,
            Meta::Str(_) => 8,
            Meta::Array(_) => 9,
            Meta::U64(_) => 10,
            Meta::I64(_) => 11,
            Meta::F64(_) => 12,
        }
    }

    /// An integer value of any width, where it is one.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Meta::U8(v) => Some(v.into()),
            Meta::U16(v) => Some(v.into()),
            Meta::U32(v) => Some(v.into()),
            Meta::U64(v) => Some(v),
            Meta::I8(v) => u64::try_from(v).ok(),
            Meta::I16(v) => u64::try_from(v).ok(),
            Meta::I32(v) => u64::try_from(v).ok(),
            Meta::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    pub fn as_str(&self) -> Option<&str> {
        match self {
            Meta::Str(text) => Some(text),
            _ => None,
        }
    }
}

/// One tensor of the table.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    /// As GGUF lists them: fastest-varying first.
    pub dims: Vec<u64>,
    pub storage: Storage,
    /// From the start of the data section.
    pub offset: u64,
    /// Its bytes, from `dims` and `storage`.
    pub bytes: u64,
}

impl TensorInfo {
    /// The shape in Linnet's (and safetensors') order: slowest first.
    pub fn shape(&self) -> Vec<u64> {
        self.dims.iter().rev().copied().collect()
    }

    pub fn elements(&self) -> u64 {
        self.dims.iter().product()
    }
}

/// A file's metadata and tensor table; the tensors' bytes start at
/// `data_offset` in the file.
#[derive(Clone, Debug)]
pub struct Gguf {
    pub metadata: Vec<(String, Meta)>,
    pub tensors: Vec<TensorInfo>,
    pub data_offset: u64,
    pub alignment: u64,
}

impl Gguf {
    pub fn meta(&self, key: &str) -> Option<&Meta> {
        self.metadata.iter().find(|(k, _)| k == key).map(|(_, v)| v)
    }

    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensors.iter().find(|t| t.name == name)
    }

    /// The metadata's numbers, strings and flags as JSON, each list as its
    /// length (`tokenizer.ggml.tokens`: the vocabulary's size): what a
    /// model card reads generics from.
    pub fn card_metadata(&self) -> serde_json::Map<String, serde_json::Value> {
        use serde_json::Value;
        let scalar = |meta: &Meta| match meta {
            Meta::F32(v) => serde_json::Number::from_f64(f64::from(*v)).map(Value::Number),
            Meta::F64(v) => serde_json::Number::from_f64(*v).map(Value::Number),
            Meta::Bool(v) => Some(Value::Bool(*v)),
            Meta::Str(text) => Some(Value::String(text.clone())),
            Meta::I8(v) => Some(Value::from(*v)),
            Meta::I16(v) => Some(Value::from(*v)),
            Meta::I32(v) => Some(Value::from(*v)),
            Meta::I64(v) => Some(Value::from(*v)),
            // An array stands for its length (`tokenizer.ggml.tokens`: the vocabulary).
            Meta::Array(items) => Some(Value::from(items.len())),
            other => other.as_u64().map(Value::from),
        };
        self.metadata.iter().filter_map(|(key, meta)| Some((key.clone(), scalar(meta)?))).collect()
    }

    /// The type its floating tensors are stored in, as torch names it
    /// (`general.file_type` 0, 1 and 32: f32, f16, bf16); `None` for a
    /// file of block formats, whose values are computed in the card's type.
    pub fn float_type(&self) -> Option<&'static str> {
        match self.meta("general.file_type")?.as_u64()? {
            0 => Some("float32"),
            1 => Some("float16"),
            32 => Some("bfloat16"),
            _ => None,
        }
    }

    /// A tensor's bytes within the whole file's.
    pub fn tensor_bytes<'f>(&self, file: &'f [u8], tensor: &TensorInfo) -> &'f [u8] {
        let start = (self.data_offset + tensor.offset) as usize;
        &file[start..start + tensor.bytes as usize]
    }
}

/// What is wrong with a file, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GgufError {
    /// The byte offset where reading stopped.
    pub at: u64,
    pub message: String,
}

impl fmt::Display for GgufError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (at byte {})", self.message, self.at)
    }
}

impl std::error::Error for GgufError {}

#[cfg(test)]
mod tests;
