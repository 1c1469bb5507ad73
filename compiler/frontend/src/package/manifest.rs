//! The package's TOML and JSON files, read with their spans so that a bad
//! value is reported where it is written: `linnet.toml`'s package name and
//! dependencies,
//! `nest.toml`'s source, generics, check dims and weights, and
//! `bindings.json`'s parameter-to-tensor names.

use crate::code::Code;
use crate::diagnostic::Diagnostic;
use crate::source::{FileId, SourceMap, Span};
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use toml::Spanned;

/// A value given to a generic: a size, a number for an `f32`, or a dtype
/// name for a `Float`.
#[derive(Clone, Debug, PartialEq)]
pub enum NestValue {
    Int(i64),
    Float(f64),
    Text(String),
    Other(String),
}

impl NestValue {
    /// A value as typed on the command line: an integer, a number, else
    /// text.
    pub fn parse(text: &str) -> NestValue {
        if let Ok(value) = text.parse::<i64>() {
            NestValue::Int(value)
        } else if let Ok(value) = text.parse::<f64>() {
            NestValue::Float(value)
        } else {
            NestValue::Text(text.to_string())
        }
    }
}

impl std::fmt::Display for NestValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NestValue::Int(value) => write!(f, "{value}"),
            NestValue::Float(value) => write!(f, "{value:?}"),
            NestValue::Text(text) => write!(f, "\"{text}\""),
            NestValue::Other(text) => f.write_str(text),
        }
    }
}

/// One `NAME = value` line of `[generics]` or `[check]`.
#[derive(Clone, Debug)]
pub struct NestEntry {
    pub name: String,
    pub value: NestValue,
    pub name_span: Span,
    pub value_span: Span,
}

pub struct Nest {
    pub file: FileId,
    /// `[model] name`
    pub model_name: Option<String>,
    pub source_path: PathBuf,
    pub source_span: Span,
    pub root: Option<(String, Span)>,
    pub entry: Option<(String, Span)>,
    pub generics: Vec<NestEntry>,
    pub generics_span: Span,
    pub check: Vec<NestEntry>,
    pub bindings_path: Option<(String, Span)>,
    /// `[weights] gguf`: where llama.cpp's GGUF files keep the parameters.
    pub gguf_names_path: Option<(String, Span)>,
    pub repo: Option<String>,
    pub revision: Option<String>,
    /// `[config]`: how a checkpoint's `config.json` gives the generics.
    pub config: Vec<super::config::ConfigLine>,
    /// The derived `[config]` values a checkpoint gave, to hold against
    /// the generics once they are known.
    pub config_checks: Vec<super::config::ConfigCheck>,
    /// `[drafter]`: the model's drafter for speculative decoding.
    pub drafter: Option<Drafter>,
    /// Whether the root, entry and bindings are the drafter's.
    pub drafting: bool,
}

/// `[drafter]` of a card: a second root in the package (a
/// multi-token-prediction layer) that drafts tokens for the model, with
/// the card's generics and its own bindings, read from the same
/// checkpoint. Loading with `LoadOptions::drafter` builds it instead of
/// the model.
#[derive(Clone, Debug)]
pub struct Drafter {
    /// The `[drafter]` table, for messages about it as a whole.
    pub span: Span,
    pub root: Option<(String, Span)>,
    pub entry: Option<(String, Span)>,
    pub bindings_path: Option<(String, Span)>,
}

pub struct Bindings {
    pub file: FileId,
    /// Parameter path, checkpoint tensor name, span of the key.
    pub entries: Vec<(String, String, Span)>,
}

fn toml_error(file: FileId, error: toml::de::Error, what: &str) -> Diagnostic {
    let span = Span::new(file, error.span().unwrap_or(0..0));
    Diagnostic::error(Code::PackageError, span, format!("invalid {what}: {}", error.message().trim()))
        .with_label(error.message().trim().to_string())
}

#[derive(Deserialize)]
struct RawManifest {
    package: Option<RawPackage>,
    dependencies: Option<BTreeMap<Spanned<String>, Spanned<toml::Value>>>,
}

#[derive(Deserialize)]
struct RawPackage {
    name: Spanned<String>,
}

/// `linnet.toml`: the package's name and the packages it uses.
pub struct Manifest {
    pub name: String,
    pub dependencies: Vec<Dependency>,
}

/// One `name = { path = "…" }` line of `[dependencies]`.
pub struct Dependency {
    /// What modules write to use it (`use name.module::{…}`); it must be
    /// the `[package] name` of the package at `path`.
    pub name: String,
    /// Relative to the folder of the `linnet.toml` that declares it;
    /// `None` (reported) where the manifest gives none.
    pub path: Option<PathBuf>,
    pub name_span: Span,
    pub path_span: Span,
}

