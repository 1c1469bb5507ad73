//! Block instances and their bounds. Wherever a block is instantiated (a
//! `sub`, a block argument such as `LayerGroup<..., SparseMoe<...>>`, a
//! `type`'s target) its `where` clauses must follow from those in force,
//! and each block argument must meet the bound of the generic it is given
//! for. A trait's functions are signatures; a block meets the trait when,
//! for each, it has a public function of the same name that accepts every
//! call the signature allows and returns what the signature promises:
//! checked as a call whose arguments have the signature's parameter types,
//! the signature's own generics held abstract. A trait's function with a
//! body is a default: a block that lacks it takes the trait's.

use super::facts::Facts;
use super::program::Program;
use super::ty::{compare, infer, Axis, Elem, Number, SubTy, Subst, Ty};
use crate::code::Code;
use crate::diagnostic::Diagnostic;
use crate::source::Span;
use crate::syntax::ast::{self, GenericKind};
use linnet_ir::dim::{Dim, Symbol};
use std::sync::Arc;

/// Where an instance is written: the facts in force, the place to report,
/// and who writes it (for messages).
pub struct Site<'s> {
    pub facts: &'s Facts,
    pub span: Span,
    /// `block `LayerGroup``, `type `Model``.
    pub owner: &'s str,
}

/// Checks the instance `sub` written with the arguments `args` (as
/// written, to point at the one at fault), and the block arguments inside
/// it, recursively.
pub fn check_instance(
    program: &Program,
    sub: &SubTy,
    args: &[ast::GenericArg],
    site: &Site,
    diagnostics: &mut Vec<Diagnostic>,
) {
    let target = &program.blocks[sub.block];
    for clause in &target.clauses {
        let (lhs, rhs) = (sub.args.dim(&clause.lhs), sub.args.dim(&clause.rhs));
        if !site.facts.proves(&lhs, clause.op, &rhs) {
            diagnostics.push(
                Diagnostic::error(
                    Code::UnsatisfiedWhere,
                    site.span,
                    format!(
                        "`{}` requires `{}`, here {lhs} {} {rhs}, which does not follow from the `where` clauses of {}",
                        target.name,
                        clause.text,
                        clause.op.symbol(),
                        site.owner
                    ),
                )
                .with_label(format!("`{}` instantiated here", target.name))
                .with_secondary(clause.span, "required by this clause"),
            );
        }
    }
    if sub.generic.is_some() {
        return;
    }
    for (at, generic) in target.generics.iter().enumerate().filter(|(_, g)| g.kind == GenericKind::Block) {
        let (Some(argument), Some(bound)) = (sub.args.blocks.get(&generic.name), &generic.bound) else { continue };
        let required = sub.args.sub(bound);
        let written = args.get(at);
        let span = written.map_or(site.span, ast::GenericArg::span);
        let inner_args = match written {
            Some(ast::GenericArg::Type(ast::TypeExpr::Named { args, .. })) => args.as_slice(),
            _ => &[],
        };
        let trait_name = &program.blocks[required.block].name;
        let problems = match &argument.generic {
            Some(_) if same_bound(argument, &required, site.facts) => Vec::new(),
            Some(name) => {
                vec![format!(
                    "`{name}` is bounded by `{}`, not `{}`",
                    describe(program, argument),
                    describe(program, &required)
                )]
            }
            None => {
                check_instance(program, argument, inner_args, &Site { span, ..*site }, diagnostics);
                unmet(program, argument, &required, site.facts)
            }
        };
        if problems.is_empty() {
            continue;
        }
        let shown = match &argument.generic {
            Some(name) => name.to_string(),
            None => program.blocks[argument.block].name.clone(),
        };
        let mut diagnostic = Diagnostic::error(
            Code::UnmetBound,
            span,
            format!(
                "`{shown}` does not meet the bound `{}: {}` of `{}`: {}",
                generic.name,
                describe(program, &required),
                target.name,
                problems.join("; ")
            ),
        )
        .with_label(format!("does not provide what `{trait_name}` requires"))
        .with_secondary(generic.span, "bound declared here");
        if argument.generic.is_none() {
            diagnostic = diagnostic.with_secondary(program.blocks[argument.block].decl.name.span, "block defined here");
        }
        diagnostics.push(diagnostic);
    }
}

/// `FeedForward<H, T>`, with the arguments as the site sees them.
fn describe(program: &Program, bound: &SubTy) -> String {
    let block = &program.blocks[bound.block];
    let args: Vec<String> = block
        .generics
        .iter()
        .filter_map(|g| match g.kind {
            GenericKind::Dim => bound.args.dims.get(&g.name).map(Dim::to_string),
            GenericKind::Float => bound.args.elems.get(&g.name).map(Elem::to_string),
            GenericKind::Number => bound.args.numbers.get(&g.name).map(Number::to_string),
            GenericKind::Shape | GenericKind::Block => None,
        })
        .collect();
    if args.is_empty() {
        block.name.clone()
    } else {
        format!("{}<{}>", block.name, args.join(", "))
    }
}

