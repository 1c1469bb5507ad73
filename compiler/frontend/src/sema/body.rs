//! Checking function bodies: names, statements, index definitions, calls
//! and elementwise arithmetic, under the `where` facts of the block and
//! the function. Each expression gets a [`Ty`]; a problem is reported once
//! and the expression becomes [`Ty::Error`], which silences what follows.

use super::facts::Facts;
use super::program::{GenericScope, GenericSig, ItemRef, Program};
use super::suggest;
use super::ty::{compare, infer, Axis, Elem, Subst, TensorTy, Ty};
use crate::code::Code;
use crate::diagnostic::Diagnostic;
use crate::source::Span;
use crate::syntax::ast::{self, BinOp, CmpOp, Expr, ExprKind, GenericKind, IndexItem, Stmt, UnOp};
use linnet_ir::dim::Dim;
use linnet_ir::Dtype;
use std::collections::HashMap;

#[derive(Clone, Copy, PartialEq, Eq)]
enum LocalKind {
    Let,
    Var,
    Param,
}

struct Local {
    ty: Ty,
    kind: LocalKind,
    span: Span,
}

/// What an index variable ranges over, once something it indexes says.
#[derive(Clone)]
enum IndexRange {
    Dim(Dim, Span),
    Shape(Vec<Axis>, Span),
}

struct IndexVar {
    name: String,
    variadic: bool,
    span: Span,
    range: Option<IndexRange>,
    /// Its ranges disagreed (reported): the definition has no type.
    poisoned: bool,
}

pub struct BodyChecker<'p, 'a> {
    pub(super) program: &'p Program<'a>,
    module: usize,
    block: Option<usize>,
    pub(super) facts: Facts,
    generics: Vec<GenericSig>,
    locals: Vec<HashMap<String, Local>>,
    index_frames: Vec<Vec<IndexVar>>,
    /// Every name a `let`, `var` or `static for` bound, where: one never
    /// read is a warning.
    bound: Vec<(String, Span)>,
    pub(super) diagnostics: &'p mut Vec<Diagnostic>,
    index: &'p mut super::SourceIndex,
}

impl<'p, 'a> BodyChecker<'p, 'a> {
    pub fn new(
        program: &'p Program<'a>,
        module: usize,
        block: Option<usize>,
        generics: Vec<GenericSig>,
        facts: Facts,
        diagnostics: &'p mut Vec<Diagnostic>,
        index: &'p mut super::SourceIndex,
    ) -> Self {
        BodyChecker {
            program,
            module,
            block,
            facts,
            generics,
            locals: vec![HashMap::new()],
            index_frames: Vec::new(),
            bound: Vec::new(),
            diagnostics,
            index,
        }
    }

    fn define(&mut self, used: Span, declared: Span) {
        self.index.definitions.push((used, declared));
    }

    pub(super) fn error(&mut self, diagnostic: Diagnostic) -> Ty {
        self.diagnostics.push(diagnostic);
        Ty::Error
    }

    pub fn bind_param(&mut self, name: &str, ty: Ty, span: Span) {
        self.index.types.push((span, ty.clone()));
        self.locals[0].insert(name.to_string(), Local { ty, kind: LocalKind::Param, span });
    }

    fn bind(&mut self, name: &ast::Ident, ty: Ty, kind: LocalKind) {
        self.index.types.push((name.span, ty.clone()));
        self.bound.push((name.name.clone(), name.span));
        self.locals.last_mut().expect("a scope").insert(name.name.clone(), Local { ty, kind, span: name.span });
    }

    /// Checks a function body against its declared return type.
    pub fn check_body(&mut self, body: &[Stmt], ret: &Ty, name: &ast::Ident) {
        let errors_before = self.error_count();
        self.check_stmts(body, ret);
        let returns = matches!(body.last(), Some(Stmt::Return { .. }) | Some(Stmt::Error(_)));
        if *ret != Ty::Unit && !returns {
            self.diagnostics.push(
                Diagnostic::error(
                    Code::MissingReturn,
                    name.span,
                    format!("`{}` does not end with `return`", name.name),
                )
                .with_label(format!("declared to return `{ret}`")),
            );
        }
        // A body with errors may not have recorded the reads its broken
        // expressions make: its unused names would be noise.
        if self.error_count() == errors_before {
            self.report_unused();
        }
    }

    fn error_count(&self) -> usize {
        self.diagnostics.iter().filter(|d| d.severity == crate::diagnostic::Severity::Error).count()
    }

    /// A warning for each name bound and never read (one that starts with
    /// `_` is meant to be unused).
    fn report_unused(&mut self) {
        for (name, span) in std::mem::take(&mut self.bound) {
            let read = self.index.definitions.iter().any(|(_, declared)| *declared == span);
            if !read && !name.starts_with('_') {
                self.diagnostics.push(
                    Diagnostic::warning(Code::UnusedLet, span, format!("`{name}` is never read"))
                        .with_label("bound here and not used: drop it, or mark it as meant")
                        .with_suggestion(
                            format!("if that is meant, name it `_{name}`"),
                            span,
                            format!("_{name}"),
                            crate::diagnostic::Applicability::MachineApplicable,
                        ),
                );
            }
        }
    }

    fn check_stmts(&mut self, stmts: &[Stmt], ret: &Ty) {
        for stmt in stmts {
            self.check_stmt(stmt, ret);
        }
    }

