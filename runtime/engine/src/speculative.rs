//! Speculative decoding: a drafter proposes the next few tokens (n-gram
//! drafts, or prompt lookup: where the text so far has met its last few
//! tokens before, the tokens that followed them then), and the model
//! checks them all in one call of its `verify` entry (a prefill that gives
//! the logits after every token).
//! Each draft is kept or refused by the standard rejection rule
//! ([`settle`]), so the tokens are distributed as the model's own choices
//! are, whatever the sampling settings; greedy choices are the very tokens
//! greedy decoding gives. Several come per read of the weights when the
//! drafts are right.
//!
//! Rollback is derived from what the compiler knows of each state
//! (`Machine::recurrent_rows`): a cache written at token positions needs
//! nothing (positions past the kept ones are written again before they are
//! read), a recurrent state (DeltaNet's, the convolution history) is put
//! back as it was before the check, and the kept tokens are fed again at
//! the head of the next call, with its drafts: one call of the model a
//! step, drafts kept or not.

use crate::generate::{batch_rows, check_room, feed_all, first_row};
use crate::sampling::{Candidates, Rng, Sampling};
use crate::Error;
use linnet_exec::tensor::Tensor;
use linnet_exec::{Machine, RunError};

/// The longest run of the history's last tokens looked up.
const LONGEST_MATCH: usize = 3;

/// How a speculative run went: calls of the model (each reads the
/// weights once), those that checked drafts, tokens drafted, and drafts
/// kept.
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

/// What a speculative run is asked for: up to `max_tokens` after `prompt`,
/// drafts of up to `draft` tokens a step, each token chosen by `sampling`,
/// and the tokens after which it stops.
#[derive(Clone, Copy, Debug)]
pub struct Request<'a> {
    pub prompt: &'a [i64],
    pub max_tokens: usize,
    pub draft: usize,
    pub sampling: &'a Sampling,
    pub stop: &'a [i64],
}

/// What proposes the drafts: given the tokens so far and how many it may
/// propose, its guesses of the next ones. A drafter proposes with
/// certainty (the same history gives the same drafts), as [`settle`]
/// takes them. Any `FnMut(&[i64], usize) -> Vec<i64>` is one
/// ([`ngram_draft`]); a drafter that reads the model's hidden states (a
/// multi-token-prediction layer, `crate::mtp`) is told them.
pub trait Drafter {
    /// Whether it reads the model's hidden states: the model is then
    /// called through the entries that give them (`prefill_hidden`,
    /// `verify`), and [`Drafter::observe`] is told them.
    fn reads_hidden(&self) -> bool {
        false
    }

    /// The model's hidden states after its final norm, `[rows, S, H]`, of
    /// the tokens at positions `from..from + S` just fed. Those past the
    /// tokens kept are told again when they are fed again; a drafter reads
    /// only the positions before the history's last token.
    fn observe(&mut self, _from: usize, _hidden: &Tensor) -> Result<(), RunError> {
        Ok(())
    }

    /// Up to `room` tokens to follow `history`.
    fn draft(&mut self, history: &[i64], room: usize) -> Result<Vec<i64>, RunError>;
}

impl<F: FnMut(&[i64], usize) -> Vec<i64>> Drafter for F {
    fn draft(&mut self, history: &[i64], room: usize) -> Result<Vec<i64>, RunError> {
        Ok(self(history, room))
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

/// Whether drafting waits while `pending` tokens (the last chosen, and
/// refused drafts' kept ones before it) are to be fed, with drafts of up to
/// `draft`: they go at the head of the next check, with its drafts, until
/// refusals in a row have made them more than twice the draft; then they
/// are fed alone. A check so holds at most three times the draft.
pub fn drafts_wait(pending: usize, draft: usize) -> bool {
    pending > 2 * draft
}

/// The standard rejection rule for drafts proposed with certainty (as an
/// n-gram lookup proposes them): draft `i` is kept with the chance the
/// target gives it there (`target(i)`, its candidates after the drafts
/// before it); the first one refused is replaced by a token drawn from the
/// target's candidates without it, and after the last draft kept the
/// target draws the next. The tokens so given are distributed as the
/// target's own draws would be; where the target is greedy they are its
/// choices, and no draw is taken. Returns how many drafts were kept and
/// the token after them.
pub fn settle(drafts: &[i64], mut target: impl FnMut(usize) -> Candidates, rng: &mut Rng) -> (usize, i64) {
    for (at, &draft) in drafts.iter().enumerate() {
        let candidates = target(at);
        let chance = candidates.probability(draft);
        let kept = chance >= 1.0 || (chance > 0.0 && rng.next_f64() < chance);
        if !kept {
            // Refused, so the draft was not the only candidate.
            return (at, candidates.without(draft).map_or(draft, |rest| rest.draw(rng)));
        }
    }
    (drafts.len(), target(drafts.len()).draw(rng))
}

/// [`settle`] against the choices `sampling` makes: `judged` holds a row
/// of logits for each draft, the first after the tokens before the drafts
/// (`history`, its last `generated` generated), each next after one more
/// draft.
pub fn settle_sampled(
    drafts: &[i64],
    judged: &[f32],
    sampling: &Sampling,
    history: &[i64],
    generated: usize,
    rng: &mut Rng,
) -> (usize, i64) {
    let width = judged.len() / (drafts.len() + 1);
    let mut context = history.to_vec();
    let target = |at: usize| {
        context.truncate(history.len());
        context.extend_from_slice(&drafts[..at]);
        sampling.candidates(&judged[at * width..(at + 1) * width], &context, generated + at)
    };
    settle(drafts, target, rng)
}

/// The model a speculative run checks drafts with, every batch row given
/// the same tokens.
struct Model<'m> {
    machine: &'m mut Machine,
    rows: usize,
    reads_hidden: bool,
}

impl Model<'_> {
    /// `tokens` at `position` through `entry`: its logits; `drafter` is
    /// told the hidden states where it reads them.
    fn feed(
        &mut self,
        drafter: &mut impl Drafter,
        entry: &str,
        tokens: &[i64],
        position: usize,
    ) -> Result<Tensor, RunError> {
        let mut outputs = feed_all(self.machine, entry, self.rows, tokens, position)?;
        if self.reads_hidden {
            drafter.observe(position, &outputs[1])?;
        }
        Ok(outputs.swap_remove(0))
    }
}

