//! `linnet quantize` and `linnet init-weights --type`: a model's
//! parameters written as a GGUF file in block formats, each tensor named as
//! the checkpoint names it (so the package's `bindings.json` reads the file
//! too). A recipe says which format each tensor gets; what the blocks
//! cannot hold stays as it is, as llama.cpp keeps it: one-dimensional
//! tensors (norms, gates' biases, decays) and tensors whose rows the block
//! does not divide (the DeltaNet's convolution taps). The routers (the
//! experts' and the shared expert's gates) stay too, as llama.cpp keeps
//! them: a rounded router picks other experts.

use crate::gguf::{self, Meta, Planned, Storage};
use crate::Error;
use linnet_exec::tensor::Tensor;
use linnet_ir::quant::{quantize, BlockFormat};
use linnet_ir::{Model, Param};
use rayon::prelude::*;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// Which format each tensor gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recipe {
    /// Every tensor the blocks can hold in one format.
    Uniform(BlockFormat),
    /// llama.cpp's Q4_K_M mix: Q4_K, with Q6_K for the output head and for
    /// the value and down projections of the layers that matter most (the
    /// first and last eighth, and every third between).
    Q4KM,
}

impl Recipe {
    pub fn parse(name: &str) -> Option<Recipe> {
        if name.eq_ignore_ascii_case("q4_k_m") {
            return Some(Recipe::Q4KM);
        }
        BlockFormat::parse(name).map(Recipe::Uniform)
    }

    pub fn name(self) -> &'static str {
        match self {
            Recipe::Uniform(format) => format.name(),
            Recipe::Q4KM => "q4_k_m",
        }
    }

    /// The format of the tensor `name` (a checkpoint name) of `layers`
    /// layers, if the blocks can hold it.
    fn format_of(self, name: &str, shape: &[usize], layers: usize) -> Option<BlockFormat> {
        if is_router(name) {
            return None;
        }
        let chosen = match self {
            Recipe::Uniform(format) => format,
            Recipe::Q4KM => {
                let layer = layer_of(name);
                let sensitive = name.contains("v_proj") || name.contains("down_proj");
                let more_bits = layer.is_some_and(|layer| {
                    let eighth = layers / 8;
                    layer < eighth || layer >= 7 * layers / 8 || (layer - eighth) % 3 == 2
                });
                if is_output_head(name) || sensitive && more_bits {
                    BlockFormat::Q6K
                } else {
                    BlockFormat::Q4K
                }
            }
        };
        let row = *shape.last()?;
        (shape.len() >= 2 && row % chosen.block_values() == 0).then_some(chosen)
    }
}

/// The experts' router (`….mlp.gate.weight`) or the shared expert's gate.
fn is_router(name: &str) -> bool {
    name.ends_with(".mlp.gate.weight") || name.ends_with(".shared_expert_gate.weight")
}

fn is_output_head(name: &str) -> bool {
    name == "lm_head.weight" || name == "output.weight"
}

/// The layer a checkpoint name belongs to: `…layers.N.…`.
fn layer_of(name: &str) -> Option<usize> {
    let rest = &name[name.find("layers.")? + "layers.".len()..];
    rest.split('.').next()?.parse().ok()
}

/// How many layers the names count (one more than the largest index).
fn layer_count<'n>(names: impl Iterator<Item = &'n str>) -> usize {
    names.filter_map(layer_of).max().map_or(0, |last| last + 1)
}

/// Tensors and bytes, per storage, before and after.
#[derive(Default, Debug)]
pub struct Summary {
    pub bytes_before: u64,
    pub by_storage: BTreeMap<String, (usize, u64)>,
}

impl Summary {
    pub fn bytes_after(&self) -> u64 {
        self.by_storage.values().map(|(_, bytes)| bytes).sum()
    }