    fn check_stmt(&mut self, stmt: &Stmt, ret: &Ty) {
        match stmt {
            Stmt::Let { pattern, value, .. } => match pattern {
                ast::Pattern::Name(name) => {
                    let ty = self.check_expr(value);
                    self.bind(name, ty, LocalKind::Let);
                }
                ast::Pattern::Tuple(names, span) => {
                    let ty = self.check_expr(value);
                    let items = match ty {
                        Ty::Tuple(items) if items.len() == names.len() => items,
                        Ty::Error => vec![Ty::Error; names.len()],
                        other => {
                            self.error(
                                Diagnostic::error(
                                    Code::PatternMismatch,
                                    *span,
                                    format!("a pattern of {} names cannot take {}", names.len(), other.describe()),
                                )
                                .with_label("this pattern")
                                .with_secondary(value.span, format!("this is `{other}`")),
                            );
                            vec![Ty::Error; names.len()]
                        }
                    };
                    for (name, ty) in names.iter().zip(items) {
                        if let Some(name) = name {
                            self.bind(name, ty, LocalKind::Let);
                        }
                    }
                }
                ast::Pattern::Indexed(name, vars) => {
                    let ty = self.check_index_definition(vars, value);
                    self.bind(name, ty, LocalKind::Let);
                }
            },
            Stmt::Var { name, value, .. } => {
                let ty = self.check_expr(value);
                self.bind(name, ty, LocalKind::Var);
            }
            Stmt::Assign { target, value, .. } => self.check_assign(target, value),
            Stmt::Return { value, .. } => {
                let found = self.check_expr(value);
                self.check_returned(value, &found, ret);
            }
            Stmt::StaticFor { var, index, over, body, .. } => {
                if let Some(declared) = self.member_span(&over.name) {
                    self.define(over.span, declared);
                }
                let element = match self.lookup_member(&over.name) {
                    Some(Ty::SubArray(sub, _)) => Ty::Sub(sub),
                    Some(Ty::Error) => Ty::Error,
                    Some(other) => self.error(
                        Diagnostic::error(
                            Code::NotASubArray,
                            over.span,
                            format!("`static for` runs over an array of subs; `{}` is {}", over.name, other.describe()),
                        )
                        .with_label("not a `sub name: [Block; N]`"),
                    ),
                    None => self.unknown_name(over),
                };
                self.locals.push(HashMap::new());
                self.bind(var, element, LocalKind::Let);
                if let Some(index) = index {
                    self.bind(index, Ty::Tensor(TensorTy::scalar(Elem::Known(Dtype::I32))), LocalKind::Let);
                }
                self.check_stmts(body, ret);
                self.locals.pop();
            }
            Stmt::Expr(expr) => {
                self.check_expr(expr);
            }
            Stmt::Error(_) => {}
        }
    }

    /// Reports a returned value that does not fit, at the tuple element
    /// that differs when a tuple is written out.
    fn check_returned(&mut self, value: &Expr, found: &Ty, ret: &Ty) {
        if let (ExprKind::Tuple(items), Ty::Tuple(found_items), Ty::Tuple(expected)) = (&value.kind, found, ret) {
            if items.len() == expected.len() {
                for ((item, found), expected) in items.iter().zip(found_items).zip(expected) {
                    self.check_returned(item, found, expected);
                }
                return;
            }
        }
        if let Err(mismatch) = compare(ret, found, &self.facts) {
            self.error(
                Diagnostic::error(
                    mismatch.code(),
                    value.span,
                    format!("returns `{found}` where the function returns `{ret}`"),
                )
                .with_label(format!("this is `{found}`")),
            );
        }
    }

    fn check_assign(&mut self, target: &ast::Ident, value: &Expr) {
        let found = self.check_expr(value);
        let local = self.locals.iter().rev().find_map(|scope| scope.get(&target.name));
        if let Some(declared) = local.map(|l| l.span).or_else(|| self.member_span(&target.name)) {
            self.define(target.span, declared);
        }
        let local = self.locals.iter().rev().find_map(|scope| scope.get(&target.name));
        let (expected, what) = match local {
            Some(Local { ty, kind: LocalKind::Var, .. }) => (ty.clone(), "variable"),
            Some(Local { kind, .. }) => {
                let what = if *kind == LocalKind::Param { "a parameter" } else { "a `let`" };
                self.error(
                    Diagnostic::error(
                        Code::AssignToImmutable,
                        target.span,
                        format!("`{}` is {what} and cannot be assigned", target.name),
                    )
                    .with_label("declare it with `var` to assign it"),
                );
                return;
            }
            None => match self.block_state(&target.name) {
                Some(ty) => (ty, "state"),
                None => {
                    if self.lookup_member(&target.name).is_some() {
                        self.error(
                            Diagnostic::error(
                                Code::AssignToImmutable,
                                target.span,
                                format!("`{}` is not a state and cannot be assigned", target.name),
                            )
                            .with_label("only `var`s and `state`s are assigned"),
                        );
                    } else {
                        self.unknown_name(target);
                    }
                    return;
                }
            },
        };
        if let Err(mismatch) = compare(&expected, &found, &self.facts) {
            self.error(
                Diagnostic::error(
                    mismatch.code(),
                    value.span,
                    format!("{what} `{}` is `{expected}`, but is assigned `{found}`", target.name),
                )
                .with_label(format!("this is `{found}`")),
            );
        }
    }

    fn block_state(&self, name: &str) -> Option<Ty> {
        let block = &self.program.blocks[self.block?];
        block.states.iter().find(|(n, _, _)| n == name).map(|(_, ty, _)| ty.clone())
    }

    /// A member of the current block (a sub, a param or a state): its type
    /// and where it is declared.
    fn member(&self, name: &str) -> Option<(&Ty, Span)> {
        let block = &self.program.blocks[self.block?];
        block.subs.iter().find(|sub| sub.name == name).map(|sub| (&sub.ty, sub.name_span)).or_else(|| {
            block.params.iter().chain(&block.states).find(|(n, _, _)| n == name).map(|(_, ty, span)| (ty, *span))
        })
    }

    /// Where a member of the current block is declared.
    fn member_span(&self, name: &str) -> Option<Span> {
        self.member(name).map(|(_, span)| span)
    }

    /// The type of a member of the current block.
    fn lookup_member(&self, name: &str) -> Option<Ty> {
        self.member(name).map(|(ty, _)| ty.clone())
    }

