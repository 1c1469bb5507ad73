//! Semantic analysis: from a loaded [`Package`] to diagnostics. The
//! [`program`] collects items and resolves signatures; [`body`] and
//! [`builtins`] check function bodies under the `where` facts ([`facts`])
//! over canonical dims ([`dim`]); [`instantiate`] evaluates the clauses with
//! the model card's generics and checks the bindings.

mod block_bounds;
pub mod body;
mod builtins;
pub mod facts;
pub mod footprint;
mod imports;
pub mod instantiate;
pub mod program;
mod suggest;
pub mod ty;

use crate::code::Code;
use crate::diagnostic::Diagnostic;
use crate::package::Package;
use crate::source::Span;
use crate::syntax::ast::{self, FnKind, GenericKind};
use body::BodyChecker;
use facts::Facts;
use linnet_ir::dim::Dim;
use program::{Clause, Program};
use ty::{compare, Ty};

/// The dim an expression stands for, if it is made only of integer
/// literals and names that `name` resolves to dims.
pub fn static_dim(expr: &ast::Expr, name: &dyn Fn(&ast::Ident) -> Option<Dim>) -> Option<Dim> {
    match &expr.kind {
        ast::ExprKind::Int(value) => i64::try_from(*value).ok().map(Dim::constant),
        ast::ExprKind::Name(ident) => name(ident),
        ast::ExprKind::Binary(op, left, right) => {
            let (left, right) = (static_dim(left, name)?, static_dim(right, name)?);
            Some(match op {
                ast::BinOp::Add => left.add(&right),
                ast::BinOp::Sub => left.sub(&right),
                ast::BinOp::Mul => left.mul(&right),
                // A zero divisor is no dim: the expression is integer
                // arithmetic, where it gives 0 as at run time.
                ast::BinOp::Div | ast::BinOp::Rem if right.as_constant() == Some(0) => return None,
                ast::BinOp::Div => left.div(&right),
                ast::BinOp::Rem => left.rem(&right),
                _ => return None,
            })
        }
        _ => None,
    }
}

fn assume_all(facts: &mut Facts, clauses: &[Clause]) {
    for clause in clauses {
        facts.assume(&clause.lhs, clause.op, &clause.rhs);
    }
}

/// What the checker learned about the source, for editors: the type of
/// every expression and binding, and where each name is declared.
#[derive(Default)]
pub struct SourceIndex {
    /// An expression, a binding or an index variable, and its type (an
    /// index variable's is `Ty::DimValue` of its range).
    pub types: Vec<(Span, Ty)>,
    /// A use of a name, and the name in its declaration.
    pub definitions: Vec<(Span, Span)>,
}

/// Checks every module of the package, then its instantiation.
pub fn check(package: &Package, diagnostics: &mut Vec<Diagnostic>) -> SourceIndex {
    let program = Program::build(package, diagnostics);
    let mut index = SourceIndex { types: Vec::new(), definitions: program.definitions.clone() };
    for block in &program.blocks {
        for (_, ty, span) in block.params.iter().chain(&block.states) {
            index.types.push((*span, ty.clone()));
        }
    }
    for block_id in 0..program.blocks.len() {
        check_block(&program, block_id, diagnostics);
    }
    for alias in &program.aliases {
        check_alias(&program, alias, diagnostics);
    }
    for fn_id in 0..program.fns.len() {
        check_fn(&program, fn_id, diagnostics, &mut index);
    }
    check_consts(&program, diagnostics, &mut index);
    imports::report_unused(package, &index, diagnostics);
    let source_is_sound = !diagnostics.iter().any(Diagnostic::is_error);
    instantiate::check(&program, source_is_sound, diagnostics);
    index
}

/// Each `sub`'s block must accept its arguments: its `where` clauses must
/// follow from this block's, and its block arguments meet their bounds.
fn check_block(program: &Program, block_id: usize, diagnostics: &mut Vec<Diagnostic>) {
    let block = &program.blocks[block_id];
    if block.decl.kind == ast::BlockKind::Trait {
        return;
    }
    let mut facts = Facts::default();
    assume_all(&mut facts, &block.clauses);
    let owner = format!("`{}`", block.name);
    for sub in &block.subs {
        let Some(target) = &sub.target else { continue };
        let args = block.decl.members.iter().find_map(|member| match member {
            ast::Member::Sub { name, args, .. } if name.span == sub.name_span => Some(args.as_slice()),
            _ => None,
        });
        let site = block_bounds::Site { facts: &facts, span: sub.span, owner: &owner };
        block_bounds::check_instance(program, target, args.unwrap_or_default(), &site, diagnostics);
    }
}