    /// One line per storage, then the total.
    pub fn report(&self) -> String {
        let mut lines: Vec<String> = self
            .by_storage
            .iter()
            .map(|(storage, (tensors, bytes))| format!("{storage:>6}: {tensors:>5} tensors, {}", human(*bytes)))
            .collect();
        let ratio = self.bytes_before as f64 / self.bytes_after().max(1) as f64;
        lines.push(format!(
            "total: {} before, {} after ({ratio:.2}x smaller)",
            human(self.bytes_before),
            human(self.bytes_after())
        ));
        lines.join("\n")
    }
}

fn human(bytes: u64) -> String {
    format!("{} ({bytes} bytes)", linnet_ir::plan::human_bytes(u128::from(bytes)))
}

/// What each parameter becomes: its checkpoint name and storage.
fn plan(model: &Model, bindings: &HashMap<String, String>, recipe: Recipe) -> Result<Vec<Planned>, Error> {
    crate::init::every_param_bound(model, bindings)?;
    let layers = layer_count(model.params.iter().map(|p| linnet_artifact::written_name(&bindings[&p.path])));
    Ok(model
        .params
        .iter()
        .map(|param| {
            let name = linnet_artifact::written_name(&bindings[&param.path]).to_string();
            let storage = match recipe.format_of(&name, &param.shape, layers) {
                Some(format) => Storage::Blocks(format),
                None => Storage::Plain(param.dtype),
            };
            Planned { name, shape: param.shape.iter().map(|d| *d as u64).collect(), storage }
        })
        .collect())
}

/// A parameter's bytes as `storage` holds them.
fn encode(param: &Param, values: &[f32], storage: Storage) -> Result<Vec<u8>, Error> {
    Ok(match storage {
        Storage::Blocks(format) => {
            // Rows of whole blocks, quantized on every core in runs of rows.
            let row = param.shape.last().copied().unwrap_or(1).max(1);
            let run = row * (1usize << 16).div_ceil(row);
            let parts: Vec<Vec<u8>> = values
                .par_chunks(run)
                .map(|values| quantize(format, values))
                .collect::<Result<_, _>>()
                .map_err(|e| Error::Weights(format!("`{}`: {e}", param.path)))?;
            parts.concat()
        }
        Storage::Plain(dtype) if dtype.is_float() => crate::init::bytes(values, dtype),
        Storage::Plain(other) => {
            return Err(Error::Weights(format!("`{}` is {other:?}: not a weight to store", param.path)))
        }
    })
}

fn metadata(model: &Model, recipe: Recipe) -> Vec<(String, Meta)> {
    vec![
        ("general.architecture".into(), Meta::Str("linnet".into())),
        ("general.name".into(), Meta::Str(model.name.clone())),
        ("general.quantization_version".into(), Meta::U32(2)),
        ("linnet.recipe".into(), Meta::Str(recipe.name().into())),
    ]
}

/// Writes `model`'s parameters, with the values `values_of` gives each
/// (by index), to `out` under `recipe`; a progress bar counts tensors.
fn write(
    model: &Model,
    bindings: &HashMap<String, String>,
    recipe: Recipe,
    out: &Path,
    mut values_of: impl FnMut(usize) -> Result<Vec<f32>, Error>,
) -> Result<Summary, Error> {
    let planned = plan(model, bindings, recipe)?;
    // Written aside and renamed into place: a failure leaves no half file.
    let partial = PathBuf::from(format!("{}.partial", out.display()));
    let written = write_to(model, &planned, recipe, &partial, &mut values_of);
    match written {
        Ok(summary) => {
            std::fs::rename(&partial, out).map_err(|e| Error::Weights(format!("{}: {e}", out.display())))?;
            Ok(summary)
        }
        Err(problem) => {
            let _ = std::fs::remove_file(&partial);
            Err(problem)
        }
    }
}

