//! The parser: tokens to a [`Module`] (chumsky). It never fails outright:
//! it returns what it could parse plus its errors. Statements and items
//! recover by skipping to the next one, and bracketed groups by skipping to
//! their closing bracket, so one syntax error does not hide the next.

// chumsky 0.9's `Simple` error is large by design; it is built only on
// failure paths.
#![allow(clippy::result_large_err)]

use super::ast::*;
use super::lexer::{Comment, Token};
use crate::code::Code;
use crate::diagnostic::Diagnostic;
use crate::source::{FileId, Span};
use chumsky::prelude::*;
use chumsky::Stream;

impl chumsky::Span for Span {
    type Context = FileId;
    type Offset = u32;

    fn new(file: FileId, range: std::ops::Range<u32>) -> Span {
        Span { file, start: range.start, end: range.end }
    }

    fn context(&self) -> FileId {
        self.file
    }

    fn start(&self) -> u32 {
        self.start
    }

    fn end(&self) -> u32 {
        self.end
    }
}

type Error = Simple<Token, Span>;

/// Parses one module. Docs are attached from `comments` afterwards.
pub fn parse(
    file: FileId,
    text: &str,
    tokens: Vec<(Token, Span)>,
    comments: &[Comment],
    diagnostics: &mut Vec<Diagnostic>,
) -> Module {
    let end = text.len();
    let eoi = Span::new(file, end..end);
    let stream = Stream::from_iter(eoi, tokens.into_iter());
    let (module, errors) = module_parser().parse_recovery(stream);
    diagnostics.extend(errors.into_iter().map(syntax_diagnostic));
    let mut module = module.unwrap_or(Module { name: None, uses: Vec::new(), items: Vec::new() });
    attach_docs(&mut module, text, comments);
    module
}

fn syntax_diagnostic(error: Error) -> Diagnostic {
    use chumsky::error::SimpleReason;
    let span = error.span();
    match error.reason() {
        SimpleReason::Custom(message) => {
            Diagnostic::error(Code::SyntaxError, span, message.clone()).with_label(message.clone())
        }
        SimpleReason::Unclosed { span: open, delimiter } => {
            Diagnostic::error(Code::SyntaxError, span, format!("unclosed delimiter {delimiter}"))
                .with_label("expected it to be closed by here")
                .with_secondary(*open, "opened here")
        }
        SimpleReason::Unexpected => {
            let found = match error.found() {
                Some(token) => token.to_string(),
                None => "end of file".to_string(),
            };
            let mut expected: Vec<String> = error
                .expected()
                .map(|token| match token {
                    Some(token) => token.to_string(),
                    None => "end of file".to_string(),
                })
                .collect();
            expected.sort();
            expected.dedup();
            let message = match error.label() {
                Some(what) => format!("expected {what}, found {found}"),
                None if expected.is_empty() => format!("unexpected {found}"),
                None if expected.len() > 6 => format!("unexpected {found}"),
                None => format!("expected {}, found {found}", expected.join(" or ")),
            };
            Diagnostic::error(Code::SyntaxError, span, message).with_label(format!("unexpected {found}"))
        }
    }
}

fn ident() -> impl Parser<Token, Ident, Error = Error> + Clone {
    filter_map(|span, token| match token {
        Token::Ident(name) => Ok(Ident { name, span }),
        found => Err(Simple::expected_input_found(span, Vec::new(), Some(found))),
    })
}

fn keyword_ident(word: &'static str) -> impl Parser<Token, Ident, Error = Error> + Clone {
    filter_map(move |span, token| match token {
        Token::Ident(name) if name == word => Ok(Ident { name, span }),
        found => Err(Simple::expected_input_found(span, Vec::new(), Some(found))),
    })
}

