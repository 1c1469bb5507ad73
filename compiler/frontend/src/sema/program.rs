//! The package's items and their signatures: every block, function and
//! constant gets an id, every module a scope (its items and its `use`
//! imports), and every signature is resolved once, with dims normalized
//! and generics known by kind. Bodies are checked later against this.

use super::suggest;
use super::ty::{Axis, Elem, Number, SubTy, Subst, TensorTy, Ty};
use crate::code::Code;
use crate::diagnostic::Diagnostic;
use crate::package::Package;
use crate::source::Span;
use crate::syntax::ast::{self, CmpOp, FnKind, GenericKind};
use linnet_ir::dim::{Dim, Symbol};
use linnet_ir::Dtype;
use std::collections::HashMap;
use std::sync::Arc;

/// What a generic is when not given.
#[derive(Clone, Debug, PartialEq)]
pub enum GenericDefault {
    /// A `Float`'s: `T: Float = bf16`.
    Elem(Elem),
    /// A number's: `Eps: f32 = 1e-6`.
    Number(f64),
}

#[derive(Clone, Debug)]
pub struct GenericSig {
    pub name: Symbol,
    pub kind: GenericKind,
    pub default: Option<GenericDefault>,
    /// A block generic's bound: its trait, with arguments over the
    /// generics declared before it.
    pub bound: Option<SubTy>,
    pub span: Span,
}

/// A `where` clause over resolved dims.
#[derive(Clone, Debug)]
pub struct Clause {
    pub lhs: Dim,
    pub op: CmpOp,
    pub rhs: Dim,
    pub span: Span,
    /// As written, for messages.
    pub text: String,
}

pub struct FnSig<'a> {
    pub name: String,
    pub module: usize,
    pub block: Option<usize>,
    pub decl: &'a ast::FnDecl,
    pub generics: Vec<GenericSig>,
    pub params: Vec<(String, Ty, Span)>,
    pub ret: Ty,
    pub clauses: Vec<Clause>,
}

pub struct SubSig {
    pub name: String,
    pub name_span: Span,
    pub ty: Ty,
    pub span: Span,
    /// The block and its generic arguments (absent where they did not
    /// resolve, already reported).
    pub target: Option<SubTy>,
}

pub struct BlockSig<'a> {
    pub name: String,
    pub module: usize,
    pub decl: &'a ast::BlockDecl,
    pub generics: Vec<GenericSig>,
    pub clauses: Vec<Clause>,
    pub subs: Vec<SubSig>,
    pub params: Vec<(String, Ty, Span)>,
    pub states: Vec<(String, Ty, Span)>,
    pub fns: HashMap<String, usize>,
}

/// `type Name<...> = Block<...> where ...`: the block instance it names,
/// over its own generics and clauses.
pub struct AliasSig<'a> {
    pub name: String,
    pub module: usize,
    pub decl: &'a ast::AliasDecl,
    pub generics: Vec<GenericSig>,
    pub clauses: Vec<Clause>,
    pub target: Option<SubTy>,
}

pub struct ConstSig {
    pub ty: Ty,
    pub span: Span,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ItemRef {
    Block(usize),
    Fn(usize),
    Const(usize),
    Alias(usize),
    /// An import that failed, already reported: its uses stay quiet.
    Unresolved,
}

pub struct Program<'a> {
    pub package: &'a Package,
    pub blocks: Vec<BlockSig<'a>>,
    pub fns: Vec<FnSig<'a>>,
    pub consts: Vec<ConstSig>,
    pub aliases: Vec<AliasSig<'a>>,
    /// Per module: the names it can use, with where each was defined.
    pub scopes: Vec<HashMap<String, ItemRef>>,
    /// Per module: its own items only.
    items: Vec<HashMap<String, (ItemRef, bool)>>,
    /// Uses resolved while building (imports, sub blocks) and the names
    /// they refer to.
    pub definitions: Vec<(Span, Span)>,
}

/// The generics in force while resolving a signature.
pub struct GenericScope<'s> {
    pub layers: Vec<&'s [GenericSig]>,
}

impl GenericScope<'_> {
    pub fn find(&self, name: &str) -> Option<&GenericSig> {
        self.layers.iter().rev().flat_map(|layer| layer.iter()).find(|g| &*g.name == name)
    }

    fn names(&self) -> impl Iterator<Item = &str> {
        self.layers.iter().flat_map(|layer| layer.iter()).map(|g| &*g.name)
    }
}

pub fn resolve_dim(expr: &ast::DimExpr, scope: &GenericScope, diagnostics: &mut Vec<Diagnostic>) -> Option<Dim> {
    match expr {
        ast::DimExpr::Int(value, span) => match i64::try_from(*value) {
            Ok(value) => Some(Dim::constant(value)),
            Err(_) => {
                diagnostics.push(Diagnostic::error(Code::DimOverflow, *span, "this dim is too large"));
                None
            }
        },
        ast::DimExpr::Name(ident) => match scope.find(&ident.name) {
            Some(generic) if generic.kind == GenericKind::Dim => Some(Dim::generic(&ident.name)),
            Some(generic) => {
                let kind = generic.kind.article();
                diagnostics.push(
                    Diagnostic::error(Code::KindMismatch, ident.span, format!("`{}` is {kind}, not a Dim", ident.name))
                        .with_label("a dim is expected here")
                        .with_secondary(generic.span, "declared here"),
                );
                None
            }
            None => {
                let unknown =
                    Diagnostic::error(Code::UnknownName, ident.span, format!("no generic `{}` in scope", ident.name))
                        .with_label("not a generic of this block or function");
                diagnostics.push(suggest::did_you_mean(unknown, &ident.name, scope.names(), false));
                None
            }
        },
        ast::DimExpr::Binary(op, left, right, _) => {
            let left = resolve_dim(left, scope, diagnostics);
            let right = resolve_dim(right, scope, diagnostics);
            let (left, right) = (left?, right?);
            Some(match op {
                ast::DimOp::Add => left.add(&right),
                ast::DimOp::Sub => left.sub(&right),
                ast::DimOp::Mul => left.mul(&right),
                ast::DimOp::Div => left.div(&right),
                ast::DimOp::Rem => left.rem(&right),
            })
        }
        ast::DimExpr::Error(_) => None,
    }
}

