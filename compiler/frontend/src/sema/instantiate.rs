//! The instantiation check: with `nest.toml`'s `[generics]` (and `--set`
//! overrides) every `where` clause of the root block evaluates to true, and
//! with `[check]` dims so do the entries' clauses; a violation points at the
//! value that breaks it. The symbolic check has already shown that every
//! other block's clauses follow from the root's. Then `bindings.json` must
//! name a checkpoint tensor for every parameter of this instantiation.

use super::program::{Clause, GenericDefault, GenericSig, ItemRef, Program};
use super::suggest;
use super::ty::{Elem, Number, SubTy, Subst, Ty};
use crate::code::Code;
use crate::diagnostic::Diagnostic;
use crate::package::{gguf_names, Nest, NestValue};
use crate::source::Span;
use crate::syntax::ast::{BlockKind, GenericKind};
use linnet_artifact::gguf_names::GgufNames;
use linnet_ir::dim::{Atom, Dim, Symbol};
use linnet_ir::Dtype;
use std::collections::{BTreeSet, HashMap};

/// Concrete generics: sizes, element types and blocks (each with its own
/// values), with where each size was given.
#[derive(Default, Clone)]
pub struct Values {
    pub dims: HashMap<Symbol, i64>,
    pub elems: HashMap<Symbol, Dtype>,
    pub numbers: HashMap<Symbol, f64>,
    pub blocks: HashMap<Symbol, (usize, Values)>,
    pub spans: HashMap<Symbol, Span>,
}

impl Values {
    /// The values a sub-block's generics take: its arguments evaluated
    /// with these (those that cannot be are left out). A size given as
    /// one of these generics keeps the place it was given.
    pub fn of_arguments(&self, args: &Subst) -> Values {
        let mut inner = Values::default();
        for (name, dim) in &args.dims {
            if let Some(value) = self.eval(dim) {
                inner.dims.insert(name.clone(), value);
            }
            if let Some(span) = dim.as_generic().and_then(|outer| self.spans.get(outer)) {
                inner.spans.insert(name.clone(), *span);
            }
        }
        for (name, block) in &args.blocks {
            if let Some(instance) = self.instance(block) {
                inner.blocks.insert(name.clone(), instance);
            }
        }
        for (name, elem) in &args.elems {
            let dtype = match elem {
                Elem::Known(dtype) => Some(*dtype),
                Elem::Generic(outer) => self.elems.get(outer).copied(),
                Elem::IntLiteral | Elem::FloatLiteral => None,
            };
            if let Some(dtype) = dtype {
                inner.elems.insert(name.clone(), dtype);
            }
        }
        for (name, number) in &args.numbers {
            let value = match number {
                Number::Known(value) => Some(*value),
                Number::Generic(outer) => self.numbers.get(outer).copied(),
            };
            if let Some(value) = value {
                inner.numbers.insert(name.clone(), value);
            }
        }
        inner
    }

    pub fn eval(&self, dim: &Dim) -> Option<i64> {
        dim.value_under(&self.dims).ok()
    }

    /// The block a sub holds under these values, and its generics' values.
    pub fn instance(&self, sub: &SubTy) -> Option<(usize, Values)> {
        match &sub.generic {
            Some(generic) => self.blocks.get(generic).cloned(),
            None => Some((sub.block, self.of_arguments(&sub.args))),
        }
    }

    /// The same values as a substitution of constants, for lowering.
    pub fn to_subst(&self) -> Subst {
        Subst {
            dims: self.dims.iter().map(|(name, value)| (name.clone(), Dim::constant(*value))).collect(),
            shapes: HashMap::new(),
            elems: self.elems.iter().map(|(name, dtype)| (name.clone(), Elem::Known(*dtype))).collect(),
            numbers: self.numbers.iter().map(|(name, value)| (name.clone(), Number::Known(*value))).collect(),
            blocks: self
                .blocks
                .iter()
                .map(|(name, (block, values))| (name.clone(), SubTy::concrete(*block, values.to_subst())))
                .collect(),
        }
    }
}

