//! The syntax tree of one Linnet module, as written: names are strings,
//! dims are expressions, and every node keeps its span. Error nodes
//! (`Expr::Error`, `DimExpr::Error`, `TypeExpr::Error`) stand where the
//! parser recovered, so later phases stay quiet about them.

use crate::source::Span;
/// The surface comparisons are the IR's: a clause's or an expression's
/// operator is lowered as it is.
pub use linnet_ir::CmpOp;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ident {
    pub name: String,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct Module {
    /// `module a.b.c`, absent when the file has no header.
    pub name: Option<Path>,
    pub uses: Vec<Use>,
    pub items: Vec<Item>,
}

/// A dotted module path such as `crate.attention` or `std.nn.linear`.
#[derive(Clone, Debug)]
pub struct Path {
    pub segments: Vec<Ident>,
    pub span: Span,
}

impl Path {
    pub fn text(&self) -> String {
        self.segments.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(".")
    }
}

/// `use crate.attention::{GatedAttention, other}`
#[derive(Clone, Debug)]
pub struct Use {
    pub path: Path,
    pub names: Vec<Ident>,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub enum Item {
    /// A `block` or a `trait` (a block's signatures only).
    Block(BlockDecl),
    Fn(FnDecl),
    Const(ConstDecl),
    Alias(AliasDecl),
}

impl Item {
    pub fn name(&self) -> &Ident {
        match self {
            Item::Block(block) => &block.name,
            Item::Fn(function) => &function.name,
            Item::Const(constant) => &constant.name,
            Item::Alias(alias) => &alias.name,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GenericKind {
    Dim,
    Shape,
    Float,
    /// A number setting, written `Eps: f32`: a value known before running
    /// (ε, a rotary base, a scaling factor), used in expressions as an
    /// `f32` scalar.
    Number,
    /// A block type, bounded by a trait: `F: FeedForward<H, T>`.
    Block,
}

impl GenericKind {
    /// The kind as a message names it: "a Dim", "a block".
    pub fn article(self) -> &'static str {
        match self {
            GenericKind::Dim => "a Dim",
            GenericKind::Shape => "a Shape",
            GenericKind::Float => "a Float",
            GenericKind::Number => "a number (f32)",
            GenericKind::Block => "a block",
        }
    }
}

/// `B: Dim`, `*S: Shape`, `T: Float = bf16`, `Eps: f32 = 1e-6`,
/// `F: FeedForward<H, T>`.
#[derive(Clone, Debug)]
pub struct Generic {
    pub name: Ident,
    pub kind: GenericKind,
    pub kind_span: Span,
    /// The trait a block generic must satisfy, with its arguments.
    pub bound: Option<(Ident, Vec<GenericArg>)>,
    /// What the generic is when not given: a dtype name for a `Float`, a
    /// number for an `f32`.
    pub default: Option<GenericArg>,
    pub span: Span,
}

/// A `where` clause: a comparison of two dim expressions.
#[derive(Clone, Debug)]
pub struct WhereClause {
    pub lhs: DimExpr,
    pub op: CmpOp,
    pub rhs: DimExpr,
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DimOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
}

impl DimOp {
    pub fn symbol(self) -> &'static str {
        match self {
            DimOp::Add => "+",
            DimOp::Sub => "-",
            DimOp::Mul => "*",
            DimOp::Div => "/",
            DimOp::Rem => "%",
        }
    }
}

#[derive(Clone, Debug)]
pub enum DimExpr {
    Int(u64, Span),
    Name(Ident),
    Binary(DimOp, Box<DimExpr>, Box<DimExpr>, Span),
    Error(Span),
}

/// Prints a dim as written, with the parentheses its precedence needs.
impl std::fmt::Display for DimExpr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        fn precedence(op: DimOp) -> u8 {
            if matches!(op, DimOp::Add | DimOp::Sub) {
                1
            } else {
                2
            }
        }
        match self {
            DimExpr::Int(value, _) => write!(f, "{value}"),
            DimExpr::Name(ident) => f.write_str(&ident.name),
            DimExpr::Error(_) => f.write_str("?"),
            DimExpr::Binary(op, left, right, _) => {
                let wrap = |f: &mut std::fmt::Formatter<'_>, side: &DimExpr, strict: bool| match side {
                    DimExpr::Binary(inner, ..)
                        if precedence(*inner) < precedence(*op) || strict && precedence(*inner) == precedence(*op) =>
                    {
                        write!(f, "({side})")
                    }
                    _ => write!(f, "{side}"),
                };
                wrap(f, left, false)?;
                write!(f, " {} ", op.symbol())?;
                wrap(f, right, true)
            }
        }
    }
}