/// Two bounds name the same trait with equal arguments.
fn same_bound(a: &SubTy, b: &SubTy, facts: &Facts) -> bool {
    a.block == b.block
        && a.args.dims.len() == b.args.dims.len()
        && a.args.dims.iter().all(|(name, dim)| b.args.dims.get(name).is_some_and(|other| facts.equal(dim, other)))
        && a.args.elems == b.args.elems
}

/// What `block` lacks to meet `bound`, one line each.
fn unmet(program: &Program, block: &SubTy, bound: &SubTy, facts: &Facts) -> Vec<String> {
    let implementor = &program.blocks[block.block];
    let mut required: Vec<(&String, &usize)> = program.blocks[bound.block].fns.iter().collect();
    required.sort_by_key(|(_, id)| **id);
    let mut problems = Vec::new();
    for (name, &signature_id) in required {
        let Some(&fn_id) = implementor.fns.get(name) else {
            if program.fns[signature_id].decl.body.is_none() {
                problems.push(format!("it has no function `{name}`"));
            }
            continue;
        };
        let function = &program.fns[fn_id];
        if !function.decl.is_pub || function.is_entry() {
            problems.push(format!("its `{name}` is not a `pub fn`"));
            continue;
        }
        if let Err(problem) = accepts(program, block, fn_id, bound, signature_id, facts) {
            problems.push(format!("its `{name}` {problem}"));
        }
    }
    problems
}

/// How a function falls short of a trait's signature, in words that
/// follow its name (`takes …`, `returns …`).
struct Unmet(String);

impl std::fmt::Display for Unmet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Whether function `fn_id` of `block` serves every call that signature
/// `signature_id` of `bound` allows.
fn accepts(
    program: &Program,
    block: &SubTy,
    fn_id: usize,
    bound: &SubTy,
    signature_id: usize,
    facts: &Facts,
) -> Result<(), Unmet> {
    let (function, signature) = (&program.fns[fn_id], &program.fns[signature_id]);
    // The signature's own generics stay abstract, under names of their own.
    let mut promised = bound.args.clone();
    for generic in &signature.generics {
        let fresh: Symbol = Arc::from(format!("{}'", generic.name));
        match generic.kind {
            GenericKind::Dim => {
                promised.dims.insert(generic.name.clone(), Dim::generic(&fresh));
            }
            GenericKind::Shape => {
                promised.shapes.insert(generic.name.clone(), vec![Axis::Shape(fresh)]);
            }
            GenericKind::Float => {
                promised.elems.insert(generic.name.clone(), Elem::Generic(fresh));
            }
            GenericKind::Number => {
                promised.numbers.insert(generic.name.clone(), Number::Generic(fresh));
            }
            GenericKind::Block => {}
        }
    }
    let mut facts = facts.clone();
    for clause in &signature.clauses {
        facts.assume(&promised.dim(&clause.lhs), clause.op, &promised.dim(&clause.rhs));
    }
    if function.params.len() != signature.params.len() {
        return Err(Unmet(format!(
            "takes {} argument(s) where the trait's takes {}",
            function.params.len(),
            signature.params.len()
        )));
    }
    let arguments: Vec<Ty> = signature.params.iter().map(|(_, ty, _)| promised.ty(ty)).collect();
    let mut own: Subst = block.args.clone();
    let generics: Vec<Symbol> = function.generics.iter().map(|g| g.name.clone()).collect();
    for ((_, param, _), argument) in function.params.iter().zip(&arguments) {
        infer(param, argument, &generics, &mut own);
    }
    if let Some(unbound) = function.generics.iter().find(|g| !own.is_bound(&g.name)) {
        return Err(Unmet(format!("has a generic `{}` that the trait's arguments do not determine", unbound.name)));
    }
    for ((name, param, _), argument) in function.params.iter().zip(&arguments) {
        let expected = own.ty(param);
        if compare(&expected, argument, &facts).is_err() {
            return Err(Unmet(format!("takes `{name}: {expected}` where the trait passes `{argument}`")));
        }
    }
    for clause in &function.clauses {
        let (lhs, rhs) = (own.dim(&clause.lhs), own.dim(&clause.rhs));
        if !facts.proves(&lhs, clause.op, &rhs) {
            return Err(Unmet(format!("requires `{}`, which the trait's signature does not promise", clause.text)));
        }
    }
    let (returned, promised_ret) = (own.ty(&function.ret), promised.ty(&signature.ret));
    if compare(&promised_ret, &returned, &facts).is_err() {
        return Err(Unmet(format!("returns `{returned}` where the trait promises `{promised_ret}`")));
    }
    Ok(())
}