/// `source_is_sound`: the modules checked without errors, so the parameter
/// tree is complete and the bindings can be checked against it.
pub fn check(program: &Program, source_is_sound: bool, diagnostics: &mut Vec<Diagnostic>) {
    let Some(nest) = &program.package.nest else { return };
    let Some((instance, given)) = root_generics(program, diagnostics) else { return };
    let Some((root, values)) = given.instance(&instance) else { return };
    check_clauses(&program.blocks[root].clauses, &values, diagnostics);
    check_config(nest, &given, diagnostics);
    check_entries(program, root, nest, &values, diagnostics);
    let within_limits = source_is_sound && super::footprint::check(program, &instance, &given, diagnostics);
    if !within_limits {
        return;
    }
    if nest.bindings_path.is_none() && nest.gguf_names_path.is_none() {
        diagnostics.push(
            Diagnostic::warning(
                Code::NoWeights,
                Span::new(nest.file, 0..0),
                "the model card names no `[weights] bindings`: no checkpoint can be loaded for it",
            )
            .with_label("add `[weights]` with `bindings = \"bindings.json\"`"),
        );
    }
    if let Some(bindings) = &program.package.bindings {
        bindings_of(program, &given, diagnostics);
        let entries = bindings.entries.iter().map(|(path, _, span)| (path.as_str(), *span)).collect();
        let covers =
            Covers { file: bindings.file, name: "bindings.json", missing: Code::MissingBinding, what: "binding" };
        check_coverage(program, root, &values, &covers, entries, diagnostics);
    }
    if let Some(names) = &program.package.gguf_names {
        gguf_names_of(program, &given, diagnostics);
        let entries = names.tensors.iter().map(|(path, _, span)| (path.as_str(), *span)).collect();
        let covers =
            Covers { file: names.file, name: "gguf.json", missing: Code::MissingGgufName, what: "GGUF source" };
        check_coverage(program, root, &values, &covers, entries, diagnostics);
    }
}

/// A file that says something of every parameter, for the messages of
/// [`check_coverage`].
struct Covers {
    file: crate::source::FileId,
    name: &'static str,
    /// The code of the diagnostic for parameters it leaves out.
    missing: Code,
    /// What it gives a parameter.
    what: &'static str,
}

/// The root block named by the model card and the values of its generics.
pub fn root_instance(program: &Program, diagnostics: &mut Vec<Diagnostic>) -> Option<(usize, Values)> {
    let (instance, given) = root_generics(program, diagnostics)?;
    given.instance(&instance)
}

/// `gguf.json` for the instance the card makes, its sizes and settings as
/// the root's generics take them (`given`: the card's values, `[config]`'s
/// and `--set`'s, defaults and derived dims included); `None` without
/// one, or when an entry does not evaluate (each such a diagnostic at its key).
fn gguf_names_of(program: &Program, given: &Values, diagnostics: &mut Vec<Diagnostic>) -> Option<GgufNames> {
    let file = program.package.gguf_names.as_ref()?;
    let dims = given.dims.iter().map(|(name, value)| (name.to_string(), *value)).collect();
    let numbers = given.numbers.iter().map(|(name, value)| (name.to_string(), *value)).collect();
    gguf_names::resolve(file, &dims, &numbers, diagnostics)
}

/// `bindings.json` for the instance the card makes: each parameter's
/// tensor name with its `{expr}`s evaluated over the root's sizes
/// (`given`, as for [`gguf_names_of`]); a name that does not evaluate is
/// left out, with a diagnostic at its entry.
fn bindings_of(program: &Program, given: &Values, diagnostics: &mut Vec<Diagnostic>) -> HashMap<String, String> {
    let Some(file) = &program.package.bindings else { return HashMap::new() };
    let dims = given.dims.iter().map(|(name, value)| (name.to_string(), *value)).collect();
    file.entries
        .iter()
        .filter_map(|(path, tensor, span)| match crate::package::gguf_names::instance_name(tensor, &dims) {
            Ok(name) => Some((path.clone(), name)),
            Err(why) => {
                diagnostics.push(
                    Diagnostic::error(Code::PackageError, *span, format!("binding `{path}`: {why}"))
                        .with_label("a tensor name's `{…}` is an expression over the card's sizes"),
                );
                None
            }
        })
        .collect()
}

/// `package`'s `bindings.json` for the instance its card makes (see
/// [`bindings_of`]): parameter path to checkpoint tensor name; empty
/// without one, or when the card does not evaluate, which `linnetc check`
/// reports.
pub fn bindings(package: &crate::package::Package) -> HashMap<String, String> {
    if package.bindings.is_none() {
        return HashMap::new();
    }
    names(package).0
}

