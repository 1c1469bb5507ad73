//! The targets: each reader of untrusted input, with the repository files
//! its corpus starts from.

use super::Target;
use linnet_exec::tensor::Tensor;
use linnet_frontend::driver::{check_package, lower_checked, lower_package};
use linnet_frontend::package::LoadOptions;
use linnet_frontend::source::FileId;
use linnet_ir::quant::{dequantize, quantize, BlockFormat};
use linnet_ir::Dtype;
use linnet_ir::Model;
use linnet_runtime::weights::NonFinite;
use linnet_runtime::Naming;
use linnet_server::{Limits, Served};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::OnceLock;

pub const TARGETS: &[Target] = &[
    Target { name: "syntax", seeds: module_texts, run: syntax },
    Target { name: "package", seeds: numbered_modules, run: package },
    Target { name: "card", seeds: card_texts, run: card },
    Target { name: "bindings", seeds: bindings_texts, run: bindings },
    Target { name: "safetensors", seeds: small_checkpoints, run: safetensors },
    Target { name: "npy", seeds: npy_files, run: npy },
    Target { name: "request", seeds: request_bodies, run: request },
    Target { name: "gguf", seeds: gguf_files, run: gguf },
    Target { name: "llama-gguf", seeds: llama_cpp_files, run: llama_cpp_file },
];

pub fn target(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|target| target.name == name)
}

/// The repository, found from this crate's sources wherever it runs.
fn repository() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

fn model_dir() -> PathBuf {
    repository().join("models/qwen3.6-35b-a3b")
}

fn oracle() -> PathBuf {
    repository().join("tests/fixtures/oracle/tiny-qwen3.5-moe")
}

fn options(overlay: HashMap<PathBuf, String>) -> LoadOptions {
    LoadOptions { stdlib: Some(repository().join("stdlib")), overlay, ..LoadOptions::default() }
}

/// The seed package's modules and those of the dense package it uses, in
/// a fixed order.
fn modules() -> Vec<PathBuf> {
    let mut paths: Vec<PathBuf> = ["models/qwen3.6-35b-a3b/src", "models/qwen3.8-27b/src"]
        .iter()
        .flat_map(|dir| std::fs::read_dir(repository().join(dir)).expect("the model packages' sources"))
        .map(|entry| entry.expect("an entry").path())
        .collect();
    paths.sort();
    paths
}

