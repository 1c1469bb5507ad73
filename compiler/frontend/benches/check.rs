//! How long `linnetc check` takes on the seed package: load, parse,
//! resolve, check every body, instantiate with `nest.toml`. Run with
//! `cargo bench -p linnet-frontend --bench check`; prints mean ± sd and
//! the fastest of the runs.

use linnet_frontend::driver::check_package;
use linnet_frontend::package::LoadOptions;
use std::path::PathBuf;
use std::time::Instant;

fn main() {
    let root = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    let package = root.join("models/qwen3.6-35b-a3b");
    let options = LoadOptions { stdlib: Some(root.join("stdlib")), ..LoadOptions::default() };
    let warmup = check_package(&package, &options);
    assert!(!warmup.has_errors(), "the seed package must check clean");
    let runs = 50;
    let mut millis = Vec::with_capacity(runs);
    for _ in 0..runs {
        let start = Instant::now();
        let checked = check_package(&package, &options);
        millis.push(start.elapsed().as_secs_f64() * 1e3);
        assert!(checked.diagnostics.is_empty());
    }
    let mean = millis.iter().sum::<f64>() / runs as f64;
    let sd = (millis.iter().map(|m| (m - mean).powi(2)).sum::<f64>() / (runs - 1) as f64).sqrt();
    let fastest = millis.iter().cloned().fold(f64::INFINITY, f64::min);
    println!("check models/qwen3.6-35b-a3b: {mean:.2} ms ± {sd:.2} ms (fastest {fastest:.2} ms, {runs} runs)");
}
