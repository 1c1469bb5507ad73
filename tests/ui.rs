//! The frontend as a model author meets it: the seed package checks clean
//! under every consistent set of generics; each mistake in the corpus
//! (`ui/model-mistakes.toml`, `ui/packages/`) is reported with the right
//! code at the right line, and renders as its snapshot; no source, however
//! broken, makes the checker panic.

use linnet_frontend::driver::{check_package, lower_package, Checked};
use linnet_frontend::package::LoadOptions;
mod support;

use serde::Deserialize;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use support::{annotations, difference, render, reported, root, snapshot};

fn model_dir() -> PathBuf {
    root().join("models/qwen3.6-35b-a3b")
}

/// A module of the seed package or of the dense package it uses, by the
/// path the loader reads it at.
fn module_file(module: &str) -> PathBuf {
    let package = if matches!(module, "lib" | "moe") { "qwen3.6-35b-a3b" } else { "qwen3.8-27b" };
    root().join("models").join(package).join(format!("src/{module}.linnet"))
}

fn options() -> LoadOptions {
    LoadOptions { stdlib: Some(root().join("stdlib")), ..LoadOptions::default() }
}

fn assert_clean(checked: &Checked) {
    assert!(checked.diagnostics.is_empty(), "expected no diagnostics:\n{}", render(checked));
}

#[test]
fn seed_package_is_clean() {
    assert_clean(&check_package(&model_dir(), &options()));
}

#[test]
fn seed_package_is_clean_with_the_oracle_generics() {
    for config in ["tiny-qwen3.5-moe", "tiny-qwen3.5-moe-calm"] {
        for dtype in ["f32", "bf16"] {
            let nest = root().join(format!("tests/fixtures/oracle/{config}/package/nest-{dtype}.toml"));
            assert_clean(&check_package(&model_dir(), &LoadOptions { nest: Some(nest), ..options() }));
        }
    }
}

#[test]
fn seed_package_is_clean_with_other_consistent_generics() {
    let sizes = [
        ("Vocab", "1000"),
        ("H", "96"),
        ("Heads", "6"),
        ("KvHeads", "3"),
        ("HeadDim", "40"),
        ("KeyHeads", "3"),
        ("ValueHeads", "9"),
        ("KeyDim", "8"),
        ("ValueDim", "12"),
        ("Conv", "156"),
        ("Width", "3"),
        ("Experts", "5"),
        ("TopK", "3"),
        ("ExpertInner", "7"),
        ("SharedInner", "11"),
        ("Groups", "1"),
        ("Batch", "3"),
        ("MaxSeq", "17"),
        ("T", "f32"),
        ("S", "1"),
        ("B", "4"),
    ];
    let overrides = sizes.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    assert_clean(&check_package(&model_dir(), &LoadOptions { overrides, ..options() }));
}

/// The dense package checks clean under its card (the published 27B
/// sizes), the dense oracle checkpoint's sizes, and other consistent ones.
#[test]
fn dense_package_is_clean_with_its_card_and_other_generics() {
    let dense = root().join("models/qwen3.8-27b");
    assert_clean(&check_package(&dense, &options()));
    let oracle = [
        ("Vocab", "512"),
        ("H", "64"),
        ("Heads", "4"),
        ("KvHeads", "2"),
        ("HeadDim", "32"),
        ("KeyHeads", "2"),
        ("ValueHeads", "4"),
        ("KeyDim", "16"),
        ("ValueDim", "16"),
        ("Conv", "128"),
        ("Inner", "96"),
        ("Groups", "2"),
        ("Batch", "2"),
        ("MaxSeq", "64"),
        ("T", "f32"),
    ];
    let other = [
        ("H", "96"),
        ("Heads", "6"),
        ("KvHeads", "3"),
        ("HeadDim", "40"),
        ("KeyHeads", "3"),
        ("ValueHeads", "9"),
        ("KeyDim", "8"),
        ("ValueDim", "12"),
        ("Conv", "156"),
        ("Width", "3"),
        ("Inner", "7"),
        ("Groups", "1"),
        ("Batch", "3"),
        ("MaxSeq", "17"),
        ("S", "1"),
        ("B", "4"),
    ];
    for sizes in [&oracle[..], &other[..]] {
        let overrides = sizes.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        assert_clean(&check_package(&dense, &LoadOptions { overrides, ..options() }));
    }
    // A size the MoE package has and the dense one does not is refused.
    let overrides = vec![("Experts".to_string(), "8".to_string())];
    assert!(check_package(&dense, &LoadOptions { overrides, ..options() }).has_errors());
}

