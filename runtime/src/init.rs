//! `linnet init-weights`: a random checkpoint laid out as the package's
//! `bindings.json` says, as sharded safetensors with an index, so a model
//! can be tried without downloading it.

use crate::random;
use linnet_ir::Dtype;
use linnet_ir::Model;
use safetensors::tensor::TensorView;
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

fn bytes(values: &[f32], dtype: Dtype) -> Vec<u8> {
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
pub fn copy_text_files(package: &Path, dir: &Path) -> Result<(), String> {
    for name in TEXT_FILES {
        let from = package.join(name);
        if from.exists() {
            std::fs::copy(&from, dir.join(name)).map_err(|e| format!("{}: {e}", from.display()))?;
        }
    }
    Ok(())
}

/// Writes `shards` files and `model.safetensors.index.json` into `dir`;
/// returns the bytes written.
pub fn write(
    model: &Model,
    bindings: &HashMap<String, String>,
    seed: u64,
    shards: usize,
    dir: &Path,
) -> Result<usize, String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let missing: Vec<&str> =
        model.params.iter().filter(|p| !bindings.contains_key(&p.path)).map(|p| p.path.as_str()).collect();
    if !missing.is_empty() {
        return Err(format!("bindings.json names no tensor for: {}", missing.join(", ")));
    }
    let shards = shards.clamp(1, model.params.len().max(1));
    let per_shard = model.params.len().div_ceil(shards);
    let progress = indicatif::ProgressBar::new(model.params.len() as u64);
    let mut weight_map = BTreeMap::new();
    let mut total = 0;
    for (shard, params) in model.params.chunks(per_shard).enumerate() {
        let name = format!("model-{:05}-of-{:05}.safetensors", shard + 1, shards);
        let offset = shard * per_shard;
        let data: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = params
            .iter()
            .enumerate()
            .map(|(at, param)| {
                progress.inc(1);
                let values = random::values(param, seed, offset + at);
                (bindings[&param.path].clone(), param.dtype, param.shape.clone(), bytes(&values, param.dtype))
            })
            .collect();
        let views = data
            .iter()
            .map(|(tensor, dtype, shape, raw)| {
                TensorView::new(file_dtype(*dtype), shape.clone(), raw).map(|view| (tensor.clone(), view))
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        let serialized = safetensors::serialize(views, None).map_err(|e| e.to_string())?;
        total += serialized.len();
        std::fs::write(dir.join(&name), serialized).map_err(|e| format!("{name}: {e}"))?;
        for (tensor, ..) in &data {
            weight_map.insert(tensor.clone(), name.clone());
        }
    }
    progress.finish_and_clear();
    let index = serde_json::json!({ "metadata": { "total_size": total }, "weight_map": weight_map });
    std::fs::write(dir.join("model.safetensors.index.json"), serde_json::to_string_pretty(&index).expect("JSON"))
        .map_err(|e| e.to_string())?;
    Ok(total)
}
