//! Quantized weights end to end: the oracle checkpoint quantized by
//! `linnet quantize`'s library, loaded from the GGUF file, is the model of
//! its dequantized values, read in its blocks. On the reference
//! interpreter (which dequantizes them at load) its logits are bit for bit those of a safetensors
//! checkpoint holding the dequantized values; the CPU backend, whose
//! kernels read the blocks in place, meets them within the f32 contract
//! on every entry path, greedy tokens equal, and so do the GPU kernels
//! run on the host (with `nvptx`), which decode them in registers; the quantized model stays
//! near the unquantized one. The build for the file stores its
//! parameters in their formats and plans their real bytes; a file missing
//! a tensor names it, and a tensor in a format the model was not built
//! for is refused by name. Written weights files leave the page cache.

use linnet_exec::tensor::Tensor;
use linnet_frontend::package::LoadOptions;
use linnet_ir::quant::{dequantize, BlockFormat};
use linnet_ir::{Dtype, StoredBlocks};
use linnet_runtime::generate::greedy;
use linnet_runtime::gguf::Files;
use linnet_runtime::quantize::{from_params, Mix, Recipe};
use linnet_runtime::weights::NonFinite;
use linnet_runtime::{BackendKind, Weights};
use std::path::{Path, PathBuf};

mod common;
use common::{oracle, oracle_options, root};

/// The seed's package, and the plain Qwen3 decoder's.
const MOE: &str = "models/qwen3.6-35b-a3b";
const DENSE: &str = "models/qwen3-8b";

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("linnet-quantized-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn checkpoint(dir: &Path) -> Weights {
    Weights::Checkpoint { dir: Some(dir.to_path_buf()), non_finite: NonFinite::Refuse }
}

fn tokens(rows: &[&[i64]]) -> Tensor {
    let width = rows[0].len();
    Tensor::from_i64(Dtype::I32, vec![rows.len(), width], rows.iter().flat_map(|r| r.iter().copied()).collect())
}

fn position(at: usize) -> Tensor {
    Tensor::from_i64(Dtype::I32, Vec::new(), vec![at as i64])
}

/// What every entry path gives on the golden sequences, each flattened:
/// `forward` of sequences 0 and 1; `prefill` of their first six tokens,
/// then `decode` of the rest; `prefill_slots` of a prefix of sequence 2
/// then `decode_rows`; and the greedy tokens after sequences 0 and 1.
fn entry_paths(
    package: &str,
    weights: &Weights,
    backend: BackendKind,
    options: &LoadOptions,
) -> (Vec<Vec<f32>>, Vec<Vec<i64>>) {
    let mut machine =
        common::load_on(&root().join(package), options, weights, backend).unwrap_or_else(|e| panic!("{e}")).machine;
    let golden = common::golden(&oracle(), "f32");
    let (a, b) = (&golden[0].tokens, &golden[1].tokens);
    let mut call = |entry: &str, inputs: Vec<Tensor>| {
        let out = machine.call(entry, inputs).unwrap_or_else(|e| panic!("{entry}: {e}")).swap_remove(0);
        out.widened().as_f32().unwrap().to_vec()
    };
    let mut outputs = vec![call("forward", vec![tokens(&[a, b])])];
    outputs.push(call("prefill", vec![tokens(&[&a[..6], &b[..6]]), position(0)]));
    for at in 6..a.len() {
        outputs.push(call("decode", vec![tokens(&[&a[at..=at], &b[at..=at]]), position(at)]));
    }
    let long = &golden[2].tokens;
    let slots = Tensor::from_i64(Dtype::I32, vec![1], vec![1]);
    let starts = Tensor::from_i64(Dtype::I32, vec![1], vec![0]);
    let lengths = Tensor::from_i64(Dtype::I32, vec![1], vec![5]);
    outputs.push(call("prefill_slots", vec![tokens(&[&long[..5]]), slots, starts, lengths]));
    for (at, token) in long.iter().enumerate().skip(5) {
        let steps = Tensor::from_i64(Dtype::I32, vec![2], vec![0, at as i64]);
        outputs.push(call("decode_rows", vec![tokens(&[&[0], &[*token]]), steps]));
    }
    machine.reset().unwrap();
    let greedy = golden[..2].iter().map(|seq| greedy(&mut machine, &seq.tokens, seq.greedy.len()).unwrap()).collect();
    (outputs, greedy)
}

