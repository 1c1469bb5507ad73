//! The fuzz targets and a stable-toolchain runner for them. Each target
//! takes bytes and drives one reader of untrusted input the way the tools
//! do: the lexer and parser, the checker over the seed package with one
//! file replaced, the model card and bindings readers, the safetensors
//! loader, the GGUF reader (with its vocabulary) and the loader of
//! llama.cpp's files through `gguf.json`, the `.npy` reader, and the
//! server's request reader. The runner
//! mutates a corpus seeded from the repository's own files and fails on a
//! panic or on an input slower than [`SLOW`]; a stack overflow aborts the
//! process, so the input being tried is always on disk first (see
//! [`run`]). `cargo fuzz` drives the same targets (`fuzz/`).

mod mutate;
mod targets;

pub use targets::{target, TARGETS};

use linnet_runtime::sampling::Rng;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// An input that takes longer than this is a failure: a hang in waiting.
pub const SLOW: Duration = Duration::from_secs(10);

/// One fuzz target: its name, the inputs its corpus starts from, and the
/// code under test (which must return, not panic, for any bytes).
pub struct Target {
    pub name: &'static str,
    pub seeds: fn() -> Vec<Vec<u8>>,
    pub run: fn(&[u8]),
}

/// What went wrong with one input, and where the input was saved.
#[derive(Debug)]
pub struct Failure {
    pub what: String,
    pub input: PathBuf,
}

#[derive(Debug, Default)]
pub struct Report {
    pub inputs: u64,
    pub slowest: Duration,
    pub failures: Vec<Failure>,
}

/// Runs `target` on mutated inputs until `budget` has passed or `limit`
/// inputs were tried. Each input is written to `dir/<target>.current`
/// before it runs (an abort leaves it there); failing ones are kept as
/// `dir/<target>-<n>.input`.
pub fn run(target: &Target, budget: Duration, limit: u64, seed: u64, dir: &Path) -> Report {
    std::fs::create_dir_all(dir).expect("the fuzz output folder can be created");
    let corpus = (target.seeds)();
    assert!(!corpus.is_empty(), "target `{}` has no seeds", target.name);
    let current = dir.join(format!("{}.current", target.name));
    let mut rng = Rng::new(seed);
    let mut report = Report::default();
    let started = Instant::now();
    while started.elapsed() < budget && report.inputs < limit {
        let input = mutate::mutated(&corpus, &mut rng);
        std::fs::write(&current, &input).expect("the current input can be saved");
        let began = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| (target.run)(&input)));
        let took = began.elapsed();
        report.inputs += 1;
        report.slowest = report.slowest.max(took);
        let what = match outcome {
            Err(panic) => Some(format!("panicked: {}", panic_message(panic.as_ref()))),
            Ok(()) if took > SLOW => Some(format!("took {:.1} s", took.as_secs_f64())),
            Ok(()) => None,
        };
        if let Some(what) = what {
            let saved = dir.join(format!("{}-{}.input", target.name, report.failures.len()));
            std::fs::write(&saved, &input).expect("a failing input can be saved");
            report.failures.push(Failure { what, input: saved });
        }
    }
    let _ = std::fs::remove_file(&current);
    report
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "a panic without a message".into())
}