fn write_to(
    model: &Model,
    planned: &[Planned],
    recipe: Recipe,
    out: &Path,
    values_of: &mut impl FnMut(usize) -> Result<Vec<f32>, Error>,
) -> Result<Summary, Error> {
    let mut writer = gguf::Writer::create(out, &metadata(model, recipe), planned)?;
    let progress =
        indicatif::ProgressBar::new(planned.len() as u64).with_message(format!("quantizing to {}", recipe.name()));
    let mut summary = Summary::default();
    for (at, (param, planned)) in model.params.iter().zip(planned).enumerate() {
        let values = values_of(at)?;
        let bytes = encode(param, &values, planned.storage)?;
        writer.write_tensor(&bytes)?;
        summary.bytes_before += (values.len() * param.dtype.bytes()) as u64;
        let entry = summary.by_storage.entry(planned.storage.name().to_string()).or_default();
        entry.0 += 1;
        entry.1 += bytes.len() as u64;
        progress.inc(1);
    }
    progress.finish_and_clear();
    writer.finish()?;
    Ok(summary)
}

/// Quantizes loaded parameters (one tensor per parameter of `model`).
pub fn from_params(
    model: &Model,
    bindings: &HashMap<String, String>,
    params: &[Tensor],
    recipe: Recipe,
    out: &Path,
) -> Result<Summary, Error> {
    write(model, bindings, recipe, out, |at| {
        let widened = params[at].widened();
        widened
            .as_f32()
            .map(<[f32]>::to_vec)
            .ok_or_else(|| Error::Weights(format!("`{}` holds no floats", model.params[at].path)))
    })
}

/// Random parameters, drawn as `init-weights` draws them, quantized as
/// they are drawn: a full-size model without its bf16 checkpoint first.
pub fn random(
    model: &Model,
    bindings: &HashMap<String, String>,
    seed: u64,
    recipe: Recipe,
    out: &Path,
) -> Result<Summary, Error> {
    write(model, bindings, recipe, out, |at| crate::random::values(&model.params[at], seed, at))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn q4_k_m_gives_more_bits_where_llama_cpp_does() {
        let recipe = Recipe::Q4KM;
        let matrix = [64, 256];
        let format = |name: &str| recipe.format_of(name, &matrix, 16);
        assert_eq!(format("lm_head.weight"), Some(BlockFormat::Q6K));
        assert_eq!(format("model.layers.0.mlp.down_proj.weight"), Some(BlockFormat::Q6K));
        assert_eq!(format("model.layers.15.self_attn.v_proj.weight"), Some(BlockFormat::Q6K));
        assert_eq!(format("model.layers.4.mlp.down_proj.weight"), Some(BlockFormat::Q6K));
        assert_eq!(format("model.layers.3.mlp.down_proj.weight"), Some(BlockFormat::Q4K));
        assert_eq!(format("model.layers.3.self_attn.q_proj.weight"), Some(BlockFormat::Q4K));
        // What the blocks cannot hold stays as it is.
        assert_eq!(recipe.format_of("model.norm.weight", &[256], 16), None);
        assert_eq!(recipe.format_of("model.layers.0.linear_attn.conv1d.weight", &[8192, 1, 4], 16), None);
        // Nor do the routers, in any format.
        for recipe in [recipe, Recipe::Uniform(BlockFormat::Q8_0)] {
            assert_eq!(recipe.format_of("model.language_model.layers.2.mlp.gate.weight", &matrix, 16), None);
            assert_eq!(recipe.format_of("model.layers.2.mlp.shared_expert_gate.weight", &[1, 256], 16), None);
            assert!(recipe.format_of("model.layers.2.mlp.shared_expert.gate_proj.weight", &matrix, 16).is_some());
        }
        assert_eq!(Recipe::parse("Q4_K_M"), Some(Recipe::Q4KM));
        assert_eq!(Recipe::parse("q6_k"), Some(Recipe::Uniform(BlockFormat::Q6K)));
        assert_eq!(Recipe::parse("q5_k"), None);
    }
}
