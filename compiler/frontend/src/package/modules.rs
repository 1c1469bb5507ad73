//! Loading modules: the root module, then every module a `use` reaches,
//! in this package, a dependency or the standard library. A module's name
//! is qualified (`crate.norm` in package `qwen3_5` is `qwen3_5.norm`), and
//! a `use` may name only its own package, `std`, or a package its own
//! `linnet.toml` declares: a dependency's dependencies are its own.

use super::link::Member;
use super::{file_start, unreadable, LoadOptions, LoadedModule};
use crate::code::Code;
use crate::diagnostic::Diagnostic;
use crate::source::{SourceMap, Span};
use crate::syntax::{self, ast};
use std::collections::{HashSet, VecDeque};
use std::path::{Path, PathBuf};

pub struct ModuleLoader<'a> {
    pub members: &'a [Member],
    pub stdlib: Option<PathBuf>,
    pub options: &'a LoadOptions,
    pub sources: &'a mut SourceMap,
    pub diagnostics: &'a mut Vec<Diagnostic>,
    pub modules: Vec<LoadedModule>,
}

impl ModuleLoader<'_> {
    /// Loads the root package's root module, then every module its `use`
    /// lists reach.
    pub fn load_all(&mut self, root_span: Option<Span>) {
        let root = &self.members[0];
        let (root_name, root_path) = (root.name.clone(), root.root_file.clone());
        let mut queue = VecDeque::new();
        match self.options.read(&root_path) {
            Ok(text) => self.parse(root_name.clone(), &root_path, text, &mut queue),
            Err(error) => {
                let span = root_span.unwrap_or_else(|| file_start(self.sources, &root_path));
                self.diagnostics.push(unreadable(span, &root_path, &error));
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
                    Diagnostic::error(Code::UnknownModule, span, format!("no module `{name}`"))
                        .with_label(format!("looked for `{}`", path.display())),
                ),
            }
        }
    }

    fn parse(&mut self, name: String, path: &Path, text: String, queue: &mut VecDeque<(String, Span)>) {
        let file = self.sources.add(path, text);
        let text = &self.sources.get(file).text;
        let cached = self.options.parse_cache.as_ref().and_then(|cache| cache.borrow().get(path, text, file));
        let ast = match cached {
            Some((ast, diagnostics)) => {
                self.diagnostics.extend(diagnostics);
                ast
            }
            None => {
                let mut diagnostics = Vec::new();
                let ast = syntax::parse_module(file, text, &mut diagnostics);
                if let Some(cache) = &self.options.parse_cache {
                    cache.borrow_mut().insert(path, text, file, &ast, &diagnostics);
                }
                self.diagnostics.extend(diagnostics);
                ast
            }
        };
        match &ast.name {
            Some(header) if header.text() != name => self.diagnostics.push(
                Diagnostic::error(
                    Code::ModuleNameMismatch,
                    header.span,
                    format!("this file is module `{name}`, but its header says `{}`", header.text()),
                )
                .with_label(format!("expected `module {name}`")),
            ),
            _ => {}
        }
        let mut imports = Vec::with_capacity(ast.uses.len());
        for item in &ast.uses {
            let import = self.import(&name, &item.path);
            if let Some(qualified) = &import {
                queue.push_back((qualified.clone(), item.path.span));
            }
            imports.push(import);
        }
        self.modules.push(LoadedModule { name, file, ast, imports });
    }

    /// The module a `use` in module `importer` names, qualified; `None`
    /// when it names a package that `importer`'s package does not declare
    /// (reported here) or declares but could not link (reported there).
    fn import(&mut self, importer: &str, path: &ast::Path) -> Option<String> {
        let package = importer.split('.').next().unwrap_or_default();
        let text = path.text();
        let (first, rest) = text.split_once('.').map_or((text.as_str(), ""), |(first, rest)| (first, rest));
        let first = if first == "crate" { package } else { first };
        let qualified = if rest.is_empty() { first.to_string() } else { format!("{first}.{rest}") };
        let member = self.members.iter().find(|member| member.name == package);
        let declared =
            first == "std" || first == package || member.is_some_and(|m| m.dependencies.iter().any(|d| d == first));
        if declared {
            return Some(qualified);
        }
        if member.is_some_and(|m| m.unlinked.iter().any(|d| d == first)) {
            return None;
        }
        let mut diagnostic = Diagnostic::error(Code::UnknownModule, path.span, format!("no package `{first}`"))
            .with_label(
            "modules come from `crate.…` (this package), `std.…`, or a package under `[dependencies]` in linnet.toml",
        );
        if self.members.iter().any(|member| member.name == first) {
            diagnostic = diagnostic.with_note(format!(
                "`{first}` is a dependency of another package here; declare it in `{package}`'s linnet.toml to use it"
            ));
        }
        self.diagnostics.push(diagnostic);
        None
    }

    /// The file of the module `name` (`std.nn.linear`, `qwen3_5.norm`, or
    /// a dependency's root module, `qwen3_5`).
    fn module_path(&mut self, name: &str, span: Span) -> Option<PathBuf> {
        let mut segments = name.split('.');
        let first = segments.next().unwrap_or_default();
        let rest: Vec<&str> = segments.collect();
        let base = if first == "std" {
            if rest.is_empty() {
                self.diagnostics.push(
                    Diagnostic::error(Code::UnknownModule, span, "`std` names the standard library, not a module")
                        .with_label("name a module inside it"),
                );
                return None;
            }
            match &self.stdlib {
                Some(dir) => dir.clone(),
                None => {
                    self.diagnostics.push(
                        Diagnostic::error(Code::UnknownModule, span, "the standard library was not found")
                            .with_label("imports from `std`")
                            .with_note("set LINNET_STDLIB to the `stdlib` folder of a Linnet checkout"),
                    );
                    return None;
                }
            }
        } else {
            // `import` let through only the packages the members declare.
            let member = self.members.iter().find(|member| member.name == first)?;
            if rest.is_empty() {
                return Some(member.root_file.clone());
            }
            member.source_dir()
        };
        let mut path = base;
        for segment in &rest {
            path.push(segment);
        }
        path.set_extension("linnet");
        Some(path)
    }
}