/// A float literal as a generic argument, `-` allowed: `1e-5`, `-0.5`.
fn number_arg() -> impl Parser<Token, GenericArg, Error = Error> + Clone {
    let float = filter_map(|span, token| match token {
        Token::Float(text) => text
            .parse::<f64>()
            .map(|value| (value, span))
            .map_err(|_| Simple::custom(span, format!("`{text}` is not a number"))),
        found => Err(Simple::expected_input_found(span, Vec::new(), Some(found))),
    });
    just(Token::Minus).or_not().then(float).map_with_span(|(minus, (value, _)), span| {
        GenericArg::Number(if minus.is_some() { -value } else { value }, span)
    })
}

fn int_literal() -> impl Parser<Token, (u64, Span), Error = Error> + Clone {
    filter_map(|span, token| match token {
        Token::Int(text) => text
            .parse::<u64>()
            .map(|value| (value, span))
            .map_err(|_| Simple::custom(span, format!("integer `{text}` is too large"))),
        found => Err(Simple::expected_input_found(span, Vec::new(), Some(found))),
    })
}

/// One precedence level: `operand (op operand)*`, folded to the left.
fn left_assoc<O: Clone, Op: Clone>(
    operand: impl Parser<Token, O, Error = Error> + Clone,
    op: impl Parser<Token, Op, Error = Error> + Clone,
    combine: fn(O, (Op, O)) -> O,
) -> impl Parser<Token, O, Error = Error> + Clone {
    operand.clone().then(op.then(operand).repeated()).foldl(combine)
}

/// `*`, `/` and `%` as the operators of one level.
fn product_ops<Op: Clone>(mul: Op, div: Op, rem: Op) -> impl Parser<Token, Op, Error = Error> + Clone {
    choice((just(Token::Star).to(mul), just(Token::Slash).to(div), just(Token::Percent).to(rem)))
}

/// `+` and `-` as the operators of one level.
fn sum_ops<Op: Clone>(add: Op, sub: Op) -> impl Parser<Token, Op, Error = Error> + Clone {
    choice((just(Token::Plus).to(add), just(Token::Minus).to(sub)))
}

fn path() -> impl Parser<Token, Path, Error = Error> + Clone {
    ident().separated_by(just(Token::Dot)).at_least(1).map_with_span(|segments, span| Path { segments, span })
}

fn dim_expr() -> impl Parser<Token, DimExpr, Error = Error> + Clone {
    recursive(|dim| {
        let atom = int_literal()
            .map(|(value, span)| DimExpr::Int(value, span))
            .or(ident().map(DimExpr::Name))
            .or(dim.delimited_by(just(Token::LParen), just(Token::RParen)))
            .labelled("a dim");
        let binary: fn(DimExpr, (DimOp, DimExpr)) -> DimExpr = |left, (op, right)| {
            let span = left.span().to(right.span());
            DimExpr::Binary(op, Box::new(left), Box::new(right), span)
        };
        let product = left_assoc(atom, product_ops(DimOp::Mul, DimOp::Div, DimOp::Rem), binary);
        left_assoc(product, sum_ops(DimOp::Add, DimOp::Sub), binary)
    })
}

fn cmp_op() -> impl Parser<Token, CmpOp, Error = Error> + Clone {
    choice((
        just(Token::EqEq).to(CmpOp::Eq),
        just(Token::NotEq).to(CmpOp::Ne),
        just(Token::Le).to(CmpOp::Le),
        just(Token::Ge).to(CmpOp::Ge),
        just(Token::Lt).to(CmpOp::Lt),
        just(Token::Gt).to(CmpOp::Gt),
    ))
}

fn where_clauses() -> impl Parser<Token, Vec<WhereClause>, Error = Error> + Clone {
    let clause = dim_expr()
        .then(cmp_op())
        .then(dim_expr())
        .map_with_span(|((lhs, op), rhs), span| WhereClause { lhs, op, rhs, span })
        .labelled("a where clause");
    just(Token::Where)
        .ignore_then(clause.separated_by(just(Token::Comma)).allow_trailing().at_least(1))
        .or_not()
        .map(Option::unwrap_or_default)
}