fn read(path: PathBuf) -> Vec<u8> {
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn module_texts() -> Vec<Vec<u8>> {
    let mut texts: Vec<Vec<u8>> = modules().into_iter().map(read).collect();
    let mut stdlib = vec![repository().join("stdlib")];
    while let Some(dir) = stdlib.pop() {
        for entry in std::fs::read_dir(&dir).expect("the standard library") {
            let path = entry.expect("an entry").path();
            if path.is_dir() {
                stdlib.push(path);
            } else if path.extension().is_some_and(|e| e == "linnet") {
                texts.push(read(path));
            }
        }
    }
    texts
}

/// Lexing, parsing and formatting one module.
fn syntax(input: &[u8]) {
    let text = String::from_utf8_lossy(input);
    let mut diagnostics = Vec::new();
    linnet_frontend::syntax::parse_module(FileId(0), &text, &mut diagnostics);
    linnet_frontend::syntax::format::format(&text);
}

/// Each module with its index in [`modules`] as the first byte.
fn numbered_modules() -> Vec<Vec<u8>> {
    modules().into_iter().enumerate().map(|(at, path)| [vec![at as u8], read(path)].concat()).collect()
}

/// Checks the seed package with one module replaced (chosen by the first
/// byte), and lowers it when it checks clean.
fn package(input: &[u8]) {
    let Some((&which, text)) = input.split_first() else { return };
    let modules = modules();
    let path = modules[usize::from(which) % modules.len()].clone();
    checked_and_lowered(HashMap::from([(path, String::from_utf8_lossy(text).into_owned())]));
}

fn checked_and_lowered(overlay: HashMap<PathBuf, String>) {
    let checked = check_package(&model_dir(), &options(overlay));
    if checked.diagnostics.iter().all(|d| d.severity != linnet_frontend::diagnostic::Severity::Error) {
        let _ = lower_checked(checked, Default::default());
    }
}

fn card_texts() -> Vec<Vec<u8>> {
    vec![read(model_dir().join("nest.toml")), read(oracle().join("package/nest-f32.toml"))]
}

fn card(input: &[u8]) {
    checked_and_lowered(HashMap::from([(model_dir().join("nest.toml"), String::from_utf8_lossy(input).into_owned())]));
}

fn bindings_texts() -> Vec<Vec<u8>> {
    vec![read(model_dir().join("bindings.json"))]
}

fn bindings(input: &[u8]) {
    let overlay = HashMap::from([(model_dir().join("bindings.json"), String::from_utf8_lossy(input).into_owned())]);
    let _ = check_package(&model_dir(), &options(overlay));
}

/// The oracle model and its names (bindings and gguf.json).
fn oracle_model() -> (Model, Naming) {
    let options = LoadOptions { nest: Some(oracle().join("package/nest-f32.toml")), ..options(HashMap::new()) };
    let (model, checked) = lower_package(&model_dir(), &options).unwrap_or_else(|_| panic!("the oracle model lowers"));
    (model, linnet_build::naming(checked.package.as_ref().expect("a package")))
}

thread_local! {
    /// Lowered once per thread (the IR is not shared between threads).
    static ORACLE_MODEL: (Model, Naming) = oracle_model();
}

/// Small checkpoints: a few of the oracle's tensors, serialized.
fn small_checkpoints() -> Vec<Vec<u8>> {
    let shards = read(oracle().join("weights-f32/model-00001-of-00003.safetensors"));
    let file = safetensors::SafeTensors::deserialize(&shards).expect("the oracle's shard");
    let mut names = file.names();
    names.sort();
    names
        .chunks(3)
        .take(4)
        .map(|chunk| {
            let views: Vec<(String, safetensors::tensor::TensorView)> =
                chunk.iter().map(|name| (name.to_string(), file.tensor(name).expect("listed"))).collect();
            safetensors::serialize(views, None).expect("serializable")
        })
        .collect()
}

/// The bytes as the one shard of a checkpoint, loaded for the oracle model.
fn safetensors(input: &[u8]) {
    let dir = std::env::temp_dir().join(format!("linnet-fuzz-safetensors-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    std::fs::write(dir.join("model.safetensors"), input).expect("the shard is written");
    ORACLE_MODEL.with(|(model, naming)| {
        let _ = linnet_runtime::weights::load(model, naming, &dir, NonFinite::Refuse);
    });
}

fn npy_files() -> Vec<Vec<u8>> {
    vec![
        linnet_runtime::npy::write(&Tensor::from_f32(Dtype::F32, vec![2, 3], vec![1.0, -2.0, 0.5, 3.0, 0.0, 7.0])),
        linnet_runtime::npy::write(&Tensor::from_i64(Dtype::I32, vec![1, 4], vec![5, 17, 42, 7])),
        linnet_runtime::npy::write(&Tensor::from_i64(Dtype::I64, vec![], vec![9])),
    ]
}

fn npy(input: &[u8]) {
    let _ = linnet_runtime::npy::read(input);
}

/// Small GGUF files: a few of the oracle's tensors quantized, with
/// metadata of several kinds.
fn gguf_files() -> Vec<Vec<u8>> {
    use linnet_runtime::gguf::{Meta, Planned, Storage, Writer};
    let path = std::env::temp_dir().join(format!("linnet-fuzz-seed-{}.gguf", std::process::id()));
    let strings = |items: &[&str]| Meta::Array(items.iter().map(|s| Meta::Str(s.to_string())).collect());
    let metadata = vec![
        ("general.name".to_string(), Meta::Str("seed".into())),
        ("tokenizer.ggml.model".to_string(), Meta::Str("gpt2".into())),
        ("tokenizer.ggml.pre".to_string(), Meta::Str("qwen35".into())),
        ("tokenizer.ggml.tokens".to_string(), strings(&["a", "b", "c", "ab", "abc", "<|im_end|>"])),
        ("tokenizer.ggml.token_type".to_string(), Meta::Array([1, 1, 1, 1, 1, 3].map(Meta::I32).to_vec())),
        ("tokenizer.ggml.merges".to_string(), strings(&["a b", "ab c"])),
        ("tokenizer.ggml.eos_token_id".to_string(), Meta::U32(5)),
        ("n".to_string(), Meta::U64(3)),
    ];
    let rows: Vec<f32> = (0..512).map(|at| (at as f32 * 0.37).sin()).collect();
    let formats =
        [Storage::Blocks(BlockFormat::Q8_0), Storage::Blocks(BlockFormat::Q4K), Storage::Blocks(BlockFormat::Q6K)];
    let mut seeds = Vec::new();
    for storage in formats {
        let Storage::Blocks(format) = storage else { continue };
        let tensors = vec![
            Planned { name: "norm".into(), shape: vec![4], storage: Storage::Plain(Dtype::F32) },
            Planned { name: "w".into(), shape: vec![2, 256], storage },
        ];
        let mut writer = Writer::create(&path, &metadata, &tensors).expect("a seed file");
        writer.write_tensor(&[0u8; 16]).expect("written");
        writer.write_tensor(&quantize(format, &rows).expect("whole blocks")).expect("written");
        writer.finish().expect("written");
        seeds.push(read(path.clone()));
    }
    let _ = std::fs::remove_file(&path);
    seeds
}

/// The bytes as a GGUF file: the table read, every tensor dequantized,
/// the vocabulary made a tokenizer that encodes a line.
fn gguf(input: &[u8]) {
    let Ok(gguf) = linnet_runtime::gguf::read(input) else { return };
    if let Ok(Some(tokenizer)) = linnet_runtime::vocab::tokenizer(&gguf) {
        let _ = tokenizer.encode("abc ab<|im_end|>", false);
    }
    for tensor in &gguf.tensors {
        if let linnet_runtime::gguf::Storage::Blocks(format) = tensor.storage {
            let bytes = gguf.tensor_bytes(input, tensor);
            let mut out = vec![0f32; (bytes.len() / format.block_bytes()) * format.block_values()];
            dequantize(format, bytes, &mut out).expect("a tensor the reader accepted is whole blocks");
        }
    }
}

/// llama.cpp's Q8_0 file of the oracle checkpoint (`tests/fixtures/llama-cpp`).
fn llama_cpp_files() -> Vec<Vec<u8>> {
    vec![read(repository().join("tests/fixtures/llama-cpp/tiny-qwen3.5-moe-q8_0.gguf"))]
}

/// The bytes as llama.cpp's file of the oracle model, read through its
/// gguf.json: the formats planned, the model built for them loaded.
fn llama_cpp_file(input: &[u8]) {
    let path = std::env::temp_dir().join(format!("linnet-fuzz-llama-{}.gguf", std::process::id()));
    std::fs::write(&path, input).expect("the file is written");
    ORACLE_MODEL.with(|(model, naming)| {
        let Ok(files) = linnet_runtime::gguf::Files::open(&path) else { return };
        let Ok(formats) = linnet_runtime::gguf::load::formats(model, naming, &files) else { return };
        let Ok(stored) = model.clone().stored_as(&formats) else { return };
        let _ = linnet_runtime::weights::load(&stored, naming, &path, NonFinite::Refuse);
    });
    let _ = std::fs::remove_file(&path);
}

fn request_bodies() -> Vec<Vec<u8>> {
    [
        r#"{"model": "tiny", "prompt": [5, 17, 42], "max_tokens": 4, "temperature": 0}"#,
        r#"{"prompt": "Hello there", "max_tokens": 8, "top_p": 0.9, "top_k": 40, "seed": 7, "stream": true}"#,
        r#"{"messages": [{"role": "user", "content": "Hi"}], "max_completion_tokens": 3}"#,
        r#"{"messages": [{"role": "system", "content": [{"type": "text", "text": "Be brief."}]}, {"role": "user", "content": "Why?"}], "stop": []}"#,
    ]
    .iter()
    .map(|body| body.as_bytes().to_vec())
    .collect()
}

/// The server's reading of a request body (by the chat endpoint when it
/// mentions `messages`), with the oracle's tokenizer.
fn request(input: &[u8]) {
    static SERVED: OnceLock<Served> = OnceLock::new();
    let served = SERVED.get_or_init(|| {
        Served::new(
            Limits {
                model: "tiny".into(),
                rows: 2,
                max_seq: 64,
                vocab: 512,
                states: Default::default(),
                verifies: true,
            },
            linnet_runtime::text::TextModel::load(&oracle().join("weights-f32")).expect("the oracle's tokenizer"),
        )
    });
    let chat = input.windows(8).any(|window| window == b"messages");
    let _ = served.read(input, chat);
}
