//! Every path to logits against the reference implementation's: the
//! random-weight checkpoints and the logits Hugging Face transformers
//! computes for them (`tests/fixtures/oracle`), through the seed package
//! (`models/qwen3.6-35b-a3b`) on the reference interpreter and the CPU
//! backend. f32: within 1e-4 of the largest logit, every argmax and greedy
//! token equal. bf16: within 1e-1, argmax agreement at least 0.8, greedy
//! tokens as `greedy_generation` says.

use linnet_compiler::exec::Machine;
use linnet_compiler::tensor::Tensor;
use linnet_compiler::package::LoadOptions;
use linnet_compiler::sema::ty::Dtype;
use linnet_runtime::generate::{argmax_rows, greedy};
use safetensors::SafeTensors;
use std::path::PathBuf;

fn root() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
}

struct Oracle {
    machine: Machine,
    golden: Vec<Sequence>,
    tolerance: f32,
    min_agreement: f32,
}

struct Sequence {
    tokens: Vec<i64>,
    logits: Vec<Vec<f32>>,
    greedy: Vec<i64>,
}

fn load(config: &str, dtype: &str, backend: linnet_runtime::Backend) -> Oracle {
    let dir = root().join("tests/fixtures/oracle").join(config);
    let options = LoadOptions {
        nest: Some(dir.join(format!("package/nest-{dtype}.toml"))),
        stdlib: Some(root().join("stdlib")),
        ..LoadOptions::default()
    };
    let weights = linnet_runtime::Weights::Checkpoint { dir: Some(dir.join(format!("weights-{dtype}"))), non_finite: linnet_runtime::weights::NonFinite::Refuse };
    let machine = linnet_runtime::load_on(&root().join("models/qwen3.6-35b-a3b"), &options, &weights, backend).unwrap_or_else(|e| panic!("{e}")).machine;
    let bytes = std::fs::read(dir.join(format!("golden-{dtype}.safetensors"))).expect("golden file");
    let file = SafeTensors::deserialize(&bytes).expect("golden safetensors");
    let floats = |name: &str| -> Vec<f32> {
        file.tensor(name).expect(name).data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    };
    let ints = |name: &str| -> Vec<i64> {
        file.tensor(name).expect(name).data().chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as i64).collect()
    };
    let mut golden = Vec::new();
    for n in 0.. {
        if file.tensor(&format!("seq{n}.tokens")).is_err() {
            break;
        }
        let tokens = ints(&format!("seq{n}.tokens"));
        let logits = floats(&format!("seq{n}.logits")).chunks(512).map(<[f32]>::to_vec).collect();
        golden.push(Sequence { tokens, logits, greedy: ints(&format!("seq{n}.greedy")) });
    }
    let (tolerance, min_agreement) = if dtype == "f32" { (1e-4, 1.0) } else { (1e-1, 0.8) };
    Oracle { machine, golden, tolerance, min_agreement }
}

/// Compares rows of logits with the reference rows at the same positions.
struct Score {
    worst: f32,
    agree: usize,
    rows: usize,
}

impl Score {
    fn new() -> Score {
        Score { worst: 0.0, agree: 0, rows: 0 }
    }

    fn add(&mut self, ours: &[f32], reference: &[f32]) {
        let scale = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
        let diff = ours.iter().zip(reference).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        self.worst = self.worst.max(diff / scale);
        let argmax = |row: &[f32]| argmax_rows(&Tensor::from_f32(Dtype::F32, vec![1, row.len()], row.to_vec()))[0];
        self.agree += usize::from(argmax(ours) == argmax(reference));
        self.rows += 1;
    }

    fn check(&self, oracle: &Oracle, what: &str) {
        let agreement = self.agree as f32 / self.rows as f32;
        assert!(self.worst <= oracle.tolerance, "{what}: max|diff|/max|ref| = {:.2e} > {:.0e}", self.worst, oracle.tolerance);
        assert!(agreement >= oracle.min_agreement, "{what}: argmax agreement {agreement:.3} < {}", oracle.min_agreement);
        eprintln!("{what}: max|diff|/max|ref| = {:.2e}, argmax agreement {agreement:.3} over {} rows", self.worst, self.rows);
    }
}