    fn visible_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.locals.iter().flat_map(|scope| scope.keys().cloned()).collect();
        names.extend(self.index_frames.iter().flatten().map(|var| var.name.clone()));
        names.extend(self.generics.iter().map(|g| g.name.to_string()));
        if let Some(block) = self.block {
            let block = &self.program.blocks[block];
            names.extend(block.subs.iter().map(|sub| sub.name.clone()));
            names.extend(block.params.iter().chain(&block.states).map(|(n, _, _)| n.clone()));
            names.extend(block.fns.keys().cloned());
        }
        names.extend(self.program.scopes[self.module].keys().cloned());
        names
    }

    fn unknown_name(&mut self, name: &ast::Ident) -> Ty {
        let names = self.visible_names();
        let unknown = Diagnostic::error(Code::UnknownName, name.span, format!("no `{}` in scope", name.name))
            .with_label("not found");
        self.error(suggest::did_you_mean(unknown, &name.name, names.iter().map(String::as_str), false))
    }

    fn lookup_value(&mut self, name: &ast::Ident) -> Ty {
        let index_var = self.index_frames.iter().rev().flat_map(|frame| frame.iter()).find(|var| var.name == name.name);
        if let Some(var) = index_var {
            if var.variadic {
                return self.error(
                    Diagnostic::error(
                        Code::VariadicIndex,
                        name.span,
                        format!("`*{}` stands for several indices", name.name),
                    )
                    .with_label(format!("write it as `x[*{}, ...]`", name.name)),
                );
            }
            return Ty::scalar(Dtype::I64);
        }
        if let Some(local) = self.locals.iter().rev().find_map(|scope| scope.get(&name.name)) {
            let (ty, declared) = (local.ty.clone(), local.span);
            self.define(name.span, declared);
            return ty;
        }
        if let Some(ty) = self.lookup_member(&name.name) {
            if let Some(declared) = self.member_span(&name.name) {
                self.define(name.span, declared);
            }
            return ty;
        }
        if let Some(generic) = self.generics.iter().find(|g| *g.name == name.name).cloned() {
            self.define(name.span, generic.span);
            return match generic.kind {
                GenericKind::Dim => Ty::DimValue(Dim::generic(&name.name)),
                GenericKind::Number => Ty::Tensor(TensorTy::scalar(Elem::Known(Dtype::F32))),
                kind => self.error(
                    Diagnostic::error(
                        Code::KindMismatch,
                        name.span,
                        format!("`{}` is {} generic, not a value", name.name, kind.article()),
                    )
                    .with_label("only a Dim or an f32 generic can be used as a value"),
                ),
            };
        }
        match self.program.scopes[self.module].get(&name.name) {
            Some(ItemRef::Const(id)) => {
                let (ty, declared) = (self.program.consts[*id].ty.clone(), self.program.consts[*id].span);
                self.define(name.span, declared);
                return ty;
            }
            Some(ItemRef::Unresolved) => return Ty::Error,
            Some(_) => {
                return self.error(
                    Diagnostic::error(
                        Code::NotAValue,
                        name.span,
                        format!("`{}` is a function or block, not a value", name.name),
                    )
                    .with_label("call it, or use it as a `sub`"),
                )
            }
            None => {}
        }
        if name.name == "none" {
            return Ty::Option(None);
        }
        self.unknown_name(name)
    }

    /// The dim an expression stands for, if it is made only of integer
    /// literals and Dim generics.
    pub(super) fn static_dim(&self, expr: &Expr) -> Option<Dim> {
        super::static_dim(expr, &|name| {
            let shadowed = self.index_frames.iter().flatten().any(|var| var.name == name.name)
                || self.locals.iter().any(|scope| scope.contains_key(&name.name));
            let generic = self.generics.iter().find(|g| *g.name == name.name)?;
            (!shadowed && generic.kind == GenericKind::Dim).then(|| Dim::generic(&name.name))
        })
    }

    fn mentions_generic(&self, expr: &Expr) -> bool {
        match &expr.kind {
            ExprKind::Name(_) => true,
            ExprKind::Binary(_, left, right) => self.mentions_generic(left) || self.mentions_generic(right),
            _ => false,
        }
    }

    /// The type of an expression, recorded for editors.
    pub fn check_expr(&mut self, expr: &Expr) -> Ty {
        let ty = self.expr_type(expr);
        self.index.types.push((expr.span, ty.clone()));
        ty
    }

    fn expr_type(&mut self, expr: &Expr) -> Ty {
        match &expr.kind {
            ExprKind::Int(_) => Ty::Tensor(TensorTy::scalar(Elem::IntLiteral)),
            ExprKind::Float(_) => Ty::Tensor(TensorTy::scalar(Elem::FloatLiteral)),
            ExprKind::Bool(_) => Ty::scalar(Dtype::Bool),
            ExprKind::Str(_) => self.error(
                Diagnostic::error(Code::TypeError, expr.span, "a string is only a message argument")
                    .with_label("not a value"),
            ),
            ExprKind::Name(name) => self.lookup_value(name),
            ExprKind::Call { callee, generics, args } => self.check_call(callee, generics, args, expr.span),
            ExprKind::Method { receiver, method, generics, args } => {
                self.check_method(receiver, method, generics, args)
            }
            ExprKind::Index { base, items } => self.check_index(base, items, expr.span),
            ExprKind::Unary(op, operand) => self.check_unary(*op, operand, expr.span),
            ExprKind::Binary(op, left, right) => {
                if let (Some(dim), true) = (self.static_dim(expr), self.mentions_generic(expr)) {
                    return Ty::DimValue(dim);
                }
                self.check_binary(*op, left, right, expr.span)
            }
            ExprKind::Reduce { op, acc, index, body } => self.check_reduce(*op, acc.as_ref(), index, body, expr.span),
            ExprKind::If { cond, then, otherwise } => {
                let cond_ty = self.check_expr(cond);
                self.expect_bool_scalar(&cond_ty, cond.span, "an `if` condition");
                let (then_ty, otherwise_ty) = adapt_literals(self.check_expr(then), self.check_expr(otherwise));
                match compare(&then_ty, &otherwise_ty, &self.facts) {
                    Ok(()) => then_ty,
                    Err(mismatch) => self.error(
                        Diagnostic::error(
                            mismatch.code(),
                            otherwise.span,
                            format!("the branches of `if` differ: `{then_ty}` and `{otherwise_ty}`"),
                        )
                        .with_label(format!("this is `{otherwise_ty}`"))
                        .with_secondary(then.span, format!("this is `{then_ty}`")),
                    ),
                }
            }
            ExprKind::Tuple(items) => Ty::Tuple(items.iter().map(|item| self.check_expr(item)).collect()),
            ExprKind::List(_) => self.error(
                Diagnostic::error(
                    Code::MisplacedList,
                    expr.span,
                    "a list is only an argument of `reshape`, `permute` or `fill`",
                )
                .with_label("not a value"),
            ),
            ExprKind::Error => Ty::Error,
        }
    }

    pub(super) fn expect_bool_scalar(&mut self, ty: &Ty, span: Span, what: &str) {
        match ty {
            Ty::Error => {}
            Ty::Tensor(t) if t.axes.is_empty() && t.elem.is_bool() => {}
            other => {
                self.error(
                    Diagnostic::error(
                        Code::TypeMismatch,
                        span,
                        format!("{what} must be a `bool` scalar, found `{other}`"),
                    )
                    .with_label(format!("this is `{other}`")),
                );
            }
        }
    }

    fn check_unary(&mut self, op: UnOp, operand: &Expr, span: Span) -> Ty {
        let ty = self.check_expr(operand);
        match (op, &ty) {
            (_, Ty::Error) => Ty::Error,
            (UnOp::Neg, Ty::Tensor(t)) if t.elem.is_numeric() => ty,
            (UnOp::Not, Ty::Tensor(t)) if t.elem.is_bool() => ty,
            (UnOp::Neg, Ty::DimValue(_)) => Ty::Tensor(TensorTy::scalar(Elem::IntLiteral)),
            _ => {
                let (symbol, wanted) = if op == UnOp::Neg { ("-", "a number") } else { ("!", "a `bool`") };
                self.error(
                    Diagnostic::error(Code::TypeMismatch, span, format!("`{symbol}` takes {wanted}, found `{ty}`"))
                        .with_label(format!("this is `{ty}`")),
                )
            }
        }
    }

    /// A value as a tensor: dims become integer scalars.
    pub(super) fn as_tensor(&mut self, ty: Ty, span: Span, what: &str) -> Option<TensorTy> {
        match ty {
            Ty::Tensor(tensor) => Some(tensor),
            Ty::DimValue(_) => Some(TensorTy::scalar(Elem::IntLiteral)),
            Ty::Error => None,
            other => {
                self.error(
                    Diagnostic::error(
                        Code::TypeMismatch,
                        span,
                        format!("{what} must be a tensor, found {}", other.describe()),
                    )
                    .with_label("not a tensor"),
                );
                None
            }
        }
    }

    fn check_binary(&mut self, op: BinOp, left: &Expr, right: &Expr, span: Span) -> Ty {
        let left_ty = self.check_expr(left);
        let right_ty = self.check_expr(right);
        let what = format!("an operand of `{}`", op.symbol());
        let (Some(a), Some(b)) =
            (self.as_tensor(left_ty, left.span, &what), self.as_tensor(right_ty, right.span, &what))
        else {
            return Ty::Error;
        };
        let Some(elem) = a.elem.unify(&b.elem) else {
            return self.error(
                Diagnostic::error(
                    Code::DtypeMismatch,
                    span,
                    format!("`{}` needs operands of one element type, found {} and {}", op.symbol(), a.elem, b.elem),
                )
                .with_label("cast one side: Linnet never converts implicitly")
                .with_secondary(left.span, format!("this is {}", a.elem))
                .with_secondary(right.span, format!("this is {}", b.elem)),
            );
        };
        let elem_ok = match op {
            BinOp::And | BinOp::Or => elem.is_bool(),
            BinOp::Cmp(CmpOp::Eq | CmpOp::Ne) => true,
            _ => elem.is_numeric(),
        };
        if !elem_ok {
            return self.error(
                Diagnostic::error(Code::TypeMismatch, span, format!("`{}` does not apply to {elem}", op.symbol()))
                    .with_label(format!("operands are {elem}")),
            );
        }
        let Some(axes) = self.broadcast(&a, &b, span, op.symbol(), left.span, right.span) else { return Ty::Error };
        let elem = if matches!(op, BinOp::Cmp(_)) { Elem::Known(Dtype::Bool) } else { elem };
        Ty::Tensor(TensorTy { axes, elem })
    }

    /// NumPy broadcasting, decided on dims: axes align at the right; a pair
    /// must be equal, or one of them the constant 1; missing axes repeat.
    pub(super) fn broadcast(
        &mut self,
        a: &TensorTy,
        b: &TensorTy,
        span: Span,
        op: &str,
        left: Span,
        right: Span,
    ) -> Option<Vec<Axis>> {
        let rank = a.axes.len().max(b.axes.len());
        let mut axes = Vec::with_capacity(rank);
        for back in 1..=rank {
            let x = a.axes.len().checked_sub(back).map(|at| &a.axes[at]);
            let y = b.axes.len().checked_sub(back).map(|at| &b.axes[at]);
            let axis = match (x, y) {
                (Some(x), None) => x.clone(),
                (None, Some(y)) => y.clone(),
                (Some(Axis::Dim(p)), Some(Axis::Dim(q))) => {
                    if self.facts.equal(p, q) || q.as_constant() == Some(1) {
                        Axis::Dim(p.clone())
                    } else if p.as_constant() == Some(1) {
                        Axis::Dim(q.clone())
                    } else {
                        return self.shape_mismatch(a, b, span, op, left, right);
                    }
                }
                (Some(Axis::Shape(s)), Some(Axis::Shape(t))) if s == t => Axis::Shape(s.clone()),
                _ => return self.shape_mismatch(a, b, span, op, left, right),
            };
            axes.push(axis);
        }
        axes.reverse();
        Some(axes)
    }

    fn shape_mismatch(
        &mut self,
        a: &TensorTy,
        b: &TensorTy,
        span: Span,
        op: &str,
        left: Span,
        right: Span,
    ) -> Option<Vec<Axis>> {
        let shape = |t: &TensorTy| {
            let axes: Vec<String> = t.axes.iter().map(Axis::to_string).collect();
            format!("[{}]", axes.join(", "))
        };
        self.error(
            Diagnostic::error(
                Code::ShapeMismatch,
                span,
                format!("`{op}` of shapes {} and {} that do not broadcast", shape(a), shape(b)),
            )
            .with_label("axes must be equal or 1, aligned at the right")
            .with_secondary(left, shape(a))
            .with_secondary(right, shape(b)),
        );
        None
    }

    /// `let y[i, j] = body`: the body is a scalar at each point; each
    /// index ranges over what it indexes.
    fn check_index_definition(&mut self, vars: &[ast::IndexVar], body: &Expr) -> Ty {
        let frame = vars
            .iter()
            .map(|var| IndexVar {
                name: var.name.name.clone(),
                variadic: var.variadic,
                span: var.name.span,
                range: None,
                poisoned: false,
            })
            .collect();
        self.index_frames.push(frame);
        let body_ty = self.check_expr(body);
        let frame = self.index_frames.pop().expect("pushed above");
        if body_ty.is_error() || frame.iter().any(|var| var.poisoned) {
            return Ty::Error;
        }
        let elem = match body_ty {
            Ty::Tensor(t) if t.axes.is_empty() => Some(t.elem),
            other => {
                self.error(
                    Diagnostic::error(
                        Code::IndexBodyNotScalar,
                        body.span,
                        format!("an index definition's body is one element, but this is `{other}`"),
                    )
                    .with_label("index every axis, or reduce it with `sum[...]`"),
                );
                None
            }
        };
        let mut axes = Vec::new();
        let mut complete = true;
        for var in frame {
            if let Some(IndexRange::Dim(dim, _)) = &var.range {
                self.index.types.push((var.span, Ty::DimValue(dim.clone())));
            }
            match var.range {
                Some(IndexRange::Dim(dim, _)) => axes.push(Axis::Dim(dim)),
                Some(IndexRange::Shape(shape, _)) => axes.extend(shape),
                None => {
                    complete = false;
                    self.unbound_index(&var);
                }
            }
        }
        match (elem, complete) {
            (Some(elem), true) => Ty::Tensor(TensorTy { axes, elem }),
            _ => Ty::Error,
        }
    }

    fn unbound_index(&mut self, var: &IndexVar) {
        self.error(
            Diagnostic::error(
                Code::UnboundIndex,
                var.span,
                format!("index `{}` has no range: it indexes no axis directly", var.name),
            )
            .with_label("use it as a position of some tensor, e.g. `x[.., ".to_string() + &var.name + ", ..]`"),
        );
    }

    fn check_reduce(
        &mut self,
        op: ast::Reduction,
        acc: Option<&ast::Ident>,
        index: &ast::IndexVar,
        body: &Expr,
        span: Span,
    ) -> Ty {
        let acc_elem = acc.and_then(|acc| {
            let scope = GenericScope { layers: vec![&self.generics] };
            let mut diagnostics = Vec::new();
            let elem = super::program::resolve_elem(acc, &scope, &mut diagnostics);
            self.diagnostics.extend(diagnostics);
            elem
        });
        self.index_frames.push(vec![IndexVar {
            name: index.name.name.clone(),
            variadic: index.variadic,
            span: index.name.span,
            range: None,
            poisoned: false,
        }]);
        let body_ty = self.check_expr(body);
        let var = self.index_frames.pop().expect("pushed above").pop().expect("one variable");
        if body_ty.is_error() || var.poisoned {
            return Ty::Error;
        }
        if var.range.is_none() {
            self.unbound_index(&var);
        }
        let elem = match body_ty {
            Ty::Tensor(t) if t.axes.is_empty() => t.elem,
            Ty::Error => return Ty::Error,
            other => {
                return self.error(
                    Diagnostic::error(
                        Code::IndexBodyNotScalar,
                        body.span,
                        format!("`{}` reduces one element at a time, but this is `{other}`", op.name()),
                    )
                    .with_label("index every axis"),
                )
            }
        };
        if !elem.is_numeric() {
            return self.error(
                Diagnostic::error(
                    Code::TypeMismatch,
                    body.span,
                    format!("`{}` needs numbers, found {elem}", op.name()),
                )
                .with_label("cast it to a number"),
            );
        }
        match acc_elem {
            Some(acc) if !elem.fits(&acc) => self.error(
                Diagnostic::error(
                    Code::DtypeMismatch,
                    span,
                    format!("`{}<{acc}>` reduces {acc}, but the body is {elem}", op.name()),
                )
                .with_label(format!("cast the body to {acc}")),
            ),
            Some(acc) => Ty::Tensor(TensorTy::scalar(acc)),
            None => Ty::Tensor(TensorTy::scalar(elem)),
        }
    }

    fn index_var_mut(&mut self, name: &str) -> Option<&mut IndexVar> {
        self.index_frames.iter_mut().rev().flat_map(|frame| frame.iter_mut()).find(|var| var.name == name)
    }

    /// Records that index `name` runs over `dim` (or checks it agrees).
    fn bind_index(&mut self, name: &ast::Ident, range: IndexRange) {
        let facts = self.facts.clone();
        let Some(var) = self.index_var_mut(&name.name) else { return };
        let previous = var.range.clone();
        match (&previous, &range) {
            (None, _) => var.range = Some(range),
            (Some(IndexRange::Dim(old, old_span)), IndexRange::Dim(new, _)) if !facts.equal(old, new) => {
                var.poisoned = true;
                let old_span = *old_span;
                let message = format!("index `{}` ranges over {old} here and over {new} there", name.name);
                self.error(
                    Diagnostic::error(Code::IndexRangeMismatch, name.span, message)
                        .with_label(format!("this axis has {new}"))
                        .with_secondary(old_span, format!("this axis has {old}")),
                );
            }
            (Some(IndexRange::Shape(old, old_span)), IndexRange::Shape(new, _)) => {
                let same = old.len() == new.len()
                    && old.iter().zip(new).all(|(a, b)| match (a, b) {
                        (Axis::Dim(a), Axis::Dim(b)) => facts.equal(a, b),
                        (a, b) => a == b,
                    });
                if !same {
                    var.poisoned = true;
                    let old_span = *old_span;
                    self.error(
                        Diagnostic::error(
                            Code::IndexRangeMismatch,
                            name.span,
                            format!("`*{}` stands for different axes here and there", name.name),
                        )
                        .with_label("these axes")
                        .with_secondary(old_span, "differ from these"),
                    );
                }
            }
            _ => {}
        }
    }

    fn is_index_var(&self, name: &str, variadic: bool) -> bool {
        self.index_frames.iter().flatten().any(|var| var.name == name && var.variadic == variadic)
    }

    fn check_index(&mut self, base: &Expr, items: &[IndexItem], span: Span) -> Ty {
        let base_ty = self.check_expr(base);
        let tensor = match base_ty {
            Ty::Tensor(tensor) => tensor,
            Ty::Error => return Ty::Error,
            other => {
                return self.error(
                    Diagnostic::error(
                        Code::TypeMismatch,
                        base.span,
                        format!("only tensors are indexed; this is {}", other.describe()),
                    )
                    .with_label("not a tensor"),
                )
            }
        };
        // Align the items with the axes, a variadic item with a variadic shape.
        let shape_axis = tensor.axes.iter().position(|axis| matches!(axis, Axis::Shape(_)));
        let variadic_item = items.iter().position(|item| matches!(item, IndexItem::Variadic(_)));
        let fixed_axes = tensor.axes.len() - usize::from(shape_axis.is_some());
        let fixed_items = items.len() - usize::from(variadic_item.is_some());
        let aligned = match (shape_axis, variadic_item) {
            (None, None) => fixed_axes == fixed_items,
            (Some(p), Some(q)) => p == q && fixed_axes == fixed_items,
            (None, Some(_)) => fixed_items <= fixed_axes,
            (Some(_), None) => false,
        };
        if !aligned {
            let what = if shape_axis.is_some() && variadic_item.is_none() {
                "its variadic axes are indexed with `*name`".to_string()
            } else {
                format!("{} position(s) given", items.len())
            };
            return self.error(
                Diagnostic::error(
                    Code::RankMismatch,
                    span,
                    format!("`{tensor}` has {} axes; {what}", tensor.axes.len()),
                )
                .with_label("index every axis once")
                .with_secondary(base.span, format!("this is `{tensor}`")),
            );
        }
        let mut kept = Vec::new();
        let mut axis_at = 0;
        for item in items {
            if let IndexItem::Variadic(name) = item {
                let count = match shape_axis {
                    Some(_) => 1,
                    None => fixed_axes - fixed_items,
                };
                let axes = tensor.axes[axis_at..axis_at + count].to_vec();
                axis_at += count;
                if self.is_index_var(&name.name, true) {
                    self.bind_index(name, IndexRange::Shape(axes, name.span));
                } else {
                    self.error(
                        Diagnostic::error(
                            Code::UnknownName,
                            name.span,
                            format!("no variadic index `*{}` in scope", name.name),
                        )
                        .with_label("declare it on the left: `let y[*s, ..] = ...`"),
                    );
                }
                continue;
            }
            let Axis::Dim(dim) = tensor.axes[axis_at].clone() else { unreachable!("aligned above") };
            axis_at += 1;
            match item {
                IndexItem::Full(_) => kept.push(Axis::Dim(dim)),
                IndexItem::Range(lo, hi, range_span) => {
                    let lo_dim = lo.as_ref().map_or(Some(Dim::default()), |lo| self.slice_bound(lo));
                    let hi_dim = hi.as_ref().map_or(Some(dim.clone()), |hi| self.slice_bound(hi));
                    let (Some(lo_dim), Some(hi_dim)) = (lo_dim, hi_dim) else { return Ty::Error };
                    if !self.facts.proves(&lo_dim, CmpOp::Le, &hi_dim) || !self.facts.proves(&hi_dim, CmpOp::Le, &dim) {
                        self.error(
                            Diagnostic::error(
                                Code::SliceOutOfBounds,
                                *range_span,
                                format!("cannot show that the slice {lo_dim}:{hi_dim} lies within an axis of {dim}"),
                            )
                            .with_label(format!("needs 0 <= {lo_dim} <= {hi_dim} <= {dim}")),
                        );
                    }
                    kept.push(Axis::Dim(self.facts.normalize(&hi_dim.sub(&lo_dim))));
                }
                IndexItem::At(position) => self.check_position(position, &dim),
                IndexItem::Variadic(_) => unreachable!("handled above"),
            }
        }
        Ty::Tensor(TensorTy { axes: kept, elem: tensor.elem })
    }

    fn slice_bound(&mut self, expr: &Expr) -> Option<Dim> {
        match self.static_dim(expr) {
            Some(dim) => Some(dim),
            None => {
                let ty = self.check_expr(expr);
                if !ty.is_error() {
                    self.error(
                        Diagnostic::error(Code::DynamicSlice, expr.span, "slice bounds are dims known before running")
                            .with_label("use a gather in an index definition for a position known only at run time"),
                    );
                }
                None
            }
        }
    }

    /// One position of `x[...]`: an index variable (pointwise), a dim, or a
    /// computed i64 index (a gather).
    fn check_position(&mut self, position: &Expr, dim: &Dim) {
        if let ExprKind::Name(name) = &position.kind {
            if self.is_index_var(&name.name, false) {
                self.bind_index(name, IndexRange::Dim(dim.clone(), position.span));
                return;
            }
        }
        if let Some(at) = self.static_dim(position) {
            if !self.facts.proves(&at, CmpOp::Lt, dim) || !self.facts.proves(&at, CmpOp::Ge, &Dim::default()) {
                self.error(
                    Diagnostic::error(
                        Code::IndexOutOfBounds,
                        position.span,
                        format!("cannot show that position {at} lies within an axis of {dim}"),
                    )
                    .with_label(format!("needs 0 <= {at} < {dim}")),
                );
            }
            return;
        }
        match self.check_expr(position) {
            Ty::Error => {}
            Ty::Tensor(t) if t.axes.is_empty() && t.elem == Elem::Known(Dtype::I64) => {}
            Ty::DimValue(_) => {}
            Ty::Tensor(t) if t.axes.is_empty() && t.elem.is_int() => {
                self.error(
                    Diagnostic::error(
                        Code::IndexDtype,
                        position.span,
                        format!("a computed index is i64, found {}", t.elem),
                    )
                    .with_label("cast it: `cast<i64>(...)`"),
                );
            }
            other => {
                self.error(
                    Diagnostic::error(
                        Code::IndexDtype,
                        position.span,
                        format!("a position is an index, a dim or an i64 scalar, found `{other}`"),
                    )
                    .with_label("not a position"),
                );
            }
        }
    }

    fn check_method(
        &mut self,
        receiver: &Expr,
        method: &ast::Ident,
        generics: &[ast::GenericArg],
        args: &[ast::Arg],
    ) -> Ty {
        let receiver_ty = self.check_expr(receiver);
        let sub = match receiver_ty {
            Ty::Sub(sub) => sub,
            Ty::Error => {
                self.check_args_quietly(args);
                return Ty::Error;
            }
            Ty::SubArray(..) => {
                return self.error(
                    Diagnostic::error(Code::NotABlock, receiver.span, "an array of subs has no methods")
                        .with_label("run over it with `static for layer in ... { layer.method(...) }`"),
                )
            }
            other => {
                return self.error(
                    Diagnostic::error(
                        Code::NotABlock,
                        receiver.span,
                        format!("methods are called on subs; this is {}", other.describe()),
                    )
                    .with_label("not a sub"),
                )
            }
        };
        let block = &self.program.blocks[sub.block];
        let Some(&fn_id) = block.fns.get(&method.name) else {
            let (what, label) = match &sub.generic {
                Some(generic) => (
                    format!("`{generic}` is bounded by trait `{}`, which", block.name),
                    "a block generic offers only what its bound promises",
                ),
                None => (format!("block `{}`", block.name), "not found"),
            };
            let unknown = Diagnostic::error(
                Code::UnknownMethod,
                method.span,
                format!("{what} has no function `{}`", method.name),
            )
            .with_label(label)
            .with_secondary(block.decl.name.span, "defined here");
            return self.error(suggest::did_you_mean(
                unknown,
                &method.name,
                block.fns.keys().map(String::as_str),
                false,
            ));
        };
        let function = &self.program.fns[fn_id];
        let declared = function.decl.name.span;
        self.define(method.span, declared);
        let function = &self.program.fns[fn_id];
        let in_trait = block.decl.kind == ast::BlockKind::Trait;
        if !function.decl.is_pub && !in_trait {
            return self.error(
                Diagnostic::error(
                    Code::PrivateItem,
                    method.span,
                    format!("`{}.{}` is private", block.name, method.name),
                )
                .with_label("declare it `pub fn` to call it from outside its block")
                .with_secondary(function.decl.name.span, "defined here"),
            );
        }
        let declared = match &receiver.kind {
            ExprKind::Name(name) => self.sub_declaration(&name.name),
            _ => None,
        };
        self.check_user_call(fn_id, sub.args.clone(), generics, args, method.span, declared)
    }

    /// Where a sub of the current block is declared, for messages.
    fn sub_declaration(&self, name: &str) -> Option<Span> {
        let block = &self.program.blocks[self.block?];
        block.subs.iter().find(|sub| sub.name == name).map(|sub| sub.span)
    }

    fn check_args_quietly(&mut self, args: &[ast::Arg]) {
        for arg in args {
            self.check_expr(&arg.value);
        }
    }

    fn check_call(&mut self, callee: &ast::Ident, generics: &[ast::GenericArg], args: &[ast::Arg], span: Span) -> Ty {
        if let Some(ty) = self.check_builtin(callee, generics, args, span) {
            return ty;
        }
        let own = self.block.and_then(|block| self.program.blocks[block].fns.get(&callee.name).copied());
        let fn_id = match own.or_else(|| match self.program.scopes[self.module].get(&callee.name) {
            Some(ItemRef::Fn(id)) => Some(*id),
            _ => None,
        }) {
            Some(id) => id,
            None if self.program.scopes[self.module].get(&callee.name) == Some(&ItemRef::Unresolved) => {
                self.check_args_quietly(args);
                return Ty::Error;
            }
            None => {
                self.check_args_quietly(args);
                let mut names = self.visible_names();
                names.extend(crate::builtin::names().map(str::to_string));
                let unknown = Diagnostic::error(
                    Code::UnknownFunction,
                    callee.span,
                    format!("no function `{}` in scope", callee.name),
                )
                .with_label("not defined, imported or built in");
                return self.error(suggest::did_you_mean(
                    unknown,
                    &callee.name,
                    names.iter().map(String::as_str),
                    false,
                ));
            }
        };
        let declared = self.program.fns[fn_id].decl.name.span;
        self.define(callee.span, declared);
        if self.program.fns[fn_id].is_entry() {
            return self.error(
                Diagnostic::error(
                    Code::EntryCall,
                    callee.span,
                    format!("`{}` is an entry; entries are called by the runtime, not by code", callee.name),
                )
                .with_label("move the shared work into a `fn`"),
            );
        }
        self.check_user_call(fn_id, Subst::default(), generics, args, callee.span, None)
    }

    /// A call of a Linnet function: generic arguments given or inferred
    /// from the arguments, each argument checked, `where` clauses proved.
    /// `span` is the callee's name, where call-level problems are shown.
    fn check_user_call(
        &mut self,
        fn_id: usize,
        mut subst: Subst,
        explicit: &[ast::GenericArg],
        args: &[ast::Arg],
        span: Span,
        sub_declared: Option<Span>,
    ) -> Ty {
        let scope = GenericScope { layers: vec![&self.generics] };
        let mut uses = Vec::new();
        explicit.iter().for_each(|arg| super::program::garg_uses(arg, &scope, &mut uses));
        self.index.definitions.extend(uses);
        let function = &self.program.fns[fn_id];
        let name = function.name.clone();
        let arg_tys: Vec<(Ty, Span)> = args.iter().map(|arg| (self.check_expr(&arg.value), arg.value.span)).collect();
        for arg in args {
            if let Some(label) = &arg.name {
                return self.error(
                    Diagnostic::error(Code::NamedArgument, label.span, format!("`{name}` takes positional arguments"))
                        .with_label("only built-ins take named arguments"),
                );
            }
        }
        let params = &function.params;
        if args.len() < params.len() {
            let missing: Vec<String> = params[args.len()..].iter().map(|(n, ty, _)| format!("`{n}: {ty}`")).collect();
            return self.error(
                Diagnostic::error(
                    Code::MissingArgument,
                    span,
                    format!(
                        "`{name}` takes {} argument(s), {} given: missing {}",
                        params.len(),
                        args.len(),
                        missing.join(", ")
                    ),
                )
                .with_label("too few arguments")
                .with_secondary(function.decl.name.span, format!("`{name}` defined here")),
            );
        }
        if args.len() > params.len() {
            return self.error(
                Diagnostic::error(
                    Code::ExtraArgument,
                    args[params.len()].value.span,
                    format!("`{name}` takes {} argument(s), {} given", params.len(), args.len()),
                )
                .with_label("unexpected argument")
                .with_secondary(function.decl.name.span, format!("`{name}` defined here")),
            );
        }
        let scope = GenericScope { layers: vec![&self.generics] };
        let mut diagnostics = Vec::new();
        let bound = self.program.bind_generic_args(
            self.module,
            &function.generics,
            explicit,
            &scope,
            span,
            &name,
            false,
            &mut diagnostics,
        );
        let Some(bound) = bound else {
            self.diagnostics.extend(diagnostics);
            return Ty::Error;
        };
        subst.dims.extend(bound.dims);
        subst.shapes.extend(bound.shapes);
        subst.elems.extend(bound.elems);
        let own_generics: Vec<_> = function.generics.iter().map(|g| g.name.clone()).collect();
        for ((_, param_ty, _), (arg_ty, _)) in params.iter().zip(&arg_tys) {
            infer(param_ty, arg_ty, &own_generics, &mut subst);
        }
        let unbound: Vec<&str> =
            function.generics.iter().filter(|g| !subst.is_bound(&g.name)).map(|g| &*g.name).collect();
        if !unbound.is_empty() {
            if arg_tys.iter().any(|(ty, _)| ty.is_error()) {
                return Ty::Error;
            }
            return self.error(
                Diagnostic::error(
                    Code::CannotInfer,
                    span,
                    format!("cannot infer {} of `{name}` from its arguments", unbound.join(", ")),
                )
                .with_label(format!("give them explicitly: `{name}<...>(...)`")),
            );
        }
        let mut arguments_fit = true;
        for generic in function.generics.iter().filter(|g| g.kind == GenericKind::Float) {
            let bound = subst.elems.get(&generic.name).cloned();
            if let Some(elem) = bound.filter(|elem| !elem.is_float()) {
                arguments_fit = false;
                self.error(
                    Diagnostic::error(
                        Code::DtypeMismatch,
                        span,
                        format!("`{}` of `{name}` is a Float, but the arguments make it {elem}", generic.name),
                    )
                    .with_label("cast the argument to a float type")
                    .with_secondary(generic.span, "declared here"),
                );
            }
        }
        for ((param_name, param_ty, param_span), (arg_ty, arg_span)) in params.iter().zip(&arg_tys) {
            let expected = subst.ty(param_ty);
            if let Err(mismatch) = compare(&expected, arg_ty, &self.facts) {
                arguments_fit = false;
                let declared = if expected.to_string() != param_ty.to_string() {
                    format!(" as `{param_ty}`")
                } else {
                    String::new()
                };
                let mut diagnostic = Diagnostic::error(
                    mismatch.code(),
                    *arg_span,
                    format!("argument `{param_name}` of `{name}` must be `{expected}`, found `{arg_ty}`"),
                )
                .with_label(format!("this is `{arg_ty}`"))
                .with_secondary(*param_span, format!("parameter declared here{declared}"));
                if let Some(declared) = sub_declared {
                    diagnostic = diagnostic.with_secondary(declared, "the sub's generic arguments are declared here");
                }
                self.error(diagnostic);
            }
        }
        for clause in &function.clauses {
            let (lhs, rhs) = (subst.dim(&clause.lhs), subst.dim(&clause.rhs));
            if arguments_fit && !self.facts.proves(&lhs, clause.op, &rhs) {
                self.error(
                    Diagnostic::error(
                        Code::UnsatisfiedWhere,
                        span,
                        format!(
                            "`{name}` requires `{}`, here {lhs} {} {rhs}, which does not follow from the `where` clauses in force",
                            clause.text,
                            clause.op.symbol()
                        ),
                    )
                    .with_label("this call")
                    .with_secondary(clause.span, "required by this clause"),
                );
            }
        }
        // A broken `where` clause leaves the result's type well defined.
        if arguments_fit {
            subst.ty(&function.ret)
        } else {
            Ty::Error
        }
    }

    /// Resolves a generic argument that names an element type.
    pub(super) fn elem_arg(&mut self, arg: &ast::GenericArg) -> Option<Elem> {
        match arg {
            ast::GenericArg::Dim(ast::DimExpr::Name(ident)) => {
                let scope = GenericScope { layers: vec![&self.generics] };
                let mut diagnostics = Vec::new();
                let elem = super::program::resolve_elem(ident, &scope, &mut diagnostics);
                self.diagnostics.extend(diagnostics);
                elem
            }
            other => {
                self.error(
                    Diagnostic::error(Code::KindMismatch, other.span(), "expected an element type")
                        .with_label("not a dtype"),
                );
                None
            }
        }
    }
}

/// Two types that must agree, a literal element adapting to the other's
/// (`if c { 0.5 } else { x[i] }` is `f32` when `x` is).
fn adapt_literals(a: Ty, b: Ty) -> (Ty, Ty) {
    match (a, b) {
        (Ty::Tensor(mut a), Ty::Tensor(mut b)) if a.elem.is_literal() || b.elem.is_literal() => {
            if let Some(elem) = a.elem.unify(&b.elem) {
                a.elem = elem.clone();
                b.elem = elem;
            }
            (Ty::Tensor(a), Ty::Tensor(b))
        }
        other => other,
    }
}
