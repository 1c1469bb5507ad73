//! `linnetc lsp`: a language server over stdio. On every open and change
//! it checks the document's package with the unsaved texts of all open
//! documents and publishes the diagnostics of every file in it; it answers
//! hover (types, concrete shapes under the model card, signatures and
//! docs), go to definition, find references, document symbols and
//! formatting from the last check.

mod features;

use crate::diagnostic::{Diagnostic, Severity};
use crate::driver::{check_package, Checked};
use crate::package::LoadOptions;
use crate::source::{FileId, Span};
use lsp_server::{Connection, Message, Notification, Request, RequestId, Response};
use lsp_types::notification::{self, Notification as _};
use lsp_types::request::{self, Request as _};
use lsp_types::{
    DiagnosticRelatedInformation, DiagnosticSeverity, DocumentSymbol, Hover, HoverContents, Location, MarkupContent, MarkupKind,
    NumberOrString, OneOf, Position, PublishDiagnosticsParams, Range, ServerCapabilities, TextDocumentSyncCapability,
    TextDocumentSyncKind, TextEdit, Url,
};
use std::collections::{BTreeMap, HashMap};
use std::error::Error;
use std::path::{Path, PathBuf};

type Failure = Box<dyn Error + Send + Sync>;

pub fn serve() -> Result<(), Failure> {
    let (connection, io_threads) = Connection::stdio();
    let capabilities = ServerCapabilities {
        text_document_sync: Some(TextDocumentSyncCapability::Kind(TextDocumentSyncKind::FULL)),
        hover_provider: Some(lsp_types::HoverProviderCapability::Simple(true)),
        definition_provider: Some(OneOf::Left(true)),
        references_provider: Some(OneOf::Left(true)),
        document_symbol_provider: Some(OneOf::Left(true)),
        document_formatting_provider: Some(OneOf::Left(true)),
        ..ServerCapabilities::default()
    };
    connection.initialize(serde_json::to_value(capabilities)?)?;
    let mut server = Server::default();
    for message in &connection.receiver {
        match message {
            Message::Request(request) => {
                if connection.handle_shutdown(&request)? {
                    break;
                }
                let response = server.request(request);
                connection.sender.send(Message::Response(response))?;
            }
            Message::Notification(note) => {
                for publish in server.notification(note) {
                    connection.sender.send(Message::Notification(publish))?;
                }
            }
            Message::Response(_) => {}
        }
    }
    drop(connection);
    io_threads.join()?;
    Ok(())
}

#[derive(Default)]
struct Server {
    /// Open documents' texts, by path.
    documents: HashMap<PathBuf, String>,
    parse_cache: std::rc::Rc<std::cell::RefCell<crate::package::ParseCache>>,
    /// The last check of each package, by its folder.
    checked: BTreeMap<PathBuf, Checked>,
}

/// The package folder holding `path`: the nearest with a `linnet.toml`.
fn package_of(path: &Path) -> Option<PathBuf> {
    path.ancestors().skip(1).find(|dir| dir.join("linnet.toml").is_file()).map(Path::to_path_buf)
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
        .filter_map(|label| Some(DiagnosticRelatedInformation { location: location(checked, label.span)?, message: label.message.clone() }))
        .collect();
    let mut message = diagnostic.message.clone();
    if !diagnostic.primary.message.is_empty() {
        message = format!("{message}\n{}", diagnostic.primary.message);
    }
    lsp_types::Diagnostic {
        range: range_of(checked, diagnostic.primary.span),
        severity: Some(if diagnostic.severity == Severity::Error { DiagnosticSeverity::ERROR } else { DiagnosticSeverity::WARNING }),
        code: Some(NumberOrString::String(diagnostic.code.to_string())),
        source: Some("linnetc".into()),
        message,
        related_information: Some(related),
        ..lsp_types::Diagnostic::default()
    }
}

