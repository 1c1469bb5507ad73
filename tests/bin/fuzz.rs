//! `cargo run --release -p linnet-tests --bin fuzz -- TARGET [SECONDS]
//! [MAX_INPUTS] [SEED]`: one fuzz target on mutated inputs on the stable
//! toolchain, reporting how many inputs ran, the slowest, and every
//! failing input (saved under `target/fuzz/`). `all` runs every target in
//! turn. Exits 1 when anything failed. `fuzz seeds DIR` writes every
//! target's seed inputs to `DIR/TARGET/` as a corpus for `cargo fuzz`.

#[path = "../fuzz/mod.rs"]
mod fuzz;

use fuzz::{run, target, TARGETS};
use std::time::Duration;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(name) = args.first() else {
        let names: Vec<&str> = TARGETS.iter().map(|t| t.name).collect();
        eprintln!("usage: fuzz TARGET [SECONDS] [MAX_INPUTS] [SEED]; TARGET is all or one of {}", names.join(", "));
        std::process::exit(2);
    };
    if name == "seeds" {
        let Some(dir) = args.get(1) else {
            eprintln!("usage: fuzz seeds DIR");
            std::process::exit(2);
        };
        for target in TARGETS {
            let folder = std::path::Path::new(dir).join(target.name);
            std::fs::create_dir_all(&folder).unwrap_or_else(|e| panic!("{}: {e}", folder.display()));
            for (at, seed) in (target.seeds)().iter().enumerate() {
                std::fs::write(folder.join(format!("seed-{at}")), seed)
                    .unwrap_or_else(|e| panic!("{}: {e}", folder.display()));
            }
        }
        return;
    }
    let number = |at: usize, default: u64| -> u64 {
        args.get(at).map_or(default, |text| {
            text.parse().unwrap_or_else(|_| {
                eprintln!("`{text}` is not a whole number");
                std::process::exit(2)
            })
        })
    };
    let (seconds, limit, seed) = (number(1, 60), number(2, u64::MAX), number(3, 1));
    let chosen: Vec<_> = match name.as_str() {
        "all" => TARGETS.iter().collect(),
        one => match target(one) {
            Some(target) => vec![target],
            None => {
                eprintln!("no fuzz target `{one}`");
                std::process::exit(2)
            }
        },
    };
    let dir = std::path::PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../target/fuzz"));
    let mut failed = false;
    for target in chosen {
        let report = run(target, Duration::from_secs(seconds), limit, seed, &dir);
        println!(
            "{:<12} {:>9} inputs, slowest {:.3} s, {} failure(s)",
            target.name,
            report.inputs,
            report.slowest.as_secs_f64(),
            report.failures.len()
        );
        for failure in &report.failures {
            println!("  {}: {}", failure.input.display(), failure.what);
        }
        failed |= !report.failures.is_empty();
    }
    std::process::exit(i32::from(failed));
}
