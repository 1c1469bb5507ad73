//! Diagnostics as data, and their two renderings: ariadne reports for people
//! (colour on a terminal, plain otherwise) and one JSON object per line for
//! editors and scripts. Every phase produces [`Diagnostic`]s; nothing else in
//! the compiler prints.

use crate::code::Code;
use crate::source::{SourceMap, Span};
use ariadne::{Color, Config, IndexType, Label as AriadneLabel, Report, ReportKind};
use std::io::{self, Write};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Error,
    Warning,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        }
    }
}

/// A span with a message: the primary label says what is wrong, secondary
/// labels say why (the clause broken, the declaration expected).
#[derive(Clone, Debug)]
pub struct Label {
    pub span: Span,
    pub message: String,
}

/// How sure a suggested fix is, as rustc grades them: certain (a tool
/// may apply it unasked), or a guess for the author to confirm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Applicability {
    MachineApplicable,
    MaybeIncorrect,
}

impl Applicability {
    pub fn as_str(self) -> &'static str {
        match self {
            Applicability::MachineApplicable => "machine-applicable",
            Applicability::MaybeIncorrect => "maybe-incorrect",
        }
    }
}

/// A `help:` that names its fix: `replacement` in place of the text at
/// `span` (an empty replacement deletes it).
#[derive(Clone, Debug)]
pub struct Suggestion {
    pub message: String,
    pub span: Span,
    pub replacement: String,
    pub applicability: Applicability,
}

#[derive(Clone, Debug)]
pub struct Diagnostic {
    pub severity: Severity,
    /// What it is about: a stable name, such as `shape-mismatch`, with an
    /// explanation (`linnetc explain`).
    pub code: Code,
    pub message: String,
    pub primary: Label,
    pub secondary: Vec<Label>,
    pub notes: Vec<String>,
    pub suggestions: Vec<Suggestion>,
}

impl Diagnostic {
    pub fn error(code: Code, span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic {
            severity: Severity::Error,
            code,
            message: message.into(),
            primary: Label { span, message: String::new() },
            secondary: Vec::new(),
            notes: Vec::new(),
            suggestions: Vec::new(),
        }
    }

    pub fn warning(code: Code, span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic { severity: Severity::Warning, ..Diagnostic::error(code, span, message) }
    }

    /// The text under the primary span.
    pub fn with_label(mut self, message: impl Into<String>) -> Diagnostic {
        self.primary.message = message.into();
        self
    }

    pub fn with_secondary(mut self, span: Span, message: impl Into<String>) -> Diagnostic {
        self.secondary.push(Label { span, message: message.into() });
        self
    }

    pub fn with_note(mut self, note: impl Into<String>) -> Diagnostic {
        self.notes.push(note.into());
        self
    }

    /// A `help:` with its fix: `replacement` in place of `span`.
    pub fn with_suggestion(
        mut self,
        message: impl Into<String>,
        span: Span,
        replacement: impl Into<String>,
        applicability: Applicability,
    ) -> Diagnostic {
        let suggestion = Suggestion { message: message.into(), span, replacement: replacement.into(), applicability };
        self.suggestions.push(suggestion);
        self
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

/// Orders diagnostics by file and position, so output is stable, and drops
/// repeats (one clause broken by one value is one problem, however many
/// entries share it).
pub fn sort(diagnostics: &mut Vec<Diagnostic>) {
    diagnostics.sort_by_key(|d| (d.primary.span.file, d.primary.span.start, d.code.name()));
    diagnostics.dedup_by(|a, b| a.code == b.code && a.primary.span == b.primary.span && a.message == b.message);
}

/// Writes an ariadne report for each diagnostic.
pub fn render_human(
    diagnostics: &[Diagnostic],
    sources: &SourceMap,
    colour: bool,
    out: &mut dyn Write,
) -> io::Result<()> {
    let name = |span: Span| sources.path(span.file).display().to_string();
    let cache_files: Vec<(String, String)> =
        sources.iter().map(|(_, file)| (file.path.display().to_string(), file.text.clone())).collect();
    let mut cache = ariadne::sources(cache_files);
    for diagnostic in diagnostics {
        let kind = match diagnostic.severity {
            Severity::Error => ReportKind::Error,
            Severity::Warning => ReportKind::Warning,
        };
        let primary = &diagnostic.primary;
        let mut report = Report::build(kind, (name(primary.span), primary.span.range()))
            .with_config(Config::default().with_color(colour).with_index_type(IndexType::Byte))
            .with_code(diagnostic.code.name())
            .with_message(&diagnostic.message)
            .with_label(
                AriadneLabel::new((name(primary.span), primary.span.range()))
                    .with_message(&primary.message)
                    .with_color(Color::Red)
                    .with_order(0),
            );
        for (at, label) in diagnostic.secondary.iter().enumerate() {
            report = report.with_label(
                AriadneLabel::new((name(label.span), label.span.range()))
                    .with_message(&label.message)
                    .with_color(Color::Blue)
                    .with_order(at as i32 + 1),
            );
        }
        for note in &diagnostic.notes {
            report = report.with_note(note);
        }
        for suggestion in &diagnostic.suggestions {
            report = report.with_help(&suggestion.message);
        }
        report.finish().write(&mut cache, &mut *out)?;
    }
    Ok(())
}

fn label_json(label: &Label, sources: &SourceMap) -> serde_json::Value {
    let file = sources.get(label.span.file);
    let (line, column) = file.line_column(label.span.start as usize);
    let (end_line, end_column) = file.line_column(label.span.end as usize);
    serde_json::json!({
        "file": file.path.display().to_string(),
        "line": line,
        "column": column,
        "end_line": end_line,
        "end_column": end_column,
        "message": label.message,
    })
}

/// One JSON object per diagnostic: severity, code, message, the primary
/// label's file and 1-based range, the secondary labels, the notes, and
/// the suggestions (each a range with its `replacement` and
/// `applicability`, as rustc's JSON gives them).
pub fn to_json(diagnostic: &Diagnostic, sources: &SourceMap) -> serde_json::Value {
    let mut object = label_json(&diagnostic.primary, sources);
    let fields = object.as_object_mut().expect("label_json builds an object");
    let label = fields.remove("message").unwrap_or_default();
    fields.insert("severity".into(), diagnostic.severity.as_str().into());
    fields.insert("code".into(), diagnostic.code.name().into());
    fields.insert("message".into(), diagnostic.message.clone().into());
    fields.insert("label".into(), label);
    fields.insert("secondary".into(), diagnostic.secondary.iter().map(|label| label_json(label, sources)).collect());
    fields.insert("notes".into(), diagnostic.notes.clone().into());
    let suggestions = diagnostic.suggestions.iter().map(|suggestion| {
        let mut object = label_json(&Label { span: suggestion.span, message: suggestion.message.clone() }, sources);
        object["replacement"] = suggestion.replacement.clone().into();
        object["applicability"] = suggestion.applicability.as_str().into();
        object
    });
    fields.insert("suggestions".into(), suggestions.collect());
    object
}
