//! The nesting bound, checked on tokens before any tree exists. The parser,
//! the checker, lowering and the formatter walk expressions recursively, so
//! an expression's depth is their recursion depth: ten thousand `-` signs
//! or nested calls would overflow the stack. This pass bounds the depth
//! from above without parsing: each open bracket is a level, and within a
//! level every operator, `.`, `if`, reduction and bracket since the last
//! separator may put one more node above the next operand. An expression
//! over [`MAX_NESTING`] is reported where it crosses the bound and its
//! tokens are skipped up to the bracket (or statement) that encloses it,
//! so nothing downstream ever sees it.

use super::delimiters::starts_statement;
use super::lexer::Token;
use crate::code::Code;
use crate::diagnostic::Diagnostic;
use crate::source::Span;

/// The deepest expression the frontend accepts. Model code nests a few
/// dozen levels at most; the bound is far above that and far below what
/// the recursive passes can take on a 2 MiB thread stack.
pub const MAX_NESTING: usize = 256;

fn opens(token: &Token) -> bool {
    matches!(token, Token::LParen | Token::LBracket | Token::LBrace)
}

fn closes(token: &Token) -> bool {
    matches!(token, Token::RParen | Token::RBracket | Token::RBrace)
}

/// Tokens after which a new expression starts: its depth is not added to
/// what came before.
fn separates(token: &Token) -> bool {
    starts_statement(token)
        || matches!(
            token,
            Token::Comma
                | Token::Semi
                | Token::Assign
                | Token::Colon
                | Token::ColonColon
                | Token::Arrow
                | Token::For
                | Token::In
                | Token::Where
        )
}

/// Tokens that may put a node above the operand that follows them.
fn deepens(token: &Token) -> bool {
    match token {
        Token::Plus
        | Token::Minus
        | Token::Star
        | Token::Slash
        | Token::Percent
        | Token::AndAnd
        | Token::OrOr
        | Token::Bang
        | Token::Lt
        | Token::Gt
        | Token::Le
        | Token::Ge
        | Token::EqEq
        | Token::NotEq
        | Token::Dot
        | Token::If
        | Token::Else => true,
        Token::Ident(name) => matches!(name.as_str(), "sum" | "max" | "min"),
        _ => false,
    }
}

fn is_operand(token: &Token) -> bool {
    matches!(token, Token::Ident(_) | Token::Int(_) | Token::Float(_) | Token::Str(_) | Token::True | Token::False)
}

/// Two operands side by side (`f(a)` then `g(b)`) are two expressions. A
/// `]` is left out: after `sum[i]` the body is nested under the reduction.
fn ends_operand(token: &Token) -> bool {
    is_operand(token) || matches!(token, Token::RParen | Token::RBrace)
}

fn at_statement_level(chains: &[usize], statements: &[(usize, usize)]) -> bool {
    statements.last().is_some_and(|(_, level)| *level == chains.len())
}

fn too_deep(span: Span) -> Diagnostic {
    Diagnostic::error(Code::NestingTooDeep, span, format!("expression nested more than {MAX_NESTING} levels deep"))
        .with_label("nesting crosses the limit here")
        .with_note("split the expression into named parts with `let`")
}

/// Returns `tokens` (balanced, see `delimiters`) where every expression
/// that could nest deeper than [`MAX_NESTING`] is reported and replaced by
/// one [`Token::Elided`], which parses as an error expression: the rest of
/// the file is checked as usual, without a cascade of follow-on errors.
pub fn bound(tokens: Vec<(Token, Span)>, diagnostics: &mut Vec<Diagnostic>) -> Vec<(Token, Span)> {
    let mut out: Vec<(Token, Span)> = Vec::with_capacity(tokens.len());
    // Per open bracket (the first: outside all brackets), how many nodes
    // may stand above the next operand; `depth` is the bound so far.
    let mut chains: Vec<usize> = vec![0];
    let mut depth = 0usize;
    // Per open brace (the first: outside all braces), where its current
    // statement's expression starts in `out`, and the level of the brace.
    let mut statements: Vec<(usize, usize)> = vec![(0, 1)];
    // While an elided expression's tokens are dropped: the brackets it
    // opened that are still open.
    let mut skipping: Option<usize> = None;
    for (token, span) in tokens {
        if let Some(open) = skipping.as_mut() {
            if opens(&token) {
                *open += 1;
                continue;
            }
            if closes(&token) && *open > 0 {
                *open -= 1;
                continue;
            }
            if !(closes(&token) || (*open == 0 && separates(&token))) {
                continue;
            }
            skipping = None;
        }
        let previous = out.last().map(|(token, _)| token);
        let current = chains.last_mut().expect("the outermost level stays");
        if separates(&token) || (is_operand(&token) && previous.is_some_and(ends_operand)) {
            depth -= *current;
            *current = 0;
        }
        if closes(&token) {
            if token == Token::RBrace {
                statements.pop();
            }
            depth -= chains.pop().expect("brackets are balanced") + 1;
        } else if opens(&token) || deepens(&token) {
            *current += 1;
            depth += 1;
            if opens(&token) {
                chains.push(0);
                depth += 1;
            }
            if depth > MAX_NESTING {
                diagnostics.push(too_deep(span));
                let (start, level) = *statements.last().expect("the outermost statement level stays");
                let dropped = out.drain(start..);
                let unclosed = dropped.fold(isize::from(opens(&token)), |open, (token, _)| {
                    open + isize::from(opens(&token)) - isize::from(closes(&token))
                });
                skipping = Some(usize::try_from(unclosed).expect("dropped brackets are balanced or open"));
                chains.truncate(level);
                *chains.last_mut().expect("a brace level") = 0;
                depth = chains.len() - 1 + chains.iter().sum::<usize>();
                out.push((Token::Elided, span));
                continue;
            }
        }
        let (brace, separated) = (token == Token::LBrace, separates(&token) || token == Token::RBrace);
        out.push((token, span));
        if brace {
            statements.push((out.len(), chains.len()));
        } else if separated && at_statement_level(&chains, &statements) {
            statements.last_mut().expect("the outermost statement level stays").0 = out.len();
        }
    }
    out
}
