//! Support for the end-to-end tests: expected diagnostics read from
//! annotations in the sources (`//~ ERROR code` in Linnet, `#~ ERROR code`
//! in TOML), compared with what the checker reports, and snapshots of the
//! rendered reports (`LINNET_BLESS=1` rewrites them).

use linnet_frontend::diagnostic::{self, Severity};
use linnet_frontend::driver::Checked;
use std::path::{Path, PathBuf};

/// The repository root, as a path relative to the test's working
/// directory (`tests/`), so that rendered paths are the same everywhere.
pub fn root() -> PathBuf {
    PathBuf::from("..")
}

/// One diagnostic as the tests see it: where and what, not how it reads.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Expected {
    pub file: PathBuf,
    pub line: usize,
    pub severity: &'static str,
    pub code: String,
}

/// The annotations in one file: `//~ ERROR a, b` or `#~ WARNING c` on the
/// line each diagnostic points at.
pub fn annotations(path: &Path, text: &str) -> Vec<Expected> {
    let mut expected = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let Some(at) = line.find("//~").or_else(|| line.find("#~")) else { continue };
        let marker = line[at..].trim_start_matches("//~").trim_start_matches("#~").trim();
        let (severity, codes) = match marker.split_once(' ') {
            Some(("ERROR", codes)) => ("error", codes),
            Some(("WARNING", codes)) => ("warning", codes),
            _ => panic!("{}:{}: malformed annotation `{marker}`", path.display(), index + 1),
        };
        for code in codes.split(',') {
            expected.push(Expected {
                file: path.to_path_buf(),
                line: index + 1,
                severity,
                code: code.trim().to_string(),
            });
        }
    }
    expected
}

/// What the checker reported, in the same form.
pub fn reported(checked: &Checked) -> Vec<Expected> {
    checked
        .diagnostics
        .iter()
        .map(|d| {
            let file = checked.sources.get(d.primary.span.file);
            let (line, _) = file.line_column(d.primary.span.start as usize);
            let severity = if d.severity == Severity::Error { "error" } else { "warning" };
            Expected { file: file.path.clone(), line, severity, code: d.code.to_string() }
        })
        .collect()
}

/// `None` when the two agree as multisets; otherwise what differs.
pub fn difference(mut expected: Vec<Expected>, mut reported: Vec<Expected>) -> Option<String> {
    expected.sort();
    reported.sort();
    if expected == reported {
        return None;
    }
    let show = |items: &[Expected]| {
        items
            .iter()
            .map(|e| format!("    {}:{} {} {}", e.file.display(), e.line, e.severity, e.code))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let mut missing = expected.clone();
    let mut extra = Vec::new();
    for item in reported {
        match missing.iter().position(|e| *e == item) {
            Some(at) => {
                missing.remove(at);
            }
            None => extra.push(item),
        }
    }
    Some(format!("  expected but not reported:\n{}\n  reported but not expected:\n{}", show(&missing), show(&extra)))
}

/// The reports as a person sees them, without colour.
pub fn render(checked: &Checked) -> String {
    let mut out = Vec::new();
    diagnostic::render_human(&checked.diagnostics, &checked.sources, false, &mut out).expect("writing to memory");
    String::from_utf8(out).expect("ariadne writes UTF-8")
}

/// Compares `text` with the snapshot `name`; with `LINNET_BLESS=1`,
/// writes it instead.
pub fn snapshot(dir: &Path, name: &str, text: &str) -> Result<(), String> {
    let path = dir.join(format!("{name}.txt"));
    if std::env::var_os("LINNET_BLESS").is_some() {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        std::fs::write(&path, text).map_err(|e| e.to_string())?;
        return Ok(());
    }
    match std::fs::read_to_string(&path) {
        Ok(stored) if stored == text => Ok(()),
        Ok(stored) => Err(format!(
            "snapshot {} differs (LINNET_BLESS=1 rewrites it)\n--- stored\n{stored}\n--- now\n{text}",
            path.display()
        )),
        Err(_) => Err(format!("no snapshot {} (LINNET_BLESS=1 writes it)\n{text}", path.display())),
    }
}