fn tokens(rows: &[&[i64]]) -> Tensor {
    let width = rows[0].len();
    Tensor::from_i64(Dtype::I32, vec![rows.len(), width], rows.iter().flat_map(|r| r.iter().copied()).collect())
}

fn scalar(value: i64) -> Tensor {
    Tensor::from_i64(Dtype::I32, Vec::new(), vec![value])
}

fn rows(logits: &Tensor) -> Vec<Vec<f32>> {
    let width = *logits.shape.last().unwrap();
    logits.as_f32().unwrap().chunks(width).map(<[f32]>::to_vec).collect()
}

fn forward_and_next_token(oracle: &mut Oracle, what: &str) {
    let mut score = Score::new();
    // seq0 and seq1 have one length: one batch.
    let (a, b) = (&oracle.golden[0], &oracle.golden[1]);
    let out = oracle.machine.call("forward", vec![tokens(&[&a.tokens, &b.tokens])]).unwrap().remove(0);
    for (ours, reference) in rows(&out).iter().zip(a.logits.iter().chain(&b.logits)) {
        score.add(ours, reference);
    }
    for seq in &oracle.golden[2..] {
        let out = oracle.machine.call("forward", vec![tokens(&[&seq.tokens])]).unwrap().remove(0);
        for (ours, reference) in rows(&out).iter().zip(&seq.logits) {
            score.add(ours, reference);
        }
    }
    score.check(oracle, &format!("{what} forward"));
    let mut score = Score::new();
    for seq in &oracle.golden {
        let out = oracle.machine.call("next_token", vec![tokens(&[&seq.tokens])]).unwrap().remove(0);
        score.add(&rows(&out)[0], seq.logits.last().unwrap());
    }
    score.check(oracle, &format!("{what} next_token"));
}

/// `prefill` of a prefix of seq0 and seq1 (one per row), then `decode` of
/// the rest, one token at a time.
fn prefill_then_decode(oracle: &mut Oracle, what: &str) {
    let mut score = Score::new();
    let (a, b) = (oracle.golden[0].tokens.clone(), oracle.golden[1].tokens.clone());
    let prefix = 6;
    oracle.machine.reset();
    let out = oracle.machine.call("prefill", vec![tokens(&[&a[..prefix], &b[..prefix]]), scalar(0)]).unwrap().remove(0);
    let rows_out = rows(&out);
    score.add(&rows_out[0], &oracle.golden[0].logits[prefix - 1]);
    score.add(&rows_out[1], &oracle.golden[1].logits[prefix - 1]);
    for position in prefix..a.len() {
        let step = vec![tokens(&[&a[position..=position], &b[position..=position]]), scalar(position as i64)];
        let rows_out = rows(&oracle.machine.call("decode", step).unwrap().remove(0));
        score.add(&rows_out[0], &oracle.golden[0].logits[position]);
        score.add(&rows_out[1], &oracle.golden[1].logits[position]);
    }
    score.check(oracle, &format!("{what} prefill+decode"));
}

