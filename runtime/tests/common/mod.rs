//! What the runtime's test files share: where the repository, the oracle
//! fixture and its model card are, the golden files' contents, the dense
//! oracle checkpoint's generics, copies of the f32 checkpoint with a
//! change made (a tensor missing, a NaN), and a GGUF file's copy with its
//! blocks dequantized. Each test file uses a part of it.
#![allow(dead_code)]

pub mod server;

use linnet_exec::tensor::Tensor;
use linnet_exec::Machine;
use linnet_frontend::package::LoadOptions;
use linnet_ir::Model;
use linnet_runtime::{BackendKind, Loaded, Weights};
use safetensors::tensor::TensorView;
use safetensors::SafeTensors;
use std::path::{Path, PathBuf};

pub fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

/// A package or artifact ready to run on `backend`, as the CLI loads it:
/// the package built into the artifact cache (unless it is there), then
/// loaded with the builder as its compiler.
pub fn load_on(
    package: &Path,
    options: &LoadOptions,
    weights: &Weights,
    backend: BackendKind,
) -> Result<Loaded, String> {
    let dir = linnet_build::cache::artifact_for(package, options).map_err(|e| e.to_string())?;
    linnet_runtime::load(&dir, weights, backend, Some(&linnet_build::Builder)).map_err(|e| e.to_string())
}

/// [`load_on`] the reference interpreter.
pub fn load(package: &Path, options: &LoadOptions, weights: &Weights) -> Result<Loaded, String> {
    load_on(package, options, weights, BackendKind::Interp)
}

/// `model` with `params` on `backend`, compiled in this process: what a
/// conformance suite holds to the reference interpreter.
pub fn machine_on(backend: BackendKind, model: Model, params: Vec<Tensor>) -> Machine {
    match backend {
        BackendKind::Interp => linnet_exec::interp::machine(model, params),
        BackendKind::Cpu => linnet_cranelift::jit_machine(model, params, linnet_cranelift::Elementwise::default())
            .unwrap_or_else(|e| panic!("{e}")),
        #[cfg(feature = "nvptx")]
        BackendKind::MlirHost => {
            Machine::new(model, params, linnet_gpu::host::MlirHost::default()).unwrap_or_else(|e| panic!("{e}"))
        }
        other => panic!("no machine on {other:?} in this build of the tests"),
    }
}

/// Instantiates a conformance suite once per compiled backend, as burn's
/// `testgen!` does: `$suite!(module, backend)` for native code on the CPU
/// and, with the `nvptx` feature, the GPU kernels run on the host. A test
/// written once in the suite runs on each, as `module::test`, held to the
/// reference interpreter.
#[allow(unused_macros)]
macro_rules! for_each_compiled_backend {
    ($suite:ident) => {
        $suite!(cpu, linnet_runtime::BackendKind::Cpu);
        #[cfg(feature = "nvptx")]
        $suite!(gpu_kernels_on_the_host, linnet_runtime::BackendKind::MlirHost);
    };
}
#[allow(unused_imports)]
pub(crate) use for_each_compiled_backend;

/// The f32 oracle configuration: package card and weights.
pub fn oracle() -> PathBuf {
    root().join("tests/fixtures/oracle/tiny-qwen3.5-moe")
}

/// The seed package instantiated as the f32 oracle's card says.
pub fn oracle_options() -> LoadOptions {
    LoadOptions {
        nest: Some(oracle().join("package/nest-f32.toml")),
        stdlib: Some(root().join("stdlib")),
        ..LoadOptions::default()
    }
}

/// The dense oracle checkpoint's generics (its `config.json`), given as
/// `--set` gives them: its folder has no model card of its own.
pub const DENSE_GENERICS: [(&str, &str); 14] = [
    ("Vocab", "512"),
    ("H", "64"),
    ("Heads", "4"),
    ("KvHeads", "2"),
    ("HeadDim", "32"),
    ("KeyHeads", "2"),
    ("ValueHeads", "4"),
    ("KeyDim", "16"),
    ("ValueDim", "16"),
    ("Conv", "128"),
    ("Inner", "96"),
    ("Groups", "2"),
    ("Batch", "2"),
    ("MaxSeq", "64"),
];

/// The integer generics of the model card at `path` (its `[generics]`
/// lines `Name = 123`), as `--set` gives them.
pub fn card_generics(path: &Path) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(path).unwrap();
    let section = text.split("[generics]").nth(1).expect("a [generics] table").split("\n[").next().unwrap();
    section
        .lines()
        .filter_map(|line| line.split_once(" = "))
        .filter(|(_, value)| value.parse::<i64>().is_ok())
        .map(|(name, value)| (name.trim().to_string(), value.trim().to_string()))
        .collect()
}

/// `tests/fixtures/oracle/tiny-qwen3-dense`'s sizes, for `models/qwen3-8b`.
pub const QWEN3_GENERICS: [(&str, &str); 9] = [
    ("Vocab", "512"),
    ("H", "64"),
    ("Layers", "4"),
    ("Heads", "4"),
    ("KvHeads", "2"),
    ("HeadDim", "32"),
    ("Inner", "128"),
    ("Batch", "2"),
    ("MaxSeq", "64"),
];

/// One sequence of an oracle's golden file.
pub struct Golden {
    pub tokens: Vec<i64>,
    /// The reference's logits at every position, a row each.
    pub logits: Vec<Vec<f32>>,
    /// The tokens greedy generation appends after the whole sequence.
    pub greedy: Vec<i64>,
}