fn type_expr() -> impl Parser<Token, TypeExpr, Error = Error> + Clone {
    recursive(|ty| {
        let dim_item = just(Token::Star).ignore_then(ident()).map(DimItem::Shape).or(dim_expr().map(DimItem::Dim));
        let tensor = keyword_ident("Tensor")
            .ignore_then(
                dim_item
                    .separated_by(just(Token::Comma))
                    .allow_trailing()
                    .then_ignore(just(Token::Semi))
                    .then(ident())
                    .delimited_by(just(Token::LBracket), just(Token::RBracket)),
            )
            .map_with_span(|(dims, elem), span| TypeExpr::Tensor { dims, elem, span });
        let generic_arg = choice((tensor.clone().map(GenericArg::Type), number_arg(), dim_expr().map(GenericArg::Dim)));
        let named = ident()
            .then(
                generic_arg
                    .separated_by(just(Token::Comma))
                    .allow_trailing()
                    .delimited_by(just(Token::Lt), just(Token::Gt))
                    .or_not(),
            )
            .map_with_span(|(name, args), span| TypeExpr::Named { name, args: args.unwrap_or_default(), span });
        let tuple = ty
            .separated_by(just(Token::Comma))
            .allow_trailing()
            .delimited_by(just(Token::LParen), just(Token::RParen))
            .map_with_span(TypeExpr::Tuple);
        choice((tensor, tuple, named)).labelled("a type")
    })
}

/// `<H, HeadDim / 4, T>` after a name, as in `tables<S, HeadDim / 4, T>(...)`;
/// a block instance `SwiGlu<H, Inner, T>` is an argument too.
fn generic_args() -> impl Parser<Token, Vec<GenericArg>, Error = Error> + Clone {
    recursive(|args| {
        let tensor = type_expr().try_map(|ty, span| match ty {
            TypeExpr::Tensor { .. } => Ok(GenericArg::Type(ty)),
            _ => Err(Simple::custom(span, "not a tensor type")),
        });
        let instance = ident()
            .then(args)
            .map_with_span(|(name, args), span| GenericArg::Type(TypeExpr::Named { name, args, span }));
        let arg = choice((tensor, instance, number_arg(), dim_expr().map(GenericArg::Dim)));
        arg.separated_by(just(Token::Comma)).allow_trailing().at_least(1).delimited_by(just(Token::Lt), just(Token::Gt))
    })
}

fn index_var() -> impl Parser<Token, IndexVar, Error = Error> + Clone {
    just(Token::Star).or_not().then(ident()).map(|(star, name)| IndexVar { name, variadic: star.is_some() })
}

