//! `linnetc fmt`: one canonical layout for Linnet source. The formatter
//! works on tokens and comments, so it never changes what a file says: it
//! keeps the author's line breaks (at most one blank line in a row),
//! indents by four spaces per open bracket line and for `where` clause
//! lists, spaces tokens by one rule set, and keeps every comment where it
//! was. Formatting its own output changes nothing.

use super::lexer::{self, Token};
use crate::source::FileId;

/// A token or a comment, with the line it starts on.
struct Piece {
    text: String,
    token: Option<Token>,
    line: usize,
}

/// The formatted text, or `None` when the file has a syntax error (it is
/// left as it is: formatting never guesses where a gap ends).
pub fn format(text: &str) -> Option<String> {
    let mut diagnostics = Vec::new();
    super::parse_module(FileId(0), text, &mut diagnostics);
    if !diagnostics.is_empty() {
        return None;
    }
    let lexed = lexer::lex(FileId(0), text, &mut diagnostics);
    let line_starts = crate::source::SourceFile::lines_of(text);
    let line_of = |offset: u32| line_starts.partition_point(|start| *start <= offset as usize);
    let mut pieces: Vec<(u32, Piece)> = lexed
        .tokens
        .into_iter()
        .map(|(token, span)| {
            (span.start, Piece { text: text[span.range()].to_string(), token: Some(token), line: line_of(span.start) })
        })
        .collect();
    pieces.extend(lexed.comments.into_iter().map(|comment| {
        let piece = Piece {
            text: text[comment.span.range()].trim_end().to_string(),
            token: None,
            line: line_of(comment.span.start),
        };
        (comment.span.start, piece)
    }));
    pieces.sort_by_key(|(start, _)| *start);
    let pieces: Vec<Piece> = pieces.into_iter().map(|(_, piece)| piece).collect();
    Some(layout(&pieces))
}

fn is_opener(token: &Option<Token>) -> bool {
    matches!(token, Some(Token::LParen | Token::LBracket | Token::LBrace))
}

fn is_closer(token: &Option<Token>) -> bool {
    matches!(token, Some(Token::RParen | Token::RBracket | Token::RBrace))
}

/// Whether the `<` at `at` opens generic arguments: it follows a name and
/// a matching `>` comes before anything a generic list cannot hold.
fn opens_generics(pieces: &[Piece], at: usize) -> bool {
    if !matches!(pieces.get(at.wrapping_sub(1)).and_then(|p| p.token.as_ref()), Some(Token::Ident(_))) {
        return false;
    }
    let mut depth = 0usize;
    for piece in &pieces[at..] {
        match &piece.token {
            Some(Token::Lt) => depth += 1,
            Some(Token::Gt) => {
                depth -= 1;
                if depth == 0 {
                    return true;
                }
            }
            Some(
                Token::LBrace
                | Token::RBrace
                | Token::EqEq
                | Token::NotEq
                | Token::Le
                | Token::Ge
                | Token::AndAnd
                | Token::OrOr
                | Token::Let
                | Token::Var
                | Token::Return
                | Token::RParen,
            ) => return false,
            _ => {}
        }
    }
    false
}

/// What kind of bracket each open bracket is, for spacing inside it.
#[derive(Clone, Copy, PartialEq)]
enum Open {
    Paren,
    /// `x[...]`: colons are slices.
    Index,
    /// `[a, b]` lists and `Tensor[...]` types.
    Square,
    Brace,
    /// `use path::{a, b}`: no spaces inside.
    Names,
    Generic,
}

fn layout(pieces: &[Piece]) -> String {
    let generic_openers: Vec<bool> =
        (0..pieces.len()).map(|at| pieces[at].token == Some(Token::Lt) && opens_generics(pieces, at)).collect();
    let mut generic_closers = vec![false; pieces.len()];
    {
        let mut stack = Vec::new();
        for (at, piece) in pieces.iter().enumerate() {
            match piece.token {
                Some(Token::Lt) => stack.push(generic_openers[at]),
                Some(Token::Gt) => generic_closers[at] = stack.pop().unwrap_or(false),
                _ => {}
            }
        }
    }
    let mut out = String::new();
    // Each open bracket, with its kind and the line it was opened on.
    let mut open: Vec<(Open, usize)> = Vec::new();
    let mut in_where = false;
    let mut continues = false;
    let mut previous: Option<usize> = None;
    for (at, piece) in pieces.iter().enumerate() {
        let new_line = previous.is_none_or(|p| pieces[p].line != piece.line);
        let closes = is_closer(&piece.token) || generic_closers[at];
        let inner = open.last().map(|(kind, _)| *kind);
        if closes && !open.is_empty() {
            open.pop();
        }
        if new_line {
            if let Some(p) = previous {
                out.push('\n');
                if piece.line > pieces[p].line + 1 + lines_in(&pieces[p].text) {
                    out.push('\n');
                }
                // A `where` list ends with the clause that has no comma.
                let last = &pieces[p].token;
                if in_where && last != &Some(Token::Comma) && last != &Some(Token::Where) {
                    in_where = false;
                }
                continues = ends_incomplete(last) && !closes;
            }
            if piece.token == Some(Token::LBrace) {
                in_where = false;
            }
            let mut lines: Vec<usize> = open.iter().map(|(_, line)| *line).collect();
            lines.dedup();
            let depth = lines.len() + usize::from(in_where) + usize::from(continues);
            out.push_str(&"    ".repeat(depth));
        } else if let Some(p) = previous {
            if space_between(pieces, p, at, inner, &generic_openers, &generic_closers) {
                out.push(' ');
            }
        }
        out.push_str(&piece.text);
        if piece.token == Some(Token::Where) && pieces.get(at + 1).is_none_or(|next| next.line != piece.line) {
            in_where = true;
        }
        if in_where && piece.token == Some(Token::LBrace) {
            in_where = false;
        }
        if is_opener(&piece.token) || generic_openers[at] {
            let after_path = previous.is_some_and(|p| pieces[p].token == Some(Token::ColonColon));
            let kind = match piece.token {
                Some(Token::LParen) => Open::Paren,
                Some(Token::LBrace) if after_path => Open::Names,
                Some(Token::LBrace) => Open::Brace,
                Some(Token::Lt) => Open::Generic,
                _ if indexes(pieces, at) => Open::Index,
                _ => Open::Square,
            };
            open.push((kind, piece.line));
        }
        previous = Some(at);
    }
    out.push('\n');
    out
}