/// A dtype name or a `Float` generic, as in `Tensor[...; T]` or `cast<f32>`.
pub fn resolve_elem(ident: &ast::Ident, scope: &GenericScope, diagnostics: &mut Vec<Diagnostic>) -> Option<Elem> {
    if let Some(dtype) = Dtype::parse(&ident.name) {
        return Some(Elem::Known(dtype));
    }
    match scope.find(&ident.name) {
        Some(generic) if generic.kind == GenericKind::Float => Some(Elem::Generic(generic.name.clone())),
        Some(generic) => {
            diagnostics.push(
                Diagnostic::error(
                    Code::KindMismatch,
                    ident.span,
                    format!("`{}` is {}, not an element type", ident.name, generic.kind.article()),
                )
                .with_label("an element type (bf16, f16, f32, i32, i64, bool or a Float generic) is expected here")
                .with_secondary(generic.span, "declared here"),
            );
            None
        }
        None => {
            let candidates = ["bf16", "f16", "f32", "i32", "i64", "bool"].into_iter().chain(scope.names());
            let unknown = Diagnostic::error(Code::UnknownName, ident.span, format!("no element type `{}`", ident.name))
                .with_label("not a dtype or a Float generic");
            diagnostics.push(suggest::did_you_mean(unknown, &ident.name, candidates, false));
            None
        }
    }
}

pub fn resolve_type(ty: &ast::TypeExpr, scope: &GenericScope, diagnostics: &mut Vec<Diagnostic>) -> Ty {
    match ty {
        ast::TypeExpr::Tensor { dims, elem, .. } => {
            let mut axes = Vec::with_capacity(dims.len());
            let mut failed = false;
            for item in dims {
                match item {
                    ast::DimItem::Dim(expr) => match resolve_dim(expr, scope, diagnostics) {
                        Some(dim) => axes.push(Axis::Dim(dim)),
                        None => failed = true,
                    },
                    ast::DimItem::Shape(ident) => match scope.find(&ident.name) {
                        Some(generic) if generic.kind == GenericKind::Shape => {
                            axes.push(Axis::Shape(generic.name.clone()))
                        }
                        _ => {
                            diagnostics.push(
                                Diagnostic::error(
                                    Code::UnknownName,
                                    ident.span,
                                    format!("no variadic shape `*{}` in scope", ident.name),
                                )
                                .with_label("declare it as `*Name: Shape`"),
                            );
                            failed = true;
                        }
                    },
                }
            }
            if axes.iter().filter(|axis| matches!(axis, Axis::Shape(_))).count() > 1 {
                diagnostics.push(
                    Diagnostic::error(Code::TypeError, ty.span(), "a tensor type has at most one variadic shape")
                        .with_label("two `*` shapes here"),
                );
                failed = true;
            }
            let elem = resolve_elem(elem, scope, diagnostics);
            match (elem, failed) {
                (Some(elem), false) => Ty::Tensor(TensorTy { axes, elem }),
                _ => Ty::Error,
            }
        }
        ast::TypeExpr::Named { name, args, span } => {
            if name.name == "Option" {
                return match args.as_slice() {
                    [ast::GenericArg::Type(inner)] => {
                        Ty::Option(Some(Box::new(resolve_type(inner, scope, diagnostics))))
                    }
                    _ => {
                        diagnostics.push(
                            Diagnostic::error(
                                Code::TypeError,
                                *span,
                                "`Option` takes one tensor type: `Option<Tensor[...]>`",
                            )
                            .with_label("expected one type argument"),
                        );
                        Ty::Error
                    }
                };
            }
            if !args.is_empty() {
                diagnostics.push(
                    Diagnostic::error(Code::TypeError, *span, format!("`{}` is not a value type", name.name))
                        .with_label("blocks are used as `sub` members, not as values"),
                );
                return Ty::Error;
            }
            match resolve_elem(name, scope, diagnostics) {
                Some(elem) => Ty::Tensor(TensorTy::scalar(elem)),
                None => Ty::Error,
            }
        }
        ast::TypeExpr::Tuple(items, _) => {
            Ty::Tuple(items.iter().map(|item| resolve_type(item, scope, diagnostics)).collect())
        }
        ast::TypeExpr::Error(_) => Ty::Error,
    }
}

fn bad_default(generic: &ast::Generic, label: &str) -> Diagnostic {
    let span = generic.default.as_ref().map_or(generic.span, ast::GenericArg::span);
    Diagnostic::error(
        Code::TypeError,
        span,
        format!("not a default for `{}`, {}", generic.name.name, generic.kind.article()),
    )
    .with_label(label.to_string())
}

