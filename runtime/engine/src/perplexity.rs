//! `linnet perplexity`: how well a model predicts a text, computed as
//! llama.cpp's `llama-perplexity` computes it. The text is tokenized whole
//! and cut into chunks of `ctx` tokens; each chunk is one call of the
//! model's `forward` entry, and only the tokens of its second half are
//! scored (each from the logits at the position before it), so every
//! scored token has at least `ctx / 2` tokens before it.
//!
//! Against a base (the same text through the full-precision model, saved
//! with [`BaseWriter`] in llama.cpp's `--kl-divergence-base` file format,
//! so either tool reads the other's), [`Divergence`] gathers what
//! `--kl-divergence` reports: the KL divergence of each scored position's
//! distribution from the base's, the change in the probability of the
//! right token, and how often both put the same token on top.

use linnet_exec::tensor::Tensor;
use linnet_exec::Machine;
use linnet_ir::Dtype;
use std::fmt;
use std::io::{Read, Write};

/// What stops a perplexity run, as data.
#[derive(Debug)]
pub enum PerplexityError {
    /// The text is shorter than two chunks.
    TooShort { tokens: usize, ctx: usize },
    /// The context is too small to score anything.
    ContextTooSmall(usize),
    /// A base file that cannot be read or written, or is not one.
    Base { path: String, message: String },
    /// The model's call failed.
    Run(String),
}

