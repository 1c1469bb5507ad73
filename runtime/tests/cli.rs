//! `linnet run` and `linnet generate` as a user runs them.

use linnet_ir::quant::BlockFormat;
use linnet_ir::StoredBlocks;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod common;
use common::{card_generics, root, DENSE_GENERICS, QWEN3_GENERICS};

fn linnet(args: &[&str]) -> Output {
    let oracle = root().join("tests/fixtures/oracle/tiny-qwen3.5-moe");
    let nest = oracle.join("package/nest-f32.toml");
    let weights = oracle.join("weights-f32");
    let mut command = Command::new(env!("CARGO_BIN_EXE_linnet"));
    command.args(&args[..1]).arg(root().join("models/qwen3.6-35b-a3b"));
    command.arg("--nest").arg(nest).arg("--weights").arg(weights).args(&args[1..]);
    command.env("LINNET_STDLIB", root().join("stdlib")).env("LINNET_CACHE_DIR", cache()).output().expect("linnet runs")
}

/// The tests' own artifact cache.
fn cache() -> PathBuf {
    std::env::temp_dir().join("linnet-test-cache")
}

#[test]
fn generate_prints_the_greedy_ids() {
    let prompt = [393, 201, 20, 376, 357];
    let output = linnet(&[
        "generate",
        "--prompt-ids",
        "393,201,20,376,357",
        "--max-tokens",
        "12",
        "--temperature",
        "0",
        "--print-ids",
    ]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let ids: Vec<i64> =
        String::from_utf8(output.stdout).unwrap().split_whitespace().map(|t| t.parse().unwrap()).collect();
    // The same as the library's greedy decoding (which the oracle test
    // holds to the reference's tokens).
    let oracle = root().join("tests/fixtures/oracle/tiny-qwen3.5-moe");
    let options = linnet_frontend::package::LoadOptions {
        nest: Some(oracle.join("package/nest-f32.toml")),
        stdlib: Some(root().join("stdlib")),
        ..Default::default()
    };
    let weights = linnet_runtime::Weights::Checkpoint {
        dir: Some(oracle.join("weights-f32")),
        non_finite: linnet_runtime::weights::NonFinite::Refuse,
    };
    let mut machine = common::load(&root().join("models/qwen3.6-35b-a3b"), &options, &weights).unwrap().machine;
    assert_eq!(ids, linnet_runtime::generate::greedy(&mut machine, &prompt, 12).unwrap());
}

/// An empty prompt and no tokens to generate are refused by name, before
/// anything loads: neither is a silent success.
#[test]
fn generate_refuses_an_empty_prompt_and_no_tokens() {
    for (args, expected) in [
        (&["generate", "--prompt", "", "--max-tokens", "4"][..], "--prompt is empty"),
        (&["generate", "--prompt-ids", "1,2", "--max-tokens", "0"][..], "--max-tokens must be at least 1"),
    ] {
        let output = linnet(args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success() && stderr.contains(expected), "{args:?}: {stderr}");
        assert!(output.stdout.is_empty());
    }
}

#[test]
fn run_writes_npy_and_reports_bad_arguments() {
    let dir = std::env::temp_dir().join(format!("linnet-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tokens = dir.join("tokens.npy");
    let tensor = linnet_exec::tensor::Tensor::from_i64(linnet_ir::Dtype::I32, vec![1, 4], vec![5, 17, 3, 9]);
    std::fs::write(&tokens, linnet_runtime::npy::write(&tensor)).unwrap();
    let logits = dir.join("logits.npy");
    let input = format!("tokens={}", tokens.display());
    let output = linnet(&["run", "--entry", "next_token", "--input", &input, "--output", logits.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let result = linnet_runtime::npy::read(&std::fs::read(&logits).unwrap()).unwrap();
    assert_eq!(result.shape, vec![1, 512]);

    let output = linnet(&["run", "--entry", "decode", "--input", &input, "--arg", "pos=0"]);
    assert_eq!(output.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("entry `decode` has no input `tokens`"), "{stderr}");

    let output = linnet(&["run", "--entry", "prefill", "--input", &input]);
    assert!(String::from_utf8_lossy(&output.stderr).contains("needs `pos`: pass it with --arg pos=..."));

    let output = linnet(&["run", "--entry", "sample", "--input", &input]);
    assert!(String::from_utf8_lossy(&output.stderr).contains("no entry `sample`"));
}

fn linnet_plain(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_linnet"))
        .args(args)
        .current_dir(root())
        .env("LINNET_STDLIB", root().join("stdlib"))
        .env("LINNET_CACHE_DIR", cache())
        .output()
        .expect("linnet runs")
}

/// `--backend cuda` where it cannot run says why, at once: a linnet built
/// without the backend, or a machine without a driver or a device. (Where
/// there is a GPU, the oracle tests run on it.)
#[test]
fn the_cuda_backend_says_plainly_why_it_cannot_run() {
    let output = linnet(&["run", "--entry", "next_token", "--arg", "tokens=1", "--backend", "cuda"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let plain = ["built without the cuda backend", "no CUDA driver", "no CUDA device"];
    if plain.iter().any(|reason| stderr.contains(reason)) {
        assert_eq!(output.status.code(), Some(1), "{stderr}");
    } else {
        // A machine with a GPU: the call goes on to the inputs' check.
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

/// A random checkpoint larger than the disk is refused before anything
/// is written, with the bytes it takes: not an abort on a failed
/// allocation, not a disk filled to the brim.
#[test]
fn init_weights_refuses_a_checkpoint_larger_than_the_disk() {
    let dir = std::env::temp_dir().join(format!("linnet-huge-{}", std::process::id()));
    let output = linnet_plain(&[
        "init-weights",
        "examples/tiny-qwen",
        "--set",
        "Vocab=1099511627776",
        "-o",
        dir.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("bytes and") && stderr.contains("free"), "{stderr}");
    let written = std::fs::read_dir(&dir).map_or(0, |entries| entries.count());
    assert_eq!(written, 0, "nothing is written");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The newcomer's path through the example: random weights, text
/// generation (greedy and sampled, repeatable by seed), a benchmark.
#[test]
fn the_example_from_random_weights_to_text() {
    let dir = std::env::temp_dir().join(format!("linnet-example-{}", std::process::id()));
    let weights = dir.to_str().unwrap();
    let output = linnet_plain(&["init-weights", "examples/tiny-qwen", "--seed", "1", "-o", weights]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(dir.join("model.safetensors.index.json").exists() && dir.join("tokenizer.json").exists());
    let generate = |extra: &[&str]| {
        let mut args =
            vec!["generate", "examples/tiny-qwen", "--weights", weights, "--prompt", "t5 t17 t42", "--max-tokens", "6"];
        args.extend_from_slice(extra);
        let output = linnet_plain(&args);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        String::from_utf8(output.stdout).unwrap()
    };
    let greedy = generate(&[]);
    assert_eq!(greedy.split_whitespace().count(), 6, "{greedy}");
    assert!(greedy.split_whitespace().all(|word| word.starts_with('t')), "{greedy}");
    let sampled = generate(&["--temperature", "0.9", "--top-k", "40", "--seed", "7"]);
    assert_eq!(sampled, generate(&["--temperature", "0.9", "--top-k", "40", "--seed", "7"]));
    let chat = generate(&["--chat"]);
    assert_eq!(chat.split_whitespace().count(), 6, "{chat}");
    let output =
        linnet_plain(&["bench", "examples/tiny-qwen", "--random-weights", "3", "-p", "8", "-n", "4", "-r", "2"]);
    let report = String::from_utf8(output.stdout).unwrap();
    assert!(report.contains("| pp8 |") && report.contains("| tg4 |") && report.contains("GB/s"), "{report}");
    // `-p 0` measures decode alone, from empty states, as `llama-bench -p 0`.
    let output =
        linnet_plain(&["bench", "examples/tiny-qwen", "--random-weights", "3", "-p", "0", "-n", "4", "-r", "1"]);
    let report = String::from_utf8(output.stdout).unwrap();
    assert!(output.status.success() && !report.contains("| pp") && report.contains("| tg4 |"), "{report}");
}

/// `--profile` says where prefill's and decode's time went, and what each
/// place's contractions read of the weights (nothing for other nodes).
#[test]
fn the_profile_gives_each_contraction_its_weight_bandwidth() {
    let output = linnet_plain(&[
        "bench",
        "examples/tiny-qwen",
        "--random-weights",
        "3",
        "-p",
        "8",
        "-n",
        "2",
        "-r",
        "1",
        "--profile",
    ]);
    let report = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(
        output.status.success()
            && report.contains("prefill, by kind of node")
            && report.contains("decode, by kind of node"),
        "{report}"
    );
    let places: Vec<&str> =
        report.lines().filter(|line| line.contains(" nodes") && line.contains(".linnet:")).collect();
    assert!(
        places.iter().any(|line| line.contains("contraction nodes, ") && line.contains("GB/s of weights")),
        "{report}"
    );
    assert!(
        places.iter().filter(|line| !line.contains("contraction nodes")).all(|line| !line.contains("GB/s")),
        "{report}"
    );
}

/// A built artifact runs from the CLI as its package does.
#[test]
fn generate_runs_a_built_artifact() {
    let out = std::env::temp_dir().join(format!("linnet-cli-artifact-{}", std::process::id()));
    let options = linnet_frontend::package::LoadOptions { stdlib: Some(root().join("stdlib")), ..Default::default() };
    let checked = linnet_frontend::driver::check_package(&root().join("examples/tiny-qwen"), &options);
    let key = linnet_build::content_key(&checked.sources);
    let (model, checked) =
        linnet_frontend::driver::lower_checked(checked, Default::default()).unwrap_or_else(|_| panic!("lowers"));
    linnet_build::write(&model, checked.package.as_ref().unwrap(), key, &out).unwrap();
    let args = ["--random-weights", "1", "--prompt-ids", "1,2,3", "--max-tokens", "6", "--print-ids"];
    let from_artifact = linnet_plain(&[&["generate", out.to_str().unwrap()], &args[..]].concat());
    let from_package = linnet_plain(&[&["generate", "examples/tiny-qwen"], &args[..]].concat());
    assert!(from_artifact.status.success(), "{}", String::from_utf8_lossy(&from_artifact.stderr));
    assert_eq!(from_artifact.stdout, from_package.stdout);
    let refused = linnet_plain(&[&["generate", out.to_str().unwrap(), "--set", "Layers=1"], &args[..]].concat());
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("is a built artifact"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    std::fs::remove_dir_all(&out).unwrap();
}

/// `generics` with the element type f32, as `--set` gives them.
fn in_f32<'a>(generics: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    generics.iter().copied().chain([("T", "f32")]).collect()
}

/// `linnet COMMAND package --weights weights --set ...` with `args` after;
/// its standard output.
fn linnet_on(package: &str, weights: &Path, set: &[(&str, &str)], args: &[&str]) -> Vec<u8> {
    linnet_succeeding(package, weights, set, args).stdout
}

/// [`linnet_on`]'s run, checked to succeed: its output.
fn linnet_succeeding(package: &str, weights: &Path, set: &[(&str, &str)], args: &[&str]) -> Output {
    let output = linnet_with(package, weights, set, args);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    output
}

/// `linnet ARGS[0] PACKAGE --weights WEIGHTS --set … ARGS[1..]`, whatever
/// its outcome.
fn linnet_with(package: &str, weights: &Path, set: &[(&str, &str)], args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_linnet"));
    command.args(&args[..1]).arg(root().join(package)).arg("--weights").arg(weights);
    for (name, value) in set {
        command.arg("--set").arg(format!("{name}={value}"));
    }
    command
        .args(&args[1..])
        .env("LINNET_STDLIB", root().join("stdlib"))
        .env("LINNET_CACHE_DIR", cache())
        .output()
        .unwrap()
}

/// Runs `package` on `weights` through the CLI with `set` as `--set`:
/// greedy generation after the third golden sequence of `golden_dir`
/// equals transformers', and `run --entry forward` on it gives every
/// argmax; returns the logits' largest distance over the largest
/// reference logit.
fn distance_from_the_oracle(golden_dir: &Path, package: &str, set: &[(&str, &str)], weights: &Path) -> f32 {
    let sequence = common::golden(golden_dir, "f32").swap_remove(2);
    let listed: Vec<String> = sequence.tokens.iter().map(i64::to_string).collect();
    let args = ["generate", "--prompt-ids", &listed.join(","), "--max-tokens", "12", "--print-ids"];
    let stdout = linnet_on(package, weights, set, &args);
    let ids: Vec<i64> = String::from_utf8(stdout).unwrap().split_whitespace().map(|t| t.parse().unwrap()).collect();
    assert_eq!(ids, sequence.greedy);
    let (ours, reference) = forward_logits(golden_dir, package, set, weights, 2);
    let vocab = reference.len() / listed.len();
    let argmax = |row: &[f32]| (0..row.len()).max_by(|&a, &b| row[a].total_cmp(&row[b])).unwrap();
    for (at, (mine, theirs)) in ours.chunks(vocab).zip(reference.chunks(vocab)).enumerate() {
        assert_eq!(argmax(mine), argmax(theirs), "argmax at position {at}");
    }
    distance(&ours, &reference)
}

/// `run --entry forward` on golden sequence `at`: our logits and
/// transformers', flat.
fn forward_logits(
    golden_dir: &Path,
    package: &str,
    set: &[(&str, &str)],
    weights: &Path,
    at: usize,
) -> (Vec<f32>, Vec<f32>) {
    let sequence = common::golden(golden_dir, "f32").swap_remove(at);
    // Tests run side by side, some on the same golden sequences: each
    // call has its own folder.
    static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = golden_dir.file_name().unwrap().to_string_lossy();
    let dir = std::env::temp_dir().join(format!("linnet-cli-{name}-{}-{call}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let tokens = dir.join("tokens.npy");
    let length = sequence.tokens.len();
    let tensor = linnet_exec::tensor::Tensor::from_i64(linnet_ir::Dtype::I32, vec![1, length], sequence.tokens);
    std::fs::write(&tokens, linnet_runtime::npy::write(&tensor)).unwrap();
    let logits = dir.join("logits.npy");
    let input = format!("tokens={}", tokens.display());
    let args = ["run", "--entry", "forward", "--input", &input, "--output", logits.to_str().unwrap()];
    linnet_on(package, weights, set, &args);
    let ours = linnet_runtime::npy::read(&std::fs::read(&logits).unwrap()).unwrap().as_f32().unwrap().to_vec();
    std::fs::remove_dir_all(&dir).unwrap();
    let reference = sequence.logits.concat();
    assert_eq!(ours.len(), reference.len());
    (ours, reference)
}

/// The largest distance over the largest reference value.
fn distance(ours: &[f32], reference: &[f32]) -> f32 {
    let scale = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
    ours.iter().zip(reference).fold(0f32, |m, (a, b)| m.max((a - b).abs())) / scale
}

fn runs_the_checkpoint_with_set_generics(config: &str, package: &str, generics: &[(&str, &str)], weights: &Path) {
    let golden_dir = root().join("tests/fixtures/oracle").join(config);
    let distance = distance_from_the_oracle(&golden_dir, package, &in_f32(generics), weights);
    assert!(distance <= 1e-4, "max|diff|/max|ref| = {distance:.2e}");
}

#[test]
fn the_dense_package_runs_the_dense_checkpoint_with_set_generics() {
    let weights = root().join("tests/fixtures/oracle/tiny-qwen3.5-dense/weights-f32");
    runs_the_checkpoint_with_set_generics("tiny-qwen3.5-dense", "models/qwen3.8-27b", &DENSE_GENERICS, &weights);
}

/// The card's `[config]` reads the sizes, ε and θ from the checkpoint's
/// config.json: no `--set` but the element type.
#[test]
fn the_qwen3_package_reads_the_qwen3_checkpoint_s_settings_from_its_config() {
    let oracle = root().join("tests/fixtures/oracle/tiny-qwen3-dense");
    let distance = distance_from_the_oracle(&oracle, "models/qwen3-8b", &[], &oracle.join("weights-f32"));
    assert!(distance <= 1e-4, "max|diff|/max|ref| = {distance:.2e}");
}

/// Llama 3 checkpoints (`tests/fixtures/families`, transformers'
/// `LlamaForCausalLM`) with no `--set`: one with Llama 3.1's scaled rotary
/// frequencies, ε 1e-5 and an index over three shards, one with its head
/// tied to the embeddings, plain rotary positions and one unindexed
/// `model.safetensors`.
#[test]
fn the_llama3_package_runs_llama3_checkpoints_with_the_settings_they_state() {
    for name in ["tiny-llama3", "tiny-llama3-tied"] {
        let fixture = root().join("tests/fixtures/families").join(name);
        let distance = distance_from_the_oracle(&fixture, "models/llama3", &[], &fixture.join("weights-f32"));
        assert!(distance <= 1e-4, "{name}: max|diff|/max|ref| = {distance:.2e}");
    }
}

/// A gpt-oss checkpoint (`GptOssForCausalLM`) with no `--set`: sliding
/// and full attention with sinks, YaRN positions, a biased router over
/// eight clamped-SwiGLU experts.
#[test]
fn the_gpt_oss_package_runs_a_gpt_oss_checkpoint_with_the_settings_it_states() {
    let fixture = root().join("tests/fixtures/families/tiny-gpt-oss");
    let distance = distance_from_the_oracle(&fixture, "models/gpt-oss", &[], &fixture.join("weights-f32"));
    assert!(distance <= 1e-4, "max|diff|/max|ref| = {distance:.2e}");
}

/// A Gemma 3 checkpoint (`Gemma3ForCausalLM`) with no `--set`: eight
/// layers, so the pattern of five sliding layers to one global runs past
/// its end; four norms a layer, scaled embeddings, a tied head.
#[test]
fn the_gemma3_package_runs_a_gemma3_checkpoint_with_the_settings_it_states() {
    let fixture = root().join("tests/fixtures/families/tiny-gemma3");
    let distance = distance_from_the_oracle(&fixture, "models/gemma3", &[], &fixture.join("weights-f32"));
    assert!(distance <= 1e-4, "max|diff|/max|ref| = {distance:.2e}");
}

/// A GPT-2 checkpoint (`GPT2LMHeadModel`) with no `--set`: learned
/// positions added to the embeddings (the decoder's hook), layer norms
/// with biases, `Conv1D` projections, a tied head; its greedy tokens come
/// from `DecoderLayer`'s default `decode`, which the package does not
/// write.
#[test]
fn the_gpt2_package_runs_a_gpt2_checkpoint_with_the_settings_it_states() {
    let fixture = root().join("tests/fixtures/families/tiny-gpt2");
    let distance = distance_from_the_oracle(&fixture, "models/gpt2", &[], &fixture.join("weights-f32"));
    assert!(distance <= 1e-4, "max|diff|/max|ref| = {distance:.2e}");
}

/// The oracle checkpoint at `weights` copied to a folder of its own with
/// `change` made to its `config.json`.
fn with_config(weights: &Path, name: &str, change: impl Fn(&mut serde_json::Value)) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("linnet-config-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(weights).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).unwrap()).unwrap();
    change(&mut config);
    std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    dir
}

/// The Qwen3.5 packages read their checkpoint's `config.json` too: the
/// oracle checkpoints run with no `--set` (sizes, type, θ from the file,
/// `Conv` following the sizes); a checkpoint of the seed's architecture
/// whose config says `rope_theta` 10,000 gets θ 10,000, its logits those
/// of `--set Theta=10000` and away from the oracle's; one whose ε is not
/// the 1e-6 the packages compute with is refused, both values named.
#[test]
fn the_qwen35_packages_run_their_checkpoints_with_the_settings_they_state() {
    for (config, package) in
        [("tiny-qwen3.5-moe", "models/qwen3.6-35b-a3b"), ("tiny-qwen3.5-dense", "models/qwen3.8-27b")]
    {
        let golden = root().join("tests/fixtures/oracle").join(config);
        let weights = golden.join("weights-f32");
        let distance = distance_from_the_oracle(&golden, package, &[], &weights);
        assert!(distance <= 1e-4, "{package}: max|diff|/max|ref| = {distance:.2e}");
    }
    let golden = root().join("tests/fixtures/oracle/tiny-qwen3.5-moe");
    let weights = golden.join("weights-f32");
    let package = "models/qwen3.6-35b-a3b";
    let slow = with_config(&weights, "theta", |config| config["rope_parameters"]["rope_theta"] = 10000.0.into());
    let (followed, reference) = forward_logits(&golden, package, &[], &slow, 0);
    let (set, _) = forward_logits(&golden, package, &[("Theta", "10000")], &weights, 0);
    assert_eq!(followed, set, "the file's θ is the one used");
    assert!(distance(&followed, &reference) > 1e-3, "θ 10,000 moves the logits");
    std::fs::remove_dir_all(&slow).unwrap();
    let eps = with_config(&weights, "eps", |config| config["rms_norm_eps"] = 1e-5.into());
    let output = Command::new(env!("CARGO_BIN_EXE_linnet"))
        .args(["generate", root().join(package).to_str().unwrap(), "--weights", eps.to_str().unwrap()])
        .args(["--prompt-ids", "1,2", "--max-tokens", "1"])
        .env("LINNET_STDLIB", root().join("stdlib"))
        .env("LINNET_CACHE_DIR", cache())
        .output()
        .unwrap();
    std::fs::remove_dir_all(&eps).unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success()
            && stderr.contains("`rms_norm_eps` is 0.00001")
            && stderr.contains("requires 0.000001"),
        "{stderr}"
    );
}

/// A copy of the oracle checkpoint `weights` with a multi-token-prediction
/// layer (`mtp.*`, in a file of its own, named by the index): the layer the
/// checkpoint's first full-attention layer (3), `fc` small waves, its norms
/// zero (a scale of one, as they are zero-centered).
fn with_mtp_layer(weights: &Path, name: &str) -> PathBuf {
    let dir = with_config(weights, name, |_| {});
    let index_path = dir.join("model.safetensors.index.json");
    let mut index: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&index_path).unwrap()).unwrap();
    let mut tensors: Vec<(String, Vec<usize>, Vec<u8>)> = Vec::new();
    let shards: std::collections::BTreeSet<String> =
        index["weight_map"].as_object().unwrap().values().map(|file| file.as_str().unwrap().to_string()).collect();
    let prefix = "model.language_model.layers.3.";
    let mut hidden = 0;
    for shard in shards {
        let bytes = std::fs::read(dir.join(&shard)).unwrap();
        let file = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        for (tensor_name, view) in file.tensors() {
            if let Some(rest) = tensor_name.strip_prefix(prefix) {
                tensors.push((format!("mtp.layers.0.{rest}"), view.shape().to_vec(), view.data().to_vec()));
            }
            if tensor_name == "model.language_model.norm.weight" {
                hidden = view.shape()[0];
            }
        }
    }
    let floats = |values: Vec<f32>| values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    let waves = (0..hidden * 2 * hidden).map(|at| 0.05 * (at as f32 * 0.37).sin()).collect();
    tensors.push(("mtp.fc.weight".into(), vec![hidden, 2 * hidden], floats(waves)));
    for norm in ["mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight", "mtp.norm.weight"] {
        tensors.push((norm.into(), vec![hidden], floats(vec![0.0; hidden])));
    }
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(name, shape, data)| {
            (name.clone(), safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), data).unwrap())
        })
        .collect();
    safetensors::serialize_to_file(views, None, &dir.join("mtp.safetensors")).unwrap();
    for (name, _, _) in &tensors {
        index["weight_map"][name] = "mtp.safetensors".into();
    }
    std::fs::write(&index_path, index.to_string()).unwrap();
    dir
}

/// Checkpoints of both Qwen3.5 packages with an MTP layer: greedy tokens
/// with `--speculative mtp` and with `--speculative ngram` are those
/// without, on the interpreter and the CPU, drafts made and checked.
#[test]
fn drafts_of_an_mtp_layer_or_ngrams_give_the_greedy_tokens_of_both_qwen35_packages() {
    for (config, package) in
        [("tiny-qwen3.5-moe", "models/qwen3.6-35b-a3b"), ("tiny-qwen3.5-dense", "models/qwen3.8-27b")]
    {
        let weights = root().join("tests/fixtures/oracle").join(config).join("weights-f32");
        let weights = with_mtp_layer(&weights, config);
        // Every token of the vocabulary once, then a few: whatever token
        // comes, it occurred before, so n-gram lookup drafts too.
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(weights.join("config.json")).unwrap()).unwrap();
        let vocab = config["vocab_size"].as_u64().unwrap();
        let prompt: Vec<String> = (0..vocab).chain([393, 201, 20, 376]).map(|token| token.to_string()).collect();
        let prompt = prompt.join(",");
        for backend in ["interp", "cpu"] {
            let generate = ["generate", "--backend", backend, "--prompt-ids", &prompt];
            let tokens = |drafts: &[&str]| {
                let args = [&generate[..], &["--max-tokens", "16", "--print-ids"], drafts].concat();
                let output = linnet_succeeding(package, &weights, &[], &args);
                (String::from_utf8(output.stdout).unwrap(), String::from_utf8(output.stderr).unwrap())
            };
            let (plain, _) = tokens(&[]);
            assert_eq!(plain.split_whitespace().count(), 16, "{plain}");
            for drafter in ["mtp", "ngram"] {
                let (drafted, report) = tokens(&["--speculative", drafter, "--draft", "3"]);
                assert_eq!(drafted, plain, "{package} on {backend}, {drafter} drafts");
                // Drafts were made and checked: "K of N drafted tokens", N > 0.
                let checked = report.split(" drafted tokens").next().and_then(|head| head.rsplit(' ').next());
                assert!(checked.is_some_and(|count| count.parse::<usize>().is_ok_and(|n| n > 0)), "{report}");
            }
        }
        std::fs::remove_dir_all(&weights).unwrap();
    }
}

/// The settings a checkpoint states are the ones its logits follow: each
/// set otherwise moves them out of the bound (Llama's ε of 1e-5, not the
/// 1e-6 of Qwen's cards; its scaled rotary frequencies; gpt-oss's window,
/// clamp and YaRN factor; Gemma's window, pattern, query scale and global
/// rotary scaling).
#[test]
fn each_family_s_logits_follow_the_settings_its_checkpoint_states() {
    type Settings<'a> = &'a [(&'a str, &'a str)];
    let cases: [(&str, &str, Settings); 3] = [
        ("tiny-llama3", "models/llama3", &[("Eps", "1e-6"), ("RopeFactor", "1")]),
        ("tiny-gpt-oss", "models/gpt-oss", &[("Window", "64"), ("Limit", "7"), ("RopeFactor", "1")]),
        (
            "tiny-gemma3",
            "models/gemma3",
            &[("Window", "64"), ("Pattern", "4"), ("QueryScale", "16"), ("GlobalFactor", "1")],
        ),
    ];
    for (name, package, wrongs) in cases {
        let fixture = root().join("tests/fixtures/families").join(name);
        let weights = fixture.join("weights-f32");
        let (ours, reference) = forward_logits(&fixture, package, &[], &weights, 0);
        assert!(distance(&ours, &reference) <= 1e-4, "{name}");
        for wrong in wrongs {
            let (ours, reference) = forward_logits(&fixture, package, &[*wrong], &weights, 0);
            let distance = distance(&ours, &reference);
            assert!(distance > 1e-4, "{name}: {wrong:?} left the logits {distance:.2e} away");
        }
    }
}

/// The oracle checkpoints as llama.cpp's converter writes them
/// (`tests/fixtures/llama-cpp`), through each package's `gguf.json`.
#[test]
fn each_package_runs_llama_cpp_s_file_of_its_checkpoint() {
    let file = |name: &str| root().join("tests/fixtures/llama-cpp").join(name);
    let moe_file = file("tiny-qwen3.5-moe-f32.gguf");
    let moe = card_generics(&common::oracle().join("package/nest-f32.toml"));
    let moe: Vec<(&str, &str)> = moe.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect();
    runs_the_checkpoint_with_set_generics("tiny-qwen3.5-moe", "models/qwen3.6-35b-a3b", &moe, &moe_file);
    let dense_file = file("tiny-qwen3.5-dense-f32.gguf");
    runs_the_checkpoint_with_set_generics("tiny-qwen3.5-dense", "models/qwen3.8-27b", &DENSE_GENERICS, &dense_file);
    // Split in three by the converter (`--split-max-tensors`): given as
    // the folder, and as one of its files.
    let split = file("tiny-qwen3-dense-f32");
    runs_the_checkpoint_with_set_generics("tiny-qwen3-dense", "models/qwen3-8b", &QWEN3_GENERICS, &split);
    let second = split.join("tiny-qwen3-dense-f32-00002-of-00003.gguf");
    runs_the_checkpoint_with_set_generics("tiny-qwen3-dense", "models/qwen3-8b", &QWEN3_GENERICS, &second);
}

/// The Llama checkpoints as llama.cpp's converter writes them (its query
/// and key rows permuted for its rotary layout, no `output.weight` where
/// the head is tied), read through `gguf.json` with the sizes, ε and θ
/// from the file's metadata. Llama 3.1's rotary scaling is not in the
/// metadata (the converter bakes it into a `rope_freqs` tensor): it is set.
#[test]
fn the_llama3_package_runs_llama_cpp_s_files_of_llama_checkpoints() {
    let file = |name: &str| root().join("tests/fixtures/llama-cpp").join(name);
    let families = root().join("tests/fixtures/families");
    let scaled = [("RopeFactor", "8"), ("LowFreqFactor", "1"), ("HighFreqFactor", "4"), ("OriginalContext", "32")];
    for (name, set) in [("tiny-llama3", &scaled[..]), ("tiny-llama3-tied", &[("RopeFactor", "1")][..])] {
        let gguf = file(&format!("{name}-f32.gguf"));
        let distance = distance_from_the_oracle(&families.join(name), "models/llama3", set, &gguf);
        assert!(distance <= 1e-4, "{name}: max|diff|/max|ref| = {distance:.2e}");
    }
}

/// The converter stores Llama 3.1's rotary scaling as the frequencies'
/// divisors (`rope_freqs.weight`), not as metadata: a card whose scaling
/// gives other divisors, or scales where the file has none, is refused,
/// naming the tensor and the settings, instead of run with the card's
/// scaling.
#[test]
fn a_llama_cpp_file_scaled_otherwise_than_the_card_is_refused() {
    let gguf = root().join("tests/fixtures/llama-cpp/tiny-llama3-f32.gguf");
    let args = ["generate", "--prompt-ids", "1,2", "--max-tokens", "1"];
    let card_context = [("RopeFactor", "8"), ("LowFreqFactor", "1"), ("HighFreqFactor", "4")];
    let unscaled = [("RopeFactor", "1")];
    for (set, named) in [(&card_context[..], "OriginalContext = 8192"), (&unscaled[..], "RopeFactor = 1")] {
        let output = linnet_with("models/llama3", &gguf, set, &args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "ran with the card's scaling: {stderr}");
        assert!(stderr.contains("`rope_freqs.weight` in the file divides rotary pair"), "{stderr}");
        assert!(stderr.contains(named) && stderr.contains("--set"), "{stderr}");
    }
    // A file of an unscaled checkpoint has no divisors: the card's scaling
    // is refused too.
    let unscaled_file = root().join("tests/fixtures/llama-cpp/tiny-llama3-tied-f32.gguf");
    let output = linnet_with("models/llama3", &unscaled_file, &card_context, &args);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success(), "ran with the card's scaling: {stderr}");
    assert!(stderr.contains("the file has no `rope_freqs.weight`"), "{stderr}");
}

/// The Gemma 3 and gpt-oss checkpoints as llama.cpp's converter writes
/// them, read through `gguf.json` with the sizes (the vocabulary's from
/// the token list), ε, θ and windows from the file's metadata. Gemma's:
/// every norm stored plus one, no `output.weight` (the head is the
/// embeddings), the global rotary scaling in the metadata; its query scale
/// is not (llama.cpp derives it from the sizes): it is set. gpt-oss's,
/// experts not in MXFP4: the experts' matrices transposed, the fused gate
/// and up projection and its bias split from their interleaved columns,
/// YaRN in the metadata; its SwiGLU limit is not (llama.cpp fixes it at
/// 7): it is set.
#[test]
fn the_gemma3_and_gpt_oss_packages_run_llama_cpp_s_files_of_their_checkpoints() {
    type Settings<'a> = &'a [(&'a str, &'a str)];
    let cases: [(&str, &str, Settings); 2] = [
        ("tiny-gemma3", "models/gemma3", &[("QueryScale", "24")]),
        ("tiny-gpt-oss", "models/gpt-oss", &[("Limit", "1.5")]),
    ];
    for (name, package, set) in cases {
        let gguf = root().join("tests/fixtures/llama-cpp").join(format!("{name}-f32.gguf"));
        let golden = root().join("tests/fixtures/families").join(name);
        let distance = distance_from_the_oracle(&golden, package, set, &gguf);
        assert!(distance <= 1e-4, "{name}: max|diff|/max|ref| = {distance:.2e}");
    }
}

/// The parameters `weights` keeps in blocks for `models/gpt-oss`, sized
/// by the checkpoint `config` (a folder's `config.json`): what the model
/// is built for before it loads.
fn gpt_oss_formats(weights: &Path, config: &Path) -> std::collections::BTreeMap<String, StoredBlocks> {
    let options = linnet_frontend::package::LoadOptions {
        checkpoint: Some(linnet_frontend::package::Checkpoint::Config(config.join("config.json"))),
        stdlib: Some(root().join("stdlib")),
        ..Default::default()
    };
    let (model, package) = linnet_build::lower(&root().join("models/gpt-oss"), &options).unwrap();
    let naming = linnet_build::naming(&package);
    if linnet_runtime::weights::is_gguf(weights) {
        let files = linnet_runtime::gguf::Files::open(weights).unwrap();
        linnet_runtime::gguf::load::formats(&model, &naming, &files).unwrap()
    } else {
        linnet_runtime::weights::formats(&model, &naming, weights).unwrap()
    }
}

/// Every expert matrix of the four-layer tiny gpt-oss, and nothing else,
/// held in MXFP4 blocks.
fn assert_experts_in_mxfp4(formats: &std::collections::BTreeMap<String, StoredBlocks>, source: &str) {
    let experts: Vec<&String> =
        formats.keys().filter(|path| path.ends_with("_proj") && path.contains(".mlp.")).collect();
    assert_eq!(experts.len(), 8, "{source}: {formats:?}");
    assert!(formats.values().all(|&stored| stored == BlockFormat::Mxfp4.into()), "{source}: {formats:?}");
}

/// gpt-oss's experts in MXFP4 as llama.cpp's files hold them (the f32
/// file's matrices rewritten in MXFP4 by llama.cpp's `gguf` package):
/// the file stores each expert `[out, in]`, the order the model keeps
/// it in, so the experts keep their blocks, gate and up rows interleaved
/// back as whole rows of blocks; the logits are those of the file's
/// values dequantized into a plain file, within the f32 contract, and
/// the greedy tokens the same.
#[test]
fn gpt_oss_experts_in_llama_cpp_s_mxfp4_files_keep_their_blocks() {
    let gguf = root().join("tests/fixtures/llama-cpp/tiny-gpt-oss-mxfp4.gguf");
    let golden = root().join("tests/fixtures/families/tiny-gpt-oss");
    assert_experts_in_mxfp4(&gpt_oss_formats(&gguf, &golden.join("weights-f32")), "llama.cpp's file");
    let plain = common::dequantized_gguf(&gguf);
    let set = [("Limit", "1.5")];
    let (in_blocks, _) = forward_logits(&golden, "models/gpt-oss", &set, &gguf, 2);
    let (as_values, _) = forward_logits(&golden, "models/gpt-oss", &set, &plain, 2);
    let listed: Vec<String> = common::golden(&golden, "f32")[2].tokens.iter().map(i64::to_string).collect();
    let greedy = |weights: &Path| {
        linnet_on(
            "models/gpt-oss",
            weights,
            &set,
            &["generate", "--prompt-ids", &listed.join(","), "--max-tokens", "12", "--print-ids"],
        )
    };
    assert_eq!(greedy(&gguf), greedy(&plain));
    std::fs::remove_file(&plain).unwrap();
    let apart = distance(&in_blocks, &as_values);
    assert!(apart <= 1e-4, "max|diff|/max|ref| = {apart:.2e}");
}

/// A gpt-oss checkpoint with its experts in MXFP4 as OpenAI's released
/// checkpoints store them (`_blocks` and `_scales`, two codes a byte),
/// with no `--set`: the experts are read in GGML's blocks, never widened,
/// and the logits and greedy tokens are transformers' reading the same
/// checkpoint (`tests/fixtures/families/tiny-gpt-oss-mxfp4`).
#[test]
fn the_gpt_oss_package_runs_openai_s_mxfp4_checkpoints() {
    let fixture = root().join("tests/fixtures/families/tiny-gpt-oss-mxfp4");
    let weights = fixture.join("weights-mxfp4");
    assert_experts_in_mxfp4(&gpt_oss_formats(&weights, &weights), "OpenAI's layout");
    let distance = distance_from_the_oracle(&fixture, "models/gpt-oss", &[], &weights);
    assert!(distance <= 1e-4, "max|diff|/max|ref| = {distance:.2e}");
}

/// `linnet quantize` on the oracle checkpoint: every tensor under its
/// checkpoint name; Q8_0 where rows are whole blocks, each value back
/// within half a step of its block's scale (and the scale's rounding); the rest (norms, decays,
/// convolution taps) byte for byte as stored. A format it does not write
/// is refused by name.
#[test]
fn quantize_writes_a_gguf_the_checkpoint_reads_back_from() {
    let out = std::env::temp_dir().join(format!("linnet-quantize-{}.gguf", std::process::id()));
    let output = linnet(&["quantize", "--type", "q8_0", "-o", out.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(report.contains("q8_0:") && report.contains("smaller"), "{report}");
    let (file, gguf) = linnet_runtime::gguf::read_file(&out).unwrap();
    let dir = root().join("tests/fixtures/oracle/tiny-qwen3.5-moe/weights-f32");
    let mut checkpoint = std::collections::HashMap::new();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            checkpoint.insert(path.clone(), std::fs::read(&path).unwrap());
        }
    }
    let mut quantized = 0;
    for tensor in &gguf.tensors {
        let stored = checkpoint
            .values()
            .find_map(|bytes| {
                let tensors = safetensors::SafeTensors::deserialize(bytes).unwrap();
                tensors.tensor(&tensor.name).ok().map(|view| (view.shape().to_vec(), view.data().to_vec()))
            })
            .unwrap_or_else(|| panic!("`{}` is not a checkpoint tensor", tensor.name));
        assert_eq!(tensor.shape(), stored.0.iter().map(|d| *d as u64).collect::<Vec<_>>(), "{}", tensor.name);
        let bytes = gguf.tensor_bytes(&file, tensor);
        match tensor.storage {
            linnet_runtime::gguf::Storage::Blocks(format) => {
                // The routers stay as stored, as llama.cpp keeps them.
                assert!(!tensor.name.ends_with("mlp.gate.weight"), "{}", tensor.name);
                assert!(!tensor.name.ends_with("shared_expert_gate.weight"), "{}", tensor.name);
                quantized += 1;
                let original: Vec<f32> =
                    stored.1.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
                let mut back = vec![0f32; original.len()];
                linnet_ir::quant::dequantize(format, bytes, &mut back).unwrap();
                for (original, back) in original.chunks(32).zip(back.chunks(32)) {
                    // Half a step, and the scale's own rounding to f16
                    // (2^-11 of it) over up to 127 steps.
                    let step = original.iter().fold(0f32, |m, v| m.max(v.abs())) / 127.0;
                    for (a, b) in original.iter().zip(back) {
                        let bound = step * (0.5 + 127.0 / 2048.0);
                        assert!((a - b).abs() <= bound, "{}: {a} came back as {b}", tensor.name);
                    }
                }
            }
            linnet_runtime::gguf::Storage::Plain(_) => assert_eq!(bytes, stored.1, "{}", tensor.name),
        }
    }
    // Every matrix but the 8 layers' two routers.
    assert_eq!(quantized, 80, "tensors quantized");
    assert!(!PathBuf::from(format!("{}.partial", out.display())).exists(), "written aside, then renamed");
    std::fs::remove_file(&out).unwrap();

    let refused = linnet(&["quantize", "--type", "q3_k_l", "-o", out.to_str().unwrap()]);
    assert!(!refused.status.success() && !out.exists());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("`q3_k_l` is not a format Linnet writes: q4_0, "), "{stderr}");
    assert!(stderr.contains("mxfp4_moe, q8_0, q3_k, q4_k, q5_k, q6_k, mxfp4"), "{stderr}");
}

/// A checkpoint whose config.json contradicts the card (a tied head, a
/// layer of another kind than the stack builds): each error shows the
/// card's line and the file's value, and nothing runs.
#[test]
fn a_checkpoint_that_contradicts_the_card_is_refused_naming_both() {
    let oracle = root().join("tests/fixtures/oracle/tiny-qwen3-dense/weights-f32");
    let dir = std::env::temp_dir().join(format!("linnet-cli-contradiction-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(&oracle).unwrap() {
        let path = entry.unwrap().path();
        std::fs::copy(&path, dir.join(path.file_name().unwrap())).unwrap();
    }
    let config = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let tied = config.replace("\"tie_word_embeddings\": false", "\"tie_word_embeddings\": true");
    let sliding = tied.replacen("\"full_attention\"", "\"sliding_attention\"", 1);
    assert!(tied != config && sliding != tied);
    std::fs::write(dir.join("config.json"), sliding).unwrap();
    let output = Command::new(env!("CARGO_BIN_EXE_linnet"))
        .args(["generate", root().join("models/qwen3-8b").to_str().unwrap(), "--prompt-ids", "1,2", "--print-ids"])
        .arg("--weights")
        .arg(&dir)
        .env("LINNET_STDLIB", root().join("stdlib"))
        .env("LINNET_CACHE_DIR", cache())
        .output()
        .unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(stderr.contains("[checkpoint-config]"), "{stderr}");
    assert!(stderr.contains("says `tie_word_embeddings` is true, where the card requires false"), "{stderr}");
    assert!(
        stderr.contains("where the card builds layer 0 as \"full_attention\": \"full_attention\" where the layer's number plus one is a multiple of 1"),
        "{stderr}"
    );
    assert!(stderr.contains("nest.toml") && stderr.contains("config.json"), "{stderr}");
}

/// gpt-oss's and Gemma 3's sliding layers keep rings of `Window`
/// positions: not written at the positions an entry is given (a prefix
/// cache keeps them whole, a refused draft puts them back, as recurrent
/// states), and their bytes the window's; their full layers' caches, and
/// every other package's, are written at the positions given.
#[test]
fn sliding_layers_keep_rings_of_their_window() {
    let options = linnet_frontend::package::LoadOptions { stdlib: Some(root().join("stdlib")), ..Default::default() };
    for package in ["models/gpt-oss", "models/llama3", "models/qwen3-8b", "models/qwen3.6-35b-a3b", "models/gemma3"] {
        let (model, _) = linnet_build::lower(&root().join(package), &options).unwrap();
        let positional = linnet_exec::rows::positional_states(&model);
        let caches: Vec<_> =
            model.states.iter().zip(positional).filter(|(state, _)| state.path.contains("cache_")).collect();
        assert!(!caches.is_empty(), "{package} has no attention caches");
        for (state, positional) in caches {
            let window = match package {
                "models/gpt-oss" if state.path.contains(".first.") => Some(128),
                "models/gemma3" if !state.path.contains(".global.") => Some(512),
                _ => None,
            };
            assert_eq!(positional, window.is_none(), "{package}: {} {:?}", state.path, state.shape);
            if let Some(window) = window {
                // The card's window, not its context.
                assert_eq!(state.shape[2], window, "{}", state.path);
            }
        }
    }
}