/// A package name is an identifier, and not one that `use` paths reserve.
fn valid_package_name(name: &str) -> bool {
    !name.is_empty()
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name != "std"
        && name != "crate"
}

pub fn parse_manifest(file: FileId, sources: &SourceMap, diagnostics: &mut Vec<Diagnostic>) -> Option<Manifest> {
    let raw = match toml::from_str::<RawManifest>(&sources.get(file).text) {
        Ok(raw) => raw,
        Err(error) => {
            diagnostics.push(toml_error(file, error, "linnet.toml"));
            return None;
        }
    };
    let Some(package) = raw.package else {
        diagnostics.push(
            Diagnostic::error(Code::PackageError, Span::new(file, 0..0), "linnet.toml has no [package] table")
                .with_label("expected `[package]` with a `name`"),
        );
        return None;
    };
    if !valid_package_name(package.name.get_ref()) {
        diagnostics.push(
            Diagnostic::error(Code::PackageError, Span::new(file, package.name.span()), "invalid package name")
                .with_label("a package name is an identifier (letters, digits and `_`), other than `std` and `crate`"),
        );
        return None;
    }
    let mut dependencies = Vec::new();
    for (name, value) in raw.dependencies.unwrap_or_default() {
        let name_span = Span::new(file, name.span());
        let path_value = match value.get_ref() {
            toml::Value::Table(table) => table.get("path").and_then(toml::Value::as_str).filter(|_| table.len() == 1),
            _ => None,
        };
        if path_value.is_none() {
            diagnostics.push(
                Diagnostic::error(
                    Code::PackageError,
                    Span::new(file, value.span()),
                    format!("dependency `{}` has no path", name.get_ref()),
                )
                .with_label("a dependency is a package on disk: `{ path = \"../other\" }`"),
            );
        }
        if !valid_package_name(name.get_ref()) {
            diagnostics
                .push(Diagnostic::error(Code::PackageError, name_span, "invalid dependency name").with_label(
                    "the dependency's package name: letters, digits and `_`, other than `std` and `crate`",
                ));
            continue;
        }
        dependencies.push(Dependency {
            name: name.into_inner(),
            path: path_value.map(PathBuf::from),
            name_span,
            path_span: Span::new(file, value.span()),
        });
    }
    dependencies.sort_by_key(|dependency| dependency.name_span.start);
    Some(Manifest { name: package.name.into_inner(), dependencies })
}

#[derive(Deserialize)]
struct RawNest {
    model: Option<RawModel>,
    source: Option<Spanned<RawSource>>,
    generics: Option<Spanned<BTreeMap<Spanned<String>, Spanned<toml::Value>>>>,
    check: Option<BTreeMap<Spanned<String>, Spanned<toml::Value>>>,
    weights: Option<RawWeights>,
    drafter: Option<Spanned<RawDrafter>>,
    config: Option<BTreeMap<Spanned<String>, Spanned<toml::Value>>>,
}

#[derive(Deserialize)]
struct RawDrafter {
    root: Option<Spanned<String>>,
    entry: Option<Spanned<String>>,
    bindings: Option<Spanned<String>>,
}

#[derive(Deserialize)]
struct RawModel {
    name: Option<String>,
}

#[derive(Deserialize)]
struct RawSource {
    path: Option<Spanned<String>>,
    root: Option<Spanned<String>>,
    entry: Option<Spanned<String>>,
}

#[derive(Deserialize)]
struct RawWeights {
    repo: Option<String>,
    revision: Option<String>,
    bindings: Option<Spanned<String>>,
    gguf: Option<Spanned<String>>,
}

fn nest_value(value: &toml::Value) -> NestValue {
    match value {
        toml::Value::Integer(value) => NestValue::Int(*value),
        toml::Value::Float(value) => NestValue::Float(*value),
        toml::Value::String(text) => NestValue::Text(text.clone()),
        other => NestValue::Other(other.to_string()),
    }
}

fn entries(file: FileId, table: BTreeMap<Spanned<String>, Spanned<toml::Value>>) -> Vec<NestEntry> {
    let mut entries: Vec<NestEntry> = table
        .into_iter()
        .map(|(name, value)| NestEntry {
            name_span: Span::new(file, name.span()),
            value_span: Span::new(file, value.span()),
            name: name.into_inner(),
            value: nest_value(value.get_ref()),
        })
        .collect();
    entries.sort_by_key(|entry| entry.name_span.start);
    entries
}