/// `forward` on the golden sequences 0 and 1, flattened, on `backend`.
fn logits(weights: &Weights, options: &LoadOptions, backend: BackendKind) -> Vec<f32> {
    let mut machine = common::load_on(&root().join("models/qwen3.6-35b-a3b"), options, weights, backend)
        .unwrap_or_else(|e| panic!("{e}"))
        .machine;
    let golden = common::golden(&oracle(), "f32");
    let out = machine.call("forward", vec![tokens(&[&golden[0].tokens, &golden[1].tokens])]).unwrap().swap_remove(0);
    out.widened().as_f32().unwrap().to_vec()
}

fn distance(ours: &[f32], reference: &[f32]) -> f32 {
    let scale = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
    ours.iter().zip(reference).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale
}

/// The seed at widths the K-quants' 256-value blocks divide, f32: the
/// oracle's rows (64 values) are whole blocks of Q8_0 only.
fn wide_options() -> LoadOptions {
    let wide = [
        ("H", "256"),
        ("Heads", "2"),
        ("KvHeads", "1"),
        ("HeadDim", "128"),
        ("KeyHeads", "2"),
        ("ValueHeads", "2"),
        ("KeyDim", "128"),
        ("ValueDim", "128"),
        ("Conv", "768"),
        ("Experts", "4"),
        ("ExpertInner", "256"),
        ("SharedInner", "256"),
        ("Groups", "1"),
    ];
    LoadOptions { overrides: wide.map(|(name, value)| (name.into(), value.into())).to_vec(), ..oracle_options() }
}

/// The model `options` instantiate, with the oracle's f32 weights (at the
/// oracle's widths) or seeded random ones, quantized to `recipe` into
/// `dir/model.gguf`.
fn quantized(package: &str, recipe: Recipe, options: &LoadOptions, dir: &Path) -> PathBuf {
    let (model, package) = linnet_build::lower(&root().join(package), options).unwrap();
    let bindings = linnet_build::bindings(&package);
    let params = if options.overrides.is_empty() && options.nest.is_some() {
        linnet_runtime::weights::load(
            &model,
            &linnet_build::naming(&package),
            &oracle().join("weights-f32"),
            NonFinite::Refuse,
        )
        .unwrap()
    } else {
        linnet_runtime::random::params(&model, 7).unwrap()
    };
    let file = dir.join("model.gguf");
    let summary = from_params(&model, &bindings, &params, recipe, &file).unwrap();
    assert!(summary.bytes_after() < summary.bytes_before);
    file
}

/// A safetensors checkpoint in `dir/dequantized` of the values the f32
/// model's GGUF `file` means.
fn dequantized(file: &Path, dir: &Path) -> PathBuf {
    let (bytes, gguf) = linnet_runtime::gguf::read_file(file).unwrap();
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
    dir.join("dequantized")
}