fn expr() -> impl Parser<Token, Expr, Error = Error> + Clone {
    recursive(|expr: Recursive<Token, Expr, Error>| {
        let literal = filter_map(|span, token| {
            let kind = match token {
                Token::Int(text) => text
                    .parse::<u64>()
                    .map(ExprKind::Int)
                    .map_err(|_| Simple::custom(span, format!("integer `{text}` is too large")))?,
                Token::Float(text) => ExprKind::Float(
                    text.parse::<f64>().map_err(|_| Simple::custom(span, format!("`{text}` is not a number")))?,
                ),
                Token::True => ExprKind::Bool(true),
                Token::False => ExprKind::Bool(false),
                Token::Str(text) => ExprKind::Str(text),
                Token::Elided => ExprKind::Error,
                found => return Err(Simple::expected_input_found(span, Vec::new(), Some(found))),
            };
            Ok(Expr { kind, span })
        });

        let arg = ident()
            .then_ignore(just(Token::Assign))
            .or_not()
            .then(expr.clone())
            .map(|(name, value)| Arg { name, value });
        let args = arg
            .separated_by(just(Token::Comma))
            .allow_trailing()
            .delimited_by(just(Token::LParen), just(Token::RParen))
            .recover_with(nested_delimiters(
                Token::LParen,
                Token::RParen,
                [(Token::LBracket, Token::RBracket), (Token::LBrace, Token::RBrace)],
                |_| Vec::new(),
            ))
            .boxed();

        let reduction = choice((
            keyword_ident("sum").to(Reduction::Sum),
            keyword_ident("max").to(Reduction::Max),
            keyword_ident("min").to(Reduction::Min),
        ))
        .then(ident().delimited_by(just(Token::Lt), just(Token::Gt)).or_not())
        .then(index_var().delimited_by(just(Token::LBracket), just(Token::RBracket)))
        .then(expr.clone())
        .map_with_span(|(((op, acc), index), body), span| Expr {
            kind: ExprKind::Reduce { op, acc, index, body: Box::new(body) },
            span,
        });

        let call = ident().then(generic_args().or_not()).then(args.clone()).map_with_span(
            |((callee, generics), args), span| Expr {
                kind: ExprKind::Call { callee, generics: generics.unwrap_or_default(), args },
                span,
            },
        );

        let name = ident().map(|ident| Expr { span: ident.span, kind: ExprKind::Name(ident) });

        let grouped = expr
            .clone()
            .separated_by(just(Token::Comma))
            .allow_trailing()
            .delimited_by(just(Token::LParen), just(Token::RParen))
            .map_with_span(|mut items, span| {
                if items.len() == 1 {
                    let mut inner: Expr = items.pop().expect("one item");
                    inner.span = span;
                    inner
                } else {
                    Expr { kind: ExprKind::Tuple(items), span }
                }
            });

        let list = expr
            .clone()
            .separated_by(just(Token::Comma))
            .allow_trailing()
            .delimited_by(just(Token::LBracket), just(Token::RBracket))
            .map_with_span(|items, span| Expr { kind: ExprKind::List(items), span });

        let braced = expr.clone().delimited_by(just(Token::LBrace), just(Token::RBrace));
        let conditional = just(Token::If)
            .ignore_then(expr.clone())
            .then(braced.clone())
            .then_ignore(just(Token::Else))
            .then(braced)
            .map_with_span(|((cond, then), otherwise), span| Expr {
                kind: ExprKind::If { cond: Box::new(cond), then: Box::new(then), otherwise: Box::new(otherwise) },
                span,
            });

        let atom =
            choice((literal, conditional, reduction, call, name, grouped, list)).labelled("an expression").boxed();

        // `a`, `a:b`, `a:`, `:b` or `:`, each parsed once: trying a range
        // and then a position would parse `a` twice, and twice again at
        // every level of `x[x[x[…]]]`.
        let index_item = choice((
            just(Token::Star).ignore_then(ident()).map(IndexItem::Variadic),
            expr.clone().or_not().then(just(Token::Colon).ignore_then(expr.clone().or_not()).or_not()).try_map(
                |(lo, range), span| match (lo, range) {
                    (Some(at), None) => Ok(IndexItem::At(at)),
                    (None, None) => Err(Simple::custom(span, "expected an index")),
                    (None, Some(None)) => Ok(IndexItem::Full(span)),
                    (lo, Some(hi)) => Ok(IndexItem::Range(lo, hi, span)),
                },
            ),
        ));
        let index_suffix = index_item
            .separated_by(just(Token::Comma))
            .allow_trailing()
            .delimited_by(just(Token::LBracket), just(Token::RBracket))
            .map_with_span(|items, span: Span| Suffix::Index(items, span));
        let method_suffix =
            just(Token::Dot).ignore_then(ident()).then(generic_args().or_not()).then(args).map_with_span(
                |((method, generics), args), span| Suffix::Method(method, generics.unwrap_or_default(), args, span),
            );
        let postfix = atom
            .then(index_suffix.or(method_suffix).repeated())
            .foldl(|base, suffix| match suffix {
                Suffix::Index(items, span) => {
                    Expr { span: base.span.to(span), kind: ExprKind::Index { base: Box::new(base), items } }
                }
                Suffix::Method(method, generics, args, span) => Expr {
                    span: base.span.to(span),
                    kind: ExprKind::Method { receiver: Box::new(base), method, generics, args },
                },
            })
            .boxed();

        let unary = choice((just(Token::Minus).to(UnOp::Neg), just(Token::Bang).to(UnOp::Not)))
            .map_with_span(|op, span: Span| (op, span))
            .repeated()
            .then(postfix)
            .foldr(|(op, span), operand| Expr {
                span: span.to(operand.span),
                kind: ExprKind::Unary(op, Box::new(operand)),
            })
            .boxed();

        let binary: fn(Expr, (BinOp, Expr)) -> Expr = |left, (op, right)| Expr {
            span: left.span.to(right.span),
            kind: ExprKind::Binary(op, Box::new(left), Box::new(right)),
        };
        let product = left_assoc(unary, product_ops(BinOp::Mul, BinOp::Div, BinOp::Rem), binary).boxed();
        let sum = left_assoc(product, sum_ops(BinOp::Add, BinOp::Sub), binary).boxed();
        let comparison = sum
            .clone()
            .then(cmp_op().map(BinOp::Cmp).then(sum).or_not())
            .map(move |(left, right)| match right {
                Some(right) => binary(left, right),
                None => left,
            })
            .boxed();
        let conjunction = left_assoc(comparison, just(Token::AndAnd).to(BinOp::And), binary).boxed();
        left_assoc(conjunction, just(Token::OrOr).to(BinOp::Or), binary).boxed()
    })
}

