//! Quantized weights end to end: the oracle checkpoint quantized by
//! `linnet quantize`'s library, loaded from the GGUF file, is the model of
//! its dequantized values. On the reference interpreter its logits are bit
//! for bit those of a safetensors checkpoint holding the dequantized
//! values; the CPU backend meets them within the f32 contract; the
//! quantized model stays near the unquantized one. A bf16 instantiation
//! refuses quantized tensors by name, and a file missing a tensor names it.

use linnet_exec::tensor::Tensor;
use linnet_ir::quant::{dequantize, BlockFormat};
use linnet_ir::Dtype;
use linnet_runtime::quantize::{from_params, Recipe};
use linnet_runtime::weights::NonFinite;
use linnet_runtime::{BackendKind, Weights};
use std::path::{Path, PathBuf};

mod common;
use common::{oracle, oracle_options, root};

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("linnet-quantized-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn checkpoint(dir: &Path) -> Weights {
    Weights::Checkpoint { dir: Some(dir.to_path_buf()), non_finite: NonFinite::Refuse }
}

/// `forward` on the golden sequences 0 and 1, flattened.
fn logits(weights: &Weights, backend: BackendKind) -> Vec<f32> {
    let mut machine =
        linnet_runtime::load_on(&root().join("models/qwen3.6-35b-a3b"), &oracle_options(), weights, backend)
            .unwrap_or_else(|e| panic!("{e}"))
            .machine;
    let golden = common::golden(&oracle(), "f32");
    let tokens: Vec<i64> = golden[0].tokens.iter().chain(&golden[1].tokens).copied().collect();
    let input = Tensor::from_i64(Dtype::I32, vec![2, golden[0].tokens.len()], tokens);
    let out = machine.call("forward", vec![input]).unwrap().swap_remove(0);
    out.widened().as_f32().unwrap().to_vec()
}

fn distance(ours: &[f32], reference: &[f32]) -> f32 {
    let scale = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
    ours.iter().zip(reference).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale
}

/// The oracle's f32 model, its parameters and bindings, quantized to `recipe`
/// into `dir/model.gguf`; and a safetensors checkpoint of the values the
/// file means, beside it in `dir/dequantized`.
fn quantized(recipe: Recipe, dir: &Path) -> PathBuf {
    let (model, package) = linnet_runtime::lower(&root().join("models/qwen3.6-35b-a3b"), &oracle_options()).unwrap();
    let bindings = linnet_runtime::bindings(&package);
    let params =
        linnet_runtime::weights::load(&model, &bindings, &oracle().join("weights-f32"), &[], NonFinite::Refuse)
            .unwrap();
    let file = dir.join("model.gguf");
    let summary = from_params(&model, &bindings, &params, recipe, &file).unwrap();
    assert!(summary.bytes_after() < summary.bytes_before);
    let (bytes, gguf) = linnet_runtime::gguf::read_file(&file).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    for tensor in &gguf.tensors {
        let stored = gguf.tensor_bytes(&bytes, tensor);
        let values: Vec<u8> = match tensor.storage {
            linnet_runtime::gguf::Storage::Blocks(format) => {
                let mut out = vec![0f32; tensor.elements() as usize];
                dequantize(format, stored, &mut out).unwrap();
                out.iter().flat_map(|v| v.to_le_bytes()).collect()
            }
            linnet_runtime::gguf::Storage::Plain(_) => stored.to_vec(),
        };
        tensors.push((tensor.name.clone(), tensor.shape().iter().map(|d| *d as usize).collect(), values));
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(name, shape, data)| {
            (name.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data).unwrap())
        })
        .collect();
    // One shard, and an index saying so (the card lists the oracle's three).
    let weight_map: serde_json::Map<String, serde_json::Value> =
        tensors.iter().map(|(name, ..)| (name.clone(), "model.safetensors".into())).collect();
    std::fs::create_dir_all(dir.join("dequantized")).unwrap();
    std::fs::write(dir.join("dequantized/model.safetensors"), safetensors::serialize(views, None).unwrap()).unwrap();
    let index = serde_json::json!({ "weight_map": weight_map });
    std::fs::write(dir.join("dequantized/model.safetensors.index.json"), index.to_string()).unwrap();
    file
}

#[test]
fn a_q8_0_file_runs_as_its_dequantized_values() {
    let dir = scratch("q8_0");
    let file = quantized(Recipe::Uniform(BlockFormat::Q8_0), &dir);
    let from_file = logits(&checkpoint(&file), BackendKind::Interp);
    let dequantized = logits(&checkpoint(&dir.join("dequantized")), BackendKind::Interp);
    assert!(from_file.iter().zip(&dequantized).all(|(a, b)| a.to_bits() == b.to_bits()), "the interpreter differs");
    let on_cpu = logits(&checkpoint(&file), BackendKind::Cpu);
    assert!(distance(&on_cpu, &from_file) <= 1e-4, "cpu: {:.2e}", distance(&on_cpu, &from_file));
    let unquantized = logits(&checkpoint(&oracle().join("weights-f32")), BackendKind::Interp);
    let moved = distance(&from_file, &unquantized);
    assert!(moved > 0.0 && moved < 0.5, "q8_0 moved the logits by {moved:.2e} of their scale");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn quantized_tensors_are_refused_by_a_bf16_model_and_missing_ones_named() {
    let dir = scratch("refused");
    let file = quantized(Recipe::Uniform(BlockFormat::Q8_0), &dir);
    let bf16 =
        linnet_frontend::package::LoadOptions { overrides: vec![("T".into(), "bf16".into())], ..oracle_options() };
    let error =
        linnet_runtime::load_on(&root().join("models/qwen3.6-35b-a3b"), &bf16, &checkpoint(&file), BackendKind::Interp)
            .err()
            .unwrap();
    assert!(error.contains("is stored as q8_0") && error.contains("--set T=f32"), "{error}");
    // A file without the head: named, with every other problem.
    let (model, package) = linnet_runtime::lower(&root().join("models/qwen3.6-35b-a3b"), &oracle_options()).unwrap();
    let mut bindings = linnet_runtime::bindings(&package);
    bindings.insert("lm_head.weight".into(), "no.such.tensor".into());
    let problems = linnet_runtime::weights::load(&model, &bindings, &file, &[], NonFinite::Refuse).err().unwrap();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("no tensor `no.such.tensor`"), "{problems:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