/// `package`'s `bindings.json` and `gguf.json` for the instance its card
/// makes ([`bindings`], [`gguf_names`]), its program built once for both.
pub fn names(package: &crate::package::Package) -> (HashMap<String, String>, Option<GgufNames>) {
    let mut diagnostics = Vec::new();
    let program = Program::build(package, &mut diagnostics);
    match root_generics(&program, &mut diagnostics) {
        Some((_, given)) => {
            (bindings_of(&program, &given, &mut diagnostics), gguf_names_of(&program, &given, &mut diagnostics))
        }
        None => (HashMap::new(), None),
    }
}

/// `package`'s `gguf.json` for the instance its card makes (see
/// [`gguf_names_of`]); `None` without one, or when the card or an entry
/// does not evaluate, which `linnetc check` reports.
pub fn gguf_names(package: &crate::package::Package) -> Option<GgufNames> {
    package.gguf_names.as_ref()?;
    names(package).1
}

/// The root (a block, or a `type` naming one) as an instance over the
/// generics the model card sets, and the values it sets them to; a
/// `type`'s clauses are checked against them here.
pub fn root_generics(program: &Program, diagnostics: &mut Vec<Diagnostic>) -> Option<(SubTy, Values)> {
    let Some(nest) = &program.package.nest else {
        diagnostics.push(
            Diagnostic::error(
                Code::PackageError,
                Span::new(program.package.modules.first()?.file, 0..0),
                "the package has no nest.toml",
            )
            .with_label("a model card names the root block and its generics"),
        );
        return None;
    };
    let Some((root_name, root_span)) = &nest.root else {
        diagnostics.push(
            Diagnostic::error(Code::UnknownRoot, nest.source_span, "nest.toml names no root block")
                .with_label("add `root = \"Model\"` to `[source]`"),
        );
        return None;
    };
    match program.scopes.first().and_then(|scope| scope.get(root_name)) {
        Some(ItemRef::Block(id)) if program.blocks[*id].decl.kind == BlockKind::Block => {
            let block = &program.blocks[*id];
            let values = root_values(&block.generics, &block.name, block.decl.name.span, nest, diagnostics)?;
            Some((SubTy::concrete(*id, identity(&block.generics)), values))
        }
        Some(ItemRef::Alias(id)) => {
            let alias = &program.aliases[*id];
            let values = root_values(&alias.generics, &alias.name, alias.decl.name.span, nest, diagnostics)?;
            let before = diagnostics.len();
            check_clauses(&alias.clauses, &values, diagnostics);
            if diagnostics[before..].iter().any(Diagnostic::is_error) {
                return None;
            }
            Some((alias.target.clone()?, values))
        }
        _ => {
            let roots = program
                .blocks
                .iter()
                .filter(|b| b.module == 0 && b.decl.kind == BlockKind::Block)
                .map(|b| b.name.as_str())
                .chain(program.aliases.iter().filter(|a| a.module == 0).map(|a| a.name.as_str()));
            let unknown = Diagnostic::error(
                Code::UnknownRoot,
                *root_span,
                format!("no block or `type` `{root_name}` in the root module"),
            )
            .with_label("the root block is defined in the source file");
            diagnostics.push(suggest::did_you_mean(unknown, root_name, roots, true));
            None
        }
    }
}

/// Each generic given as itself.
fn identity(generics: &[GenericSig]) -> Subst {
    let mut subst = Subst::default();
    for generic in generics {
        match generic.kind {
            GenericKind::Dim => {
                subst.dims.insert(generic.name.clone(), Dim::generic(&generic.name));
            }
            GenericKind::Float => {
                subst.elems.insert(generic.name.clone(), Elem::Generic(generic.name.clone()));
            }
            GenericKind::Number => {
                subst.numbers.insert(generic.name.clone(), Number::Generic(generic.name.clone()));
            }
            GenericKind::Shape | GenericKind::Block => {}
        }
    }
    subst
}