fn resolve_generics(generics: &[ast::Generic], diagnostics: &mut Vec<Diagnostic>) -> Vec<GenericSig> {
    let mut resolved: Vec<GenericSig> = Vec::new();
    for generic in generics {
        if let Some(previous) = resolved.iter().find(|g| *g.name == generic.name.name) {
            diagnostics.push(
                Diagnostic::error(
                    Code::DuplicateDefinition,
                    generic.name.span,
                    format!("generic `{}` is declared twice", generic.name.name),
                )
                .with_label("declared again here")
                .with_secondary(previous.span, "first declared here"),
            );
            continue;
        }
        let default = generic.default.as_ref().and_then(|default| match (generic.kind, default) {
            (GenericKind::Float, ast::GenericArg::Dim(ast::DimExpr::Name(name))) => {
                match Dtype::parse(&name.name).filter(|dtype| dtype.is_float()) {
                    Some(dtype) => Some(GenericDefault::Elem(Elem::Known(dtype))),
                    None => {
                        diagnostics.push(bad_default(generic, "a Float generic defaults to bf16, f16 or f32"));
                        None
                    }
                }
            }
            (GenericKind::Number, ast::GenericArg::Number(value, _)) => Some(GenericDefault::Number(*value)),
            (GenericKind::Number, ast::GenericArg::Dim(ast::DimExpr::Int(value, _))) => {
                Some(GenericDefault::Number(*value as f64))
            }
            (GenericKind::Number, _) => {
                diagnostics.push(bad_default(generic, "an f32 generic defaults to a number: `1e-6`, `10000`"));
                None
            }
            _ => {
                diagnostics.push(bad_default(generic, "only a Float or an f32 generic has a default"));
                None
            }
        });
        resolved.push(GenericSig {
            name: Arc::from(generic.name.name.as_str()),
            kind: generic.kind,
            default,
            bound: None,
            span: generic.name.span,
        });
    }
    resolved
}

fn resolve_clauses(
    clauses: &[ast::WhereClause],
    scope: &GenericScope,
    diagnostics: &mut Vec<Diagnostic>,
) -> Vec<Clause> {
    clauses
        .iter()
        .filter_map(|clause| {
            let lhs = resolve_dim(&clause.lhs, scope, diagnostics);
            let rhs = resolve_dim(&clause.rhs, scope, diagnostics);
            let text = format!("{} {} {}", clause.lhs, clause.op.symbol(), clause.rhs);
            Some(Clause { lhs: lhs?, op: clause.op, rhs: rhs?, span: clause.span, text })
        })
        .collect()
}