impl Server {
    fn options(&self) -> LoadOptions {
        let stdlib = crate::package::stdlib_dir().map(|dir| dir.canonicalize().unwrap_or(dir));
        LoadOptions { overlay: self.documents.clone(), stdlib, parse_cache: Some(self.parse_cache.clone()), ..LoadOptions::default() }
    }

    /// Checks the package of `path` and returns the diagnostics to publish
    /// for each of its files (empty lists clear old ones).
    fn recheck(&mut self, path: &Path) -> Vec<Notification> {
        let Some(dir) = package_of(path) else { return Vec::new() };
        let checked = check_package(&dir, &self.options());
        let mut by_file: BTreeMap<FileId, Vec<lsp_types::Diagnostic>> = BTreeMap::new();
        for (file, source) in checked.sources.iter() {
            if source.path.is_absolute() {
                by_file.insert(file, Vec::new());
            }
        }
        for diagnostic in &checked.diagnostics {
            if let Some(list) = by_file.get_mut(&diagnostic.primary.span.file) {
                list.push(to_lsp(&checked, diagnostic));
            }
        }
        let notes = by_file
            .into_iter()
            .filter_map(|(file, diagnostics)| {
                let uri = Url::from_file_path(checked.sources.path(file)).ok()?;
                let params = PublishDiagnosticsParams { uri, diagnostics, version: None };
                Some(Notification::new(notification::PublishDiagnostics::METHOD.into(), params))
            })
            .collect();
        self.checked.insert(dir, checked);
        notes
    }

    fn notification(&mut self, note: Notification) -> Vec<Notification> {
        let path_of = |uri: &Url| uri.to_file_path().ok();
        match note.method.as_str() {
            notification::DidOpenTextDocument::METHOD => {
                let Ok(params) = serde_json::from_value::<lsp_types::DidOpenTextDocumentParams>(note.params) else { return Vec::new() };
                let Some(path) = path_of(&params.text_document.uri) else { return Vec::new() };
                self.documents.insert(path.clone(), params.text_document.text);
                self.recheck(&path)
            }
            notification::DidChangeTextDocument::METHOD => {
                let Ok(params) = serde_json::from_value::<lsp_types::DidChangeTextDocumentParams>(note.params) else { return Vec::new() };
                let Some(path) = path_of(&params.text_document.uri) else { return Vec::new() };
                if let Some(change) = params.content_changes.into_iter().last() {
                    self.documents.insert(path.clone(), change.text);
                }
                self.recheck(&path)
            }
            notification::DidSaveTextDocument::METHOD => {
                let Ok(params) = serde_json::from_value::<lsp_types::DidSaveTextDocumentParams>(note.params) else { return Vec::new() };
                path_of(&params.text_document.uri).map(|path| self.recheck(&path)).unwrap_or_default()
            }
            notification::DidCloseTextDocument::METHOD => {
                let Ok(params) = serde_json::from_value::<lsp_types::DidCloseTextDocumentParams>(note.params) else { return Vec::new() };
                let Some(path) = path_of(&params.text_document.uri) else { return Vec::new() };
                self.documents.remove(&path);
                self.recheck(&path)
            }
            _ => Vec::new(),
        }
    }

