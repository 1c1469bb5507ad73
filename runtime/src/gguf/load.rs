//! A model's parameters from a GGUF file whose tensors are named as the
//! checkpoint names them (`linnet quantize`'s files), through the package's
//! bindings. Every parameter is checked (present, its shape, its storage)
//! and all problems are reported at once, before anything runs.
//!
//! A tensor in a block format binds to a parameter stored in that format
//! (the model built for the file's formats: [`formats`],
//! `cache::stored_variant`) and is read where it lies in the mapped file;
//! its values are the blocks' dequantized values, whatever the parameter's
//! dtype. Plain tensors load as safetensors' do.

use super::{read_file, Storage};
use crate::weights::NonFinite;
use linnet_exec::tensor::{Data, Elements, Tensor};
use linnet_ir::quant::{self, BlockFormat};
use linnet_ir::{Model, Param};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::rc::Rc;

/// The block format of each parameter whose bound tensor in the file at
/// `path` is quantized: what the model is built for before it loads.
pub fn formats(
    model: &Model,
    bindings: &HashMap<String, String>,
    path: &Path,
) -> Result<BTreeMap<String, BlockFormat>, String> {
    let (_, gguf) = read_file(path)?;
    Ok(model
        .params
        .iter()
        .filter_map(|param| match gguf.tensor(bindings.get(&param.path)?)?.storage {
            Storage::Blocks(format) => Some((param.path.clone(), format)),
            Storage::Plain(_) => None,
        })
        .collect())
}

/// The values of a plain stored tensor for `param`, or why it cannot
/// give them.
fn values(param: &Param, name: &str, storage: Storage, bytes: &[u8]) -> Result<Vec<f32>, String> {
    match storage {
        Storage::Plain(stored)
            if stored.is_float() && (stored == param.dtype || param.dtype == linnet_ir::Dtype::F32) =>
        {
            Ok(crate::weights::to_f32(stored, bytes))
        }
        Storage::Plain(stored) => {
            Err(format!("`{name}` is {}, and `{}` is {}", stored.name(), param.path, param.dtype.name()))
        }
        Storage::Blocks(format) => Err(format!(
            "`{name}` is stored as {format}, and the model was built for `{}` stored as {}",
            param.path,
            param.storage.map_or("plain elements", BlockFormat::name)
        )),
    }
}

/// `param`'s tensor `name` holding NaN or infinite values, as a sentence.
fn unfinite(param: &Param, name: &str, first: usize) -> String {
    format!("parameter `{}`: `{name}` holds NaN or infinite values, the first at flat index {first}", param.path)
}

/// Every parameter of `model` from the GGUF file at `path`.
pub fn load(
    model: &Model,
    bindings: &HashMap<String, String>,
    path: &Path,
    non_finite: NonFinite,
) -> Result<Vec<Tensor>, Vec<String>> {
    let (file, gguf) = read_file(path).map_err(|e| vec![e])?;
    let file = Rc::new(file);
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
        let bytes = gguf.tensor_bytes(&file, tensor);
        match (param.storage, tensor.storage) {
            (Some(format), Storage::Blocks(stored)) if stored == format => {
                if let Some(block) = quant::first_non_finite_scale(format, bytes) {
                    let first = block * format.block_values();
                    non_finite.report(unfinite(param, name, first), "file", &mut problems);
                }
                let offset = (gguf.data_offset + tensor.offset) as usize;
                let blocks = Elements::mapped(Rc::clone(&file) as Rc<dyn AsRef<[u8]>>, offset, bytes.len())
                    .expect("a tensor the reader checked lies inside the file");
                params.push(Tensor {
                    dtype: param.dtype,
                    shape: param.shape.clone(),
                    data: Data::Blocks(format, blocks),
                });
            }
            (Some(format), stored) => problems.push(format!(
                "parameter `{}`: `{name}` is {stored}, and the model was built for {format} blocks",
                param.path
            )),
            (None, storage) => match values(param, name, storage, bytes) {
                Ok(values) => {
                    if let Some(first) = values.iter().position(|v| !v.is_finite()) {
                        non_finite.report(unfinite(param, name, first), "file", &mut problems);
                    }
                    params.push(Tensor::from_f32(param.dtype, param.shape.clone(), values).into_bits());
                }
                Err(problem) => problems.push(format!("parameter `{}`: {problem}", param.path)),
            },
        }
    }
    if problems.is_empty() {
        Ok(params)
    } else {
        Err(problems)
    }
}
