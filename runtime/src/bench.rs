//! `linnet bench`: prefill and decode throughput as `llama-bench` reports
//! them (tokens per second, mean ± sd over repetitions), with the weight
//! bytes a decoded token reads and the bandwidth that achieves.

use crate::generate::batch_rows;
use linnet_compiler::exec::Machine;
use linnet_compiler::tensor::Tensor;
use linnet_compiler::sema::ty::Dtype;
use std::time::Instant;

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
}

fn mean_sd(values: &[f64]) -> (f64, f64) {
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    let variance = if values.len() > 1 { values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (values.len() - 1) as f64 } else { 0.0 };
    (mean, variance.sqrt())
}

/// Runs `repetitions` of: prefill `prompt` tokens, then decode `generate`.
pub fn run(machine: &mut Machine, prompt: usize, generate: usize, repetitions: usize) -> Result<Report, String> {
    let rows = batch_rows(machine)?;
    let vocab = machine.model().entry("decode").and_then(|e| e.nodes[e.outputs[0].index()].shape.last().and_then(|d| d.as_constant())).ok_or("`decode` has no vocabulary-sized output")?;
    let tokens: Vec<i64> = (0..rows * prompt).map(|i| (i as i64 * 7919 + 13) % vocab).collect();
    let mut report = Report {
        model: machine.model().name.clone(),
        weight_bytes: machine.model().param_bytes(),
        rows,
        backend: machine.backend(),
        prompt,
        generate,
        prefill: Vec::new(),
        decode: Vec::new(),
    };
    // One unmeasured round first: it compiles (on the CPU backend) and
    // computes what is hoisted.
    for round in 0..=repetitions {
        let measured = round > 0;
        machine.reset();
        let start = Instant::now();
        let inputs = vec![Tensor::from_i64(Dtype::I32, vec![rows, prompt], tokens.clone()), Tensor::from_i64(Dtype::I32, Vec::new(), vec![0])];
        machine.call("prefill", inputs).map_err(|e| e.to_string())?;
        if measured {
            report.prefill.push((rows * prompt) as f64 / start.elapsed().as_secs_f64());
        }
        let start = Instant::now();
        for step in 0..generate {
            let inputs = vec![
                Tensor::from_i64(Dtype::I32, vec![rows, 1], vec![(step as i64 * 31) % vocab; rows]),
                Tensor::from_i64(Dtype::I32, Vec::new(), vec![(prompt + step) as i64]),
            ];
            machine.call("decode", inputs).map_err(|e| e.to_string())?;
        }
        if measured {
            report.decode.push((rows * generate) as f64 / start.elapsed().as_secs_f64());
        }
    }
    Ok(report)
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let gib = self.weight_bytes as f64 / (1u64 << 30) as f64;
        writeln!(f, "| model | size | backend | test | t/s |")?;
        writeln!(f, "| --- | ---: | --- | ---: | ---: |")?;
        let (pp, pp_sd) = mean_sd(&self.prefill);
        let (tg, tg_sd) = mean_sd(&self.decode);
        writeln!(f, "| {} | {gib:.3} GiB | {} | pp{} | {pp:.2} ± {pp_sd:.2} |", self.model, self.backend, self.prompt)?;
        writeln!(f, "| {} | {gib:.3} GiB | {} | tg{} | {tg:.2} ± {tg_sd:.2} |", self.model, self.backend, self.generate)?;
        let gb = self.weight_bytes as f64 / 1e9;
        let steps = tg / self.rows as f64;
        write!(f, "\n{} row(s); a decode step reads at most {gb:.4} GB of weights (every parameter); at {steps:.2} steps/s that is {:.4} GB/s", self.rows, gb * steps)
    }
}

/// Milliseconds per `decode` step at each of `positions` (mean ± sd over
/// `repetitions`): the cost of a token as the context grows.
pub fn decode_at(machine: &mut Machine, positions: &[usize], repetitions: usize) -> Result<Vec<(usize, f64, f64)>, String> {
    let rows = batch_rows(machine)?;
    let mut results = Vec::new();
    for &position in positions {
        let mut millis = Vec::new();
        for _ in 0..repetitions {
            let inputs = vec![Tensor::from_i64(Dtype::I32, vec![rows, 1], vec![1; rows]), Tensor::from_i64(Dtype::I32, Vec::new(), vec![position as i64])];
            let start = Instant::now();
            machine.call("decode", inputs).map_err(|e| e.to_string())?;
            millis.push(start.elapsed().as_secs_f64() * 1e3);
        }
        let (mean, sd) = mean_sd(&millis);
        results.push((position, mean, sd));
    }
    Ok(results)
}
