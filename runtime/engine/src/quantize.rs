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
    /// One of llama-quantize's file types, its rules for which tensor gets
    /// which format ([`Mix::format_of`]).
    Mix(Mix),
}

/// llama-quantize's file types whose tensors are not all of one format:
/// a base format, more bits for the output head and for the tensors that
/// matter most, as its `llama_tensor_get_type` chooses (for the tensors
/// these models have; no importance matrix).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mix {
    /// Q4_0, Q4_1, Q5_0, Q5_1 and IQ4_NL: the format, the output head Q6_K.
    Legacy(BlockFormat),
    Q2K,
    Q3KM,
    Q4KM,
    Q5KM,
    Iq4Xs,
    /// MXFP4 for the experts' stacked matrices, Q8_0 for the rest.
    Mxfp4Moe,
}

/// What the rules ask of the whole model: its layers, its attention
/// layers' value projections in order, and its query heads per key head.
#[derive(Default)]
struct Facts {
    layers: usize,
    value_layers: Vec<usize>,
    query_heads_per_key_head: usize,
}

impl Facts {
    fn of(tensors: &[(String, Vec<usize>)]) -> Facts {
        let mut value_layers: Vec<usize> =
            tensors.iter().filter(|(name, _)| name.contains("v_proj")).filter_map(|(name, _)| layer_of(name)).collect();
        value_layers.sort_unstable();
        value_layers.dedup();
        let rows_of = |part: &str| tensors.iter().find(|(name, _)| name.contains(part)).map(|(_, shape)| shape[0]);
        let query_heads_per_key_head = match (rows_of("q_proj"), rows_of("k_proj")) {
            (Some(queries), Some(keys)) if keys > 0 => queries / keys,
            _ => 1,
        };
        Facts {
            layers: layer_count(tensors.iter().map(|(name, _)| name.as_str())),
            value_layers,
            query_heads_per_key_head,
        }
    }

    /// llama.cpp's `use_more_bits`: the first and last eighth, and every
    /// third between.
    fn more_bits(at: usize, count: usize) -> bool {
        let eighth = count / 8;
        at < eighth || at >= 7 * count / 8 || (at - eighth) % 3 == 2
    }
}

impl Mix {
    const ALL: [Mix; 11] = [
        Mix::Legacy(BlockFormat::Q4_0),
        Mix::Legacy(BlockFormat::Q4_1),
        Mix::Legacy(BlockFormat::Q5_0),
        Mix::Legacy(BlockFormat::Q5_1),
        Mix::Legacy(BlockFormat::Iq4Nl),
        Mix::Q2K,
        Mix::Q3KM,
        Mix::Q4KM,
        Mix::Q5KM,
        Mix::Iq4Xs,
        Mix::Mxfp4Moe,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Mix::Legacy(format) => format.name(),
            Mix::Q2K => "q2_k",
            Mix::Q3KM => "q3_k_m",
            Mix::Q4KM => "q4_k_m",
            Mix::Q5KM => "q5_k_m",
            Mix::Iq4Xs => "iq4_xs",
            Mix::Mxfp4Moe => "mxfp4_moe",
        }
    }

    /// The format llama-quantize gives the tensor `name` (a checkpoint
    /// name) of shape `shape`, before its fallback for rows its block does
    /// not divide.
    fn format_of(self, name: &str, shape: &[usize], facts: &Facts) -> BlockFormat {
        use BlockFormat::*;
        let layer = layer_of(name).unwrap_or(0);
        let grouped = facts.query_heads_per_key_head >= 4;
        if is_output_head(name) {
            return if self == Mix::Mxfp4Moe { Q8_0 } else { Q6K };
        }
        if self == Mix::Mxfp4Moe {
            let stacked_experts = shape.len() == 3 && shape[0] > 1;
            return if stacked_experts { Mxfp4 } else { Q8_0 };
        }
        let base = match self {
            Mix::Legacy(format) => format,
            Mix::Q2K => Q2K,
            Mix::Q3KM => Q3K,
            Mix::Q4KM => Q4K,
            Mix::Q5KM => Q5K,
            Mix::Iq4Xs => Iq4Xs,
            Mix::Mxfp4Moe => unreachable!("chosen above"),
        };
        if name.contains("embed_tokens") {
            return base;
        }
        if name.contains("v_proj") {
            let value = facts.value_layers.iter().position(|l| *l == layer).unwrap_or(0);
            return match self {
                Mix::Q2K if grouped => Q4K,
                Mix::Q2K => Q3K,
                Mix::Q3KM if value < 2 => Q5K,
                Mix::Q3KM => Q4K,
                Mix::Iq4Xs | Mix::Legacy(Iq4Nl) if grouped => Q5K,
                Mix::Q4KM | Mix::Q5KM if Facts::more_bits(value, facts.value_layers.len()) => Q6K,
                _ => base,
            };
        }
        if name.contains("down_proj") {
            let layers = facts.layers;
            return match self {
                Mix::Q2K => Q3K,
                Mix::Q3KM if layer < layers / 16 => Q5K,
                Mix::Q3KM => Q4K,
                Mix::Q4KM | Mix::Q5KM if Facts::more_bits(layer, layers) => Q6K,
                Mix::Iq4Xs | Mix::Legacy(Iq4Nl) if layer < layers / 8 => Q5K,
                _ => base,
            };
        }
        if name.contains("o_proj") {
            return match self {
                Mix::Q2K => Q3K,
                Mix::Q3KM => Q4K,
                _ => base,
            };
        }
        base
    }
}

