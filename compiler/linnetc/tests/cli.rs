//! `linnetc check` as editors and scripts run it: exit codes, the JSON
//! message format, model cards and overrides from the command line.

use std::process::{Command, Output};

fn linnetc(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_linnetc"))
        .args(args)
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
        .env("LINNET_STDLIB", concat!(env!("CARGO_MANIFEST_DIR"), "/../../stdlib"))
        .output()
        .expect("linnetc runs")
}

#[test]
fn the_model_packages_check_clean() {
    for package in ["models/qwen3.6-35b-a3b", "models/qwen3.8-27b"] {
        let output = linnetc(&["check", package]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        assert!(String::from_utf8_lossy(&output.stderr).contains("no errors"));
    }
}

/// A file or folder inside a package checks the package, found upward.
#[test]
fn a_file_or_folder_inside_the_package_checks_it() {
    for inside in ["models/qwen3.6-35b-a3b/src", "models/qwen3.6-35b-a3b/src/moe.linnet"] {
        let output = linnetc(&["check", inside]);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            output.status.success() && stderr.contains("checked `models/qwen3.6-35b-a3b`: no errors"),
            "{inside}: {stderr}"
        );
    }
    let output = Command::new(env!("CARGO_BIN_EXE_linnetc"))
        .arg("check")
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../models/qwen3.6-35b-a3b/src"))
        .env("LINNET_STDLIB", concat!(env!("CARGO_MANIFEST_DIR"), "/../../stdlib"))
        .output()
        .expect("linnetc runs");
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
}

#[test]
fn json_diagnostics_have_positions_and_codes() {
    let output = linnetc(&["check", "tests/ui/packages/misuse", "--message-format", "json"]);
    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8(output.stdout).expect("UTF-8");
    let lines: Vec<serde_json::Value> =
        stdout.lines().map(|line| serde_json::from_str(line).expect("one JSON object per line")).collect();
    assert!(lines.len() >= 10, "{stdout}");
    for diagnostic in &lines {
        for field in ["severity", "code", "message", "file", "line", "column", "end_line", "end_column", "secondary"] {
            assert!(diagnostic.get(field).is_some(), "`{field}` missing in {diagnostic}");
        }
    }
    let exp = lines
        .iter()
        .find(|d| d["message"].as_str().is_some_and(|m| m.contains("`exp` takes a float")))
        .expect("the exp misuse");
    assert_eq!(exp["code"], "dtype-mismatch");
    assert_eq!(exp["severity"], "error");
    assert_eq!((exp["line"].as_u64(), exp["column"].as_u64()), (Some(9), Some(17)));
    assert_eq!((exp["end_line"].as_u64(), exp["end_column"].as_u64()), (Some(9), Some(18)));
    assert!(exp["file"].as_str().is_some_and(|f| f.ends_with("misuse/src/lib.linnet")));
    let softmax = lines
        .iter()
        .find(|d| d["message"].as_str().is_some_and(|m| m.contains("`softmax`")))
        .expect("the softmax misuse");
    let secondary = softmax["secondary"].as_array().expect("a list");
    assert!(secondary
        .iter()
        .any(|label| label["file"].as_str().is_some_and(|f| f.ends_with("stdlib/nn/softmax.linnet"))));
}

/// A typo's fix is in the JSON as rustc gives one: the range to replace,
/// the text to put there, and how sure it is.
#[test]
fn json_diagnostics_carry_suggested_fixes() {
    let output = linnetc(&["check", "models/qwen3.6-35b-a3b", "--set", "TopP=1", "--message-format", "json"]);
    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8(output.stdout).expect("UTF-8");
    let diagnostic: serde_json::Value = serde_json::from_str(stdout.lines().next().expect("a diagnostic")).unwrap();
    assert_eq!(diagnostic["code"], "unknown-generic");
    let fix = &diagnostic["suggestions"][0];
    assert_eq!(fix["replacement"], "TopK", "{diagnostic}");
    assert_eq!(fix["applicability"], "maybe-incorrect");
    for field in ["file", "line", "column", "end_line", "end_column"] {
        assert_eq!(fix[field], diagnostic[field], "{field}");
    }
}

