//! GGUF files as llama.cpp makes them: the f32 oracle checkpoint converted
//! by llama.cpp's own `convert_hf_to_gguf.py` (renamed tensors, the
//! experts' gate and up split, norms plus one, `-exp(A_log)`, value heads
//! tiled), read through the package's `gguf.json`, gives transformers'
//! logits and greedy tokens on the interpreter and the CPU; its Q8_0,
//! Q4_0, Q5_1 and MXFP4 rewrites (llama.cpp's `gguf` package) keep their
//! blocks where whole blocks move and run bit for bit as their values
//! dequantized into a plain file, on the CPU within the f32 contract; a card whose generics disagree with the file's metadata, and a
//! package for another architecture, are refused with both values named.
//! The files and how they were made: `tests/fixtures/llama-cpp`.

use linnet_exec::tensor::Tensor;
use linnet_frontend::package::LoadOptions;
use linnet_ir::quant::BlockFormat;
use linnet_ir::tiled::Tiled;
use linnet_ir::{Dtype, StoredBlocks};
use linnet_runtime::generate::greedy;
use linnet_runtime::gguf::Files;
use linnet_runtime::weights::NonFinite;
use linnet_runtime::{BackendKind, Weights};
use std::path::PathBuf;

mod common;
use common::{oracle, oracle_options, root, QWEN3_GENERICS};

const MOE: &str = "models/qwen3.6-35b-a3b";

fn fixture(name: &str) -> PathBuf {
    root().join("tests/fixtures/llama-cpp").join(name)
}

fn file(name: &str) -> Weights {
    Weights::Checkpoint { dir: Some(fixture(name)), non_finite: NonFinite::Refuse }
}

fn distance(ours: &[f32], reference: &[f32]) -> f32 {
    let scale = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
    ours.iter().zip(reference).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale
}

/// Each golden sequence's `forward` logits, flattened, and the greedy
/// tokens after sequence 0.
fn run(weights: &Weights, backend: BackendKind) -> (Vec<Vec<f32>>, Vec<i64>) {
    let mut machine = common::load_on(&root().join(MOE), &oracle_options(), weights, backend)
        .unwrap_or_else(|e| panic!("{e}"))
        .machine;
    let golden = common::golden(&oracle(), "f32");
    let logits = golden
        .iter()
        .map(|seq| {
            let tokens = Tensor::from_i64(Dtype::I32, vec![1, seq.tokens.len()], seq.tokens.clone());
            let out = machine.call("forward", vec![tokens]).unwrap().swap_remove(0);
            out.widened().as_f32().unwrap().to_vec()
        })
        .collect();
    machine.reset().unwrap();
    let tokens = greedy(&mut machine, &golden[0].tokens, golden[0].greedy.len()).unwrap();
    (logits, tokens)
}

#[test]
fn llama_cpp_f32_file_gives_the_oracle_logits() {
    let golden = common::golden(&oracle(), "f32");
    for backend in [BackendKind::Interp, BackendKind::Cpu] {
        let (logits, tokens) = run(&file("tiny-qwen3.5-moe-f32.gguf"), backend);
        for (n, (ours, seq)) in logits.iter().zip(&golden).enumerate() {
            let reference: Vec<f32> = seq.logits.concat();
            let distance = distance(ours, &reference);
            assert!(distance <= 1e-4, "{backend:?}: sequence {n} is {distance:.2e} of the scale from transformers");
        }
        assert_eq!(tokens, golden[0].greedy, "{backend:?}: greedy tokens");
    }
}

