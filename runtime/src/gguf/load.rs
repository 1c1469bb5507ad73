//! A model's parameters from a GGUF file whose tensors are named as the
//! checkpoint names them (`linnet quantize`'s files), through the package's
//! bindings. Every parameter is checked (present, its shape, its storage)
//! and all problems are reported at once, before anything runs.
//!
//! A tensor in a block format is dequantized exactly, as the block formats
//! define it, into an f32 parameter. Until the backends' kernels read
//! blocks in place, quantized tensors load into an f32 instantiation only
//! (`--set T=f32`): a bf16 parameter would round the dequantized values,
//! and that is not what the file means.

use super::{read_file, Storage};
use crate::weights::NonFinite;
use linnet_exec::tensor::Tensor;
use linnet_ir::quant::dequantize;
use linnet_ir::{Dtype, Model, Param};
use std::collections::HashMap;
use std::path::Path;

/// The values a stored tensor gives `param`, or why it cannot.
fn values(param: &Param, name: &str, storage: Storage, bytes: &[u8]) -> Result<Vec<f32>, String> {
    let count: usize = param.shape.iter().product();
    match (storage, param.dtype) {
        (Storage::Blocks(format), Dtype::F32) => {
            let mut out = vec![0f32; count];
            dequantize(format, bytes, &mut out).map_err(|e| format!("`{name}`: {e}"))?;
            Ok(out)
        }
        (Storage::Blocks(format), dtype) => Err(format!(
            "`{name}` is stored as {format}, and `{}` is {}: quantized tensors load into an f32 instantiation (`--set T=f32`) until the block kernels land",
            param.path,
            dtype.name()
        )),
        (Storage::Plain(stored), wanted) if stored.is_float() && (stored == wanted || wanted == Dtype::F32) => {
            Ok(crate::weights::to_f32(stored, bytes))
        }
        (Storage::Plain(stored), wanted) => {
            Err(format!("`{name}` is {}, and `{}` is {}", stored.name(), param.path, wanted.name()))
        }
    }
}

/// Every parameter of `model` from the GGUF file at `path`.
pub fn load(
    model: &Model,
    bindings: &HashMap<String, String>,
    path: &Path,
    non_finite: NonFinite,
) -> Result<Vec<Tensor>, Vec<String>> {
    let (file, gguf) = read_file(path).map_err(|e| vec![e])?;
    let mut problems = Vec::new();
    let mut params = Vec::with_capacity(model.params.len());
    for param in &model.params {
        let Some(name) = bindings.get(&param.path) else {
            problems.push(format!("parameter `{}` has no binding in bindings.json", param.path));
            continue;
        };
        let Some(tensor) = gguf.tensor(name) else {
            problems.push(format!("parameter `{}`: {} has no tensor `{name}`", param.path, path.display()));
            continue;
        };
        let wanted: Vec<u64> = param.shape.iter().map(|d| *d as u64).collect();
        if tensor.shape() != wanted {
            problems.push(format!(
                "parameter `{}`: `{name}` has shape {:?}, expected {wanted:?}",
                param.path,
                tensor.shape()
            ));
            continue;
        }
        match values(param, name, tensor.storage, gguf.tensor_bytes(&file, tensor)) {
            Ok(values) => {
                if let Some(first) = values.iter().position(|v| !v.is_finite()) {
                    let found = format!(
                        "parameter `{}`: `{name}` holds NaN or infinite values, the first at flat index {first}",
                        param.path
                    );
                    match non_finite {
                        NonFinite::Warn => eprintln!("warning: {found} (--strict refuses such a file)"),
                        NonFinite::Refuse => problems.push(format!("{found} (refused under --strict)")),
                    }
                }
                let tensor = Tensor::from_f32(param.dtype, param.shape.clone(), values);
                params.push(if param.dtype == Dtype::Bf16 { tensor.into_bits() } else { tensor });
            }
            Err(problem) => problems.push(format!("parameter `{}`: {problem}", param.path)),
        }
    }
    if problems.is_empty() {
        Ok(params)
    } else {
        Err(problems)
    }
}
