//! Packages on disk: `linnet.toml` (the manifest and its dependencies),
//! `nest.toml` (the model card with generics), `bindings.json` (parameter
//! paths to checkpoint names), and the modules reached from the root
//! through `use`: in the package, its dependencies and the standard
//! library. All file IO of the frontend happens here; unsaved editor texts
//! come in through an overlay and win over the disk.

pub mod config;
pub mod gguf_names;
mod link;
mod manifest;
mod modules;
mod rope_factors;
mod stdlib;

pub use link::{join_normalized, Member};
pub use manifest::{Bindings, Drafter, Nest, NestEntry, NestValue};
pub use stdlib::stdlib_dir;

use crate::code::Code;
use crate::diagnostic::Diagnostic;
use crate::source::{FileId, SourceMap, Span};
use crate::syntax::ast;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The package `path` is in: `path` itself when it holds a `linnet.toml`,
/// else the nearest folder above it that does (from a module file, or
/// from `src/`), written relative as `path` was (`..` from `src/`).
pub fn enclosing(path: &Path) -> Option<PathBuf> {
    let levels = path.canonicalize().ok()?.components().count();
    let mut dir: PathBuf = path.components().filter(|c| !matches!(c, std::path::Component::CurDir)).collect();
    if path.is_file() {
        dir.pop();
    }
    for _ in 0..levels {
        let shown = if dir.as_os_str().is_empty() { PathBuf::from(".") } else { dir.clone() };
        if shown.join("linnet.toml").is_file() {
            return Some(shown);
        }
        if matches!(dir.components().next_back(), Some(std::path::Component::Normal(_))) {
            dir.pop();
        } else {
            dir.push("..");
        }
    }
    None
}

/// A parsed module and the dotted name it is known by (`qwen3_5_moe.moe`,
/// `qwen3_5.attention`, `std.nn.linear`).
pub struct LoadedModule {
    pub name: String,
    pub file: FileId,
    pub ast: ast::Module,
    /// The qualified module each of `ast.uses` names, in order; `None`
    /// where the loader reported that it cannot be used from here.
    pub imports: Vec<Option<String>>,
}

pub struct Package {
    pub nest: Option<Nest>,
    pub bindings: Option<Bindings>,
    /// `gguf.json`, when the card names one.
    pub gguf_names: Option<gguf_names::GgufFile>,
    /// This package first, then the packages it depends on, transitively.
    pub members: Vec<Member>,
    /// The root module first, then every module reached through `use`.
    pub modules: Vec<LoadedModule>,
}

impl Package {
    /// `[package] name`: the root module's name, what `crate` stands for.
    pub fn name(&self) -> &str {
        &self.members[0].name
    }

    /// The folder holding its `linnet.toml`.
    pub fn dir(&self) -> &Path {
        &self.members[0].dir
    }
}

/// Parsed modules kept between loads, so that a language server re-parses
/// only the file that changed. An entry is reused when the text and the
/// file's id in the new source map are the same as when it was parsed.
#[derive(Default)]
pub struct ParseCache {
    modules: HashMap<PathBuf, (String, FileId, ast::Module, Vec<Diagnostic>)>,
}

impl ParseCache {
    fn get(&self, path: &Path, text: &str, file: FileId) -> Option<(ast::Module, Vec<Diagnostic>)> {
        let (old_text, old_file, ast, diagnostics) = self.modules.get(path)?;
        (old_text == text && *old_file == file).then(|| (ast.clone(), diagnostics.clone()))
    }

    fn insert(&mut self, path: &Path, text: &str, file: FileId, ast: &ast::Module, diagnostics: &[Diagnostic]) {
        self.modules.insert(path.to_path_buf(), (text.to_string(), file, ast.clone(), diagnostics.to_vec()));
    }
}

/// What a checkpoint says of its model, for the card to read its generics
/// from.
#[derive(Clone, Debug)]
pub enum Checkpoint {
    /// A checkpoint folder's `config.json`, read through the card's
    /// `[config]` (a config that does not say its `dtype` is read as
    /// stating the type its tensors are stored in).
    Config(PathBuf),
    /// A GGUF file's metadata (at `path`), read through `gguf.json`'s
    /// `metadata`; `stored` is the type of its floating tensors, as torch
    /// names it (`bfloat16`), where the file says one.
    GgufMetadata { path: PathBuf, values: serde_json::Map<String, serde_json::Value>, stored: Option<String> },
}

