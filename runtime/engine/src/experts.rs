//! Mixture-of-experts checkpoints in transformers' per-expert layout, the
//! one `save_pretrained` writes and fine-tunes keep: each expert's
//! `….experts.{e}.gate_proj.weight`, `up_proj.weight` and
//! `down_proj.weight`, where a package binds the fused tensors
//! `….experts.gate_up_proj` (experts × (gate rows, then up rows) × hidden)
//! and `….experts.down_proj`. The loader stacks the parts at load time, so
//! both layouts load with the same `bindings.json`.

/// For a fused expert tensor's name and its expert count, per expert the
/// tensors whose rows, in order, make that expert's slice; `None` for a
/// name that is not a fused expert tensor.
pub fn per_expert_parts(fused: &str, experts: usize) -> Option<Vec<Vec<String>>> {
    let (prefix, kind) = fused.rsplit_once(".experts.")?;
    let parts: &[&str] = match kind {
        "gate_up_proj" => &["gate_proj", "up_proj"],
        "down_proj" => &["down_proj"],
        _ => return None,
    };
    Some(
        (0..experts)
            .map(|expert| parts.iter().map(|part| format!("{prefix}.experts.{expert}.{part}.weight")).collect())
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::per_expert_parts;

    #[test]
    fn fused_names_map_to_each_experts_parts() {
        let parts = per_expert_parts("model.layers.3.mlp.experts.gate_up_proj", 2).unwrap();
        assert_eq!(
            parts,
            [
                ["model.layers.3.mlp.experts.0.gate_proj.weight", "model.layers.3.mlp.experts.0.up_proj.weight"],
                ["model.layers.3.mlp.experts.1.gate_proj.weight", "model.layers.3.mlp.experts.1.up_proj.weight"],
            ]
        );
        assert_eq!(per_expert_parts("m.experts.down_proj", 1).unwrap(), [["m.experts.0.down_proj.weight"]]);
        assert_eq!(per_expert_parts("m.shared_expert.down_proj.weight", 4), None);
    }
}