impl<'a> Program<'a> {
    pub fn build(package: &'a Package, diagnostics: &mut Vec<Diagnostic>) -> Program<'a> {
        let mut program = Program {
            package,
            blocks: Vec::new(),
            fns: Vec::new(),
            consts: Vec::new(),
            aliases: Vec::new(),
            scopes: Vec::new(),
            items: Vec::new(),
            definitions: Vec::new(),
        };
        program.collect(diagnostics);
        program.import(diagnostics);
        program.resolve_signatures(diagnostics);
        program.record_generic_uses();
        program
    }

    /// Records each generic and block named in a signature (types,
    /// clauses, sub blocks and their arguments, bounds, a `type`'s target)
    /// as a use of its declaration.
    fn record_generic_uses(&mut self) {
        let mut uses = Vec::new();
        for block in &self.blocks {
            let decl = block.decl;
            let scope = GenericScope { layers: vec![&block.generics] };
            self.bound_uses(block.module, &decl.generics, &scope, &mut uses);
            decl.where_clauses.iter().for_each(|c| clause_uses(c, &scope, &mut uses));
            for member in &decl.members {
                match member {
                    ast::Member::Sub { block: name, args, count, .. } => {
                        self.block_uses(block.module, name, args, &scope, &mut uses);
                        if let Some(count) = count {
                            dim_uses(count, &scope, &mut uses);
                        }
                    }
                    ast::Member::Param { ty, .. } | ast::Member::State { ty, .. } => type_uses(ty, &scope, &mut uses),
                    ast::Member::Fn(_) => {}
                }
            }
        }
        for alias in &self.aliases {
            let scope = GenericScope { layers: vec![&alias.generics] };
            self.bound_uses(alias.module, &alias.decl.generics, &scope, &mut uses);
            alias.decl.where_clauses.iter().for_each(|c| clause_uses(c, &scope, &mut uses));
            if let ast::TypeExpr::Named { name, args, .. } = &alias.decl.target {
                self.block_uses(alias.module, name, args, &scope, &mut uses);
            }
        }
        for function in &self.fns {
            let block_generics: &[GenericSig] = function.block.map_or(&[], |b| &self.blocks[b].generics);
            let scope = GenericScope { layers: vec![block_generics, &function.generics] };
            let decl = function.decl;
            decl.params.iter().for_each(|p| type_uses(&p.ty, &scope, &mut uses));
            if let Some(ret) = &decl.ret {
                type_uses(ret, &scope, &mut uses);
            }
            decl.where_clauses.iter().for_each(|c| clause_uses(c, &scope, &mut uses));
        }
        self.definitions.extend(uses);
    }

    /// The generics named in the arguments of each bound.
    fn bound_uses(&self, module: usize, generics: &[ast::Generic], scope: &GenericScope, uses: &mut Vec<(Span, Span)>) {
        for generic in generics {
            if let Some((_, args)) = &generic.bound {
                args.iter().for_each(|arg| self.garg_block_uses(module, arg, scope, uses));
            }
        }
    }

    /// `name<args>` naming a block, a `type` or a block generic.
    fn block_uses(
        &self,
        module: usize,
        name: &ast::Ident,
        args: &[ast::GenericArg],
        scope: &GenericScope,
        uses: &mut Vec<(Span, Span)>,
    ) {
        match scope.find(&name.name) {
            Some(generic) => uses.push((name.span, generic.span)),
            None => {
                if let Some(declared) = self.scopes[module].get(&name.name).and_then(|item| self.item_span(*item)) {
                    uses.push((name.span, declared));
                }
            }
        }
        args.iter().for_each(|arg| self.garg_block_uses(module, arg, scope, uses));
    }

    fn garg_block_uses(
        &self,
        module: usize,
        arg: &ast::GenericArg,
        scope: &GenericScope,
        uses: &mut Vec<(Span, Span)>,
    ) {
        match arg {
            ast::GenericArg::Type(ast::TypeExpr::Named { name, args, .. }) => {
                self.block_uses(module, name, args, scope, uses)
            }
            ast::GenericArg::Dim(ast::DimExpr::Name(name))
                if scope.find(&name.name).is_none()
                    && matches!(self.scopes[module].get(&name.name), Some(ItemRef::Block(_) | ItemRef::Alias(_))) =>
            {
                self.block_uses(module, name, &[], scope, uses)
            }
            other => garg_uses(other, scope, uses),
        }
    }

    /// Where an item's name is declared.
    pub fn item_span(&self, item: ItemRef) -> Option<Span> {
        match item {
            ItemRef::Block(id) => Some(self.blocks[id].decl.name.span),
            ItemRef::Fn(id) => Some(self.fns[id].decl.name.span),
            ItemRef::Const(id) => Some(self.consts[id].span),
            ItemRef::Alias(id) => Some(self.aliases[id].decl.name.span),
            ItemRef::Unresolved => None,
        }
    }

    pub fn module_name(&self, module: usize) -> &str {
        &self.package.modules[module].name
    }

    /// Whether `function` is a trait's: a signature, or with a body a
    /// default.
    pub fn is_trait_function(&self, function: &FnSig) -> bool {
        function.block.is_some_and(|block| self.blocks[block].decl.kind == ast::BlockKind::Trait)
    }

    /// Gives every item an id and fills each module's own table.
    fn collect(&mut self, diagnostics: &mut Vec<Diagnostic>) {
        for (module_index, module) in self.package.modules.iter().enumerate() {
            let mut items: HashMap<String, (ItemRef, bool)> = HashMap::new();
            let mut spans: HashMap<String, Span> = HashMap::new();
            for item in &module.ast.items {
                let (item_ref, is_pub) = match item {
                    ast::Item::Block(decl) => {
                        let id = self.blocks.len();
                        let mut fns = HashMap::new();
                        for member in &decl.members {
                            if let ast::Member::Fn(function) = member {
                                let fn_id = self.add_fn(module_index, Some(id), function);
                                if fns.insert(function.name.name.clone(), fn_id).is_some() {
                                    diagnostics.push(duplicate(&function.name, None));
                                }
                            }
                        }
                        self.blocks.push(BlockSig {
                            name: decl.name.name.clone(),
                            module: module_index,
                            decl,
                            generics: Vec::new(),
                            clauses: Vec::new(),
                            subs: Vec::new(),
                            params: Vec::new(),
                            states: Vec::new(),
                            fns,
                        });
                        (ItemRef::Block(id), decl.is_pub)
                    }
                    ast::Item::Fn(function) => {
                        (ItemRef::Fn(self.add_fn(module_index, None, function)), function.is_pub)
                    }
                    ast::Item::Const(constant) => {
                        self.consts.push(ConstSig { ty: Ty::Error, span: constant.name.span });
                        (ItemRef::Const(self.consts.len() - 1), constant.is_pub)
                    }
                    ast::Item::Alias(decl) => {
                        self.aliases.push(AliasSig {
                            name: decl.name.name.clone(),
                            module: module_index,
                            decl,
                            generics: Vec::new(),
                            clauses: Vec::new(),
                            target: None,
                        });
                        (ItemRef::Alias(self.aliases.len() - 1), decl.is_pub)
                    }
                };
                let name = item.name();
                if let Some(first) = spans.get(&name.name) {
                    diagnostics.push(duplicate(name, Some(*first)));
                    continue;
                }
                spans.insert(name.name.clone(), name.span);
                items.insert(name.name.clone(), (item_ref, is_pub));
            }
            self.scopes.push(items.iter().map(|(name, (item, _))| (name.clone(), *item)).collect());
            self.items.push(items);
        }
    }

    fn add_fn(&mut self, module: usize, block: Option<usize>, decl: &'a ast::FnDecl) -> usize {
        self.fns.push(FnSig {
            name: decl.name.name.clone(),
            module,
            block,
            decl,
            generics: Vec::new(),
            params: Vec::new(),
            ret: Ty::Unit,
            clauses: Vec::new(),
        });
        self.fns.len() - 1
    }

    /// Adds each module's `use` imports to its scope.
    fn import(&mut self, diagnostics: &mut Vec<Diagnostic>) {
        let names: HashMap<&str, usize> =
            self.package.modules.iter().enumerate().map(|(at, m)| (m.name.as_str(), at)).collect();
        for (module_index, module) in self.package.modules.iter().enumerate() {
            for (item, import) in module.ast.uses.iter().zip(&module.imports) {
                // A module that cannot be used from here, or failed to
                // load, was reported by the loader.
                let Some((qualified, &target)) = import.as_deref().and_then(|q| Some((q, names.get(q)?))) else {
                    for name in &item.names {
                        self.scopes[module_index].entry(name.name.clone()).or_insert(ItemRef::Unresolved);
                    }
                    continue;
                };
                for name in &item.names {
                    let found = self.items[target].get(&name.name).copied();
                    match found {
                        Some((item_ref, true)) => {
                            if let Some(declared) = self.item_span(item_ref) {
                                self.definitions.push((name.span, declared));
                            }
                            if let Some(previous) = self.scopes[module_index].insert(name.name.clone(), item_ref) {
                                if previous != item_ref {
                                    diagnostics.push(duplicate(name, None));
                                }
                            }
                        }
                        Some((_, false)) => {
                            self.scopes[module_index].entry(name.name.clone()).or_insert(ItemRef::Unresolved);
                            diagnostics.push(
                                Diagnostic::error(
                                    Code::PrivateItem,
                                    name.span,
                                    format!("`{}` is private to `{qualified}`", name.name),
                                )
                                .with_label("declare it `pub` to use it from another module"),
                            )
                        }
                        None => {
                            self.scopes[module_index].entry(name.name.clone()).or_insert(ItemRef::Unresolved);
                            let public = self.items[target].iter().filter(|(_, (_, p))| *p).map(|(n, _)| n.as_str());
                            let unknown = Diagnostic::error(
                                Code::UnknownImport,
                                name.span,
                                format!("`{qualified}` has no item `{}`", name.name),
                            )
                            .with_label("not found in that module");
                            diagnostics.push(suggest::did_you_mean(unknown, &name.name, public, false));
                        }
                    }
                }
            }
        }
    }

    fn resolve_signatures(&mut self, diagnostics: &mut Vec<Diagnostic>) {
        for block in &mut self.blocks {
            block.generics = resolve_generics(&block.decl.generics, diagnostics);
        }
        for alias in &mut self.aliases {
            alias.generics = resolve_generics(&alias.decl.generics, diagnostics);
        }
        // Bounds name traits, whose generics are now known.
        for block_id in 0..self.blocks.len() {
            let (module, decl) = (self.blocks[block_id].module, self.blocks[block_id].decl);
            let mut generics = std::mem::take(&mut self.blocks[block_id].generics);
            self.resolve_bounds(module, &decl.generics, &mut generics, diagnostics);
            self.blocks[block_id].generics = generics;
        }
        for alias_id in 0..self.aliases.len() {
            let (module, decl) = (self.aliases[alias_id].module, self.aliases[alias_id].decl);
            let mut generics = std::mem::take(&mut self.aliases[alias_id].generics);
            self.resolve_bounds(module, &decl.generics, &mut generics, diagnostics);
            let scope = GenericScope { layers: vec![&generics] };
            let clauses = resolve_clauses(&decl.where_clauses, &scope, diagnostics);
            let target = match &decl.target {
                ast::TypeExpr::Named { name, args, span } => {
                    let target = self.resolve_block_ref(module, name, args, &scope, *span, diagnostics);
                    match target {
                        Some(target) if target.generic.is_some() => {
                            diagnostics.push(
                                Diagnostic::error(
                                    Code::NotABlock,
                                    name.span,
                                    format!("`{}` is a generic: a `type` names a block", name.name),
                                )
                                .with_label("not a block"),
                            );
                            None
                        }
                        other => other,
                    }
                }
                other => {
                    diagnostics.push(
                        Diagnostic::error(Code::NotABlock, other.span(), "a `type` names a block instance")
                            .with_label("expected `Block<...>`"),
                    );
                    None
                }
            };
            let alias = &mut self.aliases[alias_id];
            alias.generics = generics;
            alias.clauses = clauses;
            alias.target = target;
        }
        for block_id in 0..self.blocks.len() {
            let decl = self.blocks[block_id].decl;
            let generics = self.blocks[block_id].generics.clone();
            let scope = GenericScope { layers: vec![&generics] };
            let clauses = resolve_clauses(&decl.where_clauses, &scope, diagnostics);
            let mut subs = Vec::new();
            let mut params = Vec::new();
            let mut states = Vec::new();
            let mut seen: HashMap<&str, Span> = HashMap::new();
            for member in &decl.members {
                let name = match member {
                    ast::Member::Sub { name, .. }
                    | ast::Member::Param { name, .. }
                    | ast::Member::State { name, .. } => name,
                    ast::Member::Fn(function) => &function.name,
                };
                if let Some(first) = seen.insert(&name.name, name.span) {
                    if !matches!(member, ast::Member::Fn(_)) {
                        diagnostics.push(duplicate(name, Some(first)));
                    }
                }
                match member {
                    ast::Member::Sub { name, block, args, count, span, .. } => {
                        let module = self.blocks[block_id].module;
                        let target = self.resolve_block_ref(module, block, args, &scope, *span, diagnostics);
                        let count = count.as_ref().map(|count| resolve_dim(count, &scope, diagnostics));
                        let ty = match (&target, count) {
                            (Some(target), None) => Ty::Sub(target.clone()),
                            (Some(target), Some(Some(count))) => Ty::SubArray(target.clone(), count),
                            _ => Ty::Error,
                        };
                        subs.push(SubSig { name: name.name.clone(), name_span: name.span, ty, span: *span, target });
                    }
                    ast::Member::Param { name, ty, .. } => {
                        params.push((name.name.clone(), resolve_type(ty, &scope, diagnostics), name.span))
                    }
                    ast::Member::State { name, ty, .. } => {
                        states.push((name.name.clone(), resolve_type(ty, &scope, diagnostics), name.span))
                    }
                    ast::Member::Fn(_) => {}
                }
            }
            let block = &mut self.blocks[block_id];
            block.clauses = clauses;
            block.subs = subs;
            block.params = params;
            block.states = states;
        }
        for fn_id in 0..self.fns.len() {
            let decl = self.fns[fn_id].decl;
            let generics = resolve_generics(&decl.generics, diagnostics);
            for generic in generics.iter().filter(|g| g.kind == GenericKind::Block) {
                diagnostics.push(
                    Diagnostic::error(
                        Code::KindMismatch,
                        generic.span,
                        "a function's generics are dims, shapes and floats; a block generic belongs to a block",
                    )
                    .with_label("declare it on the block and hold it as a `sub`"),
                );
            }
            let block_generics: &[GenericSig] = match self.fns[fn_id].block {
                Some(block) => &self.blocks[block].generics,
                None => &[],
            };
            let scope = GenericScope { layers: vec![block_generics, &generics] };
            let params = decl
                .params
                .iter()
                .map(|param| (param.name.name.clone(), resolve_type(&param.ty, &scope, diagnostics), param.name.span))
                .collect();
            let ret = decl.ret.as_ref().map_or(Ty::Unit, |ret| resolve_type(ret, &scope, diagnostics));
            let clauses = resolve_clauses(&decl.where_clauses, &scope, diagnostics);
            let function = &mut self.fns[fn_id];
            function.params = params;
            function.ret = ret;
            function.clauses = clauses;
            function.generics = generics;
        }
        for (module_index, module) in self.package.modules.iter().enumerate() {
            for item in &module.ast.items {
                if let ast::Item::Const(constant) = item {
                    let Some((ItemRef::Const(id), _)) = self.items[module_index].get(&constant.name.name) else {
                        continue;
                    };
                    let scope = GenericScope { layers: Vec::new() };
                    self.consts[*id].ty = resolve_type(&constant.ty, &scope, diagnostics);
                }
            }
        }
    }

    /// Each block generic's bound: a trait in scope, with arguments over
    /// the generics declared before it.
    fn resolve_bounds(
        &mut self,
        module: usize,
        declared: &[ast::Generic],
        generics: &mut [GenericSig],
        diagnostics: &mut Vec<Diagnostic>,
    ) {
        for at in 0..generics.len() {
            let Some(decl) = declared.iter().find(|g| g.name.span == generics[at].span) else { continue };
            let Some((name, args)) = &decl.bound else { continue };
            let trait_id = match self.scopes[module].get(&name.name) {
                Some(ItemRef::Block(id)) if self.blocks[*id].decl.kind == ast::BlockKind::Trait => *id,
                Some(ItemRef::Unresolved) => continue,
                Some(ItemRef::Block(id)) => {
                    diagnostics.push(
                        Diagnostic::error(
                            Code::NotATrait,
                            name.span,
                            format!(
                                "`{}` is a block; a bound is a trait (`Dim`, `Shape`, `Float` or a trait)",
                                name.name
                            ),
                        )
                        .with_label("not a trait")
                        .with_secondary(self.blocks[*id].decl.name.span, "block defined here"),
                    );
                    continue;
                }
                _ => {
                    let traits = self.scopes[module]
                        .iter()
                        .filter(|(_, item)| {
                            matches!(item, ItemRef::Block(id) if self.blocks[*id].decl.kind == ast::BlockKind::Trait)
                        })
                        .map(|(name, _)| name.as_str())
                        .chain(["Dim", "Shape", "Float"]);
                    let unknown = Diagnostic::error(
                        Code::UnknownName,
                        name.span,
                        format!("no kind or trait `{}` in scope", name.name),
                    )
                    .with_label("a generic is a `Dim`, a `Shape`, a `Float` or a block bounded by a trait");
                    diagnostics.push(suggest::did_you_mean(unknown, &name.name, traits, false));
                    continue;
                }
            };
            self.definitions.push((name.span, self.blocks[trait_id].decl.name.span));
            let scope = GenericScope { layers: vec![&generics[..at]] };
            let trait_name = self.blocks[trait_id].name.clone();
            let bound = self.bind_generic_args(
                module,
                &self.blocks[trait_id].generics,
                args,
                &scope,
                decl.kind_span,
                &trait_name,
                true,
                diagnostics,
            );
            if let Some(args) = bound {
                if let Some(generic) = args.blocks.keys().next() {
                    diagnostics.push(
                        Diagnostic::error(
                            Code::KindMismatch,
                            decl.kind_span,
                            format!("a trait's generics are dims and floats; `{generic}` of `{trait_name}` is a block"),
                        )
                        .with_label("not supported in a bound"),
                    );
                    continue;
                }
                generics[at].bound = Some(SubTy::concrete(trait_id, args));
            }
        }
    }

    /// The block that `name<args>` stands for in `module` under `scope`: a
    /// block instance, a `type`'s block with its arguments, or, for a block
    /// generic in scope, an abstract sub of its bound.
    pub fn resolve_block_ref(
        &self,
        module: usize,
        name: &ast::Ident,
        args: &[ast::GenericArg],
        scope: &GenericScope,
        span: Span,
        diagnostics: &mut Vec<Diagnostic>,
    ) -> Option<SubTy> {
        if let Some(generic) = scope.find(&name.name) {
            if generic.kind != GenericKind::Block {
                diagnostics.push(
                    Diagnostic::error(
                        Code::KindMismatch,
                        name.span,
                        format!("`{}` is {}, not a block", name.name, generic.kind.article()),
                    )
                    .with_label("a block is expected here")
                    .with_secondary(generic.span, "declared here"),
                );
                return None;
            }
            if let Some(first) = args.first() {
                diagnostics.push(
                    Diagnostic::error(
                        Code::GenericCount,
                        first.span(),
                        format!("`{}` is a block generic: its arguments were given where it is bound", name.name),
                    )
                    .with_label("remove the arguments"),
                );
                return None;
            }
            let bound = generic.bound.as_ref()?;
            return Some(SubTy { block: bound.block, args: bound.args.clone(), generic: Some(generic.name.clone()) });
        }
        match self.scopes[module].get(&name.name) {
            Some(ItemRef::Block(id)) if self.blocks[*id].decl.kind == ast::BlockKind::Trait => {
                diagnostics.push(
                    Diagnostic::error(
                        Code::NotABlock,
                        name.span,
                        format!("`{}` is a trait: it bounds a block generic, it is not a block", name.name),
                    )
                    .with_label(format!("declare a generic `F: {}<...>` and use `F`", name.name))
                    .with_secondary(self.blocks[*id].decl.name.span, "trait defined here"),
                );
                None
            }
            Some(ItemRef::Block(id)) => {
                let target = &self.blocks[*id];
                let args = self.bind_generic_args(
                    module,
                    &target.generics,
                    args,
                    scope,
                    span,
                    &target.name,
                    true,
                    diagnostics,
                )?;
                Some(SubTy::concrete(*id, args))
            }
            Some(ItemRef::Alias(id)) => {
                let alias = &self.aliases[*id];
                let bound =
                    self.bind_generic_args(module, &alias.generics, args, scope, span, &alias.name, true, diagnostics)?;
                let target = alias.target.as_ref();
                if target.is_none() {
                    diagnostics.push(
                        Diagnostic::error(
                            Code::NotABlock,
                            name.span,
                            format!("`{}` is a `type` whose block is not known here", name.name),
                        )
                        .with_label("name the block itself")
                        .with_secondary(alias.decl.name.span, "type defined here"),
                    );
                }
                Some(bound.sub(target?))
            }
            Some(ItemRef::Unresolved) => None,
            Some(_) => {
                diagnostics.push(
                    Diagnostic::error(Code::NotABlock, name.span, format!("`{}` is not a block", name.name))
                        .with_label("a block is expected here"),
                );
                None
            }
            None => {
                let blocks = self.scopes[module]
                    .iter()
                    .filter(|(_, item)| matches!(item, ItemRef::Block(_) | ItemRef::Alias(_)))
                    .map(|(name, _)| name.as_str())
                    .chain(scope.names());
                let unknown =
                    Diagnostic::error(Code::UnknownName, name.span, format!("no block `{}` in scope", name.name))
                        .with_label("not defined or imported in this module");
                diagnostics.push(suggest::did_you_mean(unknown, &name.name, blocks, false));
                None
            }
        }
    }

    /// Binds explicit generic arguments to a callee's generics, by kind;
    /// missing `Float`s and numbers take their defaults, and the rest are left to
    /// inference unless `require_all`. `None` after reporting a problem.
    #[allow(clippy::too_many_arguments)]
    pub fn bind_generic_args(
        &self,
        module: usize,
        generics: &[GenericSig],
        args: &[ast::GenericArg],
        scope: &GenericScope,
        span: Span,
        callee: &str,
        require_all: bool,
        diagnostics: &mut Vec<Diagnostic>,
    ) -> Option<Subst> {
        let mut subst = Subst::default();
        if args.len() > generics.len() {
            diagnostics.push(
                Diagnostic::error(
                    Code::GenericCount,
                    args[generics.len()].span(),
                    format!("`{callee}` takes {} generic argument(s), {} given", generics.len(), args.len()),
                )
                .with_label("unexpected generic argument"),
            );
            return None;
        }
        let mut ok = true;
        for (generic, arg) in generics.iter().zip(args) {
            match (generic.kind, arg) {
                (GenericKind::Dim, ast::GenericArg::Dim(expr)) => match resolve_dim(expr, scope, diagnostics) {
                    Some(dim) => {
                        subst.dims.insert(generic.name.clone(), dim);
                    }
                    None => ok = false,
                },
                (GenericKind::Float, ast::GenericArg::Dim(ast::DimExpr::Name(ident))) => {
                    match resolve_elem(ident, scope, diagnostics) {
                        Some(elem) if elem.is_float() => {
                            subst.elems.insert(generic.name.clone(), elem);
                        }
                        Some(elem) => {
                            diagnostics.push(
                                Diagnostic::error(
                                    Code::KindMismatch,
                                    ident.span,
                                    format!("`{}` of `{callee}` is a Float, not {elem}", generic.name),
                                )
                                .with_label("expected bf16, f16, f32 or a Float generic"),
                            );
                            ok = false;
                        }
                        None => ok = false,
                    }
                }
                (GenericKind::Number, ast::GenericArg::Number(value, _)) => {
                    subst.numbers.insert(generic.name.clone(), Number::Known(*value));
                }
                (GenericKind::Number, ast::GenericArg::Dim(ast::DimExpr::Int(value, _))) => {
                    subst.numbers.insert(generic.name.clone(), Number::Known(*value as f64));
                }
                (GenericKind::Number, ast::GenericArg::Dim(ast::DimExpr::Name(ident)))
                    if scope.find(&ident.name).is_some_and(|g| g.kind == GenericKind::Number) =>
                {
                    subst.numbers.insert(generic.name.clone(), Number::Generic(Arc::from(ident.name.as_str())));
                }
                (GenericKind::Block, ast::GenericArg::Dim(ast::DimExpr::Name(name)))
                | (GenericKind::Block, ast::GenericArg::Type(ast::TypeExpr::Named { name, .. })) => {
                    let inner = match arg {
                        ast::GenericArg::Type(ast::TypeExpr::Named { args, .. }) => args.as_slice(),
                        _ => &[],
                    };
                    match self.resolve_block_ref(module, name, inner, scope, arg.span(), diagnostics) {
                        Some(block) => {
                            subst.blocks.insert(generic.name.clone(), block);
                        }
                        None => ok = false,
                    }
                }
                (kind, arg) => {
                    diagnostics.push(
                        Diagnostic::error(
                            Code::KindMismatch,
                            arg.span(),
                            format!("generic `{}` of `{callee}` is {}", generic.name, kind.article()),
                        )
                        .with_label(format!("expected {} here", kind.article()))
                        .with_secondary(generic.span, "declared here"),
                    );
                    ok = false;
                }
            }
        }
        let mut missing = Vec::new();
        for generic in &generics[args.len()..] {
            match &generic.default {
                Some(GenericDefault::Elem(default)) => {
                    subst.elems.insert(generic.name.clone(), default.clone());
                }
                Some(GenericDefault::Number(value)) => {
                    subst.numbers.insert(generic.name.clone(), Number::Known(*value));
                }
                None => missing.push(&*generic.name),
            }
        }
        if require_all && !missing.is_empty() {
            diagnostics.push(
                Diagnostic::error(
                    Code::GenericCount,
                    span,
                    format!("`{callee}` needs {} more generic argument(s): {}", missing.len(), missing.join(", ")),
                )
                .with_label("every generic of a block is given"),
            );
            return None;
        }
        ok.then_some(subst)
    }
}

fn duplicate(name: &ast::Ident, first: Option<Span>) -> Diagnostic {
    let diagnostic =
        Diagnostic::error(Code::DuplicateDefinition, name.span, format!("`{}` is defined twice", name.name))
            .with_label("defined again here");
    match first {
        Some(first) => diagnostic.with_secondary(first, "first defined here"),
        None => diagnostic,
    }
}

impl FnSig<'_> {
    pub fn is_entry(&self) -> bool {
        self.decl.kind == FnKind::Entry
    }
}

