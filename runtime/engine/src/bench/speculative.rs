//! `linnet bench --draft-accuracy`: greedy decoding's speed with and
//! without speculative drafts, side by side in one run. The drafts' worth
//! is set by construction: each drafted token is the model's own greedy
//! choice (known from the run without drafts) with probability `p`, and
//! another token otherwise; n-gram drafts (prompt lookup) and a
//! checkpoint's multi-token-prediction layer are timed beside them. Every
//! run must give the tokens the run without drafts gave, or the bench
//! fails.

use super::{counting, mean_sd, vocab};
use crate::generate;
use crate::mtp::MtpDrafter;
use crate::sampling::{Rng, Sampling};
use crate::speculative::{self, Acceptance, Request};
use crate::Error;
use linnet_exec::{Machine, RunError};
use std::time::Instant;

/// Where a run's drafts came from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Drafts {
    /// None: one token per call of `decode`.
    None,
    /// Each drafted token right with this probability.
    RightWith(f64),
    /// Prompt lookup.
    Ngram,
    /// The checkpoint's multi-token-prediction layer.
    Mtp,
}

/// Decode throughput with one kind of drafts: tokens/s after the first
/// token (mean and sd over the repetitions), and how the drafts fared in
/// the last repetition.
pub struct Run {
    pub drafts: Drafts,
    pub tokens_per_second: (f64, f64),
    pub acceptance: Acceptance,
}

/// What the timed runs continue: `Counting(n)`, n tokens spread over the
/// vocabulary (as `linnet bench`'s prompts), or text's tokens.
#[derive(Clone, Copy, Debug)]
pub enum Prompt<'a> {
    Counting(usize),
    Tokens(&'a [i64]),
}

pub struct Report {
    pub model: String,
    pub backend: &'static str,
    pub prompt: usize,
    pub generate: usize,
    pub draft: usize,
    /// The run without drafts first.
    pub runs: Vec<Run>,
}

/// What [`run`] times: greedy decoding of `generate` tokens after
/// `prompt`, without drafts, then with drafts of up to `draft` tokens right
/// with each probability of `accuracies`, then with n-gram drafts, then
/// with the drafts of `mtp`'s multi-token-prediction layer where given;
/// `repetitions` timed rounds of each after one that is not timed.
pub struct Timed<'a> {
    pub prompt: Prompt<'a>,
    pub generate: usize,
    pub draft: usize,
    pub accuracies: &'a [f64],
    pub mtp: Option<&'a mut Machine>,
    pub repetitions: usize,
}