/// How to load: which model card to read, which values to override, and
/// unsaved texts that replace files on disk.
#[derive(Default)]
pub struct LoadOptions {
    pub parse_cache: Option<std::sync::Arc<std::cell::RefCell<ParseCache>>>,
    /// A model card other than `<dir>/nest.toml`.
    pub nest: Option<PathBuf>,
    /// `--set NAME=VALUE`: generics (and `[check]` dims) to override.
    pub overrides: Vec<(String, String)>,
    /// What the checkpoint the model will run with says of itself: the
    /// card reads generics from it (`--set` still wins).
    pub checkpoint: Option<Checkpoint>,
    pub overlay: HashMap<PathBuf, String>,
    /// Where the standard library lives; found next to the compiler if absent.
    pub stdlib: Option<PathBuf>,
    /// Load the card's `[drafter]` (its root, entry and bindings) in place
    /// of the model.
    pub drafter: bool,
}

impl LoadOptions {
    /// The overlay's text for `path` (its key may be written with `..`
    /// steps that the loader's paths have taken out), else the disk's.
    fn read(&self, path: &Path) -> std::io::Result<String> {
        let overlaid = self.overlay.get(path).or_else(|| {
            let wanted = join_normalized(path, Path::new(""));
            self.overlay.iter().find(|(key, _)| join_normalized(key, Path::new("")) == wanted).map(|(_, text)| text)
        });
        match overlaid {
            Some(text) => Ok(text.clone()),
            None => std::fs::read_to_string(path),
        }
    }
}

/// The span of `"key":` in a JSON file's `text` (its first occurrence as
/// a key), for messages about its entry; the file's start if it has none.
fn json_key_span(file: FileId, text: &str, key: &str) -> Span {
    let quoted = serde_json::to_string(key).unwrap_or_default();
    let at = text
        .match_indices(&quoted)
        .map(|(at, _)| at)
        .find(|at| text[at + quoted.len()..].trim_start().starts_with(':'))
        .unwrap_or(0);
    Span::new(file, at..at + quoted.len())
}

/// A file that could not be read, reported at a span in whatever mentioned it.
fn unreadable(span: Span, path: &Path, error: &std::io::Error) -> Diagnostic {
    Diagnostic::error(Code::PackageError, span, format!("cannot read `{}`: {error}", path.display()))
        .with_label("needed here")
}

/// An anchor for problems with no better place: the start of a file.
fn file_start(sources: &mut SourceMap, path: &Path) -> Span {
    let file = sources.find(path).unwrap_or_else(|| sources.add(path, String::new()));
    Span::new(file, 0..0)
}

/// Applies what `checkpoint` says to the card's generics: a `config.json`
/// through `[config]`, a GGUF file's metadata through `gguf.json`.
fn read_checkpoint(
    checkpoint: &Checkpoint,
    nest: &mut Nest,
    gguf_names: Option<&gguf_names::GgufFile>,
    sources: &mut SourceMap,
    diagnostics: &mut Vec<Diagnostic>,
) {
    let (lines, file, stored) = match checkpoint {
        Checkpoint::Config(path) => {
            if nest.config.is_empty() {
                return;
            }
            let stored = path.parent().and_then(config::stored_dtype).map(str::to_string);
            match std::fs::read_to_string(path) {
                Ok(text) => (nest.config.clone(), sources.add(path, text), stored),
                Err(error) => {
                    diagnostics.push(unreadable(nest.config[0].span, path, &error));
                    return;
                }
            }
        }
        Checkpoint::GgufMetadata { path, values, stored } => {
            let Some(names) = gguf_names else { return };
            let mut lines = gguf_names::config_lines(names);
            // The stored type gives `T` where the card has one.
            if nest.generics.iter().any(|entry| entry.name == "T") {
                let span = Span::new(nest.file, 0..0);
                lines.push(config::ConfigLine {
                    keys: vec!["dtype".into()],
                    rule: config::Rule::Generic { name: "T".into(), per: 1, otherwise: None },
                    span,
                });
            }
            let text = serde_json::to_string_pretty(values).unwrap_or_default();
            let shown = PathBuf::from(format!("{} (metadata)", path.display()));
            (lines, sources.add(&shown, text), stored.clone())
        }
    };
    nest.config_checks = config::apply(&lines, file, stored.as_deref(), sources, &mut nest.generics, diagnostics);
}