/// Reads a model card as written; [`apply_overrides`] and the checkpoint's
/// `config.json` (`super::config::apply`) change its generics after.
pub fn parse_nest(file: FileId, sources: &SourceMap, diagnostics: &mut Vec<Diagnostic>) -> Option<Nest> {
    let raw = match toml::from_str::<RawNest>(&sources.get(file).text) {
        Ok(raw) => raw,
        Err(error) => {
            diagnostics.push(toml_error(file, error, "nest.toml"));
            return None;
        }
    };
    let span = |range: std::ops::Range<usize>| Span::new(file, range);
    let source = raw.source.map(|source| (span(source.span()), source.into_inner()));
    let (source_path, source_span) = match source.as_ref().and_then(|(_, s)| s.path.as_ref()) {
        Some(path) => (PathBuf::from(path.get_ref()), span(path.span())),
        None => (PathBuf::from("src/lib.linnet"), source.as_ref().map_or(span(0..0), |(s, _)| *s)),
    };
    let named = |value: &Option<Spanned<String>>| value.as_ref().map(|v| (v.get_ref().clone(), span(v.span())));
    let root = source.as_ref().and_then(|(_, s)| named(&s.root));
    let entry = source.as_ref().and_then(|(_, s)| named(&s.entry));
    let (generics_span, generics) = match raw.generics {
        Some(table) => (span(table.span()), entries(file, table.into_inner())),
        None => (span(0..0), Vec::new()),
    };
    let check = raw.check.map(|table| entries(file, table)).unwrap_or_default();
    let config = raw.config.map(|table| super::config::parse(file, table, diagnostics)).unwrap_or_default();
    let weights = raw.weights;
    let drafter = raw.drafter.map(|table| {
        let table_span = span(table.span());
        let table = table.into_inner();
        Drafter {
            span: table_span,
            root: named(&table.root),
            entry: named(&table.entry),
            bindings_path: named(&table.bindings),
        }
    });
    Some(Nest {
        file,
        model_name: raw.model.and_then(|model| model.name),
        source_path,
        source_span,
        root,
        entry,
        generics,
        generics_span,
        check,
        bindings_path: weights.as_ref().and_then(|w| named(&w.bindings)),
        gguf_names_path: weights.as_ref().and_then(|w| named(&w.gguf)),
        repo: weights.as_ref().and_then(|w| w.repo.clone()),
        revision: weights.and_then(|w| w.revision),
        config,
        config_checks: Vec::new(),
        drafter,
        drafting: false,
    })
}

/// `--set NAME=VALUE` replaces a `[check]` dim of that name, else a
/// generic. The values live in a source of their own, the command line,
/// so that a value that breaks a clause is shown where it was typed.
pub fn apply_overrides(sources: &mut SourceMap, overrides: &[(String, String)], nest: &mut Nest) {
    let (generics, check) = (&mut nest.generics, &mut nest.check);
    if overrides.is_empty() {
        return;
    }
    let mut text = String::new();
    let mut placed = Vec::new();
    for (name, value) in overrides {
        text.push_str("--set ");
        let name_start = text.len();
        text.push_str(name);
        text.push('=');
        let value_start = text.len();
        text.push_str(value);
        placed.push((name_start..name_start + name.len(), value_start..text.len()));
        text.push(' ');
    }
    let file = sources.add("<command line>", text);
    for ((name, value), (name_range, value_range)) in overrides.iter().zip(placed) {
        let entry = NestEntry {
            name: name.clone(),
            value: NestValue::parse(value),
            name_span: Span::new(file, name_range),
            value_span: Span::new(file, value_range),
        };
        if let Some(slot) = check.iter_mut().find(|e| e.name == *name) {
            *slot = entry;
        } else if let Some(slot) = generics.iter_mut().find(|e| e.name == *name) {
            *slot = entry;
        } else {
            generics.push(entry);
        }
    }
}

pub fn parse_bindings(file: FileId, sources: &SourceMap, diagnostics: &mut Vec<Diagnostic>) -> Option<Bindings> {
    let source = sources.get(file);
    let text = &source.text;
    let map = match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(text) {
        Ok(map) => map,
        Err(error) => {
            let line_start: usize = text.split_inclusive('\n').take(error.line().saturating_sub(1)).map(str::len).sum();
            let at = (line_start + error.column().saturating_sub(1)).min(text.len());
            diagnostics.push(
                Diagnostic::error(
                    Code::PackageError,
                    Span::new(file, at..at),
                    format!("invalid bindings.json: {error}"),
                )
                .with_label("expected an object of parameter paths to tensor names"),
            );
            return None;
        }
    };
    let mut entries = Vec::new();
    for (key, value) in map {
        let key_span = super::json_key_span(file, text, &key);
        match value {
            serde_json::Value::String(tensor) => entries.push((key, tensor, key_span)),
            _ => diagnostics.push(
                Diagnostic::error(Code::PackageError, key_span, format!("binding `{key}` is not a tensor name"))
                    .with_label("expected a string: the checkpoint's tensor name"),
            ),
        }
    }
    Some(Bindings { file, entries })
}