/// A `type`'s block must accept its arguments under the `type`'s clauses.
fn check_alias(program: &Program, alias: &program::AliasSig, diagnostics: &mut Vec<Diagnostic>) {
    let (Some(target), ast::TypeExpr::Named { args, span, .. }) = (&alias.target, &alias.decl.target) else { return };
    let mut facts = Facts::default();
    assume_all(&mut facts, &alias.clauses);
    let owner = format!("`{}`", alias.name);
    let site = block_bounds::Site { facts: &facts, span: *span, owner: &owner };
    block_bounds::check_instance(program, target, args, &site, diagnostics);
}

fn check_fn(program: &Program, fn_id: usize, diagnostics: &mut Vec<Diagnostic>, index: &mut SourceIndex) {
    let function = &program.fns[fn_id];
    let decl = function.decl;
    // A trait's function is a signature the blocks that meet the trait
    // define, or, with a body, a default for those that do not.
    let in_trait = program.is_trait_function(function);
    match (decl.kind, function.block, &decl.body) {
        _ if in_trait => {}
        (FnKind::Entry, None, _) => diagnostics.push(
            Diagnostic::error(Code::MisplacedEntry, decl.name.span, "an `entry` belongs to a block")
                .with_label("move it into the model's root block"),
        ),
        (FnKind::Intrinsic, Some(_), _) => diagnostics.push(
            Diagnostic::error(Code::MisplacedIntrinsic, decl.name.span, "an `intrinsic fn` is a free function")
                .with_label("declare it outside any block"),
        ),
        (FnKind::Intrinsic, None, Some(_)) => diagnostics.push(
            Diagnostic::error(
                Code::IntrinsicBody,
                decl.name.span,
                "an `intrinsic fn` has no body: the compiler provides it",
            )
            .with_label("remove the body"),
        ),
        (FnKind::Fn | FnKind::Entry, _, None) => diagnostics.push(
            Diagnostic::error(Code::MissingBody, decl.name.span, format!("`{}` has no body", decl.name.name))
                .with_label("only an `intrinsic fn` is declared without one"),
        ),
        _ => {}
    }
    if decl.kind == FnKind::Entry {
        for generic in decl.generics.iter().filter(|g| g.kind != GenericKind::Dim) {
            diagnostics.push(
                Diagnostic::error(
                    Code::EntryGeneric,
                    generic.span,
                    "an entry's generics are dims, bound from its inputs when it is called",
                )
                .with_label("not a Dim"),
            );
        }
    }
    let Some(body) = &decl.body else { return };
    let mut facts = Facts::default();
    let mut generics = Vec::new();
    if let Some(block) = function.block {
        assume_all(&mut facts, &program.blocks[block].clauses);
        generics.extend(program.blocks[block].generics.iter().cloned());
    }
    assume_all(&mut facts, &function.clauses);
    generics.extend(function.generics.iter().cloned());
    let mut checker = BodyChecker::new(program, function.module, function.block, generics, facts, diagnostics, index);
    for (name, ty, span) in &function.params {
        checker.bind_param(name, ty.clone(), *span);
    }
    checker.check_body(body, &function.ret, &decl.name);
}

fn check_consts(program: &Program, diagnostics: &mut Vec<Diagnostic>, index: &mut SourceIndex) {
    for (module_index, module) in program.package.modules.iter().enumerate() {
        for item in &module.ast.items {
            let ast::Item::Const(constant) = item else { continue };
            let Some(program::ItemRef::Const(id)) = program.scopes[module_index].get(&constant.name.name) else {
                continue;
            };
            let expected = program.consts[*id].ty.clone();
            let mut checker =
                BodyChecker::new(program, module_index, None, Vec::new(), Facts::default(), diagnostics, index);
            let found = checker.check_expr(&constant.value);
            let scalar = matches!(&expected, Ty::Tensor(t) if t.axes.is_empty());
            if !scalar && !expected.is_error() {
                diagnostics.push(
                    Diagnostic::error(Code::TypeError, constant.ty.span(), "a constant is a scalar")
                        .with_label("not a scalar type"),
                );
            } else if let Err(mismatch) = compare(&expected, &found, &Facts::default()) {
                diagnostics.push(
                    Diagnostic::error(
                        mismatch.code(),
                        constant.value.span,
                        format!("`{}` is `{expected}`, but its value is `{found}`", constant.name.name),
                    )
                    .with_label(format!("this is `{found}`")),
                );
            }
        }
    }
}