#[test]
fn llama_cpp_quantized_files_keep_whole_blocks_and_run() {
    let (model, package) = linnet_build::lower(&root().join(MOE), &oracle_options()).unwrap();
    for format in [BlockFormat::Q8_0, BlockFormat::Q4_0, BlockFormat::Q5_1, BlockFormat::Mxfp4] {
        let name = format!("tiny-qwen3.5-moe-{}.gguf", format.name());
        let files = Files::open(&fixture(&name)).unwrap();
        let formats = linnet_runtime::gguf::load::formats(&model, &linnet_build::naming(&package), &files).unwrap();
        let at = |path: &str| formats.get(&format!("groups.0.linear.0.{path}")).copied();
        // Concatenated rows (gate and up) and heads moved as whole rows
        // keep their blocks; heads tiled within rows of 32-value blocks by
        // 16 values keep them too, the product summing the columns in the
        // file's order; changed values (norms) are plain.
        let blocks = Some(StoredBlocks::from(format));
        assert_eq!(at("mlp.gate_up_proj"), blocks, "{name}");
        assert_eq!(at("linear_attn.in_proj_qkv.weight"), blocks, "{name}");
        assert_eq!(at("linear_attn.in_proj_b.weight"), blocks, "{name}");
        let tiled = Some(StoredBlocks { format, tiled: Some(Tiled { groups: 2, per_group: 2, head: 16 }) });
        assert_eq!(at("linear_attn.out_proj.weight"), tiled, "{name}");
        assert_eq!(at("input_layernorm.weight"), None, "{name}");
        // The reference: the same file with every block dequantized, read
        // as plain values (each change undone on values, not blocks).
        let plain = common::dequantized_gguf(&fixture(&name));
        let weights = Weights::Checkpoint { dir: Some(plain.clone()), non_finite: NonFinite::Refuse };
        let (expected, expected_tokens) = run(&weights, BackendKind::Interp);
        std::fs::remove_file(&plain).unwrap();
        let (reference, reference_tokens) = run(&file(&name), BackendKind::Interp);
        assert!(reference.concat().iter().zip(expected.concat()).all(|(a, b)| a.to_bits() == b.to_bits()), "{name}");
        assert_eq!(reference_tokens, expected_tokens, "{name}");
        let (on_cpu, cpu_tokens) = run(&file(&name), BackendKind::Cpu);
        for (n, (cpu, interp)) in on_cpu.iter().zip(&reference).enumerate() {
            let apart = distance(cpu, interp);
            assert!(apart <= 1e-4, "{name}: sequence {n}: the cpu is {apart:.2e} of the scale from the interpreter");
        }
        assert_eq!(cpu_tokens, reference_tokens, "{name}");
    }
}

/// The GPU kernels run on the host by MLIR (`--features nvptx`) read
/// llama.cpp's quantized files as the CPU does (Q4_0's): their blocks in place, the
/// output projection's columns in the file's tiled order, gathered for
/// its product; within the f32 tolerance of the interpreter, its greedy
/// tokens.
#[cfg(feature = "nvptx")]
#[test]
fn gpu_kernels_on_the_host_run_llama_cpp_quantized_files() {
    for name in ["tiny-qwen3.5-moe-q4_0.gguf"] {
        let (reference, reference_tokens) = run(&file(name), BackendKind::Interp);
        let (on_gpu, gpu_tokens) = run(&file(name), BackendKind::MlirHost);
        for (n, (gpu, interp)) in on_gpu.iter().zip(&reference).enumerate() {
            let apart = distance(gpu, interp);
            assert!(apart <= 1e-4, "{name}: sequence {n}: the GPU kernels are {apart:.2e} of the scale away");
        }
        assert_eq!(gpu_tokens, reference_tokens, "{name}");
    }
}

#[test]
fn metadata_and_architecture_must_agree_with_the_card() {
    let options = LoadOptions { overrides: vec![("TopK".into(), "1".into())], ..oracle_options() };
    let error = common::load(&root().join(MOE), &options, &file("tiny-qwen3.5-moe-f32.gguf")).err().unwrap();
    assert!(
        error.contains("metadata `qwen35moe.expert_used_count` is 2 in the file, and the model card makes it 1"),
        "{error}"
    );
    let options = LoadOptions {
        overrides: QWEN3_GENERICS.map(|(name, value)| (name.into(), value.into())).to_vec(),
        stdlib: Some(root().join("stdlib")),
        ..LoadOptions::default()
    };
    let error =
        common::load(&root().join("models/qwen3-8b"), &options, &file("tiny-qwen3.5-moe-f32.gguf")).err().unwrap();
    assert!(error.contains("for the `qwen35moe` architecture; this package reads `qwen3` files"), "{error}");
}