/// The Qwen3 package checks clean under its card (Qwen3-8B's sizes), the
/// oracle checkpoint's, and a Llama-like shape (no key/value sharing, one
/// layer); a size that breaks its `type`'s clauses is refused.
#[test]
fn qwen3_package_is_clean_with_its_card_and_other_generics() {
    let qwen3 = root().join("models/qwen3-8b");
    assert_clean(&check_package(&qwen3, &options()));
    let oracle = [("Vocab", "512"), ("H", "64"), ("Layers", "4"), ("Heads", "4"), ("KvHeads", "2"), ("HeadDim", "32")];
    let other = [("Layers", "1"), ("Heads", "6"), ("KvHeads", "6"), ("HeadDim", "48"), ("Inner", "7"), ("T", "f32")];
    for sizes in [&oracle[..], &other[..]] {
        let overrides = sizes.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        assert_clean(&check_package(&qwen3, &LoadOptions { overrides, ..options() }));
    }
    let overrides = vec![("KvHeads".to_string(), "3".to_string())];
    let checked = check_package(&qwen3, &LoadOptions { overrides, ..options() });
    let codes: Vec<&str> = checked.diagnostics.iter().map(|d| d.code.name()).collect();
    assert_eq!(codes, ["unsatisfied-where"], "{}", render(&checked));
}

/// An editor's or a harness's unsaved text applies however its path is
/// written: here with a `..` step through the package that uses it.
#[test]
fn an_overlay_applies_to_a_dependency_through_any_path() {
    let path = model_dir().join("../qwen3.8-27b/src/norm.linnet");
    let text =
        std::fs::read_to_string(&path).expect("readable").replacen("module qwen3_5.norm", "module qwen3_5.norms", 1);
    let checked = check_package(&model_dir(), &LoadOptions { overlay: HashMap::from([(path, text)]), ..options() });
    let codes: Vec<&str> = checked.diagnostics.iter().map(|d| d.code.name()).collect();
    assert_eq!(codes, ["module-name-mismatch"], "{}", render(&checked));
}

#[test]
fn an_override_that_breaks_a_clause_points_at_the_command_line() {
    let overrides = vec![("Conv".to_string(), "100".to_string())];
    let checked = check_package(&model_dir(), &LoadOptions { overrides, ..options() });
    let reports = reported(&checked);
    assert_eq!(reports.len(), 1, "{}", render(&checked));
    assert_eq!(reports[0].code, "unsatisfied-where");
    assert_eq!(reports[0].file, Path::new("<command line>"));
}

#[derive(Deserialize)]
struct Corpus {
    case: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    edit: Vec<Edit>,
}

#[derive(Deserialize)]
struct Edit {
    file: String,
    find: String,
    replace: String,
}

fn apply(case: &Case, dir: &Path) -> Result<HashMap<PathBuf, String>, String> {
    let mut overlay: HashMap<PathBuf, String> = HashMap::new();
    for edit in &case.edit {
        let path = linnet_frontend::package::join_normalized(dir, Path::new(&edit.file));
        let text = match overlay.get(&path) {
            Some(text) => text.clone(),
            None => std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?,
        };
        let found = text.matches(&edit.find).count();
        if found != 1 {
            return Err(format!("`{}` occurs {found} times in {}, not once", edit.find, edit.file));
        }
        overlay.insert(path, text.replacen(&edit.find, &edit.replace, 1));
    }
    Ok(overlay)
}

/// A layer that leaves `decode` out takes `DecoderLayer`'s default (a
/// prefill of one token): the seed checks clean and lowers without its
/// hybrid layer group's own `decode`.
#[test]
fn a_layer_without_decode_takes_the_traits_default() {
    let path = root().join("models/qwen3.8-27b/src/lib.linnet");
    let text = std::fs::read_to_string(&path).expect("readable");
    let own = "    pub fn decode(x: Tensor[Batch, 1, H; T], pos: i32) -> Tensor[Batch, 1, H; T] {\n        var y = x\n        \
               static for layer in linear {\n            y = layer.decode(y)\n        }\n        return full.decode(y, pos)\n    }\n";
    assert_eq!(text.matches(own).count(), 1, "the layer group's own decode");
    let overlay = HashMap::from([(path, text.replacen(own, "", 1))]);
    let checked = check_package(&model_dir(), &LoadOptions { overlay: overlay.clone(), ..options() });
    assert_clean(&checked);
    if let Err(checked) = lower_package(&model_dir(), &LoadOptions { overlay, ..options() }) {
        panic!("lowers:\n{}", render(&checked));
    }
}

