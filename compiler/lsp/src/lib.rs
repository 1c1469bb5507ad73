//! `linnetc lsp`: a language server over stdio. Opens, edits, saves and
//! changes on disk to a package's files (`linnet.toml`, `nest.toml`,
//! `bindings.json` and sources, watched where the editor allows) mark its
//! package; once edits pause for [`SETTLE`], or before any request is
//! answered, each marked package is checked with the unsaved texts of all
//! open documents, and diagnostics are published for the files whose
//! diagnostics changed. It answers hover (types, concrete shapes under the
//! model card, signatures and docs), go to definition, find references,
//! document symbols, formatting, and code actions (each diagnostic's
//! suggested fixes, the certain ones preferred) from the last check; a
//! standard-library file opened by navigation is served from the package
//! that read it.

mod features;

use linnet_frontend::diagnostic::{Applicability, Diagnostic, Severity};
use linnet_frontend::driver::{check_package, Checked};
use linnet_frontend::package::LoadOptions;
use linnet_frontend::source::{FileId, Span};
use lsp_server::{Connection, Message, Notification, Request, RequestId, Response};
use lsp_types::notification::{self, Notification as _};
use lsp_types::request::{self, Request as _};
use lsp_types::{
    CodeAction, CodeActionKind, CodeActionOrCommand, CodeActionProviderCapability, DiagnosticRelatedInformation,
    DiagnosticSeverity, DocumentSymbol, Hover, HoverContents, Location, MarkupContent, MarkupKind, NumberOrString,
    OneOf, Position, PublishDiagnosticsParams, Range, ServerCapabilities, TextDocumentSyncCapability,
    TextDocumentSyncKind, TextEdit, Url,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::error::Error;
use std::path::{Path, PathBuf};
use std::time::Duration;

type Failure = Box<dyn Error + Send + Sync>;

/// How long edits must pause before the marked packages are checked: a
/// burst of keystrokes is one check.
pub const SETTLE: Duration = Duration::from_millis(60);

pub fn serve() -> Result<(), Failure> {
    let (connection, io_threads) = Connection::stdio();
    let capabilities = ServerCapabilities {
        text_document_sync: Some(TextDocumentSyncCapability::Kind(TextDocumentSyncKind::FULL)),
        hover_provider: Some(lsp_types::HoverProviderCapability::Simple(true)),
        definition_provider: Some(OneOf::Left(true)),
        references_provider: Some(OneOf::Left(true)),
        document_symbol_provider: Some(OneOf::Left(true)),
        document_formatting_provider: Some(OneOf::Left(true)),
        code_action_provider: Some(CodeActionProviderCapability::Simple(true)),
        ..ServerCapabilities::default()
    };
    let initialize = connection.initialize(serde_json::to_value(capabilities)?)?;
    if initialize.pointer("/capabilities/workspace/didChangeWatchedFiles/dynamicRegistration")
        == Some(&serde_json::Value::Bool(true))
    {
        connection.sender.send(Message::Request(watch_package_files()))?;
    }
    let mut server = Server::default();
    loop {
        let message = if server.marked.is_empty() {
            match connection.receiver.recv() {
                Ok(message) => message,
                Err(_) => break,
            }
        } else {
            match connection.receiver.recv_timeout(SETTLE) {
                Ok(message) => message,
                Err(waited) if waited.is_timeout() => {
                    for publish in server.check_marked() {
                        connection.sender.send(Message::Notification(publish))?;
                    }
                    continue;
                }
                Err(_) => break,
            }
        };
        match message {
            Message::Request(request) => {
                if connection.handle_shutdown(&request)? {
                    break;
                }
                // Answers come from a check of what the editor shows.
                for publish in server.check_marked() {
                    connection.sender.send(Message::Notification(publish))?;
                }
                let response = server.request(request);
                connection.sender.send(Message::Response(response))?;
            }
            Message::Notification(note) => server.notification(note),
            Message::Response(_) => {}
        }
    }
    drop(connection);
    io_threads.join()?;
    Ok(())
}

/// Asks the editor to report changes on disk to any package's files.
fn watch_package_files() -> Request {
    let watchers: Vec<serde_json::Value> = ["**/linnet.toml", "**/nest.toml", "**/bindings.json", "**/*.linnet"]
        .iter()
        .map(|pattern| serde_json::json!({ "globPattern": pattern }))
        .collect();
    let registration = serde_json::json!({
        "registrations": [{
            "id": "linnet-package-files",
            "method": notification::DidChangeWatchedFiles::METHOD,
            "registerOptions": { "watchers": watchers },
        }]
    });
    Request::new(RequestId::from("linnet-watch".to_string()), request::RegisterCapability::METHOD.into(), registration)
}

#[derive(Default)]
struct Server {
    /// Open documents' texts, by path.
    documents: HashMap<PathBuf, String>,
    parse_cache: std::sync::Arc<std::cell::RefCell<linnet_frontend::package::ParseCache>>,
    /// The last check of each package, by its folder.
    checked: BTreeMap<PathBuf, Checked>,
    /// Packages to check once edits settle.
    marked: BTreeSet<PathBuf>,
    /// The diagnostics last published for each file.
    published: HashMap<Url, Vec<lsp_types::Diagnostic>>,
}

fn offset_at(text: &str, position: Position) -> usize {
    let mut offset = 0;
    for (number, line) in text.split_inclusive('\n').enumerate() {
        if number == position.line as usize {
            let mut units = 0;
            for (at, c) in line.char_indices() {
                if units >= position.character as usize {
                    return offset + at;
                }
                units += c.len_utf16();
            }
            return offset + line.trim_end_matches('\n').len();
        }
        offset += line.len();
    }
    text.len()
}

fn position_at(text: &str, offset: usize) -> Position {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line = before.matches('\n').count();
    let line_start = before.rfind('\n').map_or(0, |at| at + 1);
    let character = text[line_start..offset].chars().map(char::len_utf16).sum::<usize>();
    Position { line: line as u32, character: character as u32 }
}

fn range_of(checked: &Checked, span: Span) -> Range {
    let text = &checked.sources.get(span.file).text;
    Range { start: position_at(text, span.start as usize), end: position_at(text, span.end as usize) }
}

fn location(checked: &Checked, span: Span) -> Option<Location> {
    let uri = Url::from_file_path(checked.sources.path(span.file)).ok()?;
    Some(Location { uri, range: range_of(checked, span) })
}

fn to_lsp(checked: &Checked, diagnostic: &Diagnostic) -> lsp_types::Diagnostic {
    let related = diagnostic
        .secondary
        .iter()
        .filter_map(|label| {
            Some(DiagnosticRelatedInformation {
                location: location(checked, label.span)?,
                message: label.message.clone(),
            })
        })
        .collect();
    let mut message = diagnostic.message.clone();
    if !diagnostic.primary.message.is_empty() {
        message = format!("{message}\n{}", diagnostic.primary.message);
    }
    lsp_types::Diagnostic {
        range: range_of(checked, diagnostic.primary.span),
        severity: Some(if diagnostic.severity == Severity::Error {
            DiagnosticSeverity::ERROR
        } else {
            DiagnosticSeverity::WARNING
        }),
        code: Some(NumberOrString::String(diagnostic.code.name().to_string())),
        source: Some("linnetc".into()),
        message,
        related_information: Some(related),
        ..lsp_types::Diagnostic::default()
    }
}

impl Server {
    fn options(&self) -> LoadOptions {
        let stdlib = linnet_frontend::package::stdlib_dir().map(|dir| dir.canonicalize().unwrap_or(dir));
        LoadOptions {
            overlay: self.documents.clone(),
            stdlib,
            parse_cache: Some(self.parse_cache.clone()),
            ..LoadOptions::default()
        }
    }

    /// The package `path` belongs to: the nearest folder above it with a
    /// `linnet.toml`, else (a standard-library file, say) a checked
    /// package that read it.
    fn package_for(&self, path: &Path) -> Option<PathBuf> {
        linnet_frontend::package::enclosing(path).or_else(|| {
            self.checked.iter().find(|(_, checked)| checked.sources.find(path).is_some()).map(|(dir, _)| dir.clone())
        })
    }

    /// Marks for checking the package `path` is in and every checked
    /// package that read it (a package whose dependency it is).
    fn mark(&mut self, path: &Path) {
        self.marked.extend(linnet_frontend::package::enclosing(path));
        let readers = self.checked.iter().filter(|(_, checked)| checked.sources.find(path).is_some());
        self.marked.extend(readers.map(|(dir, _)| dir.clone()));
    }

    /// Checks every marked package; returns the diagnostics to publish,
    /// only for files whose diagnostics changed since last published.
    fn check_marked(&mut self) -> Vec<Notification> {
        let marked = std::mem::take(&mut self.marked);
        marked.iter().flat_map(|dir| self.check(dir.clone(), &marked)).collect()
    }

    /// Checks the package at `dir`, one of `batch` checked together.
    fn check(&mut self, dir: PathBuf, batch: &BTreeSet<PathBuf>) -> Vec<Notification> {
        let checked = check_package(&dir, &self.options());
        // A dependency's files are published by its own check when it has
        // one (when one of its files is open), so that two checks do not
        // take turns publishing the same file.
        let checked_elsewhere: Vec<&Path> = checked
            .package
            .iter()
            .flat_map(|package| package.members.iter().skip(1))
            .map(|member| member.dir.as_path())
            .filter(|member| self.checked.contains_key(*member) || batch.contains(*member))
            .collect();
        let mut by_file: BTreeMap<FileId, Vec<lsp_types::Diagnostic>> = BTreeMap::new();
        for (file, source) in checked.sources.iter() {
            if source.path.is_absolute() && !checked_elsewhere.iter().any(|member| source.path.starts_with(member)) {
                by_file.insert(file, Vec::new());
            }
        }
        for diagnostic in &checked.diagnostics {
            if let Some(list) = by_file.get_mut(&diagnostic.primary.span.file) {
                list.push(to_lsp(&checked, diagnostic));
            }
        }
        let mut notes = Vec::new();
        for (file, diagnostics) in by_file {
            let Ok(uri) = Url::from_file_path(checked.sources.path(file)) else { continue };
            if self.published.get(&uri) == Some(&diagnostics) {
                continue;
            }
            self.published.insert(uri.clone(), diagnostics.clone());
            let params = PublishDiagnosticsParams { uri, diagnostics, version: None };
            notes.push(Notification::new(notification::PublishDiagnostics::METHOD.into(), params));
        }
        self.checked.insert(dir, checked);
        notes
    }

    fn notification(&mut self, note: Notification) {
        let path_of = |uri: &Url| uri.to_file_path().ok();
        match note.method.as_str() {
            notification::DidOpenTextDocument::METHOD => {
                let Ok(params) = serde_json::from_value::<lsp_types::DidOpenTextDocumentParams>(note.params) else {
                    return;
                };
                let Some(path) = path_of(&params.text_document.uri) else { return };
                self.documents.insert(path.clone(), params.text_document.text);
                self.mark(&path);
            }
            notification::DidChangeTextDocument::METHOD => {
                let Ok(params) = serde_json::from_value::<lsp_types::DidChangeTextDocumentParams>(note.params) else {
                    return;
                };
                let Some(path) = path_of(&params.text_document.uri) else { return };
                if let Some(change) = params.content_changes.into_iter().last() {
                    self.documents.insert(path.clone(), change.text);
                }
                self.mark(&path);
            }
            notification::DidSaveTextDocument::METHOD => {
                let Ok(params) = serde_json::from_value::<lsp_types::DidSaveTextDocumentParams>(note.params) else {
                    return;
                };
                if let Some(path) = path_of(&params.text_document.uri) {
                    self.mark(&path);
                }
            }
            notification::DidCloseTextDocument::METHOD => {
                let Ok(params) = serde_json::from_value::<lsp_types::DidCloseTextDocumentParams>(note.params) else {
                    return;
                };
                let Some(path) = path_of(&params.text_document.uri) else { return };
                self.documents.remove(&path);
                self.mark(&path);
            }
            notification::DidChangeWatchedFiles::METHOD => {
                let Ok(params) = serde_json::from_value::<lsp_types::DidChangeWatchedFilesParams>(note.params) else {
                    return;
                };
                for change in params.changes {
                    if let Some(path) = path_of(&change.uri) {
                        self.mark(&path);
                    }
                }
            }
            _ => {}
        }
    }

    /// The last check that read `path`, and the file's id in it.
    fn checked_with(&self, uri: &Url) -> Option<(&Checked, FileId)> {
        let path = uri.to_file_path().ok()?;
        let preferred = self.package_for(&path).and_then(|dir| self.checked.get(&dir));
        preferred
            .into_iter()
            .chain(self.checked.values())
            .find_map(|checked| checked.sources.find(&path).map(|file| (checked, file)))
    }

    fn request(&mut self, request: Request) -> Response {
        let id = request.id.clone();
        let result = match request.method.as_str() {
            request::HoverRequest::METHOD => self.hover(request).map(|h| serde_json::to_value(h).unwrap_or_default()),
            request::GotoDefinition::METHOD => self.definition(request),
            request::References::METHOD => self.references(request),
            request::DocumentSymbolRequest::METHOD => self.symbols(request),
            request::Formatting::METHOD => self.formatting(request),
            request::CodeActionRequest::METHOD => self.code_actions(request),
            _ => {
                return Response::new_err(
                    id,
                    lsp_server::ErrorCode::MethodNotFound as i32,
                    format!("unsupported: {}", request.method),
                )
            }
        };
        match result {
            Ok(value) => Response::new_ok(id, value),
            Err(message) => error_response(id, message),
        }
    }

    fn hover(&self, request: Request) -> Result<Option<Hover>, InvalidParams> {
        let params: lsp_types::HoverParams =
            serde_json::from_value(request.params).map_err(|e| InvalidParams(e.to_string()))?;
        let document = params.text_document_position_params;
        let Some((checked, file)) = self.checked_with(&document.text_document.uri) else { return Ok(None) };
        let text = &checked.sources.get(file).text;
        let offset = offset_at(text, document.position);
        let declared =
            features::definition_at(checked, file, offset).or_else(|| features::declaration_at(checked, file, offset));
        let markdown = if let Some(signature) = declared.and_then(|d| features::signature(checked, d)) {
            signature
        } else if let Some(value) = features::card_dim_at(checked, file, offset) {
            format!("```linnet\n{value}\n```\n\nfrom the model card (nest.toml)")
        } else if let Some((span, ty)) = features::type_at(checked, file, offset) {
            let name = &text[span.range()];
            let described = match ty {
                linnet_frontend::sema::ty::Ty::DimValue(dim) => format!("{name}: index over {dim}"),
                ty => format!("{name}: {ty}"),
            };
            let concrete =
                features::concrete(checked, ty).map(|c| format!("\n\n{c} (with nest.toml)")).unwrap_or_default();
            format!("```linnet\n{described}\n```{concrete}")
        } else {
            return Ok(None);
        };
        Ok(Some(Hover {
            contents: HoverContents::Markup(MarkupContent { kind: MarkupKind::Markdown, value: markdown }),
            range: None,
        }))
    }

    fn definition(&self, request: Request) -> Result<serde_json::Value, InvalidParams> {
        let params: lsp_types::GotoDefinitionParams =
            serde_json::from_value(request.params).map_err(|e| InvalidParams(e.to_string()))?;
        let document = params.text_document_position_params;
        let Some((checked, file)) = self.checked_with(&document.text_document.uri) else {
            return Ok(serde_json::Value::Null);
        };
        let offset = offset_at(&checked.sources.get(file).text, document.position);
        let target = features::definition_at(checked, file, offset).and_then(|span| location(checked, span));
        Ok(serde_json::to_value(target).unwrap_or_default())
    }

    fn references(&self, request: Request) -> Result<serde_json::Value, InvalidParams> {
        let params: lsp_types::ReferenceParams =
            serde_json::from_value(request.params).map_err(|e| InvalidParams(e.to_string()))?;
        let document = params.text_document_position;
        let Some((checked, file)) = self.checked_with(&document.text_document.uri) else {
            return Ok(serde_json::Value::Null);
        };
        let offset = offset_at(&checked.sources.get(file).text, document.position);
        let mut spans = features::references_at(checked, file, offset);
        if !params.context.include_declaration && !spans.is_empty() {
            spans.remove(0);
        }
        let locations: Vec<Location> = spans.into_iter().filter_map(|span| location(checked, span)).collect();
        Ok(serde_json::to_value(locations).unwrap_or_default())
    }

    fn symbols(&self, request: Request) -> Result<serde_json::Value, InvalidParams> {
        let params: lsp_types::DocumentSymbolParams =
            serde_json::from_value(request.params).map_err(|e| InvalidParams(e.to_string()))?;
        let Some((checked, file)) = self.checked_with(&params.text_document.uri) else {
            return Ok(serde_json::Value::Null);
        };
        let Some(module) = checked.package.as_ref().and_then(|p| p.modules.iter().find(|m| m.file == file)) else {
            return Ok(serde_json::Value::Null);
        };
        #[allow(deprecated)]
        fn convert(checked: &Checked, symbol: features::Symbol) -> DocumentSymbol {
            DocumentSymbol {
                name: symbol.name,
                detail: None,
                kind: symbol.kind,
                tags: None,
                deprecated: None,
                range: range_of(checked, symbol.span),
                selection_range: range_of(checked, symbol.name_span),
                children: Some(symbol.children.into_iter().map(|c| convert(checked, c)).collect()),
            }
        }
        let symbols: Vec<DocumentSymbol> =
            features::outline(&module.ast).into_iter().map(|s| convert(checked, s)).collect();
        Ok(serde_json::to_value(symbols).unwrap_or_default())
    }

    fn formatting(&self, request: Request) -> Result<serde_json::Value, InvalidParams> {
        let params: lsp_types::DocumentFormattingParams =
            serde_json::from_value(request.params).map_err(|e| InvalidParams(e.to_string()))?;
        let path = params.text_document.uri.to_file_path().map_err(|()| InvalidParams("not a file".into()))?;
        let text = match self.documents.get(&path) {
            Some(text) => text.clone(),
            None => std::fs::read_to_string(&path).map_err(|e| InvalidParams(e.to_string()))?,
        };
        let Some(formatted) = linnet_frontend::syntax::format::format(&text) else {
            return Ok(serde_json::Value::Null);
        };
        if formatted == text {
            return Ok(serde_json::to_value(Vec::<TextEdit>::new()).unwrap_or_default());
        }
        let whole = Range { start: Position { line: 0, character: 0 }, end: position_at(&text, text.len()) };
        Ok(serde_json::to_value(vec![TextEdit { range: whole, new_text: formatted }]).unwrap_or_default())
    }

    /// The suggested fixes of the diagnostics whose range meets the
    /// request's, as quick fixes; the certain ones are preferred.
    fn code_actions(&self, request: Request) -> Result<serde_json::Value, InvalidParams> {
        let params: lsp_types::CodeActionParams =
            serde_json::from_value(request.params).map_err(|e| InvalidParams(e.to_string()))?;
        let Some((checked, file)) = self.checked_with(&params.text_document.uri) else {
            return Ok(serde_json::Value::Null);
        };
        let key = |position: Position| (position.line, position.character);
        let wanted = (key(params.range.start), key(params.range.end));
        let meets = |range: Range| key(range.start) <= wanted.1 && wanted.0 <= key(range.end);
        let mut actions = Vec::new();
        for diagnostic in &checked.diagnostics {
            if diagnostic.primary.span.file != file || !meets(range_of(checked, diagnostic.primary.span)) {
                continue;
            }
            for suggestion in &diagnostic.suggestions {
                let Ok(uri) = Url::from_file_path(checked.sources.path(suggestion.span.file)) else { continue };
                let edit =
                    TextEdit { range: range_of(checked, suggestion.span), new_text: suggestion.replacement.clone() };
                actions.push(CodeActionOrCommand::CodeAction(CodeAction {
                    title: suggestion.message.clone(),
                    kind: Some(CodeActionKind::QUICKFIX),
                    diagnostics: Some(vec![to_lsp(checked, diagnostic)]),
                    edit: Some(lsp_types::WorkspaceEdit {
                        changes: Some(HashMap::from([(uri, vec![edit])])),
                        ..lsp_types::WorkspaceEdit::default()
                    }),
                    is_preferred: Some(suggestion.applicability == Applicability::MachineApplicable),
                    ..CodeAction::default()
                }));
            }
        }
        Ok(serde_json::to_value(actions).unwrap_or_default())
    }
}

/// A request whose parameters do not name what it asks about, and why.
struct InvalidParams(String);

fn error_response(id: RequestId, InvalidParams(message): InvalidParams) -> Response {
    Response::new_err(id, lsp_server::ErrorCode::InvalidParams as i32, message)
}