enum Suffix {
    Index(Vec<IndexItem>, Span),
    Method(Ident, Vec<GenericArg>, Vec<Arg>, Span),
}

/// Succeeds, consuming nothing, unless the next token is `}`: a list's
/// recovery must not skip the brace that closes it.
fn not_closing() -> impl Parser<Token, (), Error = Error> + Clone {
    none_of([Token::RBrace]).rewind().ignored()
}

/// `{ statements }`; a body that does not parse becomes one error statement.
fn braced(
    stmts: impl Parser<Token, Vec<Stmt>, Error = Error> + Clone,
) -> impl Parser<Token, Vec<Stmt>, Error = Error> + Clone {
    stmts.delimited_by(just(Token::LBrace), just(Token::RBrace)).recover_with(nested_delimiters(
        Token::LBrace,
        Token::RBrace,
        [(Token::LParen, Token::RParen), (Token::LBracket, Token::RBracket)],
        |span| vec![Stmt::Error(span)],
    ))
}

fn statements() -> impl Parser<Token, Vec<Stmt>, Error = Error> + Clone {
    recursive(|stmts: Recursive<Token, Vec<Stmt>, Error>| {
        let body = braced(stmts);
        let tuple_pattern = ident()
            .map(|ident| if ident.name == "_" { None } else { Some(ident) })
            .separated_by(just(Token::Comma))
            .allow_trailing()
            .delimited_by(just(Token::LParen), just(Token::RParen))
            .map_with_span(Pattern::Tuple);
        let indexed_pattern = ident()
            .then(
                index_var()
                    .separated_by(just(Token::Comma))
                    .allow_trailing()
                    .at_least(1)
                    .delimited_by(just(Token::LBracket), just(Token::RBracket)),
            )
            .map(|(name, vars)| Pattern::Indexed(name, vars));
        let pattern = choice((tuple_pattern, indexed_pattern, ident().map(Pattern::Name)));
        // A `let` whose value does not parse still binds its names, so
        // their uses do not add errors to the syntax error.
        let let_value = expr()
            .recover_with(skip_until([Token::Let, Token::Var, Token::Return, Token::Static, Token::RBrace], |span| {
                Expr { kind: ExprKind::Error, span }
            }));
        let let_stmt = just(Token::Let)
            .ignore_then(pattern)
            .then_ignore(just(Token::Assign))
            .then(let_value)
            .map_with_span(|(pattern, value), span| Stmt::Let { pattern, value, span });
        let var_stmt = just(Token::Var)
            .ignore_then(ident())
            .then_ignore(just(Token::Assign))
            .then(expr())
            .map_with_span(|(name, value), span| Stmt::Var { name, value, span });
        let return_stmt =
            just(Token::Return).ignore_then(expr()).map_with_span(|value, span| Stmt::Return { value, span });
        let for_stmt = just(Token::Static)
            .ignore_then(just(Token::For))
            .ignore_then(ident())
            .then(just(Token::Comma).ignore_then(ident()).or_not())
            .then_ignore(just(Token::In))
            .then(ident())
            .then(body)
            .map_with_span(|(((var, index), over), body), span| Stmt::StaticFor { var, index, over, body, span });
        let assign = ident()
            .then_ignore(just(Token::Assign))
            .then(expr())
            .map_with_span(|(target, value), span| Stmt::Assign { target, value, span });
        let stmt = choice((let_stmt, var_stmt, return_stmt, for_stmt, assign, expr().map(Stmt::Expr)))
            .labelled("a statement")
            .recover_with(skip_then_retry_until([Token::RBrace]));
        not_closing().ignore_then(stmt).repeated()
    })
}