/// Whether a line ending in this token continues on the next one.
fn ends_incomplete(token: &Option<Token>) -> bool {
    matches!(
        token,
        Some(
            Token::Assign
                | Token::Plus
                | Token::Minus
                | Token::Star
                | Token::Slash
                | Token::Percent
                | Token::AndAnd
                | Token::OrOr
                | Token::EqEq
                | Token::NotEq
                | Token::Le
                | Token::Ge
                | Token::Arrow
        )
    )
}

fn lines_in(text: &str) -> usize {
    text.matches('\n').count()
}

/// Whether the `[` at `at` indexes the value before it.
fn indexes(pieces: &[Piece], at: usize) -> bool {
    let before = pieces.get(at.wrapping_sub(1)).and_then(|p| p.token.as_ref());
    match before {
        Some(Token::Ident(name)) => name != "Tensor",
        Some(Token::RParen | Token::RBracket) => true,
        _ => false,
    }
}

/// Whether the token before `at` makes a `-`, `!` or `*` at `at` unary.
fn prefix_position(pieces: &[Piece], at: usize, generic_closers: &[bool]) -> bool {
    let Some(before) = at.checked_sub(1) else { return true };
    if generic_closers[before] {
        return false;
    }
    match &pieces[before].token {
        None => true,
        Some(Token::Ident(_) | Token::Int(_) | Token::Float(_) | Token::Str(_) | Token::True | Token::False) => false,
        Some(Token::RParen | Token::RBracket | Token::RBrace) => false,
        Some(_) => true,
    }
}

/// `inner`: the innermost bracket open before `right` (the one `right`
/// closes, if it is a closer).
fn space_between(
    pieces: &[Piece],
    left: usize,
    right: usize,
    inner: Option<Open>,
    generic_openers: &[bool],
    generic_closers: &[bool],
) -> bool {
    let (a, b) = (&pieces[left].token, &pieces[right].token);
    // A comment after code on its line.
    let Some(b) = b else { return true };
    let Some(a) = a else { return true };
    if generic_openers[right] || generic_openers[left] || generic_closers[right] {
        return false;
    }
    if generic_closers[left] {
        return !matches!(
            b,
            Token::LParen
                | Token::LBracket
                | Token::Comma
                | Token::Semi
                | Token::RParen
                | Token::RBracket
                | Token::Gt
                | Token::Dot
                | Token::ColonColon
        );
    }
    match (a, b) {
        (Token::Comma, _) => true,
        (Token::LBrace, _) | (_, Token::RBrace) if inner == Some(Open::Names) => false,
        (Token::ColonColon, Token::LBrace) => false,
        (_, Token::Comma | Token::Semi | Token::RParen | Token::RBracket | Token::Dot | Token::ColonColon) => false,
        (Token::LParen | Token::LBracket | Token::Dot | Token::ColonColon, _) => false,
        (Token::Ident(_) | Token::RParen | Token::RBracket, Token::LParen | Token::LBracket) => false,
        (_, Token::Colon) if inner == Some(Open::Index) => false,
        (Token::Colon, _) if inner == Some(Open::Index) => false,
        (_, Token::Colon) => false,
        (Token::Minus | Token::Bang | Token::Star, _) if prefix_position(pieces, left, generic_closers) => false,
        (Token::LBrace, Token::RBrace) => false,
        _ => true,
    }
}

#[cfg(test)]
mod tests {
    use super::format;

    #[test]
    fn spacing_and_indentation() {
        let messy = "pub fn f<B:Dim>( x:Tensor[B;f32] )->Tensor[B;f32]\nwhere B>0{\nlet y[b]=-x[b]*cast<f32>(iota<i64>(B)[b])\n  return  concat(y,x[0:B / 2],axis=-1)\n}\n";
        let formatted = format(messy).unwrap();
        assert_eq!(
            formatted,
            "pub fn f<B: Dim>(x: Tensor[B; f32]) -> Tensor[B; f32]\nwhere B > 0 {\n    let y[b] = -x[b] * cast<f32>(iota<i64>(B)[b])\n    return concat(y, x[0:B / 2], axis = -1)\n}\n"
        );
        assert_eq!(format(&formatted).unwrap(), formatted);
    }

    #[test]
    fn comments_and_blank_lines_stay() {
        let text = "// doc\n\n\n\nfn f() -> i32 { // why\n    return a < b\n}\n";
        assert_eq!(format(text).unwrap(), "// doc\n\nfn f() -> i32 { // why\n    return a < b\n}\n");
    }
}
