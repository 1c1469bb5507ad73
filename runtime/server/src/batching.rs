//! The scheduler: one thread owns the model and runs continuous batching.
//! New requests are prefilled into free rows with `prefill_slots` while the
//! others keep decoding with `decode_rows`; `Batch` rows at most, the rest
//! wait in a queue. Each row computes only from its own tokens, so a
//! request's tokens do not depend on what else runs. A client that goes
//! away frees its row. A prompt that starts with a prefix in the prefix
//! cache (`prefix`) has the prefix's states written into its row and
//! prefills only the rest; prompts are prefilled in parts where the cache
//! takes snapshots of them.

use super::kv_events::{EventSink, KvEvent};
use super::prefix::PrefixCache;
use super::ServeError;
use linnet_exec::tensor::Tensor;
use linnet_exec::{Machine, RunError};
use linnet_ir::Dtype;
use linnet_runtime::constrain::Constraint;
use linnet_runtime::sampling::{Logprobs, Rng, Sampling};
use linnet_runtime::speculative::{self, ngram_draft, settle_sampled};
use std::collections::VecDeque;
use std::sync::atomic::AtomicBool;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::mpsc::UnboundedSender;

#[derive(Debug)]
pub enum Update {
    /// A token, with its log-probabilities where the request asked.
    Token(i64, Option<Logprobs>),
    Finished(&'static str),
    Failed(String),
}

pub struct Job {
    pub prompt: Vec<i64>,
    pub max_tokens: usize,
    pub sampling: Sampling,
    pub seed: u64,
    pub stop: Vec<i64>,
    /// Whether to report each token's log-probability, and how many of the
    /// likeliest alternatives with it.
    pub logprobs: Option<usize>,
    /// What the answer must match (a JSON schema, a regex, a grammar).
    pub constraint: Option<Constraint>,
    /// The most tokens drafted a step (n-gram lookup, checked with
    /// `verify_slots`); 0 drafts none.
    pub draft: usize,
    pub updates: UnboundedSender<Update>,
    /// The prompt's tokens found in the prefix cache, set before its first
    /// token is sent.
    pub cached: Arc<AtomicUsize>,
    /// When it left the queue for a row (its queue time's end).
    pub started: Arc<std::sync::OnceLock<Instant>>,
}

struct Row {
    job: Job,
    rng: Rng,
    history: Vec<i64>,
    generated: usize,
    /// The tokens the row's caches and states hold: the position the next
    /// one fed goes to.
    position: usize,
    /// Tokens chosen and not yet fed: the last chosen, and after refused
    /// drafts the kept ones before it.
    pending: Vec<i64>,
}

impl Row {
    /// Up to `job.draft` tokens drafted by n-gram lookup: none under a
    /// constraint (whose state follows each token), none past the tokens
    /// asked for or the caches, and none while refused drafts' kept tokens
    /// wait to be fed alone (`speculative::drafts_wait`).
    fn drafts(&self, limits: &Limits) -> Vec<i64> {
        if self.job.constraint.is_some() || speculative::drafts_wait(self.pending.len(), self.job.draft) {
            return Vec::new();
        }
        let room = self
            .job
            .draft
            .min(self.job.max_tokens.saturating_sub(self.generated + 1))
            .min(limits.max_seq.saturating_sub(self.position + self.pending.len()));
        ngram_draft(&self.history, room)
    }
}

/// The model's limits, known to the HTTP side for validation.
#[derive(Clone)]
pub struct Limits {
    pub model: String,
    pub rows: usize,
    pub max_seq: usize,
    pub vocab: usize,
    /// What the rows' states hold, for the cache's use over its capacity.
    pub states: StateBytes,
    /// Whether the model checks drafts (its `verify_slots` entry).
    pub verifies: bool,
}

/// The bytes of the model's states (the caches and recurrent states every
/// row has): those a row fills position by position (attention's keys
/// and values) and those it holds whole (DeltaNet's state, the
/// convolution's history), per row and in all.
#[derive(Clone, Copy, Debug, Default)]
pub struct StateBytes {
    pub per_position: f64,
    pub per_row: f64,
    pub total: f64,
}

impl StateBytes {
    fn of(model: &linnet_ir::Model, rows: usize, max_seq: usize) -> StateBytes {
        let positional = linnet_exec::rows::positional_states(model);
        let mut states = StateBytes::default();
        for (state, &at_positions) in model.states.iter().zip(&positional) {
            let bytes = (state.shape.iter().product::<usize>() * state.dtype.bytes()) as f64;
            states.total += bytes;
            let row = bytes / rows.max(1) as f64;
            if at_positions {
                states.per_position += row / max_seq.max(1) as f64;
            } else {
                states.per_row += row;
            }
        }
        states
    }