fn generics() -> impl Parser<Token, Vec<Generic>, Error = Error> + Clone {
    // `Dim`, `Shape`, `Float`, `f32`, or a trait that bounds a block generic.
    let kind = ident().then(generic_args().or_not()).map_with_span(|(ident, args), span| {
        let kind = match (ident.name.as_str(), &args) {
            ("Dim", None) => GenericKind::Dim,
            ("Shape", None) => GenericKind::Shape,
            ("Float", None) => GenericKind::Float,
            ("f32", None) => GenericKind::Number,
            _ => return (GenericKind::Block, span, Some((ident, args.unwrap_or_default()))),
        };
        (kind, span, None)
    });
    let generic = just(Token::Star)
        .or_not()
        .then(ident())
        .then_ignore(just(Token::Colon))
        .then(kind)
        .then(just(Token::Assign).ignore_then(generic_default()).or_not())
        .try_map(|(((star, name), (kind, kind_span, bound)), default), span| {
            if star.is_some() != (kind == GenericKind::Shape) {
                return Err(Simple::custom(
                    span,
                    "a variadic generic is written `*S: Shape`, and only a `Shape` is variadic",
                ));
            }
            Ok(Generic { name, kind, kind_span, bound, default, span })
        });
    generic
        .separated_by(just(Token::Comma))
        .allow_trailing()
        .delimited_by(just(Token::Lt), just(Token::Gt))
        .or_not()
        .map(Option::unwrap_or_default)
}

/// A generic's default: a dtype name (`bf16`) or a number (`1e-6`, `10000`).
fn generic_default() -> impl Parser<Token, GenericArg, Error = Error> + Clone {
    let int = int_literal().map(|(value, span)| GenericArg::Dim(DimExpr::Int(value, span)));
    choice((number_arg(), int, ident().map(|name| GenericArg::Dim(DimExpr::Name(name)))))
}

type Signature = ((((Ident, Vec<Generic>), Vec<FnParam>), Option<TypeExpr>), Vec<WhereClause>);

/// `name<generics>(params) -> ret where clauses`.
fn signature() -> impl Parser<Token, Signature, Error = Error> + Clone {
    let param = ident().then_ignore(just(Token::Colon)).then(type_expr()).map(|(name, ty)| FnParam { name, ty });
    let params =
        param.separated_by(just(Token::Comma)).allow_trailing().delimited_by(just(Token::LParen), just(Token::RParen));
    ident()
        .then(generics())
        .then(params)
        .then(just(Token::Arrow).ignore_then(type_expr()).or_not())
        .then(where_clauses())
}

/// What a function's parser yields: `pub`, the kind and signature, the body.
type ParsedFn = (Option<Token>, ((FnKind, Signature), Option<Vec<Stmt>>));