/// Times what `timed` says on `machine`.
pub fn run(machine: &mut Machine, timed: Timed) -> Result<Report, Error> {
    let Timed { prompt, generate, draft, accuracies, mut mtp, repetitions } = timed;
    if generate < 2 {
        return Err(Error::Input("speculative decoding is timed after the first token: generate 2 or more".into()));
    }
    if let Some(bad) = accuracies.iter().find(|p| !(0.0..=1.0).contains(*p)) {
        return Err(Error::Input(format!("a draft accuracy is a probability, in [0, 1], not {bad}")));
    }
    let vocab = vocab(machine)?;
    let prompt_ids: Vec<i64> = match prompt {
        Prompt::Counting(length) => counting(length.max(1), vocab),
        Prompt::Tokens([]) => return Err(Error::Input("the prompt makes no tokens".into())),
        Prompt::Tokens(tokens) => tokens.to_vec(),
    };
    let greedily = Sampling::default();
    let request = Request { prompt: &prompt_ids, max_tokens: generate, draft, sampling: &greedily, stop: &[] };
    // One run without drafts says what every run must give.
    let right = generate::generate(machine, &prompt_ids, generate, &greedily, &mut Rng::new(0), &[], |_| true)?;
    let mut runs: Vec<Run> = [Drafts::None]
        .into_iter()
        .chain(accuracies.iter().map(|&p| Drafts::RightWith(p)))
        .chain([Drafts::Ngram])
        .chain(mtp.is_some().then_some(Drafts::Mtp))
        .map(|drafts| Run { drafts, tokens_per_second: (0.0, 0.0), acceptance: Acceptance::default() })
        .collect();
    let mut rates = vec![Vec::new(); runs.len()];
    // Round-robin, so that whatever drifts in the machine over the run
    // falls on every kind alike; the first round is not timed.
    for round in 0..=repetitions {
        for (run, rates) in runs.iter_mut().zip(&mut rates) {
            let mut clock = Clock::default();
            let on_token = |_| clock.tick();
            let (tokens, acceptance) = match run.drafts {
                Drafts::None => {
                    let tokens =
                        generate::generate(machine, &prompt_ids, generate, &greedily, &mut Rng::new(0), &[], on_token)?;
                    (tokens, Acceptance::default())
                }
                Drafts::RightWith(p) => {
                    let mut wrong = Rng::new(round as u64);
                    let drafter = |history: &[i64], room: usize| -> Vec<i64> {
                        let ahead = &right[history.len() - prompt_ids.len()..];
                        ahead
                            .iter()
                            .take(room)
                            .map(|&token| if wrong.next_f64() < p { token } else { (token + 1) % vocab })
                            .collect()
                    };
                    speculative::speculate(machine, &request, drafter, &mut Rng::new(0), on_token)?
                }
                Drafts::Ngram => {
                    speculative::speculate(machine, &request, speculative::ngram_draft, &mut Rng::new(0), on_token)?
                }
                Drafts::Mtp => {
                    let layer = mtp.as_deref_mut().expect("an MTP run only with its layer");
                    speculative::speculate(machine, &request, MtpDrafter::new(layer)?, &mut Rng::new(0), on_token)?
                }
            };
            if tokens != right {
                let message =
                    format!("decoding with drafts ({:?}) gave {tokens:?}, without them {right:?}", run.drafts);
                return Err(RunError::Assertion { entry: "verify".into(), message }.into());
            }
            if round > 0 {
                rates.push(clock.rate());
                run.acceptance = acceptance;
            }
        }
    }
    for (run, rates) in runs.iter_mut().zip(&rates) {
        run.tokens_per_second = mean_sd(rates);
    }
    Ok(Report {
        model: machine.model().name.clone(),
        backend: machine.backend(),
        prompt: prompt_ids.len(),
        generate,
        draft,
        runs,
    })
}

/// The times of the first and last tokens, and how many came between.
#[derive(Default)]
struct Clock {
    first: Option<Instant>,
    last: Option<Instant>,
    tokens: usize,
}

impl Clock {
    fn tick(&mut self) -> bool {
        let now = Instant::now();
        self.first.get_or_insert(now);
        self.last = Some(now);
        self.tokens += 1;
        true
    }

    /// Tokens a second after the first (which the prompt's call gives).
    fn rate(&self) -> f64 {
        match (self.first, self.last) {
            (Some(first), Some(last)) => (self.tokens - 1) as f64 / (last - first).as_secs_f64(),
            _ => 0.0,
        }
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "{} on {}: {} tokens greedily after a prompt of {}, drafts of up to {}",
            self.model, self.backend, self.generate, self.prompt, self.draft
        )?;
        writeln!(f, "| drafts | accepted | tokens per call | t/s | speed-up |")?;
        writeln!(f, "| --- | ---: | ---: | ---: | ---: |")?;
        let plain = self.runs[0].tokens_per_second.0;
        for run in &self.runs {
            let drafts = match run.drafts {
                Drafts::None => "none".to_string(),
                Drafts::RightWith(p) => format!("right with p = {p:.2}"),
                Drafts::Ngram => "n-gram".to_string(),
                Drafts::Mtp => "MTP layer".to_string(),
            };
            let Acceptance { calls, drafted, accepted, .. } = run.acceptance;
            let (accepted, per_call) = match run.drafts {
                Drafts::None => ("-".to_string(), 1.0),
                // The prompt's call gives the first token; the rest come from
                // the calls after it.
                _ => (
                    format!("{accepted}/{drafted} ({:.2})", run.acceptance.rate()),
                    (self.generate - 1) as f64 / (calls - 1).max(1) as f64,
                ),
            };
            let (mean, sd) = run.tokens_per_second;
            writeln!(f, "| {drafts} | {accepted} | {per_call:.2} | {mean:.2} ± {sd:.2} | {:.2}× |", mean / plain)?;
        }
        Ok(())
    }
}