    /// The share of the states that rows hold, each row at its position:
    /// the recurrent states of every row in use and the caches' filled
    /// positions, over all of them (vLLM's `kv_cache_usage_perc`, 0 to 1).
    pub fn usage(&self, positions: impl Iterator<Item = usize>) -> f64 {
        if self.total == 0.0 {
            return 0.0;
        }
        let held: f64 = positions.map(|position| self.per_row + self.per_position * position as f64).sum();
        (held / self.total).clamp(0.0, 1.0)
    }
}

pub fn limits(machine: &Machine) -> Result<Limits, ServeError> {
    let cannot = |why: &str| ServeError::CannotServe(why.to_string());
    let model = machine.model();
    let entry =
        model.entry("decode_rows").ok_or_else(|| cannot("the model has no `decode_rows` entry: it cannot serve"))?;
    model.entry("prefill_slots").ok_or_else(|| cannot("the model has no `prefill_slots` entry: it cannot serve"))?;
    let rows =
        entry.inputs[0].shape[0].as_constant().ok_or_else(|| cannot("`decode_rows` takes a batch of unknown size"))?;
    let output = &entry.nodes[entry.outputs[0].index()];
    let vocab = output.shape.last().and_then(|d| d.as_constant()).ok_or_else(|| cannot("no vocabulary size"))?;
    let (rows, vocab) = (rows as usize, vocab as usize);
    let max_seq = linnet_runtime::generate::cache_positions(machine.model()).unwrap_or(usize::MAX);
    let states = StateBytes::of(model, rows, max_seq);
    let verifies = model.entry("verify_slots").is_some();
    Ok(Limits { model: machine.model().name.clone(), rows, max_seq, vocab, states, verifies })
}

fn logits_rows(logits: &Tensor) -> Vec<&[f32]> {
    let width = *logits.shape.last().expect("[rows, vocab]");
    logits.as_f32().expect("float logits").chunks(width).collect()
}

/// Chooses the row's next token from `logits` and sends it; says whether
/// the row goes on.
fn emit(row: &mut Row, logits: &[f32], limits: &Limits) -> bool {
    if let Some(message) = linnet_runtime::sampling::not_a_number(logits) {
        let _ = row.job.updates.send(Update::Failed(message));
        return false;
    }
    // Under a constraint, the tokens it does not allow are out of reach.
    let masked = match row.job.constraint.as_mut().map(|constraint| constraint.mask(logits)) {
        Some(Ok(masked)) => Some(masked),
        Some(Err(message)) => {
            let _ = row.job.updates.send(Update::Failed(format!("the output constraint failed: {message}")));
            return false;
        }
        None => None,
    };
    let logits = masked.as_deref().unwrap_or(logits);
    let next = row.job.sampling.choose(logits, &row.history, row.generated, &mut row.rng);
    deliver(row, next, logits, limits)
}

/// Sends `next`, chosen from `logits`; says whether the row goes on.
fn deliver(row: &mut Row, next: i64, logits: &[f32], limits: &Limits) -> bool {
    row.history.push(next);
    row.pending.push(next);
    row.generated += 1;
    let logprobs = row.job.logprobs.map(|top| Logprobs::of(logits, next, top));
    if row.job.updates.send(Update::Token(next, logprobs)).is_err() {
        return false;
    }
    let complete = match row.job.constraint.as_mut().map(|constraint| constraint.advance(next)) {
        Some(Ok(complete)) => complete,
        Some(Err(message)) => {
            let _ = row.job.updates.send(Update::Failed(format!("the output constraint failed: {message}")));
            return false;
        }
        None => false,
    };
    // The position the next token would go to.
    let next_position = row.position + row.pending.len();
    let reason = if complete || row.job.stop.contains(&next) {
        Some("stop")
    } else if row.generated >= row.job.max_tokens || next_position >= limits.max_seq {
        Some("length")
    } else {
        None
    };
    if let Some(reason) = reason {
        let _ = row.job.updates.send(Update::Finished(reason));
        return false;
    }
    true
}

/// The scheduler loop: runs until every sender of jobs is gone.
pub fn run_batches(
    mut machine: Machine,
    limits: Limits,
    jobs: mpsc::Receiver<Job>,
    load: &Load,
    mut cache: PrefixCache,
    events: Option<EventSink>,
) {
    let mut rows: Vec<Option<Row>> = (0..limits.rows).map(|_| None).collect();
    let mut queue: VecDeque<Job> = VecDeque::new();
    loop {
        load.note(&rows, &queue, &limits);
        // A drain that ran out of time ends every answer where it is.
        if load.abort.load(Ordering::Acquire) {
            for job in rows.iter_mut().filter_map(Option::take).map(|row| row.job).chain(queue.drain(..)) {
                let _ = job.updates.send(Update::Finished("abort"));
            }
        }
        let busy = rows.iter().any(Option::is_some);
        if !busy && queue.is_empty() {
            match jobs.recv() {
                Ok(job) => queue.push_back(job),
                Err(_) => {
                    // The server stopped, and its prefix cache with it.
                    if let Some(events) = &events {
                        events.publish(vec![KvEvent::AllBlocksCleared]);
                    }
                    return;
                }
            }
        }
        while let Ok(job) = jobs.try_recv() {
            queue.push_back(job);
        }
        // A client that went away frees its row and its place in the queue.
        for slot in rows.iter_mut() {
            if slot.as_ref().is_some_and(|row| row.job.updates.is_closed()) {
                *slot = None;
            }
        }
        queue.retain(|job| !job.updates.is_closed());
        // Admit waiting requests into free rows.
        let free: Vec<usize> = rows.iter().enumerate().filter(|(_, r)| r.is_none()).map(|(at, _)| at).collect();
        let admitted: Vec<(usize, Job)> = free.into_iter().zip(std::iter::from_fn(|| queue.pop_front())).collect();
        if !admitted.is_empty() {
            tracing::debug!(requests = admitted.len(), waiting = queue.len(), "prefill_slots");
            let now = Instant::now();
            for (_, job) in &admitted {
                // Set once: a job is admitted once.
                let _ = job.started.set(now);
            }
            let prompts: Vec<(usize, &[i64])> = admitted.iter().map(|(slot, job)| (*slot, &job.prompt[..])).collect();
            match prefill(&mut machine, &mut cache, &prompts, load) {
                Ok(prefilled) => {
                    for ((slot, job), (cached, row_logits)) in admitted.into_iter().zip(prefilled) {
                        job.cached.store(cached, Ordering::Release);
                        let mut row = Row {
                            rng: Rng::new(job.seed),
                            history: job.prompt.clone(),
                            generated: 0,
                            position: job.prompt.len(),
                            pending: Vec::new(),
                            job,
                        };
                        if emit(&mut row, &row_logits, &limits) {
                            rows[slot] = Some(row);
                        }
                    }
                }
                Err(error) => {
                    for (_, job) in admitted {
                        let _ = job.updates.send(Update::Failed(error.to_string()));
                    }
                }
            }
            load.cache_bytes.store(cache.bytes() as u64, Ordering::Relaxed);
            if let Some(events) = &events {
                let changes = cache.take_events();
                if !changes.is_empty() {
                    events.publish(changes);
                }
            }
        }
        load.note(&rows, &queue, &limits);
        if !rows.iter().any(Option::is_some) {
            continue;
        }
        // One step for every row: one token each through `decode_rows`, or
        // where a row has drafts or tokens to feed again, every row's
        // through `verify_slots`.
        let drafts: Vec<Vec<i64>> =
            rows.iter().map(|slot| slot.as_ref().map_or_else(Vec::new, |row| row.drafts(&limits))).collect();
        let plain = drafts.iter().all(Vec::is_empty) && rows.iter().flatten().all(|row| row.pending.len() == 1);
        let stepped = match plain {
            true => decode_step(&mut machine, &mut rows, &limits),
            false => check_step(&mut machine, &mut rows, &drafts, &limits, load),
        };
        if let Err(error) = stepped {
            for slot in rows.iter_mut() {
                if let Some(row) = slot.take() {
                    let _ = row.job.updates.send(Update::Failed(error.to_string()));
                }
            }
        }
    }
}

/// One token for every row through `decode_rows`; a free row computes
/// along and is ignored.
fn decode_step(machine: &mut Machine, rows: &mut [Option<Row>], limits: &Limits) -> Result<(), RunError> {
    let tokens: Vec<i64> = rows.iter().map(|r| r.as_ref().map_or(0, |row| row.pending[0])).collect();
    let positions: Vec<i64> = rows.iter().map(|r| r.as_ref().map_or(0, |row| row.position as i64)).collect();
    let inputs = vec![
        Tensor::from_i64(Dtype::I32, vec![limits.rows, 1], tokens),
        Tensor::from_i64(Dtype::I32, vec![limits.rows], positions),
    ];
    let outputs = machine.call("decode_rows", inputs)?;
    for (slot, row_logits) in rows.iter_mut().zip(logits_rows(&outputs[0])) {
        if let Some(row) = slot {
            row.position += 1;
            row.pending.clear();
            if !emit(row, row_logits, limits) {
                *slot = None;
            }
        }
    }
    Ok(())
}

/// Every busy row's pending tokens and drafts through `verify_slots` in
/// one call. Drafts are kept by the rejection rule; a row that refused
/// one has its recurrent states put back as before the call (positional
/// caches need nothing) and feeds its kept tokens again with its next
/// step.
fn check_step(
    machine: &mut Machine,
    rows: &mut [Option<Row>],
    drafts: &[Vec<i64>],
    limits: &Limits,
    load: &Load,
) -> Result<(), RunError> {
    let busy: Vec<usize> = rows.iter().enumerate().filter(|(_, r)| r.is_some()).map(|(at, _)| at).collect();
    let row = |slot: usize| rows[slot].as_ref().expect("a busy row");
    let checked: Vec<Vec<i64>> = busy.iter().map(|&slot| [&row(slot).pending[..], &drafts[slot]].concat()).collect();
    let width = checked.iter().map(Vec::len).max().unwrap_or(1);
    let saved: Vec<Option<Vec<Tensor>>> = busy
        .iter()
        .map(|&slot| (!drafts[slot].is_empty()).then(|| machine.recurrent_rows(slot)).transpose())
        .collect::<Result<_, _>>()?;
    let column = |value: &dyn Fn(usize, &[i64]) -> usize| {
        let values = busy.iter().zip(&checked).map(|(&slot, tokens)| value(slot, tokens) as i64).collect();
        Tensor::from_i64(Dtype::I32, vec![busy.len()], values)
    };
    let padded =
        checked.iter().flat_map(|tokens| tokens.iter().copied().chain(std::iter::repeat_n(0, width - tokens.len())));
    let inputs = vec![
        Tensor::from_i64(Dtype::I32, vec![busy.len(), width], padded.collect()),
        column(&|slot, _| slot),
        column(&|slot, _| row(slot).position),
        column(&|_, tokens| tokens.len()),
    ];
    let outputs = machine.call("verify_slots", inputs)?;
    let scores = outputs[0].as_f32().expect("float logits");
    let vocab = limits.vocab;
    for (m, (&slot, saved)) in busy.iter().zip(saved).enumerate() {
        let row = rows[slot].as_mut().expect("a busy row");
        let drafts = &drafts[slot];
        let before = row.pending.len();
        // The logits after the last pending token, then after each draft.
        let first = (m * width + before - 1) * vocab;
        let judged = &scores[first..first + (drafts.len() + 1) * vocab];
        let going = match saved {
            None => {
                row.position += before;
                row.pending.clear();
                emit(row, judged, limits)
            }
            Some(saved) => {
                if let Some(message) = linnet_runtime::sampling::not_a_number(judged) {
                    let _ = row.job.updates.send(Update::Failed(message));
                    rows[slot] = None;
                    continue;
                }
                let (agreed, following) =
                    settle_sampled(drafts, judged, &row.job.sampling, &row.history, row.generated, &mut row.rng);
                load.spec_drafts.fetch_add(1, Ordering::Relaxed);
                load.spec_draft_tokens.fetch_add(drafts.len() as u64, Ordering::Relaxed);
                load.spec_accepted_tokens.fetch_add(agreed as u64, Ordering::Relaxed);
                if agreed < drafts.len() {
                    machine.set_state_rows(slot, &saved)?;
                }
                let tokens = drafts[..agreed].iter().chain([&following]);
                let going =
                    tokens.enumerate().all(|(at, &token)| deliver(row, token, &judged[at * vocab..][..vocab], limits));
                if going && agreed == drafts.len() {
                    // Everything checked is in the states: the kept drafts
                    // too (a row that ended is let go as it is).
                    row.position += before + agreed;
                    row.pending.drain(..before + agreed);
                }
                going
            }
        };
        if !going {
            rows[slot] = None;
        }
    }
    Ok(())
}

/// Prefills `prompts` (each with its row) through `prefill_slots`: each
/// from the longest prefix the cache holds, in parts that end where the
/// cache takes snapshots, the last part of every prompt giving its logits.
/// Returns, for each prompt, its tokens found in the cache and its logits.
fn prefill(
    machine: &mut Machine,
    cache: &mut PrefixCache,
    prompts: &[(usize, &[i64])],
    load: &Load,
) -> Result<Vec<(usize, Vec<f32>)>, RunError> {
    let mut starts = Vec::with_capacity(prompts.len());
    let mut ends: Vec<Vec<usize>> = Vec::with_capacity(prompts.len());
    for &(slot, prompt) in prompts {
        let start = match cache.find(prompt) {
            Some(hit) => {
                machine.set_state_rows(slot, hit.rows)?;
                hit.tokens
            }
            None => 0,
        };
        load.prefix_queries.fetch_add(1, Ordering::Relaxed);
        if start > 0 {
            load.prefix_hits.fetch_add(1, Ordering::Relaxed);
            load.prefix_tokens.fetch_add(start as u64, Ordering::Relaxed);
        }
        let mut parts = cache.save_points(prompt, start);
        parts.push(prompt.len());
        starts.push(start);
        ends.push(parts);
    }
    let found = starts.clone();
    let mut logits: Vec<Vec<f32>> = vec![Vec::new(); prompts.len()];
    for part in 0.. {
        let taking: Vec<usize> = (0..prompts.len()).filter(|&at| part < ends[at].len()).collect();
        if taking.is_empty() {
            break;
        }
        let span = |at: usize| starts[at]..ends[at][part];
        let width = taking.iter().map(|&at| span(at).len()).max().unwrap_or(1);
        let mut tokens = Vec::with_capacity(taking.len() * width);
        for &at in &taking {
            tokens.extend_from_slice(&prompts[at].1[span(at)]);
            tokens.extend(std::iter::repeat_n(0, width - span(at).len()));
        }
        let column = |value: &dyn Fn(usize) -> usize| {
            Tensor::from_i64(Dtype::I32, vec![taking.len()], taking.iter().map(|&at| value(at) as i64).collect())
        };
        let inputs = vec![
            Tensor::from_i64(Dtype::I32, vec![taking.len(), width], tokens),
            column(&|at| prompts[at].0),
            column(&|at| starts[at]),
            column(&|at| span(at).len()),
        ];
        let outputs = machine.call("prefill_slots", inputs)?;
        for (&at, row_logits) in taking.iter().zip(logits_rows(&outputs[0])) {
            let (slot, prompt) = prompts[at];
            let end = ends[at][part];
            if end == prompt.len() {
                logits[at] = row_logits.to_vec();
            } else {
                let rows = machine.state_rows(slot, end)?;
                cache.insert(&prompt[..end], rows);
            }
            starts[at] = end;
        }
    }
    Ok(found.into_iter().zip(logits).collect())
}

/// What the scheduler holds now and what its prefix cache did, for
/// `/metrics`: rows decoding and requests waiting for one; prompts looked
/// up, those that found a prefix, the tokens found, the bytes cached.
#[derive(Default)]
pub struct Load {
    pub running: AtomicUsize,
    pub waiting: AtomicUsize,
    pub prefix_queries: AtomicU64,
    pub prefix_hits: AtomicU64,
    pub prefix_tokens: AtomicU64,
    pub cache_bytes: AtomicU64,
    /// Speculative checks made, tokens drafted, and drafts kept.
    pub spec_drafts: AtomicU64,
    pub spec_draft_tokens: AtomicU64,
    pub spec_accepted_tokens: AtomicU64,
    /// The share of the rows' states in use (`StateBytes::usage`), as f64
    /// bits.
    pub state_usage: AtomicU64,
    /// Set when a drain ran out of time: every answer ends (`"abort"`).
    pub abort: AtomicBool,
}

impl Load {
    fn note(&self, rows: &[Option<Row>], queue: &VecDeque<Job>, limits: &Limits) {
        self.running.store(rows.iter().filter(|row| row.is_some()).count(), Ordering::Relaxed);
        self.waiting.store(queue.len(), Ordering::Relaxed);
        let usage = limits.states.usage(rows.iter().flatten().map(|row| row.position));
        self.state_usage.store(usage.to_bits(), Ordering::Relaxed);
    }

    pub fn usage(&self) -> f64 {
        f64::from_bits(self.state_usage.load(Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recurrent states count whole for each row in use, caches by the
    /// positions filled; nothing in use is 0, every row full is 1.
    #[test]
    fn the_states_use_counts_rows_and_positions() {
        // Two rows of 100 positions: 4 bytes a position, 600 a row whole.
        let states = StateBytes { per_position: 4.0, per_row: 600.0, total: 2.0 * (400.0 + 600.0) };
        assert_eq!(states.usage(std::iter::empty()), 0.0);
        assert_eq!(states.usage([50].into_iter()), (600.0 + 200.0) / 2000.0);
        assert_eq!(states.usage([100, 100].into_iter()), 1.0);
    }
}
