//! Bad input gets a clear error, never a panic: checkpoints with a missing
//! tensor, a wrong shape, a wrong dtype or a truncated file; inputs of the
//! wrong shape or dtype; tokens outside the vocabulary; positions past the
//! caches; and weights that are nowhere to be found.

use linnet_compiler::exec::Machine;
use linnet_compiler::tensor::Tensor;
use linnet_compiler::sema::ty::Dtype;
use linnet_runtime::weights;
use safetensors::tensor::TensorView;
use safetensors::SafeTensors;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

mod common;

use common::{oracle, oracle_options as options, root};

fn load(weights: &Path) -> Result<Machine, String> {
    let weights = linnet_runtime::Weights::Checkpoint(Some(weights.to_path_buf()));
    linnet_runtime::load(&root().join("models/qwen3.6-35b-a3b"), &options(), &weights).map(|loaded| loaded.machine)
}

/// A copy of the f32 checkpoint in a fresh folder, with `change` applied
/// to the shard holding `tensor`.
fn altered(case: &str, tensor: &str, change: impl FnOnce(&mut Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)>)) -> PathBuf {
    let source = oracle().join("weights-f32");
    let target = std::env::temp_dir().join(format!("linnet-weights-{case}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&target);
    std::fs::create_dir_all(&target).unwrap();
    let mut change = Some(change);
    for entry in std::fs::read_dir(&source).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_owned();
        let bytes = std::fs::read(&path).unwrap();
        let holds = path.extension().is_some_and(|e| e == "safetensors")
            && SafeTensors::deserialize(&bytes).unwrap().names().contains(&tensor);
        if !holds {
            std::fs::write(target.join(name), bytes).unwrap();
            continue;
        }
        let file = SafeTensors::deserialize(&bytes).unwrap();
        let mut tensors: Vec<_> = file
            .tensors()
            .into_iter()
            .map(|(n, view)| (n.to_string(), view.dtype(), view.shape().to_vec(), view.data().to_vec()))
            .collect();
        (change.take().unwrap())(&mut tensors);
        let views: Vec<(String, TensorView)> =
            tensors.iter().map(|(n, dtype, shape, data)| (n.clone(), TensorView::new(*dtype, shape.clone(), data).unwrap())).collect();
        std::fs::write(target.join(name), safetensors::serialize(views, None).unwrap()).unwrap();
    }
    target
}

const NORM: &str = "model.language_model.norm.weight";
const GATE: &str = "model.language_model.layers.1.mlp.gate.weight";

#[test]
fn a_missing_tensor_is_named_with_its_parameter() {
    let dir = altered("missing", NORM, |tensors| tensors.retain(|(n, ..)| n != NORM));
    let error = load(&dir).err().expect("an error");
    assert!(error.contains("parameter `norm.weight`") && error.contains(NORM), "{error}");
}

#[test]
fn a_wrong_shape_and_a_wrong_dtype_are_both_reported() {
    let dir = altered("shape", GATE, |tensors| {
        for (name, dtype, shape, data) in tensors.iter_mut() {
            if name == GATE {
                shape.reverse();
            }
            if name == "model.language_model.layers.1.input_layernorm.weight" {
                *dtype = safetensors::Dtype::BF16;
                data.truncate(data.len() / 2);
            }
        }
    });
    let error = load(&dir).err().expect("an error");
    assert!(error.contains("groups.0.linear.1.mlp.gate.weight") && error.contains("shape [64, 8], expected [8, 64]"), "{error}");
    assert!(error.contains("groups.0.linear.1.input_layernorm.weight") && error.contains("dtype BF16, expected f32"), "{error}");
}

#[test]
fn a_truncated_file_is_a_clear_error() {
    let dir = altered("truncated", NORM, |_| {});
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "safetensors") {
            let bytes = std::fs::read(&path).unwrap();
            std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
            break;
        }
    }
    let error = load(&dir).err().expect("an error");
    assert!(error.contains("corrupt or truncated"), "{error}");
}

#[test]
fn weights_are_found_in_the_hub_cache_or_the_places_are_named() {
    let cache = std::env::temp_dir().join(format!("linnet-hub-{}", std::process::id()));
    let snapshot = cache.join("models--Org--Tiny/snapshots/abc123");
    std::fs::create_dir_all(&snapshot).unwrap();
    assert_eq!(weights::locate_in_caches(std::slice::from_ref(&cache), "Org/Tiny", Some("abc123")).unwrap(), snapshot);
    let error = weights::locate_in_caches(std::slice::from_ref(&cache), "Org/Other", Some("abc123")).unwrap_err();
    assert!(error.contains("models--Org--Other/snapshots/abc123") && error.contains("--weights"), "{error}");
    let error = weights::locate(Some(&cache.join("nowhere")), None, None).unwrap_err();
    assert!(error.contains("no such folder"), "{error}");
}