fn name_use(name: &ast::Ident, scope: &GenericScope, uses: &mut Vec<(Span, Span)>) {
    if let Some(generic) = scope.find(&name.name) {
        uses.push((name.span, generic.span));
    }
}

fn dim_uses(dim: &ast::DimExpr, scope: &GenericScope, uses: &mut Vec<(Span, Span)>) {
    match dim {
        ast::DimExpr::Name(name) => name_use(name, scope, uses),
        ast::DimExpr::Binary(_, a, b, _) => {
            dim_uses(a, scope, uses);
            dim_uses(b, scope, uses);
        }
        ast::DimExpr::Int(..) | ast::DimExpr::Error(_) => {}
    }
}

pub(super) fn garg_uses(arg: &ast::GenericArg, scope: &GenericScope, uses: &mut Vec<(Span, Span)>) {
    match arg {
        ast::GenericArg::Dim(dim) => dim_uses(dim, scope, uses),
        ast::GenericArg::Type(ty) => type_uses(ty, scope, uses),
        ast::GenericArg::Number(..) => {}
    }
}

fn clause_uses(clause: &ast::WhereClause, scope: &GenericScope, uses: &mut Vec<(Span, Span)>) {
    dim_uses(&clause.lhs, scope, uses);
    dim_uses(&clause.rhs, scope, uses);
}

fn type_uses(ty: &ast::TypeExpr, scope: &GenericScope, uses: &mut Vec<(Span, Span)>) {
    match ty {
        ast::TypeExpr::Tensor { dims, elem, .. } => {
            for item in dims {
                match item {
                    ast::DimItem::Dim(dim) => dim_uses(dim, scope, uses),
                    ast::DimItem::Shape(name) => name_use(name, scope, uses),
                }
            }
            name_use(elem, scope, uses);
        }
        ast::TypeExpr::Named { name, args, .. } => {
            name_use(name, scope, uses);
            args.iter().for_each(|arg| garg_uses(arg, scope, uses));
        }
        ast::TypeExpr::Tuple(items, _) => items.iter().for_each(|item| type_uses(item, scope, uses)),
        ast::TypeExpr::Error(_) => {}
    }
}