/// A file of `recipe` against its dequantized values, and `backend`
/// reading its blocks (Q4_K_M holds both K-quants).
fn runs_as_its_dequantized_values(recipe: Recipe, options: &LoadOptions, name: &str, backend: BackendKind) {
    let dir = scratch(name);
    let file = quantized(MOE, recipe, options, &dir);
    let from_file = logits(&checkpoint(&file), options, BackendKind::Interp);
    let dequantized = logits(&checkpoint(&dequantized(&file, &dir)), options, BackendKind::Interp);
    assert!(from_file.iter().zip(&dequantized).all(|(a, b)| a.to_bits() == b.to_bits()), "the interpreter differs");
    let (reference, reference_greedy) = entry_paths(MOE, &checkpoint(&file), BackendKind::Interp, options);
    let (ours, greedy) = entry_paths(MOE, &checkpoint(&file), backend, options);
    for (at, (ours, reference)) in ours.iter().zip(&reference).enumerate() {
        let distance = distance(ours, reference);
        assert!(
            distance <= 1e-4,
            "{name}: {backend:?} call {at} is {distance:.2e} of the scale away from the interpreter"
        );
    }
    assert_eq!(greedy, reference_greedy, "{name}: greedy tokens on {backend:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_q8_0_file_runs_as_its_dequantized_values() {
    runs_as_its_dequantized_values(Recipe::Uniform(BlockFormat::Q8_0), &oracle_options(), "q8_0", BackendKind::Cpu);
}

#[test]
fn a_q4_k_m_file_runs_as_its_dequantized_values() {
    runs_as_its_dequantized_values(Recipe::Mix(Mix::Q4KM), &wide_options(), "q4_k_m", BackendKind::Cpu);
}

/// llama-quantize's other mixes, which hold every other format between
/// them (Q2_K and Q3_K_M the 2- and 3-bit K-quants with Q4_K, Q5_K and
/// Q6_K; IQ4_XS with Q5_K; the 32-value formats, at the oracle's widths;
/// MXFP4 experts with Q8_0): the CPU backend's `forward` is the
/// interpreter's on the file within the f32 contract. (The interpreter
/// reads the file as the tests above hold it to, and every entry path
/// multiplies through the same decoders, which the kernels' tests hold to
/// the definition on every row count.)
#[test]
fn every_mix_runs_forward_as_the_interpreter_reads_it() {
    let (wide, narrow) = (wide_options(), oracle_options());
    let mixes = [
        (Mix::Q2K, &wide),
        (Mix::Q3KM, &wide),
        (Mix::Iq4Xs, &wide),
        (Mix::Mxfp4Moe, &narrow),
        (Mix::Legacy(BlockFormat::Q4_0), &narrow),
        (Mix::Legacy(BlockFormat::Q4_1), &narrow),
        (Mix::Legacy(BlockFormat::Q5_0), &narrow),
        (Mix::Legacy(BlockFormat::Q5_1), &narrow),
        (Mix::Legacy(BlockFormat::Iq4Nl), &narrow),
    ];
    for (mix, options) in mixes {
        let dir = scratch(mix.name());
        let file = quantized(MOE, Recipe::Mix(mix), options, &dir);
        let reference = logits(&checkpoint(&file), options, BackendKind::Interp);
        let compiled = logits(&checkpoint(&file), options, BackendKind::Cpu);
        let distance = distance(&compiled, &reference);
        assert!(distance <= 1e-4, "{}: the CPU backend is {distance:.2e} of the scale away", mix.name());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// The GPU kernels, run on the host, decoding the blocks in registers.
#[cfg(feature = "nvptx")]
#[test]
fn gpu_kernels_run_a_q8_0_file_as_its_dequantized_values() {
    let (q8_0, options) = (Recipe::Uniform(BlockFormat::Q8_0), oracle_options());
    runs_as_its_dequantized_values(q8_0, &options, "q8_0", BackendKind::MlirHost);
}

#[cfg(feature = "nvptx")]
#[test]
fn gpu_kernels_run_a_q4_k_m_file_as_its_dequantized_values() {
    runs_as_its_dequantized_values(Recipe::Mix(Mix::Q4KM), &wide_options(), "q4_k_m", BackendKind::MlirHost);
}

/// The oracle's model quantized stays near the unquantized one (the
/// quantizer's own accuracy is `linnet_ir::quant`'s tests').
#[test]
fn the_quantized_oracle_stays_near_it() {
    let dir = scratch("near");
    let file = quantized(MOE, Recipe::Uniform(BlockFormat::Q8_0), &oracle_options(), &dir);
    let from_file = logits(&checkpoint(&file), &oracle_options(), BackendKind::Interp);
    let unquantized = logits(&checkpoint(&oracle().join("weights-f32")), &oracle_options(), BackendKind::Interp);
    let moved = distance(&from_file, &unquantized);
    assert!(moved > 0.0 && moved < 0.6, "q8_0 moved the logits by {moved:.2e} of their scale");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The files `linnet quantize` and `init-weights` write are on the disk
/// and out of the page cache (`init::finish_weights_file`), so that a
/// first load reads them into the large pages a decode step streams its
/// weights from fastest, not the small ones writing them left. In the
/// target folder, which is on a disk (a temporary folder may be in
/// memory, where pages are the file).
#[cfg(target_os = "linux")]
#[test]
fn written_weights_files_leave_the_page_cache() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("linnet-quantized-{}-cache", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let gguf = quantized(MOE, Recipe::Uniform(BlockFormat::Q8_0), &oracle_options(), &dir);
    let (model, package) = linnet_build::lower(&root().join(MOE), &oracle_options()).unwrap();
    let checkpoint = dir.join("checkpoint");
    linnet_runtime::init::write(&model, &linnet_build::bindings(&package), 7, 2, &checkpoint).unwrap();
    let shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"].map(|s| checkpoint.join(s));
    for file in [gguf].iter().chain(&shards) {
        // SAFETY: a read-only map of a file this test wrote, only inspected.
        let map = unsafe { memmap2::Mmap::map(&std::fs::File::open(file).unwrap()) }.unwrap();
        // SAFETY: `sysconf` reads a constant of the system.
        let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap();
        let mut resident = vec![0u8; map.len().div_ceil(page)];
        // SAFETY: the map is `map.len()` bytes from a page boundary, and
        // `resident` has a byte for each of its pages.
        let status = unsafe { libc::mincore(map.as_ptr() as *mut libc::c_void, map.len(), resident.as_mut_ptr()) };
        assert_eq!(status, 0, "mincore: {}", std::io::Error::last_os_error());
        let cached = resident.iter().filter(|byte| **byte & 1 == 1).count();
        let name = file.display();
        assert_eq!(cached, 0, "{cached} of {name}'s {} pages are still in the page cache", resident.len());
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A bf16 instantiation reads the same blocks: its parameters mean the
/// dequantized values too. They are not bf16 values, so products are no
/// longer exact in f32 and the CPU's f32 sums round apart from the
/// interpreter's more often than over bf16 weights; the contract's bf16
/// tolerance holds them. A dense model (a router's near tie would send a
/// row to other experts on either side of a rounding), at widths the
/// K-quants divide.
#[test]
fn a_bf16_model_reads_the_same_blocks() {
    a_bf16_model_reads_the_same_blocks_on(BackendKind::Cpu, "bf16");
}

#[cfg(feature = "nvptx")]
#[test]
fn gpu_kernels_of_a_bf16_model_read_the_same_blocks() {
    a_bf16_model_reads_the_same_blocks_on(BackendKind::MlirHost, "bf16-gpu");
}

fn a_bf16_model_reads_the_same_blocks_on(backend: BackendKind, name: &str) {
    let dir = scratch(name);
    let wide = [
        ("Vocab", "512"),
        ("H", "256"),
        ("Layers", "2"),
        ("Heads", "2"),
        ("KvHeads", "1"),
        ("HeadDim", "128"),
        ("Inner", "256"),
        ("Batch", "2"),
        ("MaxSeq", "64"),
        ("T", "bf16"),
    ];
    let bf16 = LoadOptions {
        overrides: wide.map(|(name, value)| (name.into(), value.into())).to_vec(),
        stdlib: Some(root().join("stdlib")),
        ..LoadOptions::default()
    };
    let file = quantized(DENSE, Recipe::Mix(Mix::Q4KM), &bf16, &dir);
    let (reference, _) = entry_paths(DENSE, &checkpoint(&file), BackendKind::Interp, &bf16);
    let (ours, _) = entry_paths(DENSE, &checkpoint(&file), backend, &bf16);
    for (at, (ours, reference)) in ours.iter().zip(&reference).enumerate() {
        let distance = distance(ours, reference);
        assert!(
            distance <= 3e-2,
            "bf16: {backend:?} call {at} is {distance:.2e} of the scale away from the interpreter"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The build for a quantized file stores its parameters in their formats
/// and plans their real bytes; a missing tensor is named, and a tensor in
/// a format the model was not built for is refused by name.
#[test]
fn the_build_knows_the_formats_and_bad_files_are_named() {
    let dir = scratch("formats");
    let file = quantized(MOE, Recipe::Uniform(BlockFormat::Q8_0), &oracle_options(), &dir);
    let (model, package) = linnet_build::lower(&root().join("models/qwen3.6-35b-a3b"), &oracle_options()).unwrap();
    let naming = linnet_build::naming(&package);
    let formats = linnet_runtime::gguf::load::formats(&model, &naming, &Files::open(&file).unwrap()).unwrap();
    // Norms and 1-D tensors stay plain; every matrix is q8_0.
    let q8_0 = StoredBlocks::from(BlockFormat::Q8_0);
    assert!(formats.values().all(|f| *f == q8_0) && formats.contains_key("lm_head.weight"), "{formats:?}");
    assert!(!formats.keys().any(|path| path.ends_with("norm.weight")), "{formats:?}");
    let stored = model.clone().stored_as(&formats).unwrap();
    let quantized_bytes: usize = stored.params.iter().filter(|p| p.storage.is_some()).map(|p| p.bytes()).sum();
    let plain_bytes: usize = model.params.iter().filter(|p| formats.contains_key(&p.path)).map(|p| p.bytes()).sum();
    assert_eq!(quantized_bytes * 128, plain_bytes * 34, "q8_0 is 34 bytes per 32 f32 values (128 bytes)");
    // The plain model, given the quantized file: refused by name.
    let problems = linnet_runtime::weights::load(&model, &naming, &file, NonFinite::Refuse).err().unwrap();
    assert!(
        problems[0].contains("the file gives it as q8_0, and the model was built for plain elements"),
        "{problems:?}"
    );
    assert_eq!(problems.len(), formats.len(), "{problems:?}");
    // A file without the head: named, alone.
    let mut naming = naming.clone();
    naming.bindings.insert("lm_head.weight".into(), "no.such.tensor".into());
    let problems = linnet_runtime::weights::load(&stored, &naming, &file, NonFinite::Refuse).err().unwrap();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("no tensor `no.such.tensor`"), "{problems:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