#[test]
fn bad_inputs_name_the_entry_and_the_argument() {
    let mut machine = load(&oracle().join("weights-f32")).unwrap();
    let tokens = |values: Vec<i64>, shape: Vec<usize>| Tensor::from_i64(Dtype::I32, shape, values);
    let error = machine.call("forward", vec![tokens(vec![1, 2, 600], vec![1, 3])]).unwrap_err().to_string();
    assert!(error.contains("entry `forward`") && error.contains("input `tokens` holds 600"), "{error}");
    let error = machine.call("forward", vec![tokens(vec![1, 2, 3], vec![3])]).unwrap_err().to_string();
    assert!(error.contains("`tokens` must have shape [B, S]"), "{error}");
    let floats = Tensor::from_f32(Dtype::F32, vec![1, 3], vec![1.0, 2.0, 3.0]);
    let error = machine.call("forward", vec![floats]).unwrap_err().to_string();
    assert!(error.contains("`tokens` must be i32"), "{error}");
    let error = machine.call("forward", vec![tokens(Vec::new(), vec![1, 0])]).unwrap_err().to_string();
    assert!(error.contains("requires `S > 0`"), "{error}");
    let step = vec![tokens(vec![1, 1], vec![2, 1]), Tensor::from_i64(Dtype::I32, Vec::new(), vec![64])];
    let error = machine.call("decode", step).unwrap_err().to_string();
    assert!(error.contains("entry `decode`") && error.contains("input `pos` holds 64"), "{error}");
    let bindings: HashMap<String, String> = HashMap::new();
    let problems = weights::load(machine.model(), &bindings, &oracle().join("weights-f32"), &[]).unwrap_err();
    assert_eq!(problems.len(), machine.model().params.len(), "every unbound parameter is reported");
}

/// A NaN in the weights makes NaN logits: generation says so instead of
/// quietly picking token 0.
#[test]
fn a_nan_in_the_weights_is_reported_not_sampled() {
    let dir = altered("nan", NORM, |tensors| {
        for (name, _, _, data) in tensors.iter_mut() {
            if name == NORM {
                data[..4].copy_from_slice(&f32::NAN.to_le_bytes());
            }
        }
    });
    let mut machine = load(&dir).unwrap();
    let error = linnet_runtime::generate::greedy(&mut machine, &[5, 17, 42], 4).unwrap_err().to_string();
    assert!(error.contains("entry `prefill`") && error.contains("NaN"), "{error}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A tensor stored in two shards: the index's file is the one used; with
/// no index, it is a problem, not the last file's copy.
#[test]
fn a_tensor_in_two_shards_takes_the_index_file_or_is_reported() {
    let source = oracle().join("weights-f32");
    let dir = std::env::temp_dir().join(format!("linnet-weights-twice-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut planted = false;
    let mut paths: Vec<PathBuf> = std::fs::read_dir(&source).unwrap().map(|e| e.unwrap().path()).collect();
    paths.sort();
    for path in paths {
        let bytes = std::fs::read(&path).unwrap();
        let target = dir.join(path.file_name().unwrap());
        let is_shard = path.extension().is_some_and(|e| e == "safetensors");
        if !is_shard || planted || SafeTensors::deserialize(&bytes).unwrap().names().contains(&NORM) {
            std::fs::write(target, bytes).unwrap();
            continue;
        }
        // A second `norm.weight`, all zeros, in a shard the index does not name for it.
        let file = SafeTensors::deserialize(&bytes).unwrap();
        let mut tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> =
            file.tensors().into_iter().map(|(n, v)| (n.to_string(), v.dtype(), v.shape().to_vec(), v.data().to_vec())).collect();
        let width = machine_width();
        tensors.push((NORM.to_string(), safetensors::Dtype::F32, vec![width], vec![0u8; width * 4]));
        let views: Vec<(String, TensorView)> = tensors.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
        std::fs::write(target, safetensors::serialize(views, None).unwrap()).unwrap();
        planted = true;
    }
    assert!(planted);
    let tokens = || vec![Tensor::from_i64(Dtype::I32, vec![1, 3], vec![5, 17, 42])];
    let expected = load(&source).unwrap().call("forward", tokens()).unwrap();
    let indexed = load(&dir).unwrap().call("forward", tokens()).unwrap();
    assert_eq!(indexed, expected, "the index's copy of `norm.weight` is the one used");
    std::fs::remove_file(dir.join("model.safetensors.index.json")).unwrap();
    let error = load(&dir).err().expect("an ambiguous checkpoint is refused");
    assert!(error.contains(NORM) && error.contains("in both") && error.contains("no index says which"), "{error}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// The hidden width of the oracle model: `norm.weight`'s length.
fn machine_width() -> usize {
    let machine = load(&oracle().join("weights-f32")).unwrap();
    machine.model().params.iter().find(|p| p.path == "norm.weight").expect("a final norm").shape[0]
}