impl DimExpr {
    pub fn span(&self) -> Span {
        match self {
            DimExpr::Int(_, span) | DimExpr::Binary(_, _, _, span) | DimExpr::Error(span) => *span,
            DimExpr::Name(ident) => ident.span,
        }
    }
}

/// One axis of a tensor type: a dim, or a variadic shape `*S`.
#[derive(Clone, Debug)]
pub enum DimItem {
    Dim(DimExpr),
    Shape(Ident),
}

/// A generic argument as written: `H`, `HeadDim / 4`, `bf16`, `Tensor[...]`,
/// `SwiGlu<H, Inner, T>`. Whether a bare name is a dim, a dtype or a block
/// is decided by the parameter's kind; `Name<...>` is a block instance.
#[derive(Clone, Debug)]
pub enum GenericArg {
    Dim(DimExpr),
    Type(TypeExpr),
    /// A number with a point or an exponent (`1e-5`, `-0.5`), for an `f32`
    /// generic; an integer is a `Dim` until its parameter's kind says.
    Number(f64, Span),
}

impl GenericArg {
    pub fn span(&self) -> Span {
        match self {
            GenericArg::Dim(dim) => dim.span(),
            GenericArg::Type(ty) => ty.span(),
            GenericArg::Number(_, span) => *span,
        }
    }
}

#[derive(Clone, Debug)]
pub enum TypeExpr {
    /// `Tensor[D0, D1, *S; dtype]`
    Tensor {
        dims: Vec<DimItem>,
        elem: Ident,
        span: Span,
    },
    /// `i32`, `f32`, `T`, `Option<...>`, `Linear<H, Out, T>`
    Named {
        name: Ident,
        args: Vec<GenericArg>,
        span: Span,
    },
    Tuple(Vec<TypeExpr>, Span),
    Error(Span),
}

