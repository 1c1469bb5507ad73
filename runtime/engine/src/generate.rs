//! Generation through a model's own entries: `prefill` of the prompt from
//! position 0, then `decode` one token at a time, every batch row given the
//! same prompt; each token chosen by the sampling settings.

use crate::sampling::{Rng, Sampling};
use crate::Error;
use linnet_exec::tensor::Tensor;
use linnet_exec::{Machine, RunError};
use linnet_ir::Dtype;
use linnet_ir::Model;

/// The index of the largest value of each row of a `[rows, n]` tensor;
/// ties go to the lower index.
pub fn argmax_rows(logits: &Tensor) -> Vec<i64> {
    let values = logits.as_f32().expect("logits are floats");
    let width = *logits.shape.last().expect("a rank-2 tensor");
    values
        .chunks(width)
        .map(|row| {
            row.iter()
                .enumerate()
                .fold((0, f32::NEG_INFINITY), |best, (at, &v)| if v > best.1 { (at, v) } else { best })
                .0 as i64
        })
        .collect()
}

/// The model's batch size: the rows its `decode` entry takes.
pub fn batch_rows(machine: &Machine) -> Result<usize, Error> {
    let entry =
        machine.model().entry("decode").ok_or_else(|| Error::Input("the model has no `decode` entry".into()))?;
    entry.inputs[0].shape[0]
        .as_constant()
        .map(|rows| rows as usize)
        .ok_or_else(|| Error::Input("`decode` takes a batch of unknown size".into()))
}

/// How many positions the model's caches hold: the length axis of every
/// state an entry writes at token positions (`rows::positional_states`:
/// `[rows, heads, positions, width]`); `None` for a model without such
/// caches.
pub fn cache_positions(model: &Model) -> Option<usize> {
    let positional = linnet_exec::rows::positional_states(model);
    model
        .states
        .iter()
        .zip(positional)
        .filter(|(_, positional)| *positional)
        .filter_map(|(state, _)| state.shape.get(2).copied())
        .min()
}

/// Appends `max_tokens` greedy tokens to `prompt`; returns the new ones.
pub fn greedy(machine: &mut Machine, prompt: &[i64], max_tokens: usize) -> Result<Vec<i64>, RunError> {
    generate(machine, prompt, max_tokens, &Sampling::default(), &mut Rng::new(0), &[], |_| true)
}

/// Appends up to `max_tokens` tokens to `prompt`, stopping after a token of
/// `stop` or when `on_token` returns false; returns the new ones.
pub fn generate(
    machine: &mut Machine,
    prompt: &[i64],
    max_tokens: usize,
    sampling: &Sampling,
    rng: &mut Rng,
    stop: &[i64],
    mut on_token: impl FnMut(i64) -> bool,
) -> Result<Vec<i64>, RunError> {
    let rows =
        batch_rows(machine).map_err(|error| RunError::Inputs { entry: "decode".into(), message: error.to_string() })?;
    // The last token generated is never written to the caches.
    let needed = prompt.len() + max_tokens.max(1) - 1;
    if let Some(positions) = cache_positions(machine.model()).filter(|positions| needed > *positions) {
        let message = format!(
            "a prompt of {} tokens and {max_tokens} new ones need {needed} positions; this model's caches hold {positions} (its card's MaxSeq)",
            prompt.len()
        );
        return Err(RunError::Inputs { entry: "prefill".into(), message });
    }
    machine.reset()?;
    let tokens: Vec<i64> = (0..rows).flat_map(|_| prompt.iter().copied()).collect();
    let prefill = vec![
        Tensor::from_i64(Dtype::I32, vec![rows, prompt.len()], tokens),
        Tensor::from_i64(Dtype::I32, Vec::new(), vec![0]),
    ];
    let mut logits = machine.call("prefill", prefill)?.remove(0);
    let mut generated = Vec::with_capacity(max_tokens);
    let mut history = prompt.to_vec();
    let width = *logits.shape.last().expect("[rows, vocab] logits");
    for step in 0..max_tokens {
        let row = &logits.as_f32().expect("float logits")[..width];
        if let Some(message) = crate::sampling::not_a_number(row) {
            return Err(RunError::Assertion { entry: if step == 0 { "prefill" } else { "decode" }.into(), message });
        }
        let next = sampling.choose(row, &history, generated.len(), rng);
        generated.push(next);
        history.push(next);
        if !on_token(next) || stop.contains(&next) || step + 1 == max_tokens {
            break;
        }
        let position = (prompt.len() + step) as i64;
        let decode = vec![
            Tensor::from_i64(Dtype::I32, vec![rows, 1], vec![next; rows]),
            Tensor::from_i64(Dtype::I32, Vec::new(), vec![position]),
        ];
        logits = machine.call("decode", decode)?.remove(0);
    }
    Ok(generated)
}
