//! Bad input gets a clear error, never a panic: checkpoints with a missing
//! tensor, a wrong shape, a wrong dtype or a truncated file; inputs of the
//! wrong shape or dtype; tokens outside the vocabulary; positions past the
//! caches; and weights that are nowhere to be found.

use linnet_exec::tensor::Tensor;
use linnet_exec::Machine;
use linnet_ir::Dtype;
use linnet_runtime::weights::{self, NonFinite};
use safetensors::tensor::TensorView;
use safetensors::SafeTensors;
use std::path::{Path, PathBuf};

mod common;

use common::{altered, oracle, oracle_options as options, rewritten, root};

fn load(weights: &Path) -> Result<Machine, String> {
    load_with(weights, NonFinite::Refuse)
}

fn load_with(weights: &Path, non_finite: NonFinite) -> Result<Machine, String> {
    let weights = linnet_runtime::Weights::Checkpoint { dir: Some(weights.to_path_buf()), non_finite };
    common::load(&root().join("models/qwen3.6-35b-a3b"), &options(), &weights).map(|loaded| loaded.machine)
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
    assert!(
        error.contains("groups.0.linear.1.mlp.gate.weight") && error.contains("shape [64, 8], expected [8, 64]"),
        "{error}"
    );
    assert!(
        error.contains("groups.0.linear.1.input_layernorm.weight") && error.contains("dtype BF16, expected f32"),
        "{error}"
    );
}

/// NaN weights in one expert: the rows routed to it turn NaN, and the next
/// layer's router refuses to rank them, naming its layer (not an
/// out-of-range read of an expert that does not exist).
#[test]
fn nan_router_scores_are_named_with_their_layer() {
    const EXPERTS: &str = "model.language_model.layers.0.mlp.experts.gate_up_proj";
    let dir = altered("nan-expert", EXPERTS, |tensors| {
        for (name, _, _, data) in tensors.iter_mut() {
            if name == EXPERTS {
                // Every weight of every expert: whichever is chosen.
                for word in data.chunks_exact_mut(4) {
                    word.copy_from_slice(&f32::NAN.to_le_bytes());
                }
            }
        }
    });
    let mut machine = load_with(&dir, NonFinite::Warn).unwrap();
    let tokens = Tensor::from_i64(Dtype::I32, vec![1, 3], vec![1, 2, 3]);
    let error = machine.call("forward", vec![tokens]).unwrap_err().to_string();
    assert!(error.contains("the router's scores hold NaN") && error.contains("in `groups.0.linear.1.mlp`"), "{error}");
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
    let error =
        weights::locate_in_caches(std::slice::from_ref(&cache), "Org/Other", Some("abc123")).unwrap_err().to_string();
    assert!(error.contains("models--Org--Other/snapshots/abc123") && error.contains("--weights"), "{error}");
    let error = weights::locate(Some(&cache.join("nowhere")), None, None).unwrap_err().to_string();
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
    let rows = vec![tokens(vec![1, 1], vec![2, 1]), Tensor::from_i64(Dtype::I32, vec![2], vec![3, -1])];
    let error = machine.call("decode_rows", rows).unwrap_err().to_string();
    assert!(
        error.contains("entry `decode_rows`: write_rows: a position outside the cache")
            && error.contains("input `positions` holds [3, -1]"),
        "{error}"
    );
    // Past the caches: said in the user's terms before anything runs.
    let error = linnet_runtime::generate::greedy(&mut machine, &[1, 2, 3], 100).unwrap_err().to_string();
    assert!(error.contains("need 102 positions; this model's caches hold 64"), "{error}");
    assert_eq!(linnet_runtime::generate::greedy(&mut machine, &[1, 2, 3], 62).unwrap().len(), 62);
    let unbound = linnet_runtime::Naming::default();
    let problems = weights::load(machine.model(), &unbound, &oracle().join("weights-f32"), weights::NonFinite::Refuse)
        .unwrap_err();
    assert_eq!(problems.len(), machine.model().params.len(), "every unbound parameter is reported");
}