/// The card with its `[drafter]`'s root, entry and bindings in place of
/// the model's; the drafter has no GGUF names of its own.
fn as_drafter(mut nest: Nest, diagnostics: &mut Vec<Diagnostic>) -> Option<Nest> {
    let Some(drafter) = nest.drafter.take() else {
        diagnostics.push(
            Diagnostic::error(Code::PackageError, Span::new(nest.file, 0..0), "the model card names no drafter")
                .with_label("a `[drafter]` table names the drafter's root, entry and bindings"),
        );
        return None;
    };
    if drafter.root.is_none() {
        diagnostics.push(
            Diagnostic::error(Code::UnknownRoot, drafter.span, "`[drafter]` names no root block")
                .with_label("add `root = \"Mtp\"`"),
        );
        return None;
    }
    nest.root = drafter.root;
    nest.entry = drafter.entry;
    nest.bindings_path = drafter.bindings_path;
    nest.gguf_names_path = None;
    nest.drafting = true;
    Some(nest)
}

pub fn load(
    dir: &Path,
    options: &LoadOptions,
    sources: &mut SourceMap,
    diagnostics: &mut Vec<Diagnostic>,
) -> Option<Package> {
    let manifest_path = dir.join("linnet.toml");
    let manifest_text = match options.read(&manifest_path) {
        Ok(text) => text,
        Err(error) => {
            let span = file_start(sources, &manifest_path);
            diagnostics.push(
                Diagnostic::error(
                    Code::PackageError,
                    span,
                    format!("`{}` is not a Linnet package: {error}", dir.display()),
                )
                .with_label("a package has a `linnet.toml`"),
            );
            return None;
        }
    };
    let manifest_file = sources.add(&manifest_path, manifest_text);
    let manifest = manifest::parse_manifest(manifest_file, sources, diagnostics)?;

    let nest_path = options.nest.clone().unwrap_or_else(|| dir.join("nest.toml"));
    let nest = match options.read(&nest_path) {
        Ok(text) => {
            let file = sources.add(&nest_path, text);
            manifest::parse_nest(file, sources, diagnostics)
        }
        Err(error) if options.nest.is_some() => {
            let span = file_start(sources, &nest_path);
            diagnostics.push(unreadable(span, &nest_path, &error));
            None
        }
        Err(_) => None,
    };
    let nest = match nest {
        Some(nest) if options.drafter => as_drafter(nest, diagnostics),
        nest => nest,
    };

    let source_path = nest.as_ref().map_or_else(|| PathBuf::from("src/lib.linnet"), |nest| nest.source_path.clone());
    // `bindings` and `gguf` are relative to the model card that names them.
    let nest_dir = nest_path.parent().map_or_else(|| dir.to_path_buf(), Path::to_path_buf);
    let mut beside = |named: Option<(String, Span)>| {
        let (relative, span) = named?;
        let path = nest_dir.join(relative);
        match options.read(&path) {
            Ok(text) => Some(sources.add(&path, text)),
            Err(error) => {
                diagnostics.push(unreadable(span, &path, &error));
                None
            }
        }
    };
    let bindings_file = beside(nest.as_ref().and_then(|nest| nest.bindings_path.clone()));
    let gguf_file = beside(nest.as_ref().and_then(|nest| nest.gguf_names_path.clone()));
    let bindings = bindings_file.and_then(|file| manifest::parse_bindings(file, sources, diagnostics));
    let gguf_names = gguf_file.and_then(|file| gguf_names::parse(file, sources, diagnostics));
    let mut nest = nest;
    if let Some(nest) = nest.as_mut() {
        if let Some(checkpoint) = &options.checkpoint {
            read_checkpoint(checkpoint, nest, gguf_names.as_ref(), sources, diagnostics);
        }
        manifest::apply_overrides(sources, &options.overrides, nest);
    }

    let root = Member {
        name: manifest.name,
        dir: dir.to_path_buf(),
        root_file: join_normalized(dir, &source_path),
        dependencies: Vec::new(),
        unlinked: Vec::new(),
    };
    let members = link::link(root, manifest.dependencies, options, sources, diagnostics);
    let stdlib = options.stdlib.clone().or_else(stdlib_dir);
    let mut loader =
        modules::ModuleLoader { members: &members, stdlib, options, sources, diagnostics, modules: Vec::new() };
    loader.load_all(nest.as_ref().map(|nest| nest.source_span));
    let modules = loader.modules;
    Some(Package { nest, bindings, gguf_names, members, modules })
}
