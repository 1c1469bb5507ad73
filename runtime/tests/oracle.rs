//! Every path to logits against the reference implementation's: the
//! random-weight checkpoints and the logits Hugging Face transformers
//! computes for them (`tests/fixtures/oracle`), through the seed package
//! (`models/qwen3.6-35b-a3b`), the dense one (`models/qwen3.8-27b`) and
//! the plain Qwen3 decoder (`models/qwen3-8b`), these two given their
//! generics as `--set` would, on the reference interpreter and
//! the CPU backend, and the seed on the GPU kernels, run on the host by MLIR
//! (with `--features nvptx`) and on an NVIDIA GPU (with `--features
//! nvptx,cuda`, ignored unless asked for: the PTX is built when the
//! artifact has none). f32: within 1e-4 of the largest logit, every argmax and
//! greedy token equal. bf16: on the calm checkpoint within 1e-1 on every
//! row; on a unit-scale one (chaotic: a rounding flips choices) the median
//! row within 1e-1 and the worst within twice the distance between
//! transformers' own f32 and bf16 runs; argmax agreement at least 0.8 on
//! the positions those two runs agree on; greedy tokens as
//! `greedy_generation` says.

use linnet_exec::tensor::Tensor;
use linnet_exec::Machine;
use linnet_frontend::package::LoadOptions;
use linnet_ir::Dtype;
use linnet_runtime::generate::{argmax_rows, greedy};

mod common;
use common::{root, DENSE_GENERICS, QWEN3_GENERICS};

struct Oracle {
    machine: Machine,
    golden: Vec<Sequence>,
    /// The largest row distance allowed.
    tolerance: f32,
    /// The median row distance allowed.
    typical: f32,
    min_agreement: f32,
    /// How many greedy tokens transformers' f32 and bf16 runs share before
    /// each sequence's first difference, summed.
    greedy_prefix: usize,
}

/// The reference's logits at one position.
struct Row {
    logits: Vec<f32>,
    /// Whether transformers' f32 and bf16 runs choose the same token here.
    /// Where they do not, the position sits on a knife's edge that the
    /// reference's own precision decides, and its argmax is not held
    /// against another run in bf16.
    decided: bool,
}

struct Sequence {
    tokens: Vec<i64>,
    logits: Vec<Row>,
    greedy: Vec<i64>,
}

/// A folder of `tests/fixtures/oracle` and the package that runs it.
#[derive(Clone, Copy)]
struct Fixture {
    config: &'static str,
    package: &'static str,
    /// The generics, as `--set` gives them, where the folder has no
    /// model card of its own.
    generics: &'static [(&'static str, &'static str)],
    /// Block outputs scaled down so that bf16 rounding does not flip
    /// choices: held to 1e-1 on every row.
    calm: bool,
}

const MOE: Fixture =
    Fixture { config: "tiny-qwen3.5-moe", package: "models/qwen3.6-35b-a3b", generics: &[], calm: false };
const MOE_CALM: Fixture = Fixture { config: "tiny-qwen3.5-moe-calm", calm: true, ..MOE };
const DENSE: Fixture =
    Fixture { config: "tiny-qwen3.5-dense", package: "models/qwen3.8-27b", generics: &DENSE_GENERICS, calm: false };
const QWEN3: Fixture =
    Fixture { config: "tiny-qwen3-dense", package: "models/qwen3-8b", generics: &QWEN3_GENERICS, calm: false };

fn load(fixture: Fixture, dtype: &str, backend: linnet_runtime::BackendKind) -> Oracle {
    try_load(fixture, dtype, backend).unwrap_or_else(|e| panic!("{e}"))
}

