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
    check_room(machine.model(), prompt.len(), max_tokens)?;
    machine.reset()?;
    let mut logits = feed(machine, "prefill", rows, prompt, 0)?;
    let mut generated = Vec::with_capacity(max_tokens);
    let mut history = prompt.to_vec();
    for step in 0..max_tokens {
        let row = first_row(&logits, if step == 0 { "prefill" } else { "decode" })?;
        let next = sampling.choose(row, &history, generated.len(), rng);
        generated.push(next);
        history.push(next);
        if !on_token(next) || stop.contains(&next) || step + 1 == max_tokens {
            break;
        }
        logits = feed(machine, "decode", rows, &[next], prompt.len() + step)?;
    }
    Ok(generated)
}

/// Whether a prompt of `prompt` tokens and `max_tokens` new ones fit the
/// model's caches. The last token generated is never written (nor is a
/// draft checked past it).
pub(crate) fn check_room(model: &Model, prompt: usize, max_tokens: usize) -> Result<(), RunError> {
    let needed = prompt + max_tokens.max(1) - 1;
    match cache_positions(model).filter(|positions| needed > *positions) {
        None => Ok(()),
        Some(positions) => {
            let message = format!(
                "a prompt of {prompt} tokens and {max_tokens} new ones need {needed} positions; this model's caches hold {positions} (its card's MaxSeq)"
            );
            Err(RunError::Inputs { entry: "prefill".into(), message })
        }
    }
}

/// `entry` (`prefill`, `decode`, `verify`) on `tokens` at `position`, every
/// row given the same tokens: its logits, as f32 values.
pub(crate) fn feed(
    machine: &mut Machine,
    entry: &str,
    rows: usize,
    tokens: &[i64],
    position: usize,
) -> Result<Tensor, RunError> {
    Ok(feed_all(machine, entry, rows, tokens, position)?.remove(0))
}

/// [`feed`], every output of the entry (the logits first; `verify` and
/// `prefill_hidden` give the hidden states next), as f32 values.
pub(crate) fn feed_all(
    machine: &mut Machine,
    entry: &str,
    rows: usize,
    tokens: &[i64],
    position: usize,
) -> Result<Vec<Tensor>, RunError> {
    let inputs = vec![
        Tensor::from_i64(Dtype::I32, vec![rows, tokens.len()], every_row(rows, tokens)),
        Tensor::from_i64(Dtype::I32, Vec::new(), vec![position as i64]),
    ];
    Ok(machine.call(entry, inputs)?.into_iter().map(as_f32).collect())
}

/// `values` once for each of `rows` batch rows, one after another: every
/// row given the same input.
pub(crate) fn every_row<T: Copy>(rows: usize, values: &[T]) -> Vec<T> {
    (0..rows).flat_map(|_| values.iter().copied()).collect()
}

/// A float tensor with its values as f32.
pub(crate) fn as_f32(tensor: Tensor) -> Tensor {
    if tensor.as_f32().is_some() {
        tensor
    } else {
        tensor.widened().into_owned()
    }
}

/// The first batch row of `entry`'s logits (every row is given the same
/// tokens), checked for NaN.
pub(crate) fn first_row<'a>(logits: &'a Tensor, entry: &str) -> Result<&'a [f32], RunError> {
    let rows = logits.shape[0].max(1);
    let values = logits.as_f32().expect("`feed` gives f32 logits");
    let row = &values[..values.len() / rows];
    match crate::sampling::not_a_number(row) {
        Some(message) => Err(RunError::Assertion { entry: entry.into(), message }),
        None => Ok(row),
    }
}
