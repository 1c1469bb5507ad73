//! The lexer: source text to tokens with byte spans (logos). Comments are
//! kept aside, not dropped, so that doc comments can be attached to the
//! declarations they precede; a character no token starts with becomes a
//! diagnostic and is skipped.

use crate::code::Code;
use crate::diagnostic::Diagnostic;
use crate::source::{FileId, Span};
use logos::Logos;
use std::fmt;

#[derive(Logos, Clone, Debug, PartialEq, Eq, Hash)]
#[logos(skip r"[ \t\r\n\f]+")]
pub enum Token {
    #[regex(r"//[^\n]*", |lex| lex.slice()[2..].to_string())]
    Comment(String),

    #[token("module")]
    Module,
    #[token("use")]
    Use,
    #[token("pub")]
    Pub,
    #[token("block")]
    Block,
    #[token("trait")]
    Trait,
    #[token("type")]
    Type,
    #[token("fn")]
    Fn,
    #[token("entry")]
    Entry,
    #[token("intrinsic")]
    Intrinsic,
    #[token("let")]
    Let,
    #[token("var")]
    Var,
    #[token("return")]
    Return,
    #[token("static")]
    Static,
    #[token("for")]
    For,
    #[token("in")]
    In,
    #[token("if")]
    If,
    #[token("else")]
    Else,
    #[token("where")]
    Where,
    #[token("const")]
    Const,
    #[token("true")]
    True,
    #[token("false")]
    False,

    #[regex(r"[A-Za-z_][A-Za-z0-9_]*", |lex| lex.slice().to_string())]
    Ident(String),
    #[regex(r"[0-9]+", |lex| lex.slice().to_string(), priority = 3)]
    Int(String),
    #[regex(r"[0-9]+\.[0-9]+([eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+", |lex| lex.slice().to_string())]
    Float(String),
    #[regex(r#""([^"\\\n]|\\.)*""#, |lex| { let s = lex.slice(); s[1..s.len() - 1].to_string() })]
    Str(String),

    #[token("(")]
    LParen,
    #[token(")")]
    RParen,
    #[token("[")]
    LBracket,
    #[token("]")]
    RBracket,
    #[token("{")]
    LBrace,
    #[token("}")]
    RBrace,
    #[token("<")]
    Lt,
    #[token(">")]
    Gt,
    #[token("<=")]
    Le,
    #[token(">=")]
    Ge,
    #[token("==")]
    EqEq,
    #[token("!=")]
    NotEq,
    #[token("=")]
    Assign,
    #[token("+")]
    Plus,
    #[token("-")]
    Minus,
    #[token("*")]
    Star,
    #[token("/")]
    Slash,
    #[token("%")]
    Percent,
    #[token("&&")]
    AndAnd,
    #[token("||")]
    OrOr,
    #[token("!")]
    Bang,
    #[token(",")]
    Comma,
    #[token(";")]
    Semi,
    #[token("::")]
    ColonColon,
    #[token(":")]
    Colon,
    #[token(".")]
    Dot,
    #[token("->")]
    Arrow,
    /// Never lexed: stands for an expression the nesting bound removed
    /// (already reported); it parses as an error expression.
    Elided,
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = match self {
            Token::Comment(_) => "comment",
            Token::Elided => "an elided expression",
            Token::Ident(name) => return write!(f, "`{name}`"),
            Token::Int(text) | Token::Float(text) => return write!(f, "`{text}`"),
            Token::Str(text) => return write!(f, "\"{text}\""),
            Token::Module => "module",
            Token::Use => "use",
            Token::Pub => "pub",
            Token::Block => "block",
            Token::Trait => "trait",
            Token::Type => "type",
            Token::Fn => "fn",
            Token::Entry => "entry",
            Token::Intrinsic => "intrinsic",
            Token::Let => "let",
            Token::Var => "var",
            Token::Return => "return",
            Token::Static => "static",
            Token::For => "for",
            Token::In => "in",
            Token::If => "if",
            Token::Else => "else",
            Token::Where => "where",
            Token::Const => "const",
            Token::True => "true",
            Token::False => "false",
            Token::LParen => "(",
            Token::RParen => ")",
            Token::LBracket => "[",
            Token::RBracket => "]",
            Token::LBrace => "{",
            Token::RBrace => "}",
            Token::Lt => "<",
            Token::Gt => ">",
            Token::Le => "<=",
            Token::Ge => ">=",
            Token::EqEq => "==",
            Token::NotEq => "!=",
            Token::Assign => "=",
            Token::Plus => "+",
            Token::Minus => "-",
            Token::Star => "*",
            Token::Slash => "/",
            Token::Percent => "%",
            Token::AndAnd => "&&",
            Token::OrOr => "||",
            Token::Bang => "!",
            Token::Comma => ",",
            Token::Semi => ";",
            Token::ColonColon => "::",
            Token::Colon => ":",
            Token::Dot => ".",
            Token::Arrow => "->",
        };
        write!(f, "`{text}`")
    }
}

/// A comment's text (after `//`) and where it is.
#[derive(Clone, Debug)]
pub struct Comment {
    pub text: String,
    pub span: Span,
}

pub struct Lexed {
    pub tokens: Vec<(Token, Span)>,
    pub comments: Vec<Comment>,
}

pub fn lex(file: FileId, text: &str, diagnostics: &mut Vec<Diagnostic>) -> Lexed {
    let mut tokens = Vec::new();
    let mut comments = Vec::new();
    for (token, range) in Token::lexer(text).spanned() {
        let span = Span::new(file, range.clone());
        match token {
            Ok(Token::Comment(text)) => comments.push(Comment { text, span }),
            Ok(token) => tokens.push((token, span)),
            Err(()) => diagnostics.push(
                Diagnostic::error(Code::SyntaxError, span, format!("unexpected character `{}`", &text[range]))
                    .with_label("no token starts with this character"),
            ),
        }
    }
    Lexed { tokens, comments }
}