/// The values `[generics]` gives the root's generics (a block's or a
/// `type`'s), defaults filling the rest. A dim may be given as an
/// expression over the others (`Conv = "2 * KeyHeads * KeyDim"`), so
/// that it follows them wherever they come from (`[config]`, `--set`).
fn root_values(
    generics: &[GenericSig],
    root_name: &str,
    root_span: Span,
    nest: &Nest,
    diagnostics: &mut Vec<Diagnostic>,
) -> Option<Values> {
    let mut values = Values::default();
    let mut ok = true;
    let mut derived = Vec::new();
    for entry in &nest.generics {
        let Some(generic) = generics.iter().find(|g| *g.name == entry.name) else {
            let names = generics.iter().map(|g| &*g.name);
            let unknown = Diagnostic::error(
                Code::UnknownGeneric,
                entry.name_span,
                format!("`{root_name}` has no generic `{}`", entry.name),
            )
            .with_label("not a generic of the root block")
            .with_secondary(root_span, "root block");
            diagnostics.push(suggest::did_you_mean(unknown, &entry.name, names, false));
            ok = false;
            continue;
        };
        let bad = |expected: &str| {
            Diagnostic::error(
                Code::BadGenericValue,
                entry.value_span,
                format!("`{}` is a {:?}: {expected}, found {}", entry.name, generic.kind, entry.value),
            )
            .with_label(expected.to_string())
            .with_secondary(generic.span, "declared here")
        };
        match (generic.kind, &entry.value) {
            (GenericKind::Dim, NestValue::Int(size)) if *size >= 0 => {
                values.dims.insert(generic.name.clone(), *size);
            }
            (GenericKind::Dim, NestValue::Text(expression)) => derived.push((generic, entry, expression)),
            (GenericKind::Dim, _) => {
                diagnostics.push(bad("expected a non-negative integer"));
                ok = false;
            }
            (GenericKind::Float, NestValue::Text(name)) if Dtype::parse(name).is_some_and(Dtype::is_float) => {
                values.elems.insert(generic.name.clone(), Dtype::parse(name).expect("checked"));
            }
            (GenericKind::Float, _) => {
                diagnostics.push(bad("expected \"bf16\", \"f16\" or \"f32\""));
                ok = false;
            }
            (GenericKind::Number, NestValue::Int(value)) => {
                values.numbers.insert(generic.name.clone(), *value as f64);
            }
            (GenericKind::Number, NestValue::Float(value)) if value.is_finite() => {
                values.numbers.insert(generic.name.clone(), *value);
            }
            (GenericKind::Number, _) => {
                diagnostics.push(bad("expected a finite number"));
                ok = false;
            }
            (GenericKind::Shape, _) => {
                diagnostics.push(bad("a variadic shape cannot be set"));
                ok = false;
            }
            (GenericKind::Block, _) => {
                diagnostics.push(bad("a block is chosen in the source: make the root a `type` that names it"));
                ok = false;
            }
        }
        values.spans.insert(generic.name.clone(), entry.value_span);
    }
    // In the card's order: one may use another given before it.
    for (generic, entry, expression) in derived {
        let known: HashMap<String, i64> = values.dims.iter().map(|(name, v)| (name.to_string(), *v)).collect();
        match gguf_names::evaluate(expression, &known) {
            Ok(size) if size >= 0 => {
                values.dims.insert(generic.name.clone(), size);
            }
            outcome => {
                let why = match outcome {
                    Ok(size) => format!("it comes to {size}"),
                    Err(error) => error.to_string(),
                };
                diagnostics.push(
                    Diagnostic::error(
                        Code::BadGenericValue,
                        entry.value_span,
                        format!("`{}` = \"{expression}\" is not a size: {why}", entry.name),
                    )
                    .with_label("an integer, or an expression over the card's other dims")
                    .with_secondary(generic.span, "declared here"),
                );
                ok = false;
            }
        }
    }
    for generic in generics {
        // A value given but refused above is not missing as well.
        let given = values.spans.contains_key(&generic.name);
        match (&generic.default, given) {
            (_, true) => {}
            (Some(GenericDefault::Elem(super::ty::Elem::Known(dtype))), false) => {
                values.elems.insert(generic.name.clone(), *dtype);
            }
            (Some(GenericDefault::Number(value)), false) => {
                values.numbers.insert(generic.name.clone(), *value);
            }
            (_, false) if generic.kind == GenericKind::Block => {
                diagnostics.push(
                    Diagnostic::error(
                        Code::MissingGeneric,
                        root_span,
                        format!("`{root_name}` has a block generic `{}`, which a model card cannot give", generic.name),
                    )
                    .with_label(
                        "make the root a `type` that names the block: `type Model<...> = Root<..., Block<...>>`",
                    )
                    .with_secondary(generic.span, "declared here"),
                );
                ok = false;
            }
            _ => {
                diagnostics.push(
                    Diagnostic::error(
                        Code::MissingGeneric,
                        nest.generics_span,
                        format!("[generics] gives no value for `{}`", generic.name),
                    )
                    .with_label(format!("add `{} = ...`", generic.name))
                    .with_secondary(generic.span, "declared here"),
                );
                ok = false;
            }
        }
    }
    ok.then_some(values)
}