impl TypeExpr {
    pub fn span(&self) -> Span {
        match self {
            TypeExpr::Tensor { span, .. } | TypeExpr::Named { span, .. } => *span,
            TypeExpr::Tuple(_, span) | TypeExpr::Error(span) => *span,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BlockKind {
    Block,
    /// `trait Name<...> { fn ...; }`: what a block generic's argument must
    /// provide. Its members are functions without bodies.
    Trait,
}

#[derive(Clone, Debug)]
pub struct BlockDecl {
    pub doc: Option<String>,
    pub is_pub: bool,
    pub kind: BlockKind,
    pub name: Ident,
    pub generics: Vec<Generic>,
    pub where_clauses: Vec<WhereClause>,
    pub members: Vec<Member>,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub enum Member {
    /// `sub name: Block<...>` or `sub name: [Block<...>; N]`
    Sub {
        doc: Option<String>,
        name: Ident,
        block: Ident,
        args: Vec<GenericArg>,
        count: Option<DimExpr>,
        span: Span,
    },
    Param {
        doc: Option<String>,
        name: Ident,
        ty: TypeExpr,
        span: Span,
    },
    State {
        doc: Option<String>,
        name: Ident,
        ty: TypeExpr,
        span: Span,
    },
    Fn(FnDecl),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FnKind {
    Fn,
    Entry,
    /// Declared with a signature only; the compiler provides the body.
    Intrinsic,
}

#[derive(Clone, Debug)]
pub struct FnParam {
    pub name: Ident,
    pub ty: TypeExpr,
}

#[derive(Clone, Debug)]
pub struct FnDecl {
    pub doc: Option<String>,
    pub is_pub: bool,
    pub kind: FnKind,
    pub name: Ident,
    pub generics: Vec<Generic>,
    pub params: Vec<FnParam>,
    pub ret: Option<TypeExpr>,
    pub where_clauses: Vec<WhereClause>,
    /// Absent for intrinsics.
    pub body: Option<Vec<Stmt>>,
    pub span: Span,
}

/// `type Model<...> = Decoder<...> where ...`: a block instance under a
/// name with generics of its own, as a package's root or a sub.
#[derive(Clone, Debug)]
pub struct AliasDecl {
    pub doc: Option<String>,
    pub is_pub: bool,
    pub name: Ident,
    pub generics: Vec<Generic>,
    /// The block and its arguments (a `TypeExpr::Named`).
    pub target: TypeExpr,
    pub where_clauses: Vec<WhereClause>,
    pub span: Span,
}

#[derive(Clone, Debug)]
pub struct ConstDecl {
    pub doc: Option<String>,
    pub is_pub: bool,
    pub name: Ident,
    pub ty: TypeExpr,
    pub value: Expr,
    pub span: Span,
}

/// An index variable on the left of an index definition or after `sum`:
/// `b` or the variadic `*s`.
#[derive(Clone, Debug)]
pub struct IndexVar {
    pub name: Ident,
    pub variadic: bool,
}

#[derive(Clone, Debug)]
pub enum Pattern {
    Name(Ident),
    /// `let y[b, s, h] = ...`: an index definition.
    Indexed(Ident, Vec<IndexVar>),
    /// `let (a, _, c) = ...`; `None` for `_`.
    Tuple(Vec<Option<Ident>>, Span),
}

#[derive(Clone, Debug)]
pub enum Stmt {
    Let {
        pattern: Pattern,
        value: Expr,
        span: Span,
    },
    Var {
        name: Ident,
        value: Expr,
        span: Span,
    },
    Assign {
        target: Ident,
        value: Expr,
        span: Span,
    },
    Return {
        value: Expr,
        span: Span,
    },
    /// `static for var in over { ... }`, or `static for var, index in
    /// over`: `index` the element's position (an `i32`, known before
    /// running).
    StaticFor {
        var: Ident,
        index: Option<Ident>,
        over: Ident,
        body: Vec<Stmt>,
        span: Span,
    },
    Expr(Expr),
    Error(Span),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Rem,
    Cmp(CmpOp),
    And,
    Or,
}

impl BinOp {
    pub fn symbol(self) -> &'static str {
        match self {
            BinOp::Add => "+",
            BinOp::Sub => "-",
            BinOp::Mul => "*",
            BinOp::Div => "/",
            BinOp::Rem => "%",
            BinOp::Cmp(op) => op.symbol(),
            BinOp::And => "&&",
            BinOp::Or => "||",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnOp {
    Neg,
    Not,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reduction {
    Sum,
    Max,
    Min,
}

impl Reduction {
    pub fn name(self) -> &'static str {
        match self {
            Reduction::Sum => "sum",
            Reduction::Max => "max",
            Reduction::Min => "min",
        }
    }
}

/// A call argument, positional or `name = value`.
#[derive(Clone, Debug)]
pub struct Arg {
    pub name: Option<Ident>,
    pub value: Expr,
}

/// One position inside `x[...]`.
#[derive(Clone, Debug)]
pub enum IndexItem {
    /// `:`
    Full(Span),
    /// `lo:hi`, either bound optional.
    Range(Option<Expr>, Option<Expr>, Span),
    /// `*s`
    Variadic(Ident),
    /// A single position: an index variable, a dim, or a computed index.
    At(Expr),
}

#[derive(Clone, Debug)]
pub enum ExprKind {
    Int(u64),
    Float(f64),
    Bool(bool),
    Str(String),
    Name(Ident),
    Call { callee: Ident, generics: Vec<GenericArg>, args: Vec<Arg> },
    Method { receiver: Box<Expr>, method: Ident, generics: Vec<GenericArg>, args: Vec<Arg> },
    Index { base: Box<Expr>, items: Vec<IndexItem> },
    Unary(UnOp, Box<Expr>),
    Binary(BinOp, Box<Expr>, Box<Expr>),
    Reduce { op: Reduction, acc: Option<Ident>, index: IndexVar, body: Box<Expr> },
    If { cond: Box<Expr>, then: Box<Expr>, otherwise: Box<Expr> },
    Tuple(Vec<Expr>),
    List(Vec<Expr>),
    Error,
}

#[derive(Clone, Debug)]
pub struct Expr {
    pub kind: ExprKind,
    pub span: Span,
}
