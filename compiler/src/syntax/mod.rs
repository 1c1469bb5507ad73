//! Syntax: the lexer, the syntax tree and the parser. `parse_module` is the
//! one entry: text in, a [`ast::Module`] and diagnostics out, never a panic.

pub mod ast;
pub mod lexer;
pub mod parser;

use crate::diagnostic::Diagnostic;
use crate::source::FileId;

pub fn parse_module(file: FileId, text: &str, diagnostics: &mut Vec<Diagnostic>) -> ast::Module {
    let lexed = lexer::lex(file, text, diagnostics);
    parser::parse(file, text, lexed.tokens, &lexed.comments, diagnostics)
}