/// Appends up to `request.max_tokens` tokens to its prompt, `drafter`
/// proposing up to `request.draft` tokens a step; stops after a token of
/// `request.stop` or when `on_token` returns false. Returns the new tokens
/// and how the drafts fared.
pub fn speculate(
    machine: &mut Machine,
    request: &Request,
    mut drafter: impl Drafter,
    rng: &mut Rng,
    mut on_token: impl FnMut(i64) -> bool,
) -> Result<(Vec<i64>, Acceptance), RunError> {
    let Request { prompt, max_tokens, draft, sampling, stop } = *request;
    let inputs = |message: String| RunError::Inputs { entry: "verify".into(), message };
    if machine.model().entry("verify").is_none() {
        return Err(inputs("speculative decoding needs the model's `verify` entry (std.nn.decoder's)".into()));
    }
    let reads_hidden = drafter.reads_hidden();
    // Without drafts the tokens are fed by `prefill` (or `decode`, one
    // token), or where the drafter reads hidden states `prefill_hidden`.
    let feeder = |count: usize| match (reads_hidden, count) {
        (true, _) => "prefill_hidden",
        (false, 1) => "decode",
        (false, _) => "prefill",
    };
    if reads_hidden && machine.model().entry("prefill_hidden").is_none() {
        return Err(inputs("this drafter reads the model's `prefill_hidden` entry (std.nn.decoder's)".into()));
    }
    let rows = batch_rows(machine).map_err(|error: Error| inputs(error.to_string()))?;
    check_room(machine.model(), prompt.len(), max_tokens)?;
    machine.reset()?;
    let mut acceptance = Acceptance { calls: 1, ..Acceptance::default() };
    let mut model = Model { machine, rows, reads_hidden };
    let first = if reads_hidden { "prefill_hidden" } else { "prefill" };
    let logits = model.feed(&mut drafter, first, prompt, 0)?;
    let mut history = prompt.to_vec();
    let mut generated = 0;
    // The caches and states hold the first `committed` tokens; `pending`
    // ones are chosen but not yet fed (the last chosen, and after refused
    // drafts the kept ones before it).
    let mut committed = prompt.len();
    let mut pending = Vec::new();
    let mut next = sampling.candidates(first_row(&logits, first)?, &history, 0).draw(rng);
    loop {
        history.push(next);
        pending.push(next);
        generated += 1;
        if !on_token(next) || stop.contains(&next) || generated == max_tokens {
            return Ok((history.split_off(prompt.len()), acceptance));
        }
        // No draft past the last token asked for.
        let room = if drafts_wait(pending.len(), draft) { 0 } else { draft.min(max_tokens - generated - 1) };
        let mut drafts = if room == 0 { Vec::new() } else { drafter.draft(&history, room)? };
        drafts.truncate(room);
        acceptance.calls += 1;
        if drafts.is_empty() {
            let entry = feeder(pending.len());
            let logits = model.feed(&mut drafter, entry, &pending, committed)?;
            committed += pending.len();
            pending.clear();
            next = sampling.candidates(first_row(&logits, entry)?, &history, generated).draw(rng);
            continue;
        }
        let saved: Vec<_> = (0..rows).map(|row| model.machine.recurrent_rows(row)).collect::<Result<_, _>>()?;
        let checked = [&pending[..], &drafts].concat();
        let scores = model.feed(&mut drafter, "verify", &checked, committed)?;
        let by_position = first_row(&scores, "verify")?;
        let width = by_position.len() / checked.len();
        // The logits after the last pending token judge the first draft.
        let judged = &by_position[(pending.len() - 1) * width..];
        let (agreed, following) = settle_sampled(&drafts, judged, sampling, &history, generated, rng);
        acceptance.checks += 1;
        acceptance.drafted += drafts.len();
        acceptance.accepted += agreed;
        if agreed == drafts.len() {
            committed += checked.len();
            pending.clear();
        } else {
            // The states saw refused drafts: back to before the check; the
            // kept tokens are fed again with the next call.
            for (row, rows_saved) in saved.iter().enumerate() {
                model.machine.set_state_rows(row, rows_saved)?;
            }
            pending.extend_from_slice(&drafts[..agreed]);
        }
        for &kept in &drafts[..agreed] {
            history.push(kept);
            generated += 1;
            if !on_token(kept) || stop.contains(&kept) || generated == max_tokens {
                return Ok((history.split_off(prompt.len()), acceptance));
            }
        }
        next = following;
    }
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

    /// The next-token distribution of a small target: after token `t`,
    /// token `(t + 1) % 4` is likeliest, the others in decreasing steps.
    fn target(after: i64) -> Candidates {
        let logits: Vec<f32> = (0..4).map(|token| -(((token - after - 1).rem_euclid(4)) as f32) * 0.7).collect();
        Sampling { temperature: 1.0, ..Sampling::default() }.candidates(&logits, &[], 0)
    }

    /// Three tokens after `start`, drafted `draft` at a time by a fixed
    /// guess (each token's likeliest successor, every third draft another
    /// token) and settled against [`target`].
    fn speculated(start: i64, draft: usize, rng: &mut Rng) -> [i64; 3] {
        let mut tokens = vec![start];
        while tokens.len() < 4 {
            let drafts: Vec<i64> = (0..draft as i64)
                .scan(*tokens.last().unwrap(), |last, at| {
                    *last = if at % 3 == 2 { (*last + 2) % 4 } else { (*last + 1) % 4 };
                    Some(*last)
                })
                .collect();
            let (kept, following) =
                settle(&drafts, |at| target(if at == 0 { *tokens.last().unwrap() } else { drafts[at - 1] }), rng);
            tokens.extend_from_slice(&drafts[..kept]);
            tokens.push(following);
        }
        [tokens[1], tokens[2], tokens[3]]
    }

    /// Pearson's statistic of `counts` against `expected` probabilities.
    fn chi_square(counts: &[usize], expected: &[f64]) -> f64 {
        let total: usize = counts.iter().sum();
        counts.iter().zip(expected).map(|(&n, &p)| (n as f64 - total as f64 * p).powi(2) / (total as f64 * p)).sum()
    }

    /// Lossless: the three tokens speculative sampling gives are
    /// distributed as the target's own three draws, whatever the drafts'
    /// length (64 outcomes, Pearson's test at the 0.001 level: 103.4 for
    /// 63 degrees of freedom). Keeping every draft, or drawing a refused
    /// draft's replacement from the whole target, fails it.
    #[test]
    fn sampled_tokens_follow_the_target_distribution() {
        let exact: Vec<f64> = (0..64)
            .map(|outcome: i64| {
                let (a, b, c) = (outcome / 16, outcome / 4 % 4, outcome % 4);
                target(0).probability(a) * target(a).probability(b) * target(b).probability(c)
            })
            .collect();
        for draft in [1, 2, 4] {
            let mut rng = Rng::new(draft as u64);
            let mut counts = vec![0; 64];
            for _ in 0..40_000 {
                let [a, b, c] = speculated(0, draft, &mut rng);
                counts[(a * 16 + b * 4 + c) as usize] += 1;
            }
            let statistic = chi_square(&counts, &exact);
            assert!(statistic < 103.4, "drafts of {draft}: chi-square {statistic:.1}");
        }
    }

    /// A greedy target keeps exactly the drafts that are its choices, then
    /// gives its choice, and takes no draw.
    #[test]
    fn greedy_settling_keeps_the_drafts_the_target_would_choose() {
        let greedy = |_| Sampling::default().candidates(&[0.0, 1.0, 3.0, 2.0], &[], 0);
        let mut rng = Rng::new(11);
        assert_eq!(settle(&[2, 2, 1], greedy, &mut rng), (2, 2));
        assert_eq!(settle(&[2, 2], greedy, &mut rng), (2, 2));
        assert_eq!(settle(&[0], greedy, &mut rng), (0, 2));
        assert_eq!(rng.next_u64(), Rng::new(11).next_u64(), "no draw taken");
    }
}
