//! Syntax: the lexer, the syntax tree and the parser. `parse_module` is the
//! one entry: text in, a [`ast::Module`] and diagnostics out, never a panic.

pub mod ast;
mod delimiters;
pub mod format;
pub mod lexer;
mod nesting;
pub mod parser;

use crate::diagnostic::Diagnostic;
use crate::source::{FileId, SourceFile, Span};

pub fn parse_module(file: FileId, text: &str, diagnostics: &mut Vec<Diagnostic>) -> ast::Module {
    let mut syntax_errors = Vec::new();
    let lexed = lexer::lex(file, text, &mut syntax_errors);
    let end = Span::new(file, text.len()..text.len());
    let tokens = delimiters::balance(lexed.tokens, end, &mut syntax_errors);
    let tokens = nesting::bound(tokens, &mut syntax_errors);
    let module = parser::parse(file, text, tokens, &lexed.comments, &mut syntax_errors);
    // Recovery retries a statement from several places; one mistake
    // gets one report: the first on its line.
    let source = SourceFile::lines_of(text);
    syntax_errors.sort_by_key(|d| d.primary.span.start);
    let mut reported_lines = Vec::new();
    for diagnostic in syntax_errors {
        let line = source.partition_point(|start| *start <= diagnostic.primary.span.start as usize);
        if !reported_lines.contains(&line) {
            reported_lines.push(line);
            diagnostics.push(diagnostic);
        }
    }
    module
}