/// llama-quantize's fallback where a format's block does not divide a
/// tensor's rows: a 32-value format of about as many bits.
fn fallback(format: BlockFormat) -> BlockFormat {
    match format {
        BlockFormat::Iq4Xs => BlockFormat::Iq4Nl,
        BlockFormat::Q2K | BlockFormat::Q3K => BlockFormat::Q4_0,
        BlockFormat::Q4K => BlockFormat::Q5_0,
        BlockFormat::Q5K => BlockFormat::Q5_1,
        BlockFormat::Q6K => BlockFormat::Q8_0,
        other => other,
    }
}

impl Recipe {
    /// A file type as llama-quantize names it (`q4_k_m`, `q2_k`, `iq4_xs`,
    /// `mxfp4_moe`, …: its rules), else a block format's name (every
    /// tensor in it): `q8_0` and `q6_k` are both, alike.
    pub fn parse(name: &str) -> Option<Recipe> {
        if let Some(mix) = Mix::ALL.into_iter().find(|mix| mix.name().eq_ignore_ascii_case(name)) {
            return Some(Recipe::Mix(mix));
        }
        BlockFormat::parse(name).map(Recipe::Uniform)
    }

    /// Every name [`Recipe::parse`] reads: the mixes, then the formats.
    pub fn names() -> impl Iterator<Item = &'static str> {
        let mixes = Mix::ALL.map(Mix::name);
        let formats = BlockFormat::ALL.into_iter().map(BlockFormat::name).filter(move |name| !mixes.contains(name));
        mixes.into_iter().chain(formats)
    }

    pub fn name(self) -> &'static str {
        match self {
            Recipe::Uniform(format) => format.name(),
            Recipe::Mix(mix) => mix.name(),
        }
    }

    /// The format of the tensor `name` (a checkpoint name) of shape
    /// `shape`, if the blocks can hold it: llama-quantize's fallback
    /// where the chosen format's block does not divide its rows, none
    /// where that does not either.
    fn format_of(self, name: &str, shape: &[usize], facts: &Facts) -> Option<BlockFormat> {
        if is_router(name) {
            return None;
        }
        let chosen = match self {
            Recipe::Uniform(format) => format,
            Recipe::Mix(mix) => mix.format_of(name, shape, facts),
        };
        let row = *shape.last()?;
        let fits = |format: BlockFormat| row % format.block_values() == 0;
        let chosen = if fits(chosen) { chosen } else { fallback(chosen) };
        (shape.len() >= 2 && fits(chosen)).then_some(chosen)
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
    let tensors: Vec<(String, Vec<usize>)> = model
        .params
        .iter()
        .map(|param| (linnet_artifact::written_name(&bindings[&param.path]).to_string(), param.shape.clone()))
        .collect();
    let facts = Facts::of(&tensors);
    Ok(tensors
        .into_iter()
        .zip(&model.params)
        .map(|((name, shape), param)| {
            let storage = match recipe.format_of(&name, &shape, &facts) {
                Some(format) => Storage::Blocks(format),
                None => Storage::Plain(param.dtype),
            };
            Planned { name, shape: shape.iter().map(|d| *d as u64).collect(), storage }
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

    /// Sixteen layers of a dense decoder with eight query heads per key
    /// head, as checkpoint names and shapes.
    fn facts() -> Facts {
        let mut tensors = vec![("lm_head.weight".to_string(), vec![64, 256])];
        for layer in 0..16 {
            for (part, rows) in [("q_proj", 512), ("k_proj", 64), ("v_proj", 64), ("o_proj", 256)] {
                tensors.push((format!("model.layers.{layer}.self_attn.{part}.weight"), vec![rows, 256]));
            }
        }
        Facts::of(&tensors)
    }

    #[test]
    fn q4_k_m_gives_more_bits_where_llama_cpp_does() {
        let (recipe, facts) = (Recipe::Mix(Mix::Q4KM), facts());
        let matrix = [64, 256];
        let format = |name: &str| recipe.format_of(name, &matrix, &facts);
        assert_eq!(format("lm_head.weight"), Some(BlockFormat::Q6K));
        assert_eq!(format("model.layers.0.mlp.down_proj.weight"), Some(BlockFormat::Q6K));
        assert_eq!(format("model.layers.15.self_attn.v_proj.weight"), Some(BlockFormat::Q6K));
        assert_eq!(format("model.layers.4.mlp.down_proj.weight"), Some(BlockFormat::Q6K));
        assert_eq!(format("model.layers.3.mlp.down_proj.weight"), Some(BlockFormat::Q4K));
        assert_eq!(format("model.layers.3.self_attn.q_proj.weight"), Some(BlockFormat::Q4K));
        // What the blocks cannot hold stays as it is.
        assert_eq!(recipe.format_of("model.norm.weight", &[256], &facts), None);
        assert_eq!(recipe.format_of("model.layers.0.linear_attn.conv1d.weight", &[8192, 1, 4], &facts), None);
        // Nor do the routers, in any format.
        for recipe in [recipe, Recipe::Uniform(BlockFormat::Q8_0)] {
            assert_eq!(recipe.format_of("model.language_model.layers.2.mlp.gate.weight", &matrix, &facts), None);
            assert_eq!(recipe.format_of("model.layers.2.mlp.shared_expert_gate.weight", &[1, 256], &facts), None);
            assert!(recipe.format_of("model.layers.2.mlp.shared_expert.gate_proj.weight", &matrix, &facts).is_some());
        }
    }

    /// The other mixes, tensor by tensor as llama-quantize's rules give them.
    #[test]
    fn every_mix_gives_llama_cpps_formats() {
        use BlockFormat::*;
        let facts = facts();
        let matrix = [64, 256];
        let cases: [(Mix, &str, BlockFormat); 16] = [
            (Mix::Q2K, "model.layers.3.self_attn.v_proj.weight", Q4K),
            (Mix::Q2K, "model.layers.3.mlp.down_proj.weight", Q3K),
            (Mix::Q2K, "model.layers.3.self_attn.o_proj.weight", Q3K),
            (Mix::Q2K, "model.layers.3.mlp.up_proj.weight", Q2K),
            (Mix::Q3KM, "model.layers.1.self_attn.v_proj.weight", Q5K),
            (Mix::Q3KM, "model.layers.2.self_attn.v_proj.weight", Q4K),
            (Mix::Q3KM, "model.layers.0.mlp.down_proj.weight", Q5K),
            (Mix::Q3KM, "model.layers.5.mlp.down_proj.weight", Q4K),
            (Mix::Q5KM, "model.layers.0.mlp.down_proj.weight", Q6K),
            (Mix::Q5KM, "model.layers.3.mlp.down_proj.weight", Q5K),
            (Mix::Iq4Xs, "model.layers.3.self_attn.v_proj.weight", Q5K),
            (Mix::Iq4Xs, "model.layers.1.mlp.down_proj.weight", Q5K),
            (Mix::Iq4Xs, "model.layers.3.mlp.up_proj.weight", Iq4Xs),
            (Mix::Legacy(Q4_0), "lm_head.weight", Q6K),
            (Mix::Legacy(Q4_0), "model.layers.3.mlp.down_proj.weight", Q4_0),
            (Mix::Mxfp4Moe, "lm_head.weight", Q8_0),
        ];
        for (mix, name, expected) in cases {
            assert_eq!(Recipe::Mix(mix).format_of(name, &matrix, &facts), Some(expected), "{} {name}", mix.name());
        }
        let mxfp4 = Recipe::Mix(Mix::Mxfp4Moe);
        assert_eq!(mxfp4.format_of("model.layers.0.mlp.experts.down_proj", &[8, 64, 256], &facts), Some(Mxfp4));
        assert_eq!(mxfp4.format_of("model.layers.0.mlp.shared_expert.down_proj.weight", &matrix, &facts), Some(Q8_0));
    }

    /// Where a block does not divide the rows, llama-quantize's smaller
    /// block of about as many bits; where that does not either, nothing.
    #[test]
    fn rows_the_block_does_not_divide_fall_back_as_llama_cpp_does() {
        let facts = facts();
        let format =
            |format, row| Recipe::Uniform(format).format_of("model.layers.0.mlp.up_proj.weight", &[8, row], &facts);
        assert_eq!(format(BlockFormat::Q4K, 96), Some(BlockFormat::Q5_0));
        assert_eq!(format(BlockFormat::Q5K, 96), Some(BlockFormat::Q5_1));
        assert_eq!(format(BlockFormat::Q6K, 96), Some(BlockFormat::Q8_0));
        assert_eq!(format(BlockFormat::Iq4Xs, 96), Some(BlockFormat::Iq4Nl));
        assert_eq!(format(BlockFormat::Q2K, 96), Some(BlockFormat::Q4_0));
        assert_eq!(format(BlockFormat::Q4K, 100), None);
    }

    #[test]
    fn names_are_llama_quantizes() {
        assert_eq!(Recipe::parse("Q4_K_M"), Some(Recipe::Mix(Mix::Q4KM)));
        assert_eq!(Recipe::parse("q2_k"), Some(Recipe::Mix(Mix::Q2K)));
        assert_eq!(Recipe::parse("IQ4_XS"), Some(Recipe::Mix(Mix::Iq4Xs)));
        assert_eq!(Recipe::parse("q4_0"), Some(Recipe::Mix(Mix::Legacy(BlockFormat::Q4_0))));
        assert_eq!(Recipe::parse("mxfp4_moe"), Some(Recipe::Mix(Mix::Mxfp4Moe)));
        assert_eq!(Recipe::parse("q6_k"), Some(Recipe::Uniform(BlockFormat::Q6K)));
        assert_eq!(Recipe::parse("q5_k"), Some(Recipe::Uniform(BlockFormat::Q5K)));
        assert_eq!(Recipe::parse("mxfp4"), Some(Recipe::Uniform(BlockFormat::Mxfp4)));
        assert_eq!(Recipe::parse("q3_k_l"), None);
        for mix in Mix::ALL {
            assert_eq!(Recipe::parse(mix.name()), Some(Recipe::Mix(mix)));
        }
    }
}
