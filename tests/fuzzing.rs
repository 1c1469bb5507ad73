//! Every fuzz target on mutated inputs for a bounded time: no panic, no
//! input slower than `SLOW` (a stack overflow aborts the test binary, and
//! the input is left in `target/fuzz/`). `LINNET_FUZZ_SECONDS` sets the
//! time per target (default 20).

// The fuzz targets, shared with the fuzz binary (which uses all of them).
#[path = "fuzz/mod.rs"]
#[allow(dead_code, unused_imports)]
mod fuzz;

use fuzz::{run, target};
use std::time::Duration;

fn fuzz(name: &str) {
    let seconds = std::env::var("LINNET_FUZZ_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(20);
    let dir = std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/fuzz"));
    let report = run(target(name).expect("a target"), Duration::from_secs(seconds), u64::MAX, 0x5eed, &dir);
    assert!(report.inputs > 0, "{name}: no input ran");
    assert!(
        report.failures.is_empty(),
        "{name}: {} of {} inputs failed: {:#?}",
        report.failures.len(),
        report.inputs,
        report.failures
    );
}

#[test]
fn syntax() {
    fuzz("syntax");
}

#[test]
fn package() {
    fuzz("package");
}

#[test]
fn card() {
    fuzz("card");
}

#[test]
fn bindings() {
    fuzz("bindings");
}

#[test]
fn safetensors() {
    fuzz("safetensors");
}

#[test]
fn npy() {
    fuzz("npy");
}

#[test]
fn gguf() {
    fuzz("gguf");
}

#[test]
fn request() {
    fuzz("request");
}

#[test]
fn llama_gguf() {
    fuzz("llama-gguf");
}