#[test]
fn model_mistakes_are_reported_where_they_are() {
    let corpus_path = root().join("tests/ui/model-mistakes.toml");
    let corpus: Corpus = toml::from_str(&std::fs::read_to_string(&corpus_path).expect("corpus")).expect("valid corpus");
    assert!(corpus.case.len() >= 40, "the corpus has {} cases", corpus.case.len());
    let dir = model_dir();
    let mut failures = Vec::new();
    for case in &corpus.case {
        let overlay = match apply(case, &dir) {
            Ok(overlay) => overlay,
            Err(problem) => {
                failures.push(format!("{}: {problem}", case.name));
                continue;
            }
        };
        let expected: Vec<_> = overlay.iter().flat_map(|(path, text)| annotations(path, text)).collect();
        assert!(!expected.is_empty(), "{}: no `~ ERROR` annotation", case.name);
        let checked = check_package(&dir, &LoadOptions { overlay, ..options() });
        if let Some(difference) = difference(expected, reported(&checked)) {
            failures.push(format!("{}:\n{difference}\n{}", case.name, render(&checked)));
            continue;
        }
        if let Err(problem) = snapshot(&root().join("tests/ui/snapshots"), &case.name, &render(&checked)) {
            failures.push(format!("{}: {problem}", case.name));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n\n{}",
        failures.len(),
        corpus.case.len(),
        failures.join("\n\n")
    );
}

#[test]
fn package_cases_are_reported_where_they_are() {
    let packages = root().join("tests/ui/packages");
    let mut failures = Vec::new();
    let mut entries: Vec<_> =
        std::fs::read_dir(&packages).expect("packages").map(|e| e.expect("entry").path()).collect();
    entries.sort();
    assert!(!entries.is_empty());
    for dir in entries {
        let mut expected = Vec::new();
        let mut stack = vec![dir.clone()];
        while let Some(at) = stack.pop() {
            for entry in std::fs::read_dir(&at).expect("readable") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "linnet" || e == "toml") {
                    expected.extend(annotations(&path, &std::fs::read_to_string(&path).expect("readable")));
                }
            }
        }
        let checked = check_package(&dir, &options());
        let name = dir.file_name().expect("named").to_string_lossy().to_string();
        if let Some(difference) = difference(expected, reported(&checked)) {
            failures.push(format!("{name}:\n{difference}\n{}", render(&checked)));
        } else if let Err(problem) =
            snapshot(&root().join("tests/ui/snapshots"), &format!("package-{name}"), &render(&checked))
        {
            failures.push(format!("{name}: {problem}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// Every prefix of every module (the seed's and the dense blocks it uses)
/// is half-typed code: the checker must report, never panic.
#[test]
fn truncated_sources_never_panic() {
    let dir = model_dir();
    for module in ["attention", "deltanet", "lib", "moe", "norm", "rope"] {
        let path = module_file(module);
        let text = std::fs::read_to_string(&path).expect("readable");
        let step = (text.len() / 12).max(1);
        for cut in (0..text.len()).step_by(step) {
            let cut = (0..=cut).rev().find(|at| text.is_char_boundary(*at)).unwrap_or(0);
            let overlay = HashMap::from([(path.clone(), text[..cut].to_string())]);
            let checked = check_package(&dir, &LoadOptions { overlay, ..options() });
            assert!(cut == text.len() || !checked.diagnostics.is_empty() || module == "rope" && cut == 0);
        }
    }
}

/// `RmsNorm.forward`'s first line with its operand `cast<f32>(x)` wrapped
/// `levels` times by one way of nesting.
fn deeply_nested(shape: &str, levels: usize) -> HashMap<PathBuf, String> {
    let operand = "cast<f32>(x)";
    let nested = match shape {
        "negations" => format!("{}{operand}", "- ".repeat(levels)),
        "parentheses" => format!("{}{operand}{}", "(".repeat(levels), ")".repeat(levels)),
        "casts" => format!("{}{operand}{}", "cast<f32>(".repeat(levels), ")".repeat(levels)),
        "sum" => format!("{operand}{}", " + 0.0".repeat(levels)),
        // Positions within positions: each level was once parsed twice.
        "indexing" => format!("{operand} + cast<f32>({}0{})", "iota<i64>(H)[".repeat(levels), "]".repeat(levels)),
        other => panic!("no shape {other}"),
    };
    let path = module_file("norm");
    let text = std::fs::read_to_string(&path).expect("readable");
    let line = "        let xf = cast<f32>(x)\n";
    assert_eq!(text.matches(line).count(), 2, "both norms start with this line");
    HashMap::from([(path, text.replacen(line, &format!("        let xf = {nested} //~ ERROR nesting-too-deep\n"), 1))])
}

/// Ten thousand levels of any kind of nesting are one diagnostic at their
/// line (not a stack overflow, nor a cascade); just under the bound, the
/// package checks and lowers on a test thread's 2 MiB stack, unoptimized.
#[test]
fn nesting_is_bounded_with_a_diagnostic() {
    for (shape, levels_below_bound) in [("negations", 240), ("parentheses", 120), ("casts", 60), ("sum", 240)] {
        let overlay = deeply_nested(shape, 10_000);
        let expected: Vec<_> = overlay.iter().flat_map(|(path, text)| annotations(path, text)).collect();
        let checked = check_package(&model_dir(), &LoadOptions { overlay, ..options() });
        assert_eq!(difference(expected, reported(&checked)), None, "{shape}:\n{}", render(&checked));

        let overlay = deeply_nested(shape, levels_below_bound);
        let lowered = lower_package(&model_dir(), &LoadOptions { overlay, ..options() });
        if let Err(checked) = lowered {
            panic!("{shape} at {levels_below_bound} levels:\n{}", render(&checked));
        }
    }
}

/// Forty levels of `a[a[…]]` check at once: the parser once tried each
/// position as a range first and parsed it again, 2^40 times at the bottom.
#[test]
fn nested_positions_are_parsed_once() {
    let checked = check_package(&model_dir(), &LoadOptions { overlay: deeply_nested("indexing", 40), ..options() });
    let codes: Vec<&str> = checked.diagnostics.iter().map(|d| d.code.name()).collect();
    // The checker cannot show that 0 is inside `H` there (RmsNorm does not
    // require `H > 0`); parsing went through.
    assert_eq!(codes, ["index-out-of-bounds"], "{}", render(&checked));
}

fn linnet_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("readable") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            linnet_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "linnet") {
            out.push(path);
        }
    }
}

fn tokens(text: &str) -> Vec<String> {
    let mut diagnostics = Vec::new();
    let lexed = linnet_frontend::syntax::lexer::lex(linnet_frontend::source::FileId(0), text, &mut diagnostics);
    let mut pieces: Vec<(u32, String)> = lexed.tokens.iter().map(|(t, s)| (s.start, format!("{t:?}"))).collect();
    pieces.extend(lexed.comments.iter().map(|c| (c.span.start, c.text.trim_end().to_string())));
    pieces.sort();
    pieces.into_iter().map(|(_, p)| p).collect()
}

/// The formatter changes layout only: the same tokens and comments in the
/// same order, and a second run changes nothing. The packages in the
/// repository are formatted.
#[test]
fn formatting_keeps_every_token_and_is_idempotent() {
    let mut files = Vec::new();
    for dir in ["models", "stdlib", "examples", "tests/ui/packages"] {
        linnet_files(&root().join(dir), &mut files);
    }
    assert!(files.len() > 15);
    for file in files {
        let text = std::fs::read_to_string(&file).expect("readable");
        let Some(formatted) = linnet_frontend::syntax::format::format(&text) else { continue };
        assert_eq!(tokens(&text), tokens(&formatted), "{}: formatting changed the tokens", file.display());
        assert_eq!(
            linnet_frontend::syntax::format::format(&formatted).as_deref(),
            Some(formatted.as_str()),
            "{}: not idempotent",
            file.display()
        );
        if !file.starts_with(root().join("tests")) {
            assert_eq!(text, formatted, "{} is not formatted: run `linnetc fmt`", file.display());
        }
    }
}