/// A NaN in the weights: refused under `--strict` with the tensor named;
/// else loaded (with a warning), and generation reports the NaN logits
/// instead of quietly picking token 0.
#[test]
fn a_nan_in_the_weights_is_refused_or_reported_not_sampled() {
    let dir = altered("nan", NORM, |tensors| {
        for (name, _, _, data) in tensors.iter_mut() {
            if name == NORM {
                data[4..8].copy_from_slice(&f32::INFINITY.to_le_bytes());
                data[8..12].copy_from_slice(&f32::NAN.to_le_bytes());
            }
        }
    });
    let error = load(&dir).err().expect("refused under --strict");
    assert!(
        error.contains("parameter `norm.weight`")
            && error.contains(NORM)
            && error.contains("2 NaN or infinite value(s), the first at flat index 1"),
        "{error}"
    );
    let mut machine = load_with(&dir, NonFinite::Warn).unwrap();
    let error = linnet_runtime::generate::greedy(&mut machine, &[5, 17, 42], 4).unwrap_err().to_string();
    assert!(error.contains("entry `prefill`") && error.contains("NaN"), "{error}");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Experts stored one tensor per expert, as transformers' `save_pretrained`
/// writes them, load through the same bindings as the fused layout and
/// compute the same logits.
#[test]
fn experts_stored_one_tensor_per_expert_are_stacked() {
    let dir = rewritten("per-expert", |tensors| {
        let mut split = Vec::new();
        tensors.retain(|(name, dtype, shape, data)| {
            let Some((prefix, kind)) = name.rsplit_once(".experts.") else { return true };
            let parts: &[&str] = match kind {
                "gate_up_proj" => &["gate_proj", "up_proj"],
                "down_proj" => &["down_proj"],
                _ => return true,
            };
            let rows = shape[1] / parts.len();
            let row_bytes = data.len() / (shape[0] * shape[1]);
            for expert in 0..shape[0] {
                for (at, part) in parts.iter().enumerate() {
                    let start = (expert * shape[1] + at * rows) * row_bytes;
                    let bytes = data[start..start + rows * row_bytes].to_vec();
                    split.push((
                        format!("{prefix}.experts.{expert}.{part}.weight"),
                        *dtype,
                        vec![rows, shape[2]],
                        bytes,
                    ));
                }
            }
            false
        });
        tensors.extend(split);
    });
    let tokens = || vec![Tensor::from_i64(Dtype::I32, vec![1, 3], vec![5, 17, 42])];
    let expected = load(&oracle().join("weights-f32")).unwrap().call("forward", tokens()).unwrap();
    let stacked = load(&dir).unwrap().call("forward", tokens()).unwrap();
    assert_eq!(stacked, expected);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// An expert's part missing from a checkpoint stored one tensor per
/// expert is named itself, not as the fused tensor the bindings name.
#[test]
fn a_missing_experts_part_is_named() {
    let dir = rewritten("per-expert-missing", |tensors| {
        let mut split = Vec::new();
        tensors.retain(|(name, dtype, shape, data)| {
            let Some((prefix, "down_proj")) = name.rsplit_once(".experts.") else { return true };
            let row_bytes = data.len() / shape[0];
            for expert in 0..shape[0] {
                let part = format!("{prefix}.experts.{expert}.down_proj.weight");
                if !(expert == 1 && prefix.ends_with("layers.1.mlp")) {
                    let bytes = data[expert * row_bytes..(expert + 1) * row_bytes].to_vec();
                    split.push((part, *dtype, shape[1..].to_vec(), bytes));
                }
            }
            false
        });
        tensors.extend(split);
    });
    let error = load(&dir).err().expect("a part is missing");
    assert!(
        error.contains(
            "one tensor per expert but has no `model.language_model.layers.1.mlp.experts.1.down_proj.weight`"
        ),
        "{error}"
    );
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
        let mut tensors: Vec<(String, safetensors::Dtype, Vec<usize>, Vec<u8>)> = file
            .tensors()
            .into_iter()
            .map(|(n, v)| (n.to_string(), v.dtype(), v.shape().to_vec(), v.data().to_vec()))
            .collect();
        let width = machine_width();
        tensors.push((NORM.to_string(), safetensors::Dtype::F32, vec![width], vec![0u8; width * 4]));
        let views: Vec<(String, TensorView)> =
            tensors.iter().map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap())).collect();
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