    /// The last check that read `path`, and the file's id in it.
    fn checked_with(&self, uri: &Url) -> Option<(&Checked, FileId)> {
        let path = uri.to_file_path().ok()?;
        let preferred = package_of(&path).and_then(|dir| self.checked.get(&dir));
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
            _ => return Response::new_err(id, lsp_server::ErrorCode::MethodNotFound as i32, format!("unsupported: {}", request.method)),
        };
        match result {
            Ok(value) => Response::new_ok(id, value),
            Err(message) => error_response(id, message),
        }
    }

    fn hover(&self, request: Request) -> Result<Option<Hover>, String> {
        let params: lsp_types::HoverParams = serde_json::from_value(request.params).map_err(|e| e.to_string())?;
        let document = params.text_document_position_params;
        let Some((checked, file)) = self.checked_with(&document.text_document.uri) else { return Ok(None) };
        let text = &checked.sources.get(file).text;
        let offset = offset_at(text, document.position);
        let declared = features::definition_at(checked, file, offset).or_else(|| features::declaration_at(checked, file, offset));
        let markdown = if let Some(signature) = declared.and_then(|d| features::signature(checked, d)) {
            signature
        } else if let Some((span, ty)) = features::type_at(checked, file, offset) {
            let name = &text[span.range()];
            let described = match ty {
                crate::sema::ty::Ty::DimValue(dim) => format!("{name}: index over {dim}"),
                ty => format!("{name}: {ty}"),
            };
            let concrete = features::concrete(checked, ty).map(|c| format!("\n\n{c} (with nest.toml)")).unwrap_or_default();
            format!("```linnet\n{described}\n```{concrete}")
        } else {
            return Ok(None);
        };
        Ok(Some(Hover { contents: HoverContents::Markup(MarkupContent { kind: MarkupKind::Markdown, value: markdown }), range: None }))
    }

    fn definition(&self, request: Request) -> Result<serde_json::Value, String> {
        let params: lsp_types::GotoDefinitionParams = serde_json::from_value(request.params).map_err(|e| e.to_string())?;
        let document = params.text_document_position_params;
        let Some((checked, file)) = self.checked_with(&document.text_document.uri) else { return Ok(serde_json::Value::Null) };
        let offset = offset_at(&checked.sources.get(file).text, document.position);
        let target = features::definition_at(checked, file, offset).and_then(|span| location(checked, span));
        Ok(serde_json::to_value(target).unwrap_or_default())
    }

    fn references(&self, request: Request) -> Result<serde_json::Value, String> {
        let params: lsp_types::ReferenceParams = serde_json::from_value(request.params).map_err(|e| e.to_string())?;
        let document = params.text_document_position;
        let Some((checked, file)) = self.checked_with(&document.text_document.uri) else { return Ok(serde_json::Value::Null) };
        let offset = offset_at(&checked.sources.get(file).text, document.position);
        let mut spans = features::references_at(checked, file, offset);
        if !params.context.include_declaration && !spans.is_empty() {
            spans.remove(0);
        }
        let locations: Vec<Location> = spans.into_iter().filter_map(|span| location(checked, span)).collect();
        Ok(serde_json::to_value(locations).unwrap_or_default())
    }

    fn symbols(&self, request: Request) -> Result<serde_json::Value, String> {
        let params: lsp_types::DocumentSymbolParams = serde_json::from_value(request.params).map_err(|e| e.to_string())?;
        let Some((checked, file)) = self.checked_with(&params.text_document.uri) else { return Ok(serde_json::Value::Null) };
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
        let symbols: Vec<DocumentSymbol> = features::outline(&module.ast).into_iter().map(|s| convert(checked, s)).collect();
        Ok(serde_json::to_value(symbols).unwrap_or_default())
    }

    fn formatting(&self, request: Request) -> Result<serde_json::Value, String> {
        let params: lsp_types::DocumentFormattingParams = serde_json::from_value(request.params).map_err(|e| e.to_string())?;
        let path = params.text_document.uri.to_file_path().map_err(|()| "not a file".to_string())?;
        let text = match self.documents.get(&path) {
            Some(text) => text.clone(),
            None => std::fs::read_to_string(&path).map_err(|e| e.to_string())?,
        };
        let Some(formatted) = crate::syntax::format::format(&text) else { return Ok(serde_json::Value::Null) };
        if formatted == text {
            return Ok(serde_json::to_value(Vec::<TextEdit>::new()).unwrap_or_default());
        }
        let whole = Range { start: Position { line: 0, character: 0 }, end: position_at(&text, text.len()) };
        Ok(serde_json::to_value(vec![TextEdit { range: whole, new_text: formatted }]).unwrap_or_default())
    }
}

fn error_response(id: RequestId, message: String) -> Response {
    Response::new_err(id, lsp_server::ErrorCode::InvalidParams as i32, message)
}
