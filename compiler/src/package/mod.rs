//! Packages on disk: `linnet.toml` (the manifest), `nest.toml` (the model
//! card with generics), `bindings.json` (parameter paths to checkpoint
//! names), and the modules reached from the root through `use`, including
//! the standard library. All file IO of the frontend happens here; unsaved
//! editor texts come in through an overlay and win over the disk.

mod manifest;
mod stdlib;

pub use manifest::{Bindings, Nest, NestValue};
pub use stdlib::stdlib_dir;

use crate::diagnostic::Diagnostic;
use crate::source::{FileId, SourceMap, Span};
use crate::syntax::{self, ast};
use std::collections::{HashMap, HashSet, VecDeque};
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

/// A parsed module and the dotted name it is known by (`qwen3_5_moe.attention`,
/// `std.nn.linear`).
pub struct LoadedModule {
    pub name: String,
    pub file: FileId,
    pub ast: ast::Module,
}

pub struct Package {
    pub dir: PathBuf,
    /// `[package] name`: the root module's name, what `crate` stands for.
    pub name: String,
    pub nest: Option<Nest>,
    pub bindings: Option<Bindings>,
    /// The root module first, then every module reached through `use`.
    pub modules: Vec<LoadedModule>,
}

/// Parsed modules kept between loads, so that a language server re-parses
/// only the file that changed. An entry is reused when the text and the
/// file's id in the new source map are the same as when it was parsed.
#[derive(Default)]
pub struct ParseCache {
    modules: HashMap<PathBuf, (String, FileId, ast::Module, Vec<Diagnostic>)>,
}

/// How to load: which model card to read, which values to override, and
/// unsaved texts that replace files on disk.
#[derive(Default)]
pub struct LoadOptions {
    pub parse_cache: Option<std::rc::Rc<std::cell::RefCell<ParseCache>>>,
    /// A model card other than `<dir>/nest.toml`.
    pub nest: Option<PathBuf>,
    /// `--set NAME=VALUE`: generics (and `[check]` dims) to override.
    pub overrides: Vec<(String, String)>,
    pub overlay: HashMap<PathBuf, String>,
    /// Where the standard library lives; found next to the compiler if absent.
    pub stdlib: Option<PathBuf>,
}

impl LoadOptions {
    fn read(&self, path: &Path) -> std::io::Result<String> {
        match self.overlay.get(path) {
            Some(text) => Ok(text.clone()),
            None => std::fs::read_to_string(path),
        }
    }
}

/// A file that could not be read, reported at a span in whatever mentioned it.
fn unreadable(span: Span, path: &Path, error: &std::io::Error) -> Diagnostic {
    Diagnostic::error("package-error", span, format!("cannot read `{}`: {error}", path.display()))
        .with_label("needed here")
}

/// An anchor for problems with no better place: the start of a file.
fn file_start(sources: &mut SourceMap, path: &Path) -> Span {
    let file = sources.find(path).unwrap_or_else(|| sources.add(path, String::new()));
    Span::new(file, 0..0)
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
                    "package-error",
                    span,
                    format!("`{}` is not a Linnet package: {error}", dir.display()),
                )
                .with_label("a package has a `linnet.toml`"),
            );
            return None;
        }
    };
    let manifest_file = sources.add(&manifest_path, manifest_text);
    let name = manifest::package_name(manifest_file, sources, diagnostics)?;

    let nest_path = options.nest.clone().unwrap_or_else(|| dir.join("nest.toml"));
    let nest = match options.read(&nest_path) {
        Ok(text) => {
            let file = sources.add(&nest_path, text);
            manifest::parse_nest(file, sources, &options.overrides, diagnostics)
        }
        Err(error) if options.nest.is_some() => {
            let span = file_start(sources, &nest_path);
            diagnostics.push(unreadable(span, &nest_path, &error));
            None
        }
        Err(_) => None,
    };

    let source_path = nest.as_ref().map_or_else(|| PathBuf::from("src/lib.linnet"), |nest| nest.source_path.clone());
    // `bindings` is relative to the model card that names it.
    let nest_dir = nest_path.parent().map_or_else(|| dir.to_path_buf(), Path::to_path_buf);
    let bindings = nest.as_ref().and_then(|nest| {
        let (relative, span) = nest.bindings_path.clone()?;
        let path = nest_dir.join(relative);
        match options.read(&path) {
            Ok(text) => manifest::parse_bindings(sources.add(&path, text), sources, diagnostics),
            Err(error) => {
                diagnostics.push(unreadable(span, &path, &error));
                None
            }
        }
    });

    let stdlib = options.stdlib.clone().or_else(stdlib_dir);
    let root_path = dir.join(&source_path);
    // `crate.x` is the file `x.linnet` beside the root module.
    let crate_dir = root_path.parent().map_or_else(|| dir.join("src"), Path::to_path_buf);
    let mut loader = ModuleLoader { crate_dir: &crate_dir, package: &name, stdlib, options, sources, diagnostics, modules: Vec::new() };
    let root_span = nest.as_ref().map(|nest| nest.source_span);
    loader.load_all(&root_path, root_span);
    let modules = loader.modules;
    Some(Package { dir: dir.to_path_buf(), name, nest, bindings, modules })
}