#[test]
fn another_model_card_and_overrides() {
    let nest = "tests/fixtures/oracle/tiny-qwen3.5-moe/package/nest-f32.toml";
    let output = linnetc(&["check", "models/qwen3.6-35b-a3b", "--nest", nest]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let output = linnetc(&["check", "models/qwen3.6-35b-a3b", "--set", "HeadDim=36", "--message-format", "json"]);
    assert_eq!(output.status.code(), Some(1));
    let stdout = String::from_utf8(output.stdout).expect("UTF-8");
    assert!(stdout.contains("\"code\":\"unsatisfied-where\"") && stdout.contains("<command line>"), "{stdout}");
}

#[test]
fn a_folder_that_is_not_a_package() {
    let output = linnetc(&["check", "docs"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("is not a Linnet package"));
}

/// A Linnet file in no package (a standard-library module) is named as
/// such, not read as a folder.
#[test]
fn a_file_in_no_package() {
    let output = linnetc(&["check", "stdlib/nn/activations.linnet"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("is a file in no package") && !stderr.contains("Not a directory"), "{stderr}");
}

/// `linnetc fmt` leaves a file with syntax errors as it is, says so, and
/// fails: a script that formats a tree learns that it did not.
#[test]
fn fmt_fails_on_a_file_with_syntax_errors() {
    let dir = std::env::temp_dir().join(format!("linnetc-fmt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let broken = dir.join("broken.linnet");
    std::fs::write(&broken, "fn f(x: Tensor[N; f32] -> Tensor[N; f32] {\n  x\n").unwrap();
    for check in [false, true] {
        let mut args = vec!["fmt", broken.to_str().unwrap()];
        if check {
            args.push("--check");
        }
        let output = linnetc(&args);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("syntax errors"), "{stderr}");
    }
    assert_eq!(std::fs::read_to_string(&broken).unwrap(), "fn f(x: Tensor[N; f32] -> Tensor[N; f32] {\n  x\n");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn human_output_is_plain_off_a_terminal() {
    let output = linnetc(&["check", "tests/ui/packages/misuse"]);
    let stderr = String::from_utf8(output.stderr).expect("UTF-8");
    assert!(!stderr.contains('\u{1b}'), "no colour codes when not on a terminal");
    assert!(stderr.contains("[dtype-mismatch] Error"));
    let coloured = linnetc(&["check", "tests/ui/packages/misuse", "--color", "always"]);
    assert!(String::from_utf8_lossy(&coloured.stderr).contains('\u{1b}'));
}

#[test]
fn the_examples_check_clean() {
    for example in std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples")).expect("examples") {
        let path = example.expect("entry").path();
        if path.join("linnet.toml").exists() {
            let output = linnetc(&["check", path.to_str().expect("UTF-8 path")]);
            assert!(output.status.success(), "{}: {}", path.display(), String::from_utf8_lossy(&output.stderr));
        }
    }
}

#[test]
fn build_writes_an_artifact_and_reports_its_memory_plan() {
    let out = std::env::temp_dir().join(format!("linnetc-build-{}", std::process::id()));
    let output = linnetc(&["build", "examples/tiny-qwen", "-o", out.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report = String::from_utf8_lossy(&output.stderr);
    assert!(
        report.contains("built `tiny-qwen` into")
            && report.contains("kernels")
            && report.contains("weights: ")
            && report.contains("scratch: decode at"),
        "{report}"
    );
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("artifact.json")).unwrap()).unwrap();
    let entries: Vec<&str> =
        manifest["entries"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(
        entries,
        [
            "forward",
            "next_token",
            "decode",
            "prefill",
            "prefill_hidden",
            "verify",
            "decode_rows",
            "prefill_slots",
            "verify_slots"
        ]
    );
    assert_eq!(manifest["params"][0]["tensor"], "model.language_model.embed_tokens.weight");
    assert!(std::fs::metadata(out.join("kernels.o")).unwrap().len() > 1000 && out.join("model.ir.json").is_file());
    assert!(!report.contains("products outside the matrix kernels"), "{report}");
    std::fs::remove_dir_all(&out).unwrap();
}

/// A weight stored `[in, out]` (gpt-oss's experts, GPT-2's `Conv1D`) is
/// laid out with its summed axis last, so its products take the matrix
/// kernels and the build reports none outside them; a weight summed over
/// two axes (a product and its transpose) cannot be, and the report names
/// it with why, as `check --perf` does.
#[test]
fn build_reports_the_products_outside_the_matrix_kernels() {
    for (package, set) in [("models/gpt-oss", "Groups=1"), ("models/gpt2", "Layers=1")] {
        let checked = linnetc(&["check", package, "--perf", "--set", set]);
        assert!(checked.status.success(), "{}", String::from_utf8_lossy(&checked.stderr));
        let said = String::from_utf8_lossy(&checked.stderr);
        assert!(said.contains("every product with a stored weight runs on the matrix kernels"), "{package}: {said}");
    }
    let dir = std::env::temp_dir().join(format!("linnetc-both-ways-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("src")).unwrap();
    std::fs::write(dir.join("linnet.toml"), "[package]\nname = \"both\"\nversion = \"0.1.0\"\nlanguage = \"0.1\"\n")
        .unwrap();
    std::fs::write(
        dir.join("nest.toml"),
        "[model]\nname = \"both\"\n[source]\npath = \"src/lib.linnet\"\nroot = \"Both\"\nentry = \"run\"\n[generics]\nN = 8\n[check]\nB = 2\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("src/lib.linnet"),
        "module both\n\npub block Both<N: Dim> {\n    param w: Tensor[N, N; f32]\n\n    \
         pub entry run<B: Dim>(x: Tensor[B, N; f32]) -> Tensor[B, N; f32] {\n        \
         let y[b, o] = sum[i] x[b, i] * w[i, o]\n        let z[b, i] = sum[o] y[b, o] * w[i, o]\n        return z\n    }\n}\n",
    )
    .unwrap();
    let out = dir.join("artifact");
    let output = linnetc(&["build", dir.to_str().unwrap(), "-o", out.to_str().unwrap()]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let report = String::from_utf8_lossy(&output.stderr);
    let (_, missed) = report.split_once("products outside the matrix kernels").expect("a report of them");
    let lines: Vec<&str> = missed.lines().skip(1).collect();
    assert_eq!(lines.len(), 1, "{missed}");
    assert!(
        lines[0].contains("`w`, summed over its axis 0 (in run)") && lines[0].contains("`[…, out, in]`"),
        "{missed}"
    );
    let checked = linnetc(&["check", dir.to_str().unwrap(), "--perf"]);
    assert!(checked.status.success(), "{}", String::from_utf8_lossy(&checked.stderr));
    assert!(String::from_utf8_lossy(&checked.stderr).contains(missed.trim_end()), "{missed}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn build_prints_the_ir_and_the_memory_plan() {
    let output = linnetc(&["build", "models/qwen3.6-35b-a3b", "--emit", "ir", "--set", "Groups=1"]);
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    let ir = String::from_utf8_lossy(&output.stdout);
    assert!(
        ir.contains("entry decode<>(token: [1, 1; i32], pos: [; i32])") && ir.contains("grouped_attention("),
        "{}",
        &ir[..400.min(ir.len())]
    );
    let plan = String::from_utf8_lossy(&output.stderr);
    assert!(
        plan.contains("weights: ")
            && plan.contains("entry decode<>: peak scratch")
            && plan.contains("entry forward<B=1, S=8>: peak scratch"),
        "{plan}"
    );
}

/// `linnetc explain` says what a code means, as the report shows it (with
/// or without its brackets); an unknown code exits 2 with the list.
#[test]
fn explain_says_what_a_code_means() {
    for asked in ["shape-mismatch", "[shape-mismatch]"] {
        let output = linnetc(&["explain", asked]);
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(stdout.starts_with("shape-mismatch\n\n") && stdout.contains("symbolically"), "{stdout}");
    }
    let listed = linnetc(&["explain"]);
    assert!(listed.status.success());
    assert!(String::from_utf8_lossy(&listed.stdout).lines().any(|line| line.starts_with("unbound-index ")));
    let unknown = linnetc(&["explain", "shape-mismatches"]);
    assert_eq!(unknown.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&unknown.stderr);
    assert!(stderr.contains("no code `shape-mismatches`") && stderr.contains("shape-mismatch "), "{stderr}");
}