fn fn_decl(
    (is_pub, ((kind, ((((name, generics), params), ret), where_clauses)), body)): ParsedFn,
    span: Span,
) -> FnDecl {
    FnDecl { doc: None, is_pub: is_pub.is_some(), kind, name, generics, params, ret, where_clauses, body, span }
}

fn function() -> impl Parser<Token, FnDecl, Error = Error> + Clone {
    let body = braced(statements()).boxed();
    // A body is required unless the function is an intrinsic: making it
    // optional would let a body with a syntax error pass for a missing one.
    let defined = choice((just(Token::Fn).to(FnKind::Fn), just(Token::Entry).to(FnKind::Entry)))
        .then(signature())
        .then(body.clone().map(Some));
    // An intrinsic with a body is parsed, so the checker can say so.
    let intrinsic = just(Token::Intrinsic)
        .ignore_then(just(Token::Fn))
        .to(FnKind::Intrinsic)
        .then(signature())
        .then(body.or_not())
        .then_ignore(just(Token::Semi).or_not());
    just(Token::Pub).or_not().then(defined.or(intrinsic)).map_with_span(fn_decl)
}

/// A trait's function: a signature; a body is parsed so that the checker
/// can say it does not belong.
fn trait_function() -> impl Parser<Token, FnDecl, Error = Error> + Clone {
    just(Token::Pub)
        .or_not()
        .then(just(Token::Fn).to(FnKind::Fn).then(signature()).then(braced(statements()).or_not()))
        .then_ignore(just(Token::Semi).or_not())
        .map_with_span(fn_decl)
}

fn member() -> impl Parser<Token, Member, Error = Error> + Clone {
    let block_ref = ident().then(generic_args().or_not().map(Option::unwrap_or_default));
    let sub_ty = block_ref
        .clone()
        .then_ignore(just(Token::Semi))
        .then(dim_expr())
        .delimited_by(just(Token::LBracket), just(Token::RBracket))
        .map(|(block, count)| (block, Some(count)))
        .or(block_ref.map(|block| (block, None)));
    let sub = keyword_ident("sub").ignore_then(ident()).then_ignore(just(Token::Colon)).then(sub_ty).map_with_span(
        |(name, ((block, args), count)), span| Member::Sub { doc: None, name, block, args, count, span },
    );
    let typed =
        |word: &'static str| keyword_ident(word).ignore_then(ident()).then_ignore(just(Token::Colon)).then(type_expr());
    let param = typed("param").map_with_span(|(name, ty), span| Member::Param { doc: None, name, ty, span });
    let state = typed("state").map_with_span(|(name, ty), span| Member::State { doc: None, name, ty, span });
    choice((sub, param, state, function().map(Member::Fn)))
        .labelled("a member (`sub`, `param`, `state`, `fn` or `entry`)")
}

fn block() -> impl Parser<Token, BlockDecl, Error = Error> + Clone {
    let members = not_closing()
        .ignore_then(member().recover_with(skip_then_retry_until([Token::RBrace])))
        .repeated()
        .delimited_by(just(Token::LBrace), just(Token::RBrace));
    let signatures = not_closing()
        .ignore_then(trait_function().map(Member::Fn).recover_with(skip_then_retry_until([Token::RBrace])))
        .repeated()
        .delimited_by(just(Token::LBrace), just(Token::RBrace));
    let block =
        just(Token::Block).to(BlockKind::Block).then(ident()).then(generics()).then(where_clauses()).then(members);
    let bound =
        just(Token::Trait).to(BlockKind::Trait).then(ident()).then(generics()).then(where_clauses()).then(signatures);
    just(Token::Pub).or_not().then(block.or(bound)).map_with_span(
        |(is_pub, ((((kind, name), generics), where_clauses), members)), span| BlockDecl {
            doc: None,
            is_pub: is_pub.is_some(),
            kind,
            name,
            generics,
            where_clauses,
            members,
            span,
        },
    )
}

