//! `linnetc fmt`: one canonical layout for Linnet source. The formatter
//! works on tokens and comments, so it never changes what a file says: it
//! keeps the author's line breaks (at most one blank line in a row),
//! indents by four spaces per open bracket line and for `where` clause
//! lists, spaces tokens by one rule set, and keeps every comment where it
//! was. A line wider than [`MAX_WIDTH`] is broken as rustfmt breaks one:
//! its widest bracketed list one item a line, the closing bracket on a
//! line of its own, then again inside where a line is still too wide.
//! Formatting its own output changes nothing.

use super::lexer::{self, Token};
use crate::source::FileId;

/// The widest a line may be before its lists are broken (as the Rust
/// code's `rustfmt.toml` has it).
pub const MAX_WIDTH: usize = 120;

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
    let mut pieces: Vec<Piece> = pieces.into_iter().map(|(_, piece)| piece).collect();
    loop {
        let (text, widths) = layout(&pieces);
        let broken = widths.iter().any(|&(line, width)| width > MAX_WIDTH && break_widest_list(&mut pieces, line));
        if !broken {
            return Some(text);
        }
    }
}

/// Breaks the widest bracketed list that opens and closes on `line` one
/// item a line (after the opening bracket, after each of its own commas,
/// before the closing one); `false` where the line has no list to break.
fn break_widest_list(pieces: &mut [Piece], line: usize) -> bool {
    let on_line: Vec<usize> = (0..pieces.len()).filter(|&at| pieces[at].line == line).collect();
    let width = |from: usize, to: usize| pieces[from..=to].iter().map(|p| p.text.len() + 1).sum::<usize>();
    // Each list as (opener, closer, the commas at its own depth); generic
    // arguments are lists too, other `<` and `>` compare.
    let mut lists: Vec<(usize, usize, Vec<usize>)> = Vec::new();
    let mut stack: Vec<(usize, Vec<usize>)> = Vec::new();
    for &at in &on_line {
        let token = &pieces[at].token;
        let closes_generics =
            token == &Some(Token::Gt) && stack.last().is_some_and(|(o, _)| pieces[*o].token == Some(Token::Lt));
        if is_opener(token) || (token == &Some(Token::Lt) && opens_generics(pieces, at)) {
            stack.push((at, Vec::new()));
        } else if is_closer(token) || closes_generics {
            if let Some((opener, commas)) = stack.pop() {
                if at > opener + 1 {
                    lists.push((opener, at, commas));
                }
            }
        } else if token == &Some(Token::Comma) {
            if let Some((_, commas)) = stack.last_mut() {
                commas.push(at);
            }
        }
    }
    let Some((opener, closer, commas)) = lists.into_iter().max_by_key(|(opener, closer, _)| width(*opener, *closer))
    else {
        return false;
    };
    let mut starts: Vec<usize> = vec![opener + 1];
    starts.extend(commas.iter().map(|comma| comma + 1).filter(|&at| at < closer));
    starts.push(closer);
    // Each start and what follows it on the line move down a line more
    // than the one before; the lines after move down by as many.
    let line_end = on_line.last().map_or(0, |last| last + 1);
    for (shift, &start) in starts.iter().enumerate() {
        let end = starts.get(shift + 1).copied().unwrap_or(line_end);
        for piece in &mut pieces[start..end] {
            piece.line += shift + 1;
        }
    }
    for piece in &mut pieces[line_end..] {
        piece.line += starts.len();
    }
    true
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

/// The text, and each line's width with the piece line it holds.
fn layout(pieces: &[Piece]) -> (String, Vec<(usize, usize)>) {
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
    let mut widths = Vec::new();
    let mut line_start = 0;
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
                widths.push((pieces[p].line, out[line_start..].chars().count()));
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
            line_start = out.len();
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
    if let Some(p) = previous {
        widths.push((pieces[p].line, out[line_start..].chars().count()));
    }
    out.push('\n');
    (out, widths)
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

    /// A line past the width has its widest list broken, one item a line,
    /// and again inside while a line is too wide; the result is stable.
    #[test]
    fn long_lines_break_at_their_widest_list() {
        let names: Vec<String> = (0..12).map(|i| format!("Generic{i}")).collect();
        let long = format!(
            "fn f(first: Tensor[{}; f32], second: Tensor[B; f32]) -> Tensor[B; f32] {{ // note\n    return second\n}}\n",
            names.join(", ")
        );
        let formatted = format(&long).unwrap();
        let expected = format!(
            "fn f(\n    first: Tensor[\n        {}; f32\n    ],\n    second: Tensor[B; f32]\n) -> Tensor[B; f32] {{ // note\n    return second\n}}\n",
            names.iter().map(String::as_str).collect::<Vec<_>>().join(",\n        ")
        );
        assert_eq!(formatted, expected);
        assert!(formatted.lines().all(|line| line.len() <= super::MAX_WIDTH));
        assert_eq!(format(&formatted).unwrap(), formatted);
        // Generic arguments are a list; a comparison is not.
        let generic = format!("type M = Outer<{}, Inner<A, B>>\n", names.join(", ").repeat(2));
        let formatted = format(&generic).unwrap();
        assert!(formatted.starts_with("type M = Outer<\n    Generic0,\n"), "{formatted}");
        assert!(formatted.ends_with("    Inner<A, B>\n>\n"), "{formatted}");
    }

    #[test]
    fn comments_and_blank_lines_stay() {
        let text = "// doc\n\n\n\nfn f() -> i32 { // why\n    return a < b\n}\n";
        assert_eq!(format(text).unwrap(), "// doc\n\nfn f() -> i32 { // why\n    return a < b\n}\n");
    }
}