/// Every sequence of `dir/golden-{dtype}.safetensors`, in order.
pub fn golden(dir: &Path, dtype: &str) -> Vec<Golden> {
    let bytes = std::fs::read(dir.join(format!("golden-{dtype}.safetensors"))).expect("golden file");
    let file = SafeTensors::deserialize(&bytes).expect("golden safetensors");
    let words = |name: &str| -> Vec<[u8; 4]> {
        file.tensor(name).expect(name).data().chunks_exact(4).map(|c| [c[0], c[1], c[2], c[3]]).collect()
    };
    let ints = |name: &str| -> Vec<i64> { words(name).into_iter().map(|w| i64::from(i32::from_le_bytes(w))).collect() };
    let mut sequences = Vec::new();
    for n in 0.. {
        let Ok(logits) = file.tensor(&format!("seq{n}.logits")) else { break };
        let width = *logits.shape().last().expect("logits have a vocabulary axis");
        let floats: Vec<f32> = words(&format!("seq{n}.logits")).into_iter().map(f32::from_le_bytes).collect();
        sequences.push(Golden {
            tokens: ints(&format!("seq{n}.tokens")),
            logits: floats.chunks(width).map(<[f32]>::to_vec).collect(),
            greedy: ints(&format!("seq{n}.greedy")),
        });
    }
    sequences
}

pub type Stored = (String, safetensors::Dtype, Vec<usize>, Vec<u8>);

/// Every shard of the f32 checkpoint through `change`, into a fresh folder;
/// the index is rewritten to name each tensor's new shard.
pub fn rewritten(case: &str, mut change: impl FnMut(&mut Vec<Stored>)) -> PathBuf {
    let source = oracle().join("weights-f32");
    let target = std::env::temp_dir().join(format!("linnet-weights-{case}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&target);
    std::fs::create_dir_all(&target).unwrap();
    let mut weight_map = serde_json::Map::new();
    let mut index = None;
    for entry in std::fs::read_dir(&source).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let bytes = std::fs::read(&path).unwrap();
        if name == "model.safetensors.index.json" {
            index = Some(serde_json::from_slice::<serde_json::Value>(&bytes).unwrap());
            continue;
        }
        if path.extension().is_none_or(|e| e != "safetensors") {
            std::fs::write(target.join(name), bytes).unwrap();
            continue;
        }
        let file = SafeTensors::deserialize(&bytes).unwrap();
        let mut tensors: Vec<Stored> = file
            .tensors()
            .into_iter()
            .map(|(n, view)| (n.to_string(), view.dtype(), view.shape().to_vec(), view.data().to_vec()))
            .collect();
        change(&mut tensors);
        for (tensor, ..) in &tensors {
            weight_map.insert(tensor.clone(), serde_json::Value::String(name.clone()));
        }
        let views: Vec<(String, TensorView)> = tensors
            .iter()
            .map(|(n, dtype, shape, data)| (n.clone(), TensorView::new(*dtype, shape.clone(), data).unwrap()))
            .collect();
        std::fs::write(target.join(name), safetensors::serialize(views, None).unwrap()).unwrap();
    }
    if let Some(mut index) = index {
        index["weight_map"] = serde_json::Value::Object(weight_map);
        std::fs::write(target.join("model.safetensors.index.json"), index.to_string()).unwrap();
    }
    target
}

/// A copy of the f32 checkpoint in a fresh folder, with `change` applied
/// to the shard holding `tensor`.
pub fn altered(case: &str, tensor: &str, change: impl FnOnce(&mut Vec<Stored>)) -> PathBuf {
    let mut change = Some(change);
    rewritten(case, |tensors| {
        if tensors.iter().any(|(name, ..)| name == tensor) {
            (change.take().expect("one shard holds it"))(tensors);
        }
    })
}

/// A copy of the GGUF file `path` with every block dequantized to f32
/// (`quant::dequantize`, which is llama.cpp's `gguf` package's reading, bit
/// for bit), in the temporary folder; the caller removes it.
pub fn dequantized_gguf(path: &Path) -> PathBuf {
    use linnet_runtime::gguf::{read_file, Planned, Storage, Writer};
    let (bytes, gguf) = read_file(path).unwrap();
    let plain = |tensor: &linnet_runtime::gguf::TensorInfo| match tensor.storage {
        Storage::Blocks(_) => Storage::Plain(linnet_ir::Dtype::F32),
        other => other,
    };
    let planned: Vec<Planned> =
        gguf.tensors.iter().map(|t| Planned { name: t.name.clone(), shape: t.shape(), storage: plain(t) }).collect();
    let stem = path.file_stem().unwrap().to_string_lossy();
    let out = std::env::temp_dir().join(format!("linnet-dequantized-{stem}-{}.gguf", std::process::id()));
    let mut writer = Writer::create(&out, &gguf.metadata, &planned).unwrap();
    for tensor in &gguf.tensors {
        let stored = gguf.tensor_bytes(&bytes, tensor);
        match tensor.storage {
            Storage::Blocks(format) => {
                let mut values = vec![0f32; tensor.elements() as usize];
                linnet_ir::quant::dequantize(format, stored, &mut values).unwrap();
                writer.write_tensor(&values.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>()).unwrap();
            }
            Storage::Plain(_) => writer.write_tensor(stored).unwrap(),
        }
    }
    writer.finish().unwrap();
    out
}