/// The checkpoint's derived `[config]` values against the card's generics.
fn check_config(nest: &Nest, given: &Values, diagnostics: &mut Vec<Diagnostic>) {
    let sizes: HashMap<String, i64> = given.dims.iter().map(|(name, value)| (name.to_string(), *value)).collect();
    for check in &nest.config_checks {
        let problem = match gguf_names::evaluate(&check.expression, &sizes) {
            Ok(expected) if expected == check.found => continue,
            Ok(expected) => format!("the card's generics make `{}` {expected}", check.expression),
            Err(error) => format!("`{}` cannot be evaluated: {error}", check.expression),
        };
        diagnostics.push(
            Diagnostic::error(
                Code::CheckpointConfig,
                check.span,
                format!("the checkpoint's config.json says `{}` is {}, where {problem}", check.key, check.found),
            )
            .with_label("the card's `[config]` line")
            .with_secondary(check.found_at, "the checkpoint says this"),
        );
    }
}

fn check_clauses(clauses: &[Clause], values: &Values, diagnostics: &mut Vec<Diagnostic>) {
    for clause in clauses {
        let (Some(lhs), Some(rhs)) = (values.eval(&clause.lhs), values.eval(&clause.rhs)) else {
            continue;
        };
        if clause.op.holds_between(lhs, rhs) {
            continue;
        }
        // The divisor of `a % b == 0` is the likelier culprit; otherwise
        // the clause's first generic.
        let mut names = Vec::new();
        if let Some(Atom::Rem(_, divisor)) = clause.lhs.as_atom() {
            divisor.generics(&mut names);
        }
        clause.lhs.generics(&mut names);
        clause.rhs.generics(&mut names);
        let mut seen = BTreeSet::new();
        names.retain(|name| seen.insert(name.clone()));
        let given: Vec<String> = names
            .iter()
            .filter_map(|name| values.dims.get(name).map(|value| format!("{name} = {value}")))
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        let primary = names.iter().find_map(|name| values.spans.get(name)).copied().unwrap_or(clause.span);
        let mut diagnostic = Diagnostic::error(
            Code::UnsatisfiedWhere,
            primary,
            format!("{} breaks `{}`: {lhs} {} {rhs} is false", given.join(", "), clause.text, clause.op.symbol()),
        )
        .with_label("this value")
        .with_secondary(clause.span, "the clause it breaks");
        for name in names.iter().skip(1) {
            if let Some(span) = values.spans.get(name).filter(|span| **span != primary) {
                diagnostic = diagnostic.with_secondary(*span, format!("{name} is set here"));
            }
        }
        diagnostics.push(diagnostic);
    }
}

