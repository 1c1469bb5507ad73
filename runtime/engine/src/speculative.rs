//! Speculative greedy decoding with n-gram drafts (prompt lookup): where
//! the text so far has met its last few tokens before, the tokens that
//! followed them then are drafted, and the model checks them all in one
//! call of its `verify` entry (a prefill that gives the logits after every
//! token). The drafts the model's own greedy choice agrees with are kept,
//! then its choice where it first disagrees (or after the last draft), so
//! the tokens are those greedy decoding gives, several per read of the
//! weights when the drafts are right.
//!
//! Rollback is derived from what the compiler knows of each state
//! (`Machine::recurrent_rows`): a cache written at token positions needs
//! nothing (positions past the kept ones are written again before they are
//! read), a recurrent state (DeltaNet's, the convolution history) is put
//! back as it was before the check and the kept tokens are fed again.

use crate::generate::{argmax_rows, batch_rows, cache_positions};
use crate::Error;
use linnet_exec::tensor::Tensor;
use linnet_exec::{Machine, RunError};
use linnet_ir::Dtype;

/// The longest run of the history's last tokens looked up.
const LONGEST_MATCH: usize = 3;

/// How a speculative run went: calls of the model (each reads the
/// weights once), those that checked drafts, tokens drafted, and drafts
/// the model agreed with.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Acceptance {
    pub calls: usize,
    pub checks: usize,
    pub drafted: usize,
    pub accepted: usize,
}

impl Acceptance {
    /// The share of drafted tokens kept.
    pub fn rate(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
}

/// Up to `count` tokens that followed the latest earlier occurrence of the
/// history's last `n` tokens, the longest `n` (up to three) that occurs
/// before; none where no run of the last tokens occurred before.
pub fn ngram_draft(history: &[i64], count: usize) -> Vec<i64> {
    let end = history.len();
    for n in (1..=LONGEST_MATCH.min(end.saturating_sub(1))).rev() {
        let tail = &history[end - n..];
        // The latest earlier start, not the tail itself.
        if let Some(start) = (0..end - n).rev().find(|&start| &history[start..start + n] == tail) {
            let from = start + n;
            return history[from..(from + count).min(end)].to_vec();
        }
    }
    Vec::new()
}

/// Appends up to `max_tokens` greedy tokens to `prompt`, drafting up to
/// `draft` tokens a step by n-gram lookup; stops after a token of `stop`
/// or when `on_token` returns false. Returns the new tokens and how the
/// drafts fared.
pub fn greedy_ngram(
    machine: &mut Machine,
    prompt: &[i64],
    max_tokens: usize,
    draft: usize,
    stop: &[i64],
    mut on_token: impl FnMut(i64) -> bool,
) -> Result<(Vec<i64>, Acceptance), RunError> {
    let inputs = |message: String| RunError::Inputs { entry: "verify".into(), message };
    if machine.model().entry("verify").is_none() {
        return Err(inputs("speculative decoding needs the model's `verify` entry (std.nn.decoder's)".into()));
    }
    let rows = batch_rows(machine).map_err(|error: Error| inputs(error.to_string()))?;
    // A check may write `draft` positions past the last token kept.
    let needed = prompt.len() + max_tokens.max(1) - 1 + draft;
    if let Some(positions) = cache_positions(machine.model()).filter(|positions| needed > *positions) {
        let message = format!(
            "a prompt of {} tokens, {max_tokens} new ones and drafts of {draft} need {needed} positions; this model's caches hold {positions} (its card's MaxSeq)",
            prompt.len()
        );
        return Err(inputs(message));
    }
    machine.reset()?;
    let mut acceptance = Acceptance::default();
    let mut logits = feed(machine, &mut acceptance.calls, "prefill", rows, prompt, 0)?;
    let mut history = prompt.to_vec();
    let mut generated = Vec::with_capacity(max_tokens);
    // Tokens in the caches and states: the last token chosen is not yet.
    let mut position = prompt.len();
    let mut next = argmax_rows(&logits)[0];
    loop {
        generated.push(next);
        history.push(next);
        if !on_token(next) || stop.contains(&next) || generated.len() == max_tokens {
            return Ok((generated, acceptance));
        }
        let drafts = ngram_draft(&history, draft.min(max_tokens - generated.len() - 1));
        if drafts.is_empty() {
            logits = feed(machine, &mut acceptance.calls, "decode", rows, &[next], position)?;
            position += 1;
            next = argmax_rows(&logits)[0];
            continue;
        }
        let saved: Vec<Vec<Tensor>> = (0..rows).map(|row| machine.recurrent_rows(row)).collect::<Result<_, _>>()?;
        let checked = [&[next][..], &drafts].concat();
        let scores = feed(machine, &mut acceptance.calls, "verify", rows, &checked, position)?;
        let width = *scores.shape.last().expect("[rows, tokens, vocab] logits");
        let first_row = Tensor::from_f32(
            Dtype::F32,
            vec![checked.len(), width],
            scores.widened().as_f32().expect("float logits")[..checked.len() * width].to_vec(),
        );
        let chosen = argmax_rows(&first_row);
        let agreed = drafts.iter().zip(&chosen).take_while(|(draft, choice)| draft == choice).count();
        acceptance.checks += 1;
        acceptance.drafted += drafts.len();
        acceptance.accepted += agreed;
        if agreed < drafts.len() {
            // The states saw rejected drafts: back to before the check, and
            // the kept tokens fed again.
            for (row, rows_saved) in saved.iter().enumerate() {
                machine.set_state_rows(row, rows_saved)?;
            }
            feed(machine, &mut acceptance.calls, "prefill", rows, &checked[..=agreed], position)?;
        }
        position += agreed + 1;
        for &kept in &drafts[..agreed] {
            generated.push(kept);
            history.push(kept);
            if !on_token(kept) || stop.contains(&kept) || generated.len() == max_tokens {
                return Ok((generated, acceptance));
            }
        }
        next = chosen[agreed];
    }
}

/// `entry` on `tokens` at `position`, every row given the same tokens.
fn feed(
    machine: &mut Machine,
    calls: &mut usize,
    entry: &str,
    rows: usize,
    tokens: &[i64],
    position: usize,
) -> Result<Tensor, RunError> {
    *calls += 1;
    let all: Vec<i64> = (0..rows).flat_map(|_| tokens.iter().copied()).collect();
    let inputs = vec![
        Tensor::from_i64(Dtype::I32, vec![rows, tokens.len()], all),
        Tensor::from_i64(Dtype::I32, Vec::new(), vec![position as i64]),
    ];
    Ok(machine.call(entry, inputs)?.remove(0).widened().into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drafts_follow_the_latest_earlier_occurrence_of_the_longest_tail() {
        // "1 2 3" occurred before, followed by 4 5; "3" alone later, by 9.
        let history = [1, 2, 3, 4, 5, 3, 9, 1, 2, 3];
        assert_eq!(ngram_draft(&history, 2), [4, 5]);
        assert_eq!(ngram_draft(&history, 10), [4, 5, 3, 9, 1, 2, 3]);
        // Only the last token matches: what followed its latest occurrence.
        assert_eq!(ngram_draft(&[3, 9, 7, 3], 2), [9, 7]);
        assert!(ngram_draft(&[1, 2, 3], 4).is_empty(), "nothing met before");
        assert!(ngram_draft(&[], 4).is_empty());
    }
}