struct ModuleLoader<'a> {
    crate_dir: &'a Path,
    package: &'a str,
    stdlib: Option<PathBuf>,
    options: &'a LoadOptions,
    sources: &'a mut SourceMap,
    diagnostics: &'a mut Vec<Diagnostic>,
    modules: Vec<LoadedModule>,
}

impl ModuleLoader<'_> {
    /// Loads the root module, then every module its `use` lists reach.
    fn load_all(&mut self, root_path: &Path, root_span: Option<Span>) {
        let mut queue = VecDeque::new();
        let root_name = self.package.to_string();
        match self.options.read(root_path) {
            Ok(text) => self.parse(root_name.clone(), root_path, text, &mut queue),
            Err(error) => {
                let span = root_span.unwrap_or_else(|| file_start(self.sources, root_path));
                self.diagnostics.push(unreadable(span, root_path, &error));
                return;
            }
        }
        let mut seen: HashSet<String> = HashSet::from([root_name]);
        while let Some((name, span)) = queue.pop_front() {
            if !seen.insert(name.clone()) {
                continue;
            }
            let Some(path) = self.module_path(&name, span) else { continue };
            match self.options.read(&path) {
                Ok(text) => self.parse(name, &path, text, &mut queue),
                Err(_) => self.diagnostics.push(
                    Diagnostic::error("unknown-module", span, format!("no module `{name}`"))
                        .with_label(format!("looked for `{}`", path.display())),
                ),
            }
        }
    }

    fn parse(&mut self, name: String, path: &Path, text: String, queue: &mut VecDeque<(String, Span)>) {
        let file = self.sources.add(path, text);
        let text = &self.sources.get(file).text;
        let cached = self.options.parse_cache.as_ref().and_then(|cache| {
            let cache = cache.borrow();
            let (old_text, old_file, ast, diagnostics) = cache.modules.get(path)?;
            (old_text == text && *old_file == file).then(|| (ast.clone(), diagnostics.clone()))
        });
        let ast = match cached {
            Some((ast, diagnostics)) => {
                self.diagnostics.extend(diagnostics);
                ast
            }
            None => {
                let mut diagnostics = Vec::new();
                let ast = syntax::parse_module(file, text, &mut diagnostics);
                if let Some(cache) = &self.options.parse_cache {
                    let entry = (text.clone(), file, ast.clone(), diagnostics.clone());
                    cache.borrow_mut().modules.insert(path.to_path_buf(), entry);
                }
                self.diagnostics.extend(diagnostics);
                ast
            }
        };
        match &ast.name {
            Some(header) if header.text() != name => self.diagnostics.push(
                Diagnostic::error(
                    "module-name-mismatch",
                    header.span,
                    format!("this file is module `{name}`, but its header says `{}`", header.text()),
                )
                .with_label(format!("expected `module {name}`")),
            ),
            _ => {}
        }
        for item in &ast.uses {
            queue.push_back((self.qualified(&item.path), item.path.span));
        }
        self.modules.push(LoadedModule { name, file, ast });
    }

    /// `crate.x.y` is the package's module `<package>.x.y`; `std.…` stays.
    fn qualified(&self, path: &ast::Path) -> String {
        let text = path.text();
        match text.strip_prefix("crate") {
            Some(rest) if rest.is_empty() || rest.starts_with('.') => format!("{}{rest}", self.package),
            _ => text,
        }
    }

    fn module_path(&mut self, name: &str, span: Span) -> Option<PathBuf> {
        let mut segments = name.split('.');
        let first = segments.next().unwrap_or_default();
        let rest: Vec<&str> = segments.collect();
        let base = if first == "std" {
            match &self.stdlib {
                Some(dir) => dir.clone(),
                None => {
                    self.diagnostics.push(
                        Diagnostic::error("unknown-module", span, "the standard library was not found")
                            .with_label("imports from `std`")
                            .with_note("set LINNET_STDLIB to the `stdlib` folder of a Linnet checkout"),
                    );
                    return None;
                }
            }
        } else if first == self.package {
            self.crate_dir.to_path_buf()
        } else {
            self.diagnostics.push(
                Diagnostic::error("unknown-module", span, format!("no package `{first}`"))
                    .with_label("modules come from `crate.…` (this package) or `std.…`"),
            );
            return None;
        };
        if rest.is_empty() {
            self.diagnostics.push(
                Diagnostic::error("unknown-module", span, format!("`{name}` names a package, not a module"))
                    .with_label("name a module inside it"),
            );
            return None;
        }
        let mut path = base;
        for segment in &rest {
            path.push(segment);
        }
        path.set_extension("linnet");
        Some(path)
    }
}
