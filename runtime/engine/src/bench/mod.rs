//! `linnet bench`: prefill and decode throughput as `llama-bench` reports
//! them (tokens per second, mean ± sd over repetitions), with the weight
//! bytes a decode step's contractions read (counted by the CPU backend's
//! matrix kernel) and the bandwidth that achieves.

use crate::generate::batch_rows;
use crate::Error;
use linnet_exec::tensor::Tensor;
use linnet_exec::{Machine, Profile};
use linnet_ir::Dtype;
use std::time::Instant;

pub mod speculative;

pub struct Report {
    pub model: String,
    pub weight_bytes: usize,
    /// Batch rows: each step makes one token per row.
    pub rows: usize,
    pub backend: &'static str,
    pub prompt: usize,
    pub generate: usize,
    pub prefill: Vec<f64>,
    pub decode: Vec<f64>,
    /// Weight bytes a decode step's contractions read (the CPU backend's
    /// matrix kernel counts them: the chosen experts, not every one).
    pub step_bytes: Option<f64>,
    /// Where the last measured prefill's and decode's time went.
    pub prefill_profile: Option<Profile>,
    pub decode_profile: Option<Profile>,
}

fn mean_sd(values: &[f64]) -> (f64, f64) {
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    let variance = if values.len() > 1 {
        values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (values.len() - 1) as f64
    } else {
        0.0
    };
    (mean, variance.sqrt())
}

/// The size of the model's vocabulary: its `decode` logits' width.
fn vocab(machine: &Machine) -> Result<i64, Error> {
    machine
        .model()
        .entry("decode")
        .and_then(|e| e.nodes[e.outputs[0].index()].shape.last().and_then(|d| d.as_constant()))
        .ok_or_else(|| Error::Input("`decode` has no vocabulary-sized output".into()))
}

/// `count` prompt tokens spread over a vocabulary of `vocab`.
fn counting(count: usize, vocab: i64) -> Vec<i64> {
    (0..count).map(|i| (i as i64 * 7919 + 13) % vocab).collect()
}

/// Runs `repetitions` of: prefill `prompt` tokens, then decode `generate`
/// (either may be 0: then that phase is skipped and not reported, and
/// decode starts from empty states at position 0, as `llama-bench -p 0`).
/// With `profile`, the report says where the measured calls' time went.
pub fn run(
    machine: &mut Machine,
    prompt: usize,
    generate: usize,
    repetitions: usize,
    profile: bool,
) -> Result<Report, Error> {
    let rows = batch_rows(machine)?;
    let vocab = vocab(machine)?;
    let tokens = counting(rows * prompt, vocab);
    let mut report = Report {
        model: machine.model().name.clone(),
        weight_bytes: machine.model().param_bytes(),
        rows,
        backend: machine.backend(),
        prompt,
        generate,
        prefill: Vec::new(),
        decode: Vec::new(),
        step_bytes: None,
        prefill_profile: None,
        decode_profile: None,
    };
    // One unmeasured round first: it compiles (on the CPU backend) and
    // computes what is hoisted.
    for round in 0..=repetitions {
        let measured = round > 0;
        machine.reset()?;
        if prompt > 0 {
            machine.set_profiling(profile && measured);
            let start = Instant::now();
            let inputs = vec![
                Tensor::from_i64(Dtype::I32, vec![rows, prompt], tokens.clone()),
                Tensor::from_i64(Dtype::I32, Vec::new(), vec![0]),
            ];
            machine.call("prefill", inputs)?;
            if measured {
                report.prefill.push((rows * prompt) as f64 / start.elapsed().as_secs_f64());
                report.prefill_profile = machine.profile();
            }
        }
        machine.set_profiling(profile && measured);
        let start = Instant::now();
        let bytes_before = machine.weight_bytes_read();
        for step in 0..generate {
            let inputs = vec![
                Tensor::from_i64(Dtype::I32, vec![rows, 1], vec![(step as i64 * 31) % vocab; rows]),
                Tensor::from_i64(Dtype::I32, Vec::new(), vec![(prompt + step) as i64]),
            ];
            machine.call("decode", inputs)?;
        }
        if measured && generate > 0 {
            report.decode.push((rows * generate) as f64 / start.elapsed().as_secs_f64());
            if let (Some(before), Some(after)) = (bytes_before, machine.weight_bytes_read()) {
                report.step_bytes = Some((after - before) as f64 / generate as f64);
            }
            report.decode_profile = machine.profile();
        }
        machine.set_profiling(false);
    }
    Ok(report)
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gib = self.weight_bytes as f64 / (1u64 << 30) as f64;
        writeln!(f, "| model | size | backend | test | t/s |")?;
        writeln!(f, "| --- | ---: | --- | ---: | ---: |")?;
        for (test, size, rates) in [("pp", self.prompt, &self.prefill), ("tg", self.generate, &self.decode)] {
            if size > 0 {
                let (mean, sd) = mean_sd(rates);
                writeln!(
                    f,
                    "| {} | {gib:.3} GiB | {} | {test}{size} | {mean:.2} ± {sd:.2} |",
                    self.model, self.backend
                )?;
            }
        }
        if self.generate > 0 {
            let steps = mean_sd(&self.decode).0 / self.rows as f64;
            write!(f, "\n{} row(s); {steps:.2} decode steps/s", self.rows)?;
            match self.step_bytes {
                Some(bytes) => {
                    let gb = bytes / 1e9;
                    write!(f, "; a step's contractions read {gb:.4} GB of weights (counted as read: of experts, the chosen ones), {:.2} GB/s", gb * steps)?
                }
                None => write!(
                    f,
                    "; a step reads at most {:.4} GB of weights (every parameter)",
                    self.weight_bytes as f64 / 1e9
                )?,
            }
        }
        for (what, profile) in [("prefill", &self.prefill_profile), ("decode", &self.decode_profile)] {
            if let Some(profile) = profile {
                write!(f, "\n\n{what}, by kind of node:\n{profile}")?;
            }
        }
        Ok(())
    }
}

/// Milliseconds per `decode` step at each of `positions` (mean ± sd over
/// `repetitions`): the cost of a token as the context grows.
pub fn decode_at(
    machine: &mut Machine,
    positions: &[usize],
    repetitions: usize,
) -> Result<Vec<(usize, f64, f64)>, Error> {
    let rows = batch_rows(machine)?;
    let mut results = Vec::new();
    for &position in positions {
        let mut millis = Vec::new();
        for _ in 0..repetitions {
            let inputs = vec![
                Tensor::from_i64(Dtype::I32, vec![rows, 1], vec![1; rows]),
                Tensor::from_i64(Dtype::I32, Vec::new(), vec![position as i64]),
            ];
            let start = Instant::now();
            machine.call("decode", inputs)?;
            millis.push(start.elapsed().as_secs_f64() * 1e3);
        }
        let (mean, sd) = mean_sd(&millis);
        results.push((position, mean, sd));
    }
    Ok(results)
}
