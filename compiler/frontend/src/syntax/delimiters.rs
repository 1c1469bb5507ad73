//! Bracket balancing before parsing. A statement or item keyword cannot
//! stand inside `(...)` or `[...]`, so an unclosed bracket is found on the
//! line where it was opened and closed there; a closer that matches
//! nothing is reported and dropped. The parser then sees balanced input,
//! and one missing parenthesis is one error, not a cascade.

use super::lexer::Token;
use crate::code::Code;
use crate::diagnostic::Diagnostic;
use crate::source::Span;

fn closer(opener: &Token) -> Option<Token> {
    match opener {
        Token::LParen => Some(Token::RParen),
        Token::LBracket => Some(Token::RBracket),
        Token::LBrace => Some(Token::RBrace),
        _ => None,
    }
}

fn is_closer(token: &Token) -> bool {
    matches!(token, Token::RParen | Token::RBracket | Token::RBrace)
}

/// Keywords that only start a statement or an item.
pub(super) fn starts_statement(token: &Token) -> bool {
    matches!(
        token,
        Token::Let
            | Token::Var
            | Token::Return
            | Token::Static
            | Token::Fn
            | Token::Entry
            | Token::Intrinsic
            | Token::Pub
            | Token::Block
            | Token::Trait
            | Token::Type
            | Token::Module
            | Token::Use
            | Token::Const
    )
}

fn unclosed(token: &Token, span: Span) -> Diagnostic {
    Diagnostic::error(Code::SyntaxError, span, format!("unclosed {token}")).with_label("this is never closed")
}

/// Closes what `opened` leaves open down to (not including) the first
/// `{`, reporting each, with zero-width closers at `at`.
fn close_brackets(
    opened: &mut Vec<(Token, Span)>,
    at: Span,
    out: &mut Vec<(Token, Span)>,
    diagnostics: &mut Vec<Diagnostic>,
) {
    while let Some((token, span)) = opened.last().cloned() {
        if token == Token::LBrace {
            break;
        }
        opened.pop();
        diagnostics.push(unclosed(&token, span));
        let closing = closer(&token).expect("an opener");
        out.push((closing, Span { file: at.file, start: at.start, end: at.start }));
    }
}

pub fn balance(tokens: Vec<(Token, Span)>, end: Span, diagnostics: &mut Vec<Diagnostic>) -> Vec<(Token, Span)> {
    let mut out = Vec::with_capacity(tokens.len());
    let mut opened: Vec<(Token, Span)> = Vec::new();
    let mut stray: Option<Span> = None;
    let flush_stray = |stray: &mut Option<Span>, diagnostics: &mut Vec<Diagnostic>| {
        if let Some(span) = stray.take() {
            diagnostics.push(
                Diagnostic::error(Code::SyntaxError, span, "unmatched closing bracket")
                    .with_label("nothing open to close here"),
            );
        }
    };
    for (token, span) in tokens {
        if is_closer(&token) {
            match opened.iter().rposition(|(open, _)| closer(open).as_ref() == Some(&token)) {
                Some(at) => {
                    // Whatever was opened after the match is unclosed.
                    while opened.len() > at + 1 {
                        let (inner, inner_span) = opened.pop().expect("above the match");
                        diagnostics.push(unclosed(&inner, inner_span));
                        out.push((
                            closer(&inner).expect("an opener"),
                            Span { file: span.file, start: span.start, end: span.start },
                        ));
                    }
                    opened.pop();
                    flush_stray(&mut stray, diagnostics);
                    out.push((token, span));
                }
                None => {
                    stray = Some(match stray {
                        Some(previous) if previous.end == span.start => previous.to(span),
                        Some(previous) => {
                            flush_stray(&mut Some(previous), diagnostics);
                            span
                        }
                        None => span,
                    });
                }
            }
            continue;
        }
        flush_stray(&mut stray, diagnostics);
        if starts_statement(&token) {
            close_brackets(&mut opened, span, &mut out, diagnostics);
        }
        if closer(&token).is_some() {
            opened.push((token.clone(), span));
        }
        out.push((token, span));
    }
    flush_stray(&mut stray, diagnostics);
    while let Some((token, span)) = opened.pop() {
        diagnostics.push(unclosed(&token, span));
        out.push((closer(&token).expect("an opener"), end));
    }
    out
}