fn try_load(fixture: Fixture, dtype: &str, backend: linnet_runtime::BackendKind) -> Result<Oracle, String> {
    let dir = root().join("tests/fixtures/oracle").join(fixture.config);
    let card = dir.join(format!("package/nest-{dtype}.toml"));
    let options = if card.is_file() {
        LoadOptions { nest: Some(card), stdlib: Some(root().join("stdlib")), ..LoadOptions::default() }
    } else {
        let mut overrides: Vec<(String, String)> =
            fixture.generics.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        overrides.push(("T".into(), dtype.into()));
        LoadOptions { overrides, stdlib: Some(root().join("stdlib")), ..LoadOptions::default() }
    };
    let weights = linnet_runtime::Weights::Checkpoint {
        dir: Some(dir.join(format!("weights-{dtype}"))),
        non_finite: linnet_runtime::weights::NonFinite::Refuse,
    };
    let machine = common::load_on(&root().join(fixture.package), &options, &weights, backend)?.machine;
    let mut golden = read_golden(&dir, dtype);
    if dtype == "f32" {
        let greedy_prefix = golden.iter().map(|seq| seq.greedy.len()).sum();
        return Ok(Oracle { machine, golden, tolerance: 1e-4, typical: 1e-4, min_agreement: 1.0, greedy_prefix });
    }
    let f32_run = read_golden(&dir, "f32");
    let tolerance = if fixture.calm {
        1e-1
    } else {
        // Unit-scale weights: roundings in another order than transformers'
        // grow through the layers. Transformers' own bf16 run is some
        // distance from its f32 run; ours, rounding as the language says,
        // may be as far again on the other side.
        for (bf16_seq, f32_seq) in golden.iter_mut().zip(&f32_run) {
            for (row, f32_row) in bf16_seq.logits.iter_mut().zip(&f32_seq.logits) {
                row.decided = argmax(&row.logits) == argmax(&f32_row.logits);
            }
        }
        2.0 * distance(&f32_run, &golden)
    };
    let greedy_prefix = golden.iter().zip(&f32_run).map(|(a, b)| shared_prefix(&a.greedy, &b.greedy)).sum();
    Ok(Oracle { machine, golden, tolerance, typical: 1e-1, min_agreement: 0.8, greedy_prefix })
}

fn shared_prefix(a: &[i64], b: &[i64]) -> usize {
    a.iter().zip(b).take_while(|(a, b)| a == b).count()
}

/// The reference's logits, tokens and greedy tokens for every sequence,
/// every row decided until compared with the other precision's.
fn read_golden(dir: &std::path::Path, dtype: &str) -> Vec<Sequence> {
    common::golden(dir, dtype)
        .into_iter()
        .map(|seq| Sequence {
            logits: seq.logits.into_iter().map(|logits| Row { logits, decided: true }).collect(),
            tokens: seq.tokens,
            greedy: seq.greedy,
        })
        .collect()
}

/// The largest row distance between two sets of logits for the same sequences.
fn distance(a: &[Sequence], b: &[Sequence]) -> f32 {
    let mut score = Score::new();
    for (a, b) in a.iter().zip(b) {
        assert_eq!(a.tokens, b.tokens, "the golden files hold the same sequences");
        for (x, y) in a.logits.iter().zip(&b.logits) {
            score.add(&x.logits, y);
        }
    }
    score.worst()
}

/// Compares rows of logits with the reference rows at the same positions.
struct Score {
    /// Each row's `max |ours - ref| / max |ref|`.
    distances: Vec<f32>,
    /// Rows whose argmax is held (see `Row::decided`), and how many agree.
    decided: usize,
    agree: usize,
}

impl Score {
    fn new() -> Score {
        Score { distances: Vec::new(), decided: 0, agree: 0 }
    }

    fn worst(&self) -> f32 {
        self.distances.iter().fold(0f32, |m, &d| m.max(d))
    }

    fn median(&self) -> f32 {
        let mut sorted = self.distances.clone();
        sorted.sort_by(f32::total_cmp);
        sorted.get(sorted.len() / 2).copied().unwrap_or(0.0)
    }

    fn add(&mut self, ours: &[f32], reference: &Row) {
        let (decided, reference) = (reference.decided, &reference.logits);
        let scale = reference.iter().fold(0f32, |m, v| m.max(v.abs()));
        let diff = ours.iter().zip(reference).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        self.distances.push(diff / scale);
        if decided {
            self.decided += 1;
            self.agree += usize::from(argmax(ours) == argmax(reference));
        }
    }