/// `pub type Model<...> = Decoder<...> where ...`
fn alias() -> impl Parser<Token, AliasDecl, Error = Error> + Clone {
    let target = ident().then(generic_args().or_not()).map_with_span(|(name, args), span| TypeExpr::Named {
        name,
        args: args.unwrap_or_default(),
        span,
    });
    just(Token::Pub)
        .or_not()
        .then_ignore(just(Token::Type))
        .then(ident())
        .then(generics())
        .then_ignore(just(Token::Assign))
        .then(target)
        .then(where_clauses())
        .map_with_span(|((((is_pub, name), generics), target), where_clauses), span| AliasDecl {
            doc: None,
            is_pub: is_pub.is_some(),
            name,
            generics,
            target,
            where_clauses,
            span,
        })
}

fn constant() -> impl Parser<Token, ConstDecl, Error = Error> + Clone {
    just(Token::Pub)
        .or_not()
        .then_ignore(just(Token::Const))
        .then(ident())
        .then_ignore(just(Token::Colon))
        .then(type_expr())
        .then_ignore(just(Token::Assign))
        .then(expr())
        .map_with_span(|(((is_pub, name), ty), value), span| ConstDecl {
            doc: None,
            is_pub: is_pub.is_some(),
            name,
            ty,
            value,
            span,
        })
}

fn module_parser() -> impl Parser<Token, Module, Error = Error> {
    let header = just(Token::Module).ignore_then(path()).or_not();
    let use_item = just(Token::Use)
        .ignore_then(path())
        .then_ignore(just(Token::ColonColon))
        .then(
            ident()
                .separated_by(just(Token::Comma))
                .allow_trailing()
                .delimited_by(just(Token::LBrace), just(Token::RBrace)),
        )
        .map_with_span(|(path, names), span| Use { path, names, span });
    let item = choice((
        block().map(Item::Block),
        alias().map(Item::Alias),
        constant().map(Item::Const),
        function().map(Item::Fn),
    ))
    .labelled("an item (`block`, `trait`, `type`, `fn`, `const`)")
    .recover_with(skip_then_retry_until([]));
    header
        .then(use_item.repeated())
        .then(any().rewind().ignore_then(item).repeated())
        .then_ignore(end())
        .map(|((name, uses), items)| Module { name, uses, items })
}

/// The comment lines directly above `start` (no blank line between), joined.
fn doc_before(start: u32, text: &str, comments: &[Comment]) -> Option<String> {
    let mut lines = Vec::new();
    let mut cursor = start as usize;
    for comment in comments.iter().rev() {
        if comment.span.end as usize > cursor {
            continue;
        }
        let between = &text[comment.span.end as usize..cursor];
        let line_start = text[..comment.span.start as usize].rfind('\n').map_or(0, |at| at + 1);
        let alone = text[line_start..comment.span.start as usize].trim().is_empty();
        if !between.trim().is_empty() || between.matches('\n').count() > 1 || !alone {
            break;
        }
        lines.push(comment.text.strip_prefix(' ').unwrap_or(&comment.text).to_string());
        cursor = line_start;
    }
    if lines.is_empty() {
        return None;
    }
    lines.reverse();
    Some(lines.join("\n"))
}

fn attach_docs(module: &mut Module, text: &str, comments: &[Comment]) {
    let doc = |span: Span| doc_before(span.start, text, comments);
    for item in &mut module.items {
        match item {
            Item::Block(block) => {
                block.doc = doc(block.span);
                for member in &mut block.members {
                    match member {
                        Member::Sub { doc: slot, span, .. }
                        | Member::Param { doc: slot, span, .. }
                        | Member::State { doc: slot, span, .. } => *slot = doc(*span),
                        Member::Fn(function) => function.doc = doc(function.span),
                    }
                }
            }
            Item::Fn(function) => function.doc = doc(function.span),
            Item::Const(constant) => constant.doc = doc(constant.span),
            Item::Alias(alias) => alias.doc = doc(alias.span),
        }
    }
}
