//! Element types of tensors as the IR stores and computes them.

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub enum Dtype {
    Bf16,
    F16,
    F32,
    I32,
    I64,
    Bool,
}

impl Dtype {
    /// The bytes one element takes.
    pub fn bytes(self) -> usize {
        match self {
            Dtype::Bf16 | Dtype::F16 => 2,
            Dtype::F32 | Dtype::I32 => 4,
            Dtype::I64 => 8,
            Dtype::Bool => 1,
        }
    }

    pub fn parse(name: &str) -> Option<Dtype> {
        Some(match name {
            "bf16" => Dtype::Bf16,
            "f16" => Dtype::F16,
            "f32" => Dtype::F32,
            "i32" => Dtype::I32,
            "i64" => Dtype::I64,
            "bool" => Dtype::Bool,
            _ => return None,
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            Dtype::Bf16 => "bf16",
            Dtype::F16 => "f16",
            Dtype::F32 => "f32",
            Dtype::I32 => "i32",
            Dtype::I64 => "i64",
            Dtype::Bool => "bool",
        }
    }

    pub fn is_float(self) -> bool {
        matches!(self, Dtype::Bf16 | Dtype::F16 | Dtype::F32)
    }

    pub fn is_int(self) -> bool {
        matches!(self, Dtype::I32 | Dtype::I64)
    }
}