    fn check(&self, oracle: &Oracle, what: &str) {
        let agreement = self.agree as f32 / self.decided as f32;
        let (worst, median) = (self.worst(), self.median());
        assert!(worst <= oracle.tolerance, "{what}: max|diff|/max|ref| = {worst:.2e} > {:.2e}", oracle.tolerance);
        assert!(
            median <= oracle.typical,
            "{what}: median row's max|diff|/max|ref| = {median:.2e} > {:.0e}",
            oracle.typical
        );
        assert!(
            agreement >= oracle.min_agreement,
            "{what}: argmax agreement {agreement:.3} < {}",
            oracle.min_agreement
        );
        eprintln!(
            "{what}: max|diff|/max|ref| = {worst:.2e} (median row {median:.2e}) over {} rows, argmax agreement {agreement:.3} over {} decided",
            self.distances.len(),
            self.decided
        );
    }
}

fn argmax(row: &[f32]) -> i64 {
    argmax_rows(&Tensor::from_f32(Dtype::F32, vec![1, row.len()], row.to_vec()))[0]
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
    oracle.machine.reset().unwrap();
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

/// `prefill` of a prefix, then the rest through `verify` in spans of
/// three (speculative decoding's checks), every position's logits against
/// transformers'; before them a span checked and taken back, its recurrent
/// states put back as after a refused draft (positional caches need
/// nothing: they are written again).
fn verify_after_rollback(oracle: &mut Oracle, what: &str) {
    let mut score = Score::new();
    let (a, b) = (oracle.golden[0].tokens.clone(), oracle.golden[1].tokens.clone());
    let prefix = 4;
    oracle.machine.reset().unwrap();
    oracle.machine.call("prefill", vec![tokens(&[&a[..prefix], &b[..prefix]]), scalar(0)]).unwrap();
    let saved: Vec<Vec<Tensor>> = (0..2).map(|row| oracle.machine.recurrent_rows(row).unwrap()).collect();
    // Drafts that were not the text: the tokens of the other sequence.
    oracle
        .machine
        .call("verify", vec![tokens(&[&b[prefix..prefix + 2], &a[prefix..prefix + 2]]), scalar(prefix as i64)])
        .unwrap();
    for (row, states) in saved.iter().enumerate() {
        oracle.machine.set_state_rows(row, states).unwrap();
    }
    for start in (prefix..a.len()).step_by(3) {
        let end = (start + 3).min(a.len());
        let span = vec![tokens(&[&a[start..end], &b[start..end]]), scalar(start as i64)];
        let rows_out = rows(&oracle.machine.call("verify", span).unwrap().remove(0));
        for (at, position) in (start..end).enumerate() {
            score.add(&rows_out[at], &oracle.golden[0].logits[position]);
            score.add(&rows_out[end - start + at], &oracle.golden[1].logits[position]);
        }
    }
    score.check(oracle, &format!("{what} verify"));
}

/// `prefill_slots` of prefixes of seq2 and seq3 (different lengths) into
/// rows 1 and 0, in two parts each (the second continuing the rows, as
/// after a prefix cache's restore), then `decode_rows` with each row at
/// its own position.
fn slots_then_rows(oracle: &mut Oracle, what: &str) {
    let mut score = Score::new();
    let (long, short) = (oracle.golden[2].tokens.clone(), oracle.golden[3].tokens.clone());
    let (long_prefix, short_prefix) = (7, 2);
    oracle.machine.reset().unwrap();
    let slots = Tensor::from_i64(Dtype::I32, vec![2], vec![1, 0]);
    // Long: 3 tokens, then 4; short: 1, then 1. Each part is padded to the
    // longer of the two.
    for (long_part, short_part) in [(0..3, 0..1), (3..long_prefix, 1..short_prefix)] {
        let mut padded_short = short[short_part.clone()].to_vec();
        padded_short.resize(long_part.len(), 0);
        let prompts = tokens(&[&long[long_part.clone()], &padded_short]);
        let starts = Tensor::from_i64(Dtype::I32, vec![2], vec![long_part.start as i64, short_part.start as i64]);
        let lengths = Tensor::from_i64(Dtype::I32, vec![2], vec![long_part.len() as i64, short_part.len() as i64]);
        let inputs = vec![prompts, slots.clone(), starts, lengths];
        let rows_out = rows(&oracle.machine.call("prefill_slots", inputs).unwrap().remove(0));
        score.add(&rows_out[0], &oracle.golden[2].logits[long_part.end - 1]);
        score.add(&rows_out[1], &oracle.golden[3].logits[short_part.end - 1]);
    }
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
/// part ways after a while, the first token of every sequence and, before
/// each sequence's first difference, at least as many tokens as
/// transformers' own f32 and bf16 runs share.
fn greedy_generation(oracle: &mut Oracle, what: &str, exact: bool) {
    let mut equal = 0;
    let mut total = 0;
    for seq in &oracle.golden {
        let ours = greedy(&mut oracle.machine, &seq.tokens, seq.greedy.len()).unwrap();
        if exact {
            assert_eq!(ours, seq.greedy, "{what}: greedy tokens after {:?}", seq.tokens);
        }
        assert_eq!(ours.first(), seq.greedy.first(), "{what}: the first greedy token after {:?}", seq.tokens);
        equal += shared_prefix(&ours, &seq.greedy);
        total += seq.greedy.len();
    }
    eprintln!("{what} greedy: {equal} of {total} tokens equal before the first difference");
    let least = oracle.greedy_prefix;
    assert!(
        exact || equal >= least,
        "{what}: {equal} of {total} greedy tokens equal before the first difference, under {least}"
    );
}

fn every_path(fixture: Fixture, dtype: &str, backend: linnet_runtime::BackendKind) {
    every_path_of(load(fixture, dtype, backend), fixture, dtype, backend);
}

fn every_path_of(mut oracle: Oracle, fixture: Fixture, dtype: &str, backend: linnet_runtime::BackendKind) {
    let what = format!("{} {dtype} {backend:?}", fixture.config);
    forward_and_next_token(&mut oracle, &what);
    prefill_then_decode(&mut oracle, &what);
    verify_after_rollback(&mut oracle, &what);
    slots_then_rows(&mut oracle, &what);
    greedy_generation(&mut oracle, &what, dtype == "f32");
}

/// The oracle suite of one backend, declared once: each fixture's entry
/// paths, as a module of tests named for the backend (`cpu::moe_f32`).
macro_rules! oracle_suite {
    ($backend_name:ident, $backend:expr, [$($test:ident: $fixture:expr, $dtype:literal;)*]) => {
        mod $backend_name {
            use super::*;
            $(
                #[test]
                fn $test() {
                    every_path($fixture, $dtype, $backend);
                }
            )*
        }
    };
}

/// Every fixture, in f32 and bf16, on `$backend`.
macro_rules! every_fixture {
    ($backend_name:ident, $backend:expr) => {
        oracle_suite!($backend_name, $backend, [
            moe_f32: MOE, "f32";
            moe_bf16: MOE_CALM, "bf16";
            dense_f32: DENSE, "f32";
            dense_bf16: DENSE, "bf16";
            qwen3_f32: QWEN3, "f32";
            qwen3_bf16: QWEN3, "bf16";
        ]);
    };
}

every_fixture!(interp, linnet_runtime::BackendKind::Interp);
every_fixture!(cpu, linnet_runtime::BackendKind::Cpu);

// The GPU kernels' bodies, run on the host by MLIR (`--features nvptx`):
// a wrong index, reduction or rounding in a GPU kernel fails here. (The
// module's name holds `gpu`, which CI's filter for these tests names.)
#[cfg(feature = "nvptx")]
oracle_suite!(gpu_kernels_on_the_host, linnet_runtime::BackendKind::MlirHost, [
    moe_f32: MOE, "f32";
    moe_bf16: MOE_CALM, "bf16";
    qwen3_f32: QWEN3, "f32";
    qwen3_bf16: QWEN3, "bf16";
]);

/// What the GPU kernels (run on the host) refuse, they refuse at the node
/// the CPU backend does, in its words (the value, axis, position and size
/// of a load outside its axis): positions past the caches or before them,
/// a span that runs past them, two requests written into one row; and the
/// machine runs again after each.
#[cfg(feature = "nvptx")]
#[test]
fn the_gpu_kernels_refuse_bad_positions_and_slots_as_the_cpu_does() {
    let bad_calls = || {
        let position = |pos: i64| Tensor::from_i64(Dtype::I32, Vec::new(), vec![pos]);
        let pair = |a: i64, b: i64| Tensor::from_i64(Dtype::I32, vec![2], vec![a, b]);
        let duplicate = (tokens(&[&[1, 2, 3], &[4, 5, 6]]), pair(1, 1), pair(0, 0), pair(3, 3));
        let past_the_cache = (tokens(&[&[1, 2, 3], &[4, 5, 6]]), pair(0, 1), pair(0, 62), pair(3, 3));
        vec![
            ("decode", vec![tokens(&[&[1], &[2]]), position(64)]),
            ("decode", vec![tokens(&[&[1], &[2]]), position(-1)]),
            ("prefill", vec![tokens(&[&[1, 2], &[3, 4]]), position(63)]),
            ("prefill_slots", vec![duplicate.0, duplicate.1, duplicate.2, duplicate.3]),
            ("prefill_slots", vec![past_the_cache.0, past_the_cache.1, past_the_cache.2, past_the_cache.3]),
        ]
    };
    let errors = |backend| {
        let mut oracle = load(MOE, "f32", backend);
        bad_calls()
            .into_iter()
            .map(|(entry, inputs)| {
                oracle.machine.reset().unwrap();
                let error = oracle.machine.call(entry, inputs).expect_err("a bad call is refused").to_string();
                // The machine still runs.
                oracle.machine.reset().unwrap();
                oracle
                    .machine
                    .call("decode", vec![tokens(&[&[1], &[2]]), Tensor::from_i64(Dtype::I32, Vec::new(), vec![0])])
                    .expect("a good call after a bad one runs");
                error
            })
            .collect::<Vec<String>>()
    };
    let (cpu, gpu) = (errors(linnet_runtime::BackendKind::Cpu), errors(linnet_runtime::BackendKind::MlirHost));
    for (cpu, gpu) in cpu.iter().zip(&gpu) {
        assert!(cpu.contains("outside") || cpu.contains("past the cache"), "{cpu}");
        assert_eq!(gpu.replace("mlir-host", "cpu"), *cpu);
    }
}

/// On an NVIDIA GPU through the CUDA driver. A machine without a driver or
/// a device cannot run these, so they are ignored unless asked for
/// (`cargo test -p linnet-runtime --features nvptx,cuda --test oracle --
/// --ignored cuda`, on a machine with a GPU), and there they fail if the
/// device cannot be opened: never a pass that ran nothing.
#[cfg(feature = "cuda")]
fn on_the_gpu(fixture: Fixture, dtype: &str) {
    let oracle =
        try_load(fixture, dtype, linnet_runtime::BackendKind::Cuda).unwrap_or_else(|message| panic!("{message}"));
    every_path_of(oracle, fixture, dtype, linnet_runtime::BackendKind::Cuda);
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs an NVIDIA GPU and its driver: run with --ignored on such a machine"]
fn cuda_f32_every_path_on_a_gpu() {
    on_the_gpu(MOE, "f32");
}

#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs an NVIDIA GPU and its driver: run with --ignored on such a machine"]
fn cuda_bf16_every_path_on_a_gpu() {
    on_the_gpu(MOE_CALM, "bf16");
}