impl fmt::Display for PerplexityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PerplexityError::TooShort { tokens, ctx } => write!(
                f,
                "the text makes {tokens} tokens; a context of {ctx} needs at least {} (two chunks): give a longer \
                 text or a smaller --ctx-size",
                2 * ctx
            ),
            PerplexityError::ContextTooSmall(ctx) => {
                write!(f, "--ctx-size {ctx} scores no token: give at least 4")
            }
            PerplexityError::Base { path, message } => write!(f, "{path}: {message}"),
            PerplexityError::Run(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for PerplexityError {}

/// The chunks of `tokens` that are scored: `ctx` tokens each, at most
/// `limit` of them.
pub fn chunks(tokens: &[i64], ctx: usize, limit: Option<usize>) -> Result<Vec<&[i64]>, PerplexityError> {
    if ctx < 4 {
        return Err(PerplexityError::ContextTooSmall(ctx));
    }
    if tokens.len() < 2 * ctx {
        return Err(PerplexityError::TooShort { tokens: tokens.len(), ctx });
    }
    let count = (tokens.len() / ctx).min(limit.unwrap_or(usize::MAX));
    Ok(tokens.chunks_exact(ctx).take(count).collect())
}

/// The logits `[ctx, vocab]` of one chunk: one call of the `forward`
/// entry, the chunk alone (no state carried from the chunk before).
pub fn chunk_logits(machine: &mut Machine, chunk: &[i64]) -> Result<Vec<f32>, PerplexityError> {
    let tokens = Tensor::from_i64(Dtype::I32, vec![1, chunk.len()], chunk.to_vec());
    let logits = machine.call("forward", vec![tokens]).map_err(|e| PerplexityError::Run(e.to_string()))?.remove(0);
    let logits = logits.widened();
    logits.as_f32().map(<[f32]>::to_vec).ok_or_else(|| PerplexityError::Run("`forward` gave no float logits".into()))
}

/// The first position of a chunk whose logits are scored.
pub fn first_scored(ctx: usize) -> usize {
    ctx / 2
}

/// The natural log of the sum of `exp` over `row`, and its largest value's
/// index.
fn log_sum_exp(row: &[f32]) -> (f64, usize) {
    let (top, max) =
        row.iter().enumerate().fold((0, f32::NEG_INFINITY), |best, (at, &v)| if v > best.1 { (at, v) } else { best });
    let sum: f64 = row.iter().map(|&v| f64::from(v - max).exp()).sum();
    (f64::from(max) + sum.ln(), top)
}

/// Sums of negative log-likelihoods: the perplexity and its uncertainty.
#[derive(Clone, Copy, Debug, Default)]
pub struct Likelihood {
    sum: f64,
    sum_squares: f64,
    count: usize,
}

impl Likelihood {
    fn add(&mut self, nll: f64) {
        self.sum += nll;
        self.sum_squares += nll * nll;
        self.count += 1;
    }

    /// Scores a chunk: `logits` `[ctx, vocab]` for `chunk`'s tokens.
    pub fn score(&mut self, chunk: &[i64], logits: &[f32], vocab: usize) {
        for at in first_scored(chunk.len())..chunk.len() - 1 {
            let row = &logits[at * vocab..(at + 1) * vocab];
            let (total, _) = log_sum_exp(row);
            self.add(total - f64::from(row[chunk[at + 1] as usize]));
        }
    }

    /// The tokens scored.
    pub fn count(&self) -> usize {
        self.count
    }

    /// The mean negative log-likelihood and its standard error.
    fn mean(&self) -> (f64, f64) {
        mean_and_uncertainty(self.sum, self.sum_squares, self.count)
    }

    /// The perplexity, `exp` of the mean negative log-likelihood, and its
    /// uncertainty as llama.cpp states it.
    pub fn perplexity(&self) -> (f64, f64) {
        let (mean, error) = self.mean();
        let ppl = mean.exp();
        (ppl, ppl * error)
    }
}

/// A mean from sums and its standard error, as llama.cpp computes them.
fn mean_and_uncertainty(sum: f64, sum_squares: f64, count: usize) -> (f64, f64) {
    if count == 0 {
        return (0.0, 0.0);
    }
    let mean = sum / count as f64;
    let variance = sum_squares / count as f64 - mean * mean;
    let error = if variance > 0.0 && count > 1 { (variance / (count - 1) as f64).sqrt() } else { 0.0 };
    (mean, error)
}

/// The file's first bytes.
const MAGIC: &[u8; 8] = b"_logits_";

/// The `u16` slots a scored position takes in a base file: two `f32`
/// (scale and least log-probability), then one per token, padded even.
fn slots(vocab: usize) -> usize {
    2 * vocab.div_ceil(2) + 4
}

/// Writes a base file: the header, the tokens of every chunk, then each
/// chunk's scored positions' log-probabilities, quantized to 16 bits over
/// the 16 nats below the largest (llama.cpp's format).
pub struct BaseWriter<W: Write> {
    out: W,
    vocab: usize,
}

impl<W: Write> BaseWriter<W> {
    pub fn new(mut out: W, ctx: usize, vocab: usize, chunks: &[&[i64]]) -> std::io::Result<BaseWriter<W>> {
        out.write_all(MAGIC)?;
        out.write_all(&(ctx as u32).to_le_bytes())?;
        out.write_all(&(vocab as i32).to_le_bytes())?;
        out.write_all(&(chunks.len() as i32).to_le_bytes())?;
        for token in chunks.iter().flat_map(|chunk| chunk.iter()) {
            out.write_all(&(*token as i32).to_le_bytes())?;
        }
        Ok(BaseWriter { out, vocab })
    }

    /// Writes a chunk's scored positions from its `logits` `[ctx, vocab]`.
    pub fn chunk(&mut self, ctx: usize, logits: &[f32]) -> std::io::Result<()> {
        let vocab = self.vocab;
        let mut bytes = Vec::with_capacity(slots(vocab) * 2);
        for at in first_scored(ctx)..ctx - 1 {
            bytes.clear();
            let row = &logits[at * vocab..(at + 1) * vocab];
            let (total, top) = log_sum_exp(row);
            let max = row[top];
            let min = row.iter().copied().fold(f32::INFINITY, f32::min).max(max - 16.0);
            let least = min - total as f32;
            let scale = (max - min) / 65535.0;
            bytes.extend_from_slice(&scale.to_le_bytes());
            bytes.extend_from_slice(&least.to_le_bytes());
            for &logit in row {
                let level = if scale > 0.0 && logit > min { ((logit - min) / scale).round() as u16 } else { 0 };
                bytes.extend_from_slice(&level.to_le_bytes());
            }
            bytes.resize(slots(vocab) * 2, 0);
            self.out.write_all(&bytes)?;
        }
        Ok(())
    }

    pub fn finish(mut self) -> std::io::Result<W> {
        self.out.flush()?;
        Ok(self.out)
    }
}

/// A base file read back: its context, vocabulary, tokens by chunk, and
/// each scored position's log-probabilities.
#[derive(Debug)]
pub struct Base {
    pub ctx: usize,
    pub vocab: usize,
    pub tokens: Vec<i64>,
    /// Per chunk, per scored position: the `u16` slots.
    rows: Vec<u16>,
}

impl Base {
    pub fn read(mut input: impl Read, path: &str) -> Result<Base, PerplexityError> {
        let fail = |message: String| PerplexityError::Base { path: path.to_string(), message };
        let mut magic = [0u8; 8];
        input.read_exact(&mut magic).map_err(|e| fail(e.to_string()))?;
        if &magic != MAGIC {
            return Err(fail("not a file of base log-probabilities (`--kl-divergence-base`)".into()));
        }
        let mut word = [0u8; 4];
        let mut next = |what: &str| -> Result<i64, PerplexityError> {
            input.read_exact(&mut word).map_err(|e| fail(format!("its {what}: {e}")))?;
            Ok(i64::from(i32::from_le_bytes(word)))
        };
        let (ctx, vocab, chunks) = (next("context")?, next("vocabulary")?, next("chunk count")?);
        if ctx < 4 || vocab < 1 || chunks < 1 {
            return Err(fail(format!("a context of {ctx}, a vocabulary of {vocab} and {chunks} chunks make no base")));
        }
        let (ctx, vocab, chunks) = (ctx as usize, vocab as usize, chunks as usize);
        let tokens = (0..ctx * chunks).map(|_| next("tokens")).collect::<Result<Vec<i64>, _>>()?;
        if let Some(bad) = tokens.iter().find(|&&token| token < 0 || token as usize >= vocab) {
            return Err(fail(format!("token {bad} is outside its vocabulary of {vocab}")));
        }
        let expected = chunks * (ctx - 1 - first_scored(ctx)) * slots(vocab);
        let mut bytes = Vec::new();
        input.read_to_end(&mut bytes).map_err(|e| fail(e.to_string()))?;
        if bytes.len() != expected * 2 {
            return Err(fail(format!(
                "{} bytes of log-probabilities where its header says {}",
                bytes.len(),
                expected * 2
            )));
        }
        let rows = bytes.chunks_exact(2).map(|pair| u16::from_le_bytes([pair[0], pair[1]])).collect();
        Ok(Base { ctx, vocab, tokens, rows })
    }

    /// The chunks of tokens the base scored.
    pub fn chunks(&self) -> Vec<&[i64]> {
        self.tokens.chunks_exact(self.ctx).collect()
    }

    /// The slots of chunk `chunk`'s scored position `at` (from the first
    /// scored).
    fn row(&self, chunk: usize, at: usize) -> &[u16] {
        let per_chunk = self.ctx - 1 - first_scored(self.ctx);
        let start = (chunk * per_chunk + at) * slots(self.vocab);
        &self.rows[start..start + slots(self.vocab)]
    }
}

/// What `--kl-divergence` gathers over the scored positions.
#[derive(Default)]
pub struct Divergence {
    likelihood: Likelihood,
    base: Likelihood,
    /// Sum of the products of the two negative log-likelihoods.
    cross: f64,
    divergences: Vec<f64>,
    probability_changes: Vec<f64>,
    same_top: usize,
}

impl Divergence {
    /// Compares chunk `index` of `base` with the model's `logits` for it.
    pub fn chunk(&mut self, base: &Base, index: usize, logits: &[f32]) {
        let (ctx, vocab) = (base.ctx, base.vocab);
        let chunk = &base.tokens[index * ctx..(index + 1) * ctx];
        for (row_at, at) in (first_scored(ctx)..ctx - 1).enumerate() {
            let row = &logits[at * vocab..(at + 1) * vocab];
            let slots = base.row(index, row_at);
            let scale = f32::from_le_bytes(u16_pair(slots[0], slots[1]));
            let least = f32::from_le_bytes(u16_pair(slots[2], slots[3]));
            let base_log_p = |token: usize| f64::from(scale * f32::from(slots[4 + token]) + least);
            let (total, top) = log_sum_exp(row);
            let next = chunk[at + 1] as usize;
            let nll = total - f64::from(row[next]);
            let nll_base = -base_log_p(next);
            self.likelihood.add(nll);
            self.base.add(nll_base);
            self.cross += nll * nll_base;
            let mut divergence = 0.0;
            let mut base_top = (0, f64::NEG_INFINITY);
            for (token, &logit) in row.iter().enumerate() {
                let log_p_base = base_log_p(token);
                if log_p_base > base_top.1 {
                    base_top = (token, log_p_base);
                }
                if log_p_base > -16.0 {
                    divergence += log_p_base.exp() * (log_p_base - (f64::from(logit) - total));
                }
            }
            self.divergences.push(divergence);
            self.probability_changes.push((-nll).exp() - (-nll_base).exp());
            self.same_top += usize::from(top == base_top.0);
        }
    }

    /// The report, in llama.cpp's words.
    pub fn report(&self) -> String {
        let count = self.likelihood.count;
        let (ppl, ppl_error) = self.likelihood.perplexity();
        let (base_ppl, base_error) = self.base.perplexity();
        let (log_q, log_q_error) = self.likelihood.mean();
        let (log_base, log_base_error) = self.base.mean();
        let covariance =
            if count > 1 { (self.cross / count as f64 - log_q * log_base) / (count - 1) as f64 } else { 0.0 };
        let ratio = log_q - log_base;
        let ratio_error = (log_q_error.powi(2) + log_base_error.powi(2) - 2.0 * covariance).max(0.0).sqrt();
        let sum: f64 = self.divergences.iter().sum();
        let squares: f64 = self.divergences.iter().map(|d| d * d).sum();
        let (kld, kld_error) = mean_and_uncertainty(sum, squares, count);
        let mut sorted = self.divergences.clone();
        sorted.sort_by(f64::total_cmp);
        let changes: f64 = self.probability_changes.iter().sum();
        let changes_squared: f64 = self.probability_changes.iter().map(|p| p * p).sum();
        let (mean_change, change_error) = mean_and_uncertainty(changes, changes_squared, count);
        let rms_change = (changes_squared / count.max(1) as f64).sqrt();
        let same = self.same_top as f64 / count.max(1) as f64;
        let same_error = if count > 1 { (same * (1.0 - same) / (count - 1) as f64).sqrt() } else { 0.0 };
        let mut out = String::new();
        let mut line = |text: String| {
            out.push_str(&text);
            out.push('\n');
        };
        line("====== Perplexity statistics ======".into());
        line(format!("Mean PPL(Q)                   : {ppl:10.6} ± {ppl_error:10.6}"));
        line(format!("Mean PPL(base)                : {base_ppl:10.6} ± {base_error:10.6}"));
        line(format!("Mean ln(PPL(Q)/PPL(base))     : {ratio:10.6} ± {ratio_error:10.6}"));
        line(format!("Mean PPL(Q)/PPL(base)         : {:10.6} ± {:10.6}", ratio.exp(), ratio.exp() * ratio_error));
        line(String::new());
        line("====== KL divergence statistics ======".into());
        line(format!("Mean    KLD: {kld:10.6} ± {kld_error:10.6}"));
        line(format!("Maximum KLD: {:10.6}", sorted.last().copied().unwrap_or(0.0)));
        line(format!("99.9%   KLD: {:10.6}", percentile(&sorted, 0.999)));
        line(format!("99.0%   KLD: {:10.6}", percentile(&sorted, 0.990)));
        line(format!("95.0%   KLD: {:10.6}", percentile(&sorted, 0.950)));
        line(format!("Median  KLD: {:10.6}", percentile(&sorted, 0.5)));
        line(format!("Minimum KLD: {:10.6}", sorted.first().copied().unwrap_or(0.0)));
        line(String::new());
        line("====== Token probability statistics ======".into());
        line(format!("Mean    Δp: {:6.3} ± {:5.3} %", 100.0 * mean_change, 100.0 * change_error));
        line(format!("RMS Δp    : {:6.3} %", 100.0 * rms_change));
        line(format!("Same top p: {:6.3} ± {:5.3} %", 100.0 * same, 100.0 * same_error));
        line(String::new());
        line(format!("Final estimate: PPL = {ppl:.4} +/- {ppl_error:.5}"));
        out
    }

    /// The mean KL divergence, its 99th percentile, and the share of
    /// positions whose top token is the base's.
    pub fn summary(&self) -> (f64, f64, f64) {
        let count = self.divergences.len().max(1) as f64;
        let mut sorted = self.divergences.clone();
        sorted.sort_by(f64::total_cmp);
        (self.divergences.iter().sum::<f64>() / count, percentile(&sorted, 0.99), self.same_top as f64 / count)
    }

    /// The model's own likelihood of the text.
    pub fn likelihood(&self) -> &Likelihood {
        &self.likelihood
    }
}

fn u16_pair(low: u16, high: u16) -> [u8; 4] {
    let (a, b) = (low.to_le_bytes(), high.to_le_bytes());
    [a[0], a[1], b[0], b[1]]
}

/// The value at `fraction` of sorted `values`, interpolated between
/// neighbours, as llama.cpp reads percentiles.
fn percentile(sorted: &[f64], fraction: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        n => {
            let position = fraction * (n - 1) as f64;
            let below = position.floor() as usize;
            let above = (below + 1).min(n - 1);
            let part = position - below as f64;
            (1.0 - part) * sorted[below] + part * sorted[above]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Uniform logits over `vocab` tokens: every token has likelihood
    /// `1/vocab`, so the perplexity is the vocabulary's size, exactly.
    #[test]
    fn uniform_logits_have_the_vocabulary_as_perplexity() {
        let (ctx, vocab) = (8, 5);
        let tokens: Vec<i64> = (0..20).map(|i| i % 5).collect();
        let chunks = chunks(&tokens, ctx, None).unwrap();
        assert_eq!(chunks.len(), 2);
        let mut likelihood = Likelihood::default();
        for chunk in &chunks {
            likelihood.score(chunk, &vec![0.25; ctx * vocab], vocab);
        }
        // Positions 4, 5, 6 of each chunk predict 5, 6, 7.
        assert_eq!(likelihood.count(), 6);
        let (ppl, error) = likelihood.perplexity();
        assert!((ppl - 5.0).abs() < 1e-12, "{ppl}");
        assert_eq!(error, 0.0);
    }

    #[test]
    fn a_text_of_less_than_two_chunks_is_refused() {
        let error = chunks(&[1, 2, 3], 2, None).unwrap_err();
        assert!(matches!(error, PerplexityError::ContextTooSmall(2)), "{error}");
        let error = chunks(&[0; 15], 8, None).unwrap_err();
        assert!(error.to_string().contains("needs at least 16"), "{error}");
    }

    /// A model compared with its own base: no divergence, the same top
    /// token everywhere, the same perplexity (within the base's 16-bit
    /// quantization); the file reads back as written.
    #[test]
    fn a_model_does_not_diverge_from_its_own_base() {
        let (ctx, vocab) = (8, 6);
        let tokens: Vec<i64> = (0..16).map(|i| (i * 7 + 3) % 6).collect();
        let chunks = chunks(&tokens, ctx, None).unwrap();
        let logits: Vec<f32> = (0..ctx * vocab).map(|i| ((i * 37 % 11) as f32) * 0.3 - 1.0).collect();
        let mut writer = BaseWriter::new(Vec::new(), ctx, vocab, &chunks).unwrap();
        let mut likelihood = Likelihood::default();
        for chunk in &chunks {
            writer.chunk(ctx, &logits).unwrap();
            likelihood.score(chunk, &logits, vocab);
        }
        let bytes = writer.finish().unwrap();
        let base = Base::read(bytes.as_slice(), "base").unwrap();
        assert_eq!(base.tokens, tokens);
        let mut divergence = Divergence::default();
        for index in 0..base.chunks().len() {
            divergence.chunk(&base, index, &logits);
        }
        let (mean, high, same) = divergence.summary();
        // The base is kept to 16 bits a log-probability: near zero, not zero.
        assert!(mean.abs() < 1e-4 && high.abs() < 1e-4, "{mean} {high}");
        assert_eq!(same, 1.0);
        let (ppl, _) = divergence.likelihood().perplexity();
        assert!((ppl - likelihood.perplexity().0).abs() < 1e-12);
        assert!(divergence.report().contains("Same top p: 100.000"), "{}", divergence.report());
    }

    #[test]
    fn a_file_that_is_not_a_base_is_named() {
        let error = Base::read(&b"_logits_\x08\0\0\0"[..], "x.bin").unwrap_err().to_string();
        assert!(error.starts_with("x.bin: its vocabulary"), "{error}");
        let error = Base::read(&b"not a base file"[..], "y.bin").unwrap_err().to_string();
        assert!(error.contains("not a file of base log-probabilities"), "{error}");
    }
}