fn check_entries(program: &Program, root: usize, nest: &Nest, values: &Values, diagnostics: &mut Vec<Diagnostic>) {
    let block = &program.blocks[root];
    let mut ids: Vec<usize> = block.fns.values().copied().collect();
    ids.sort_unstable();
    let entries: Vec<_> = ids.into_iter().map(|id| &program.fns[id]).filter(|f| f.is_entry()).collect();
    for entry in &nest.check {
        let known = entries.iter().any(|f| f.generics.iter().any(|g| *g.name == entry.name));
        // The card's `[check]` dims are the model's: a drafter may take some.
        if !known && !nest.drafting {
            diagnostics.push(
                Diagnostic::warning(
                    Code::UnknownCheckDim,
                    entry.name_span,
                    format!("no entry of `{}` has a generic `{}`", block.name, entry.name),
                )
                .with_label("not used"),
            );
        }
    }
    if let Some((name, span)) = &nest.entry {
        if !entries.iter().any(|f| &f.name == name) {
            let names = entries.iter().map(|f| f.name.as_str());
            let unknown =
                Diagnostic::error(Code::UnknownEntry, *span, format!("`{}` has no entry `{name}`", block.name))
                    .with_label("not an entry of the root block");
            diagnostics.push(suggest::did_you_mean(unknown, name, names, true));
        }
    }
    for function in entries {
        let mut with_dims = values.clone();
        for generic in &function.generics {
            let Some(entry) = nest.check.iter().find(|e| *e.name == *generic.name) else { continue };
            match entry.value {
                NestValue::Int(size) if size >= 0 => {
                    with_dims.dims.insert(generic.name.clone(), size);
                    with_dims.spans.insert(generic.name.clone(), entry.value_span);
                }
                _ => diagnostics.push(
                    Diagnostic::error(
                        Code::BadGenericValue,
                        entry.value_span,
                        format!("`{}` is a dim: expected a non-negative integer", entry.name),
                    )
                    .with_label("not a size"),
                ),
            }
        }
        check_clauses(&function.clauses, &with_dims, diagnostics);
    }
}

/// Every parameter's path under the root, by walking the subs with
/// concrete counts; with `structural`, array positions are written `#`.
fn parameter_paths(
    program: &Program,
    block: usize,
    values: &Values,
    prefix: &str,
    structural: bool,
    out: &mut Vec<String>,
) {
    let sig = &program.blocks[block];
    for (name, _, _) in &sig.params {
        out.push(format!("{prefix}{name}"));
    }
    for sub in &sig.subs {
        let Some((target, inner)) = sub.target.as_ref().and_then(|target| values.instance(target)) else { continue };
        match &sub.ty {
            Ty::SubArray(..) if structural => {
                parameter_paths(program, target, &inner, &format!("{prefix}{}.#.", sub.name), structural, out)
            }
            Ty::SubArray(_, count) => {
                for index in 0..values.eval(count).unwrap_or(0) {
                    parameter_paths(
                        program,
                        target,
                        &inner,
                        &format!("{prefix}{}.{index}.", sub.name),
                        structural,
                        out,
                    );
                }
            }
            _ => parameter_paths(program, target, &inner, &format!("{prefix}{}.", sub.name), structural, out),
        }
    }
}

/// Every parameter of the root has an entry in `covers` (`entries`: each
/// path and its key's place), and every entry names a parameter.
fn check_coverage(
    program: &Program,
    root: usize,
    values: &Values,
    covers: &Covers,
    entries: Vec<(&str, Span)>,
    diagnostics: &mut Vec<Diagnostic>,
) {
    let mut paths = Vec::new();
    parameter_paths(program, root, values, "", false, &mut paths);
    let mut shapes = Vec::new();
    parameter_paths(program, root, values, "", true, &mut shapes);
    let shapes: BTreeSet<String> = shapes.into_iter().collect();
    let bound: HashMap<&str, Span> = entries.iter().copied().collect();
    let missing: Vec<&String> = paths.iter().filter(|path| !bound.contains_key(path.as_str())).collect();
    if !missing.is_empty() {
        let shown: Vec<&str> = missing.iter().take(8).map(|p| p.as_str()).collect();
        let more = if missing.len() > shown.len() {
            format!(" and {} more", missing.len() - shown.len())
        } else {
            String::new()
        };
        diagnostics.push(
            Diagnostic::error(
                covers.missing,
                Span::new(covers.file, 0..1),
                format!("{} parameter(s) have no {}: {}{more}", missing.len(), covers.what, shown.join(", ")),
            )
            .with_label(format!("{} says where every parameter's tensor is", covers.name)),
        );
    }
    for (path, span) in entries {
        let structural: Vec<&str> =
            path.split('.').map(|part| if part.bytes().all(|b| b.is_ascii_digit()) { "#" } else { part }).collect();
        if !shapes.contains(&structural.join(".")) {
            let unknown =
                Diagnostic::warning(Code::UnknownBinding, span, format!("`{path}` is not a parameter of this model"))
                    .with_label("binds nothing");
            diagnostics.push(suggest::did_you_mean(unknown, path, paths.iter().map(String::as_str), true));
        }
    }
}