/// `prefill_slots` of prefixes of seq2 and seq3 (different lengths) into
/// rows 1 and 0, then `decode_rows` with each row at its own position.
fn slots_then_rows(oracle: &mut Oracle, what: &str) {
    let mut score = Score::new();
    let (long, short) = (oracle.golden[2].tokens.clone(), oracle.golden[3].tokens.clone());
    let (long_prefix, short_prefix) = (7, 2);
    let mut padded_short = short[..short_prefix].to_vec();
    padded_short.resize(long_prefix, 0);
    oracle.machine.reset();
    let prompts = tokens(&[&long[..long_prefix], &padded_short]);
    let slots = Tensor::from_i64(Dtype::I32, vec![2], vec![1, 0]);
    let lengths = Tensor::from_i64(Dtype::I32, vec![2], vec![long_prefix as i64, short_prefix as i64]);
    let rows_out = rows(&oracle.machine.call("prefill_slots", vec![prompts, slots, lengths]).unwrap().remove(0));
    score.add(&rows_out[0], &oracle.golden[2].logits[long_prefix - 1]);
    score.add(&rows_out[1], &oracle.golden[3].logits[short_prefix - 1]);
    let (mut at_long, mut at_short) = (long_prefix, short_prefix);
    while at_long < long.len() || at_short < short.len() {
        // Row 0 holds the short sequence, row 1 the long one; a finished
        // row computes along and is ignored.
        let token_short = short.get(at_short).copied().unwrap_or(0);
        let token_long = long.get(at_long).copied().unwrap_or(0);
        let step = vec![
            tokens(&[&[token_short], &[token_long]]),
            Tensor::from_i64(Dtype::I32, vec![2], vec![at_short.min(63) as i64, at_long.min(63) as i64]),
        ];
        let rows_out = rows(&oracle.machine.call("decode_rows", step).unwrap().remove(0));
        if at_short < short.len() {
            score.add(&rows_out[0], &oracle.golden[3].logits[at_short]);
        }
        if at_long < long.len() {
            score.add(&rows_out[1], &oracle.golden[2].logits[at_long]);
        }
        at_long += 1;
        at_short += 1;
    }
    score.check(oracle, &format!("{what} prefill_slots+decode_rows"));
}

/// Greedy tokens against the reference's: all of them in f32; in bf16,
/// where rounding in another order than transformers' makes a sequence
/// part ways after a while, the first token of every sequence and at least
/// `BF16_GREEDY_PREFIX` of the 60 tokens before each sequence's first
/// difference (what the reference interpreter reaches).
fn greedy_generation(oracle: &mut Oracle, what: &str, exact: bool) {
    const BF16_GREEDY_PREFIX: usize = 39;
    let mut equal = 0;
    let mut total = 0;
    for seq in &oracle.golden {
        let ours = greedy(&mut oracle.machine, &seq.tokens, seq.greedy.len()).unwrap();
        if exact {
            assert_eq!(ours, seq.greedy, "{what}: greedy tokens after {:?}", seq.tokens);
        }
        assert_eq!(ours.first(), seq.greedy.first(), "{what}: the first greedy token after {:?}", seq.tokens);
        equal += ours.iter().zip(&seq.greedy).take_while(|(a, b)| a == b).count();
        total += seq.greedy.len();
    }
    eprintln!("{what} greedy: {equal} of {total} tokens equal before the first difference");
    assert!(exact || equal >= BF16_GREEDY_PREFIX, "{what}: {equal} of {total} greedy tokens equal before the first difference, under {BF16_GREEDY_PREFIX}");
}

fn every_path(config: &str, dtype: &str, backend: linnet_runtime::Backend) {
    let mut oracle = load(config, dtype, backend);
    let what = format!("{dtype} {backend:?}");
    forward_and_next_token(&mut oracle, &what);
    prefill_then_decode(&mut oracle, &what);
    slots_then_rows(&mut oracle, &what);
    greedy_generation(&mut oracle, &what, dtype == "f32");
}

#[test]
fn f32_every_path_matches_the_reference() {
    every_path("tiny-qwen3.5-moe", "f32", linnet_runtime::Backend::Interp);
}

#[test]
fn bf16_every_path_matches_the_reference() {
    every_path("tiny-qwen3.5-moe-calm", "bf16", linnet_runtime::Backend::Interp);
}

#[test]
fn f32_every_path_matches_the_reference_on_cpu() {
    every_path("tiny-qwen3.5-moe", "f32", linnet_runtime::Backend::Cpu);
}

#[test]
fn bf16_every_path_matches_the_reference_on_cpu() {
    every_path("tiny-qwen3.5-moe-calm", "bf16", linnet_runtime::Backend::Cpu);
}
