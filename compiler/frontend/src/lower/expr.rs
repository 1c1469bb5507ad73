//! Lowering function bodies: statements, tensor-level expressions
//! (broadcast arithmetic, slices, built-ins, inlined calls) and
//! element-level ones (the bodies of index definitions and reductions),
//! all into `Compute` nodes.

use super::{unsupported, Builder, Instance, Lowerer, Result, Val};
use crate::builtin::{self, Builtin};
use crate::sema::program::{GenericSig, ItemRef};
use crate::sema::ty::{self, Axis, Subst, Ty};
use crate::source::Span;
use crate::syntax::ast::{self, BinOp, CmpOp, Expr, ExprKind, GenericKind, IndexItem, Stmt, UnOp};
use linnet_ir::dim::Dim;
use linnet_ir::Dtype;
use linnet_ir::{BinaryOp, Intrinsic, Node, NodeKind, ReduceOp, Scalar, UnaryOp, Value};
use std::collections::HashMap;

/// An index variable of the index definition or reduction being lowered.
enum IndexVar {
    One {
        id: u32,
        extent: Option<Dim>,
    },
    /// `*s`: its indices, once its first use says how many.
    Group {
        ids: Option<Vec<u32>>,
        extents: Vec<Dim>,
    },
}

/// An element-level result: a scalar expression, or a whole value that is
/// about to be indexed (or is a rank-0 tensor, a literal, a dim).
enum Elem {
    Scalar(Scalar),
    Val(Val),
}

pub(crate) struct Frame<'l, 'p, 'a> {
    lowerer: &'l mut Lowerer<'p, 'a>,
    builder: &'l mut Builder,
    instance: Option<Instance>,
    module: usize,
    env: Subst,
    locals: Vec<HashMap<String, Val>>,
    indices: Vec<(String, IndexVar)>,
    generics: Vec<GenericSig>,
    /// Whether this is a trait's default method, whose calls by name reach
    /// the instance's functions and the trait's other defaults.
    in_trait: bool,
    /// The path of the innermost block instance the code runs in (a free
    /// function runs in its caller's), for messages: `groups.0.linear.1.mlp`.
    place: String,
}

fn binary_op(op: BinOp) -> BinaryOp {
    match op {
        BinOp::Add => BinaryOp::Add,
        BinOp::Sub => BinaryOp::Sub,
        BinOp::Mul => BinaryOp::Mul,
        BinOp::Div => BinaryOp::Div,
        BinOp::Rem => BinaryOp::Rem,
        BinOp::Cmp(op) => BinaryOp::Cmp(op),
        BinOp::And => BinaryOp::And,
        BinOp::Or => BinaryOp::Or,
    }
}

fn result_dtype(op: BinaryOp, operands: Dtype) -> Dtype {
    if matches!(op, BinaryOp::Cmp(_)) {
        Dtype::Bool
    } else {
        operands
    }
}

/// A literal as a scalar of the type its partner has.
fn literal(value: f64, is_float: bool, dtype: Option<Dtype>) -> Scalar {
    match dtype {
        Some(dtype) if dtype.is_float() => Scalar::Float(value, dtype),
        Some(dtype) if dtype.is_int() => Scalar::Int(value as i64, dtype),
        _ if is_float => Scalar::Float(value, Dtype::F32),
        _ => Scalar::Int(value as i64, Dtype::I64),
    }
}

fn cast(scalar: Scalar, dtype: Dtype) -> Scalar {
    if scalar.dtype() == dtype {
        scalar
    } else {
        Scalar::Cast(Box::new(scalar), dtype)
    }
}

impl<'l, 'p, 'a> Frame<'l, 'p, 'a> {
    pub fn new(
        lowerer: &'l mut Lowerer<'p, 'a>,
        builder: &'l mut Builder,
        instance: Option<Instance>,
        module: usize,
        env: Subst,
        locals: HashMap<String, Val>,
    ) -> Self {
        let place = instance.as_ref().map(|i| i.path.trim_end_matches('.').to_string()).unwrap_or_default();
        Frame {
            lowerer,
            builder,
            instance,
            module,
            env,
            locals: vec![locals],
            indices: Vec::new(),
            generics: Vec::new(),
            in_trait: false,
            place,
        }
    }

    /// Lowers a body; its value is what it returns.
    pub fn body(&mut self, stmts: &[Stmt]) -> Result<Val> {
        let mut returned = Val::Unit;
        self.stmts(stmts, &mut returned)?;
        Ok(returned)
    }

    fn stmts(&mut self, stmts: &[Stmt], returned: &mut Val) -> Result<()> {
        for stmt in stmts {
            match stmt {
                Stmt::Let { pattern, value, span } => match pattern {
                    ast::Pattern::Name(name) => {
                        let value = self.expr(value)?;
                        self.bind(&name.name, value);
                    }
                    ast::Pattern::Tuple(names, _) => match self.expr(value)? {
                        Val::Tuple(items) if items.len() == names.len() => {
                            for (name, item) in names.iter().zip(items) {
                                if let Some(name) = name {
                                    self.bind(&name.name, item);
                                }
                            }
                        }
                        _ => return Err(unsupported(*span, "a tuple pattern takes a tuple")),
                    },
                    ast::Pattern::Indexed(name, vars) => {
                        let value = self.index_definition(vars, value)?;
                        self.bind(&name.name, Val::Tensor(value));
                    }
                },
                Stmt::Var { name, value, .. } => {
                    let value = self.expr(value)?;
                    self.bind(&name.name, value);
                }
                Stmt::Assign { target, value, span } => {
                    let value = self.expr(value)?;
                    self.assign(target, value, *span)?;
                }
                Stmt::Return { value, .. } => *returned = self.expr(value)?,
                Stmt::StaticFor { var, index: position, over, body, span } => {
                    let Some(Val::SubArray(element, count)) = self.lookup(&over.name)? else {
                        return Err(unsupported(*span, "`static for` over something that is not a sub array"));
                    };
                    for index in 0..count {
                        let instance = Instance { path: format!("{}{index}.", element.path), ..(*element).clone() };
                        let mut bound = HashMap::from([(var.name.clone(), Val::Sub(Box::new(instance)))]);
                        if let Some(position) = position {
                            bound.insert(position.name.clone(), Val::Literal(index as f64, false));
                        }
                        self.locals.push(bound);
                        let result = self.stmts(body, returned);
                        self.locals.pop();
                        result?;
                    }
                }
                Stmt::Expr(expr) => {
                    self.expr(expr)?;
                }
                Stmt::Error(span) => return Err(unsupported(*span, "a statement that did not parse")),
            }
        }
        Ok(())
    }

    fn bind(&mut self, name: &str, value: Val) {
        self.locals.last_mut().expect("a scope").insert(name.to_string(), value);
    }

    fn assign(&mut self, target: &ast::Ident, value: Val, span: Span) -> Result<()> {
        for scope in self.locals.iter_mut().rev() {
            if let Some(slot) = scope.get_mut(&target.name) {
                *slot = value;
                return Ok(());
            }
        }
        let Some(instance) = &self.instance else { return Err(unsupported(span, "assignment to an unknown name")) };
        let path = format!("{}{}", instance.path, target.name);
        let Some(&state) = self.lowerer.states.get(&path) else {
            return Err(unsupported(span, "assignment to an unknown name"));
        };
        let value = self.tensor(value, span, Some(self.lowerer.model.states[state].dtype))?;
        self.builder.state_values.insert(state, value);
        if !self.builder.written.contains(&state) {
            self.builder.written.push(state);
        }
        Ok(())
    }

    /// A name's value: a local, a member of the block (a trait's default
    /// has none), a generic, a constant.
    fn lookup(&mut self, name: &str) -> Result<Option<Val>> {
        if let Some(value) = self.locals.iter().rev().find_map(|scope| scope.get(name)) {
            return Ok(Some(value.clone()));
        }
        if let Some(instance) = self.instance.clone().filter(|_| !self.in_trait) {
            let block = &self.lowerer.program.blocks[instance.block];
            if let Some(at) = block.subs.iter().position(|sub| sub.name == name) {
                let sub = &block.subs[at];
                return Ok(match &sub.ty {
                    Ty::SubArray(_, count) => {
                        let count = instance.env.dim(count).as_constant().unwrap_or(0) as usize;
                        let element = self.lowerer.sub_instance(&instance, at, format!("{}{name}.", instance.path));
                        element.map(|element| Val::SubArray(Box::new(element), count))
                    }
                    _ => self
                        .lowerer
                        .sub_instance(&instance, at, format!("{}{name}.", instance.path))
                        .map(|sub| Val::Sub(Box::new(sub))),
                });
            }
            let path = format!("{}{name}", instance.path);
            if let Some(&param) = self.lowerer.params.get(&path) {
                let info = &self.lowerer.model.params[param];
                return Ok(Some(Val::Tensor(self.builder.member(NodeKind::Param(param), &info.shape, info.dtype))));
            }
            if let Some(&state) = self.lowerer.states.get(&path) {
                let info = &self.lowerer.model.states[state];
                return Ok(Some(Val::Tensor(self.builder.member(NodeKind::State(state), &info.shape, info.dtype))));
            }
        }
        if let Some(dim) = self.env.dims.get(name) {
            return Ok(Some(Val::Dim(dim.clone())));
        }
        // Instantiation gives every number setting a value from the card.
        if let Some(ty::Number::Known(value)) = self.env.numbers.get(name) {
            return Ok(Some(Val::Literal(*value, true)));
        }
        if let Some(ItemRef::Const(_)) = self.lowerer.scope_item(self.module, name) {
            return Ok(Some(self.constant(name)?));
        }
        if name == "none" {
            return Ok(Some(Val::Option(None)));
        }
        Ok(None)
    }

    /// The value of the constant `name` resolves to in this module (its
    /// declaration is the one whose name the program recorded for it).
    fn constant(&mut self, name: &str) -> Result<Val> {
        let program = self.lowerer.program;
        let Some(ItemRef::Const(id)) = program.scopes[self.module].get(name) else {
            let module = &program.package.modules[self.module];
            return Err(unsupported(crate::source::Span::new(module.file, 0..0), format!("unknown constant `{name}`")));
        };
        let declared = program.consts[*id].span;
        let constant = program
            .package
            .modules
            .iter()
            .flat_map(|module| &module.ast.items)
            .find_map(|item| match item {
                ast::Item::Const(constant) if constant.name.span == declared => Some(constant),
                _ => None,
            })
            .expect("every constant id has a declaration");
        match &constant.value.kind {
            ExprKind::Float(value) => Ok(Val::Literal(*value, true)),
            ExprKind::Int(value) => Ok(Val::Literal(*value as f64, false)),
            _ => Err(unsupported(constant.value.span, "a constant is a literal")),
        }
    }

    /// A value as a tensor node; literals and dims become scalars of
    /// `dtype` (or their own kind).
    fn tensor(&mut self, value: Val, span: Span, dtype: Option<Dtype>) -> Result<Value> {
        match value {
            Val::Tensor(value) => Ok(value),
            Val::Literal(value, is_float) => Ok(self.builder.compute(Vec::new(), literal(value, is_float, dtype))),
            Val::Dim(dim) => {
                let scalar = cast(Scalar::Dim(dim), dtype.filter(|d| d.is_int()).unwrap_or(Dtype::I64));
                Ok(self.builder.compute(Vec::new(), scalar))
            }
            other => Err(unsupported(span, format!("{other:?} is not a tensor"))),
        }
    }

    fn static_dim(&self, expr: &Expr) -> Option<Dim> {
        crate::sema::static_dim(expr, &|name| {
            let shadowed = self.indices.iter().any(|(n, _)| *n == name.name)
                || self.locals.iter().any(|s| s.contains_key(&name.name));
            if shadowed {
                None
            } else {
                self.env.dims.get(name.name.as_str()).cloned()
            }
        })
    }

    /// A tensor-level expression.
    pub fn expr(&mut self, expr: &Expr) -> Result<Val> {
        let outer = self.builder.span.replace(expr.span);
        let value = self.expr_here(expr);
        self.builder.span = outer;
        value
    }

    /// An expression, with the nodes it makes attributed to it.
    fn expr_here(&mut self, expr: &Expr) -> Result<Val> {
        if let ExprKind::Binary(..) = expr.kind {
            if let Some(dim) = self.static_dim(expr) {
                return Ok(Val::Dim(dim));
            }
        }
        match &expr.kind {
            ExprKind::Int(value) => Ok(Val::Literal(*value as f64, false)),
            ExprKind::Float(value) => Ok(Val::Literal(*value, true)),
            ExprKind::Bool(value) => Ok(Val::Tensor(self.builder.compute(Vec::new(), Scalar::Bool(*value)))),
            ExprKind::Name(name) => {
                self.lookup(&name.name)?.ok_or_else(|| unsupported(name.span, format!("unknown name `{}`", name.name)))
            }
            ExprKind::Tuple(items) => Ok(Val::Tuple(items.iter().map(|item| self.expr(item)).collect::<Result<_>>()?)),
            ExprKind::Call { callee, generics, args } => self.call(callee, generics, args, expr.span),
            ExprKind::Method { receiver, method, generics, args } => {
                let Val::Sub(instance) = self.expr(receiver)? else {
                    return Err(unsupported(receiver.span, "a method of something that is not a sub"));
                };
                let fn_id = self
                    .lowerer
                    .method(&instance, &method.name)
                    .ok_or_else(|| unsupported(method.span, "unknown method"))?;
                let args = args.iter().map(|arg| self.expr(&arg.value)).collect::<Result<Vec<_>>>()?;
                self.inline(fn_id, Some(*instance), generics, args, expr.span)
            }
            ExprKind::If { cond, then, otherwise } => {
                let cond = self.expr(cond)?;
                let cond = self.tensor(cond, expr.span, Some(Dtype::Bool))?;
                let then = self.expr(then)?;
                let otherwise = self.expr(otherwise)?;
                self.select_values(cond, then, otherwise, expr.span)
            }
            ExprKind::Unary(op, operand) => {
                let value = self.expr(operand)?;
                match (op, value) {
                    (UnOp::Neg, Val::Literal(v, f)) => Ok(Val::Literal(-v, f)),
                    (UnOp::Neg, Val::Dim(d)) => Ok(Val::Dim(d.scale(-1))),
                    (op, value) => {
                        let value = self.tensor(value, expr.span, None)?;
                        let op = if *op == UnOp::Neg { UnaryOp::Neg } else { UnaryOp::Not };
                        Ok(Val::Tensor(
                            self.map(&[value], |loads| Scalar::Unary(op, Box::new(loads[0].clone()), loads[0].dtype())),
                        ))
                    }
                }
            }
            ExprKind::Binary(op, left, right) => {
                let left = self.expr(left)?;
                let right = self.expr(right)?;
                self.binary(binary_op(*op), left, right, expr.span)
            }
            ExprKind::Index { base, items } => {
                let base = self.expr(base)?;
                let base = self.tensor(base, expr.span, None)?;
                self.slice(base, items, expr.span)
            }
            // A reduction to a scalar: an index definition without indices.
            ExprKind::Reduce { .. } => Ok(Val::Tensor(self.index_definition(&[], expr)?)),
            ExprKind::List(_) | ExprKind::Str(_) | ExprKind::Error => Err(unsupported(expr.span, "not a value")),
        }
    }

    /// `select(cond, a, b)` over whole values (tuples elementwise).
    fn select_values(&mut self, cond: Value, then: Val, otherwise: Val, span: Span) -> Result<Val> {
        match (then, otherwise) {
            (Val::Tuple(a), Val::Tuple(b)) if a.len() == b.len() => Ok(Val::Tuple(
                a.into_iter().zip(b).map(|(a, b)| self.select_values(cond, a, b, span)).collect::<Result<_>>()?,
            )),
            (a, b) => {
                let dtype = self.dtype_of(&a).or(self.dtype_of(&b));
                let a = self.tensor(a, span, dtype)?;
                let b = self.tensor(b, span, dtype)?;
                Ok(Val::Tensor(self.map(&[cond, a, b], |loads| {
                    let dtype = loads[1].dtype();
                    Scalar::Select(
                        Box::new(loads[0].clone()),
                        Box::new(loads[1].clone()),
                        Box::new(loads[2].clone()),
                        dtype,
                    )
                })))
            }
        }
    }

    fn dtype_of(&self, value: &Val) -> Option<Dtype> {
        match value {
            Val::Tensor(value) => Some(self.builder.dtype(*value)),
            _ => None,
        }
    }

    /// The broadcast shape of several values.
    fn broadcast_shape(&self, values: &[Value]) -> Vec<Dim> {
        let rank = values.iter().map(|v| self.builder.shape(*v).len()).max().unwrap_or(0);
        let mut shape = vec![Dim::constant(1); rank];
        for value in values {
            let own = self.builder.shape(*value);
            for (at, dim) in own.iter().enumerate() {
                let slot = &mut shape[rank - own.len() + at];
                if slot.as_constant() == Some(1) {
                    *slot = dim.clone();
                }
            }
        }
        shape
    }

    /// A load of `value` at the point of a broadcast shape of `rank` axes.
    fn broadcast_load(&self, value: Value, rank: usize) -> Scalar {
        let own = self.builder.shape(value);
        let offset = rank - own.len();
        let positions = own
            .iter()
            .enumerate()
            .map(|(at, dim)| {
                if dim.as_constant() == Some(1) {
                    Scalar::Int(0, Dtype::I64)
                } else {
                    Scalar::Index((offset + at) as u32, Dtype::I64)
                }
            })
            .collect();
        Scalar::Load(value, positions, self.builder.dtype(value))
    }

    /// An elementwise map over broadcast values.
    fn map(&mut self, values: &[Value], combine: impl FnOnce(&[Scalar]) -> Scalar) -> Value {
        let shape = self.broadcast_shape(values);
        let loads: Vec<Scalar> = values.iter().map(|v| self.broadcast_load(*v, shape.len())).collect();
        let scalar = combine(&loads);
        self.builder.compute(shape, scalar)
    }

    fn binary(&mut self, op: BinaryOp, left: Val, right: Val, span: Span) -> Result<Val> {
        if let (Val::Literal(a, fa), Val::Literal(b, fb)) = (&left, &right) {
            if let BinaryOp::Cmp(cmp) = op {
                let holds = cmp.holds(a.partial_cmp(b));
                return Ok(Val::Tensor(self.builder.compute(Vec::new(), Scalar::Bool(holds))));
            }
            if matches!(op, BinaryOp::And | BinaryOp::Or) {
                return Err(unsupported(span, "a logical operation of two numbers"));
            }
            return Ok(fold(op, (*a, *fa), (*b, *fb)));
        }
        let dtype = self.dtype_of(&left).or(self.dtype_of(&right));
        let left = self.tensor(left, span, dtype)?;
        let right = self.tensor(right, span, dtype)?;
        Ok(Val::Tensor(self.map(&[left, right], |loads| {
            let dtype = result_dtype(op, loads[0].dtype());
            Scalar::Binary(op, Box::new(loads[0].clone()), Box::new(loads[1].clone()), dtype)
        })))
    }

    /// `x[...]` outside an index definition: slices, fixed positions,
    /// run-time positions.
    fn slice(&mut self, base: Value, items: &[IndexItem], span: Span) -> Result<Val> {
        let shape = self.builder.shape(base).to_vec();
        if items.len() != shape.len() {
            return Err(unsupported(span, "indexing that does not name every axis"));
        }
        let mut out_shape = Vec::new();
        let mut positions = Vec::new();
        for (item, dim) in items.iter().zip(&shape) {
            match item {
                IndexItem::Full(_) => {
                    positions.push(Scalar::Index(out_shape.len() as u32, Dtype::I64));
                    out_shape.push(dim.clone());
                }
                IndexItem::Range(lo, hi, range_span) => {
                    let lo = lo.as_ref().map_or(Some(Dim::default()), |lo| self.static_dim(lo));
                    let hi = hi.as_ref().map_or(Some(dim.clone()), |hi| self.static_dim(hi));
                    let (Some(lo), Some(hi)) = (lo, hi) else {
                        return Err(unsupported(*range_span, "a slice bound known only at run time"));
                    };
                    let index = Scalar::Index(out_shape.len() as u32, Dtype::I64);
                    positions.push(Scalar::Binary(
                        BinaryOp::Add,
                        Box::new(index),
                        Box::new(Scalar::Dim(lo.clone())),
                        Dtype::I64,
                    ));
                    out_shape.push(hi.sub(&lo));
                }
                IndexItem::At(position) => match self.static_dim(position) {
                    Some(dim) => positions.push(Scalar::Dim(dim)),
                    None => {
                        let value = self.expr(position)?;
                        let value = self.tensor(value, span, Some(Dtype::I64))?;
                        positions.push(cast(Scalar::Load(value, Vec::new(), self.builder.dtype(value)), Dtype::I64));
                    }
                },
                IndexItem::Variadic(name) => {
                    return Err(unsupported(name.span, "a variadic index outside an index definition"))
                }
            }
        }
        let dtype = self.builder.dtype(base);
        Ok(Val::Tensor(self.builder.compute(out_shape, Scalar::Load(base, positions, dtype))))
    }

    /// Resolves an explicit generic argument to a dim of this frame.
    fn dim_arg(&self, arg: &ast::GenericArg, span: Span) -> Result<Dim> {
        let ast::GenericArg::Dim(expr) = arg else { return Err(unsupported(span, "a type where a dim is expected")) };
        self.dim_expr(expr).ok_or_else(|| unsupported(span, "a dim that does not resolve"))
    }

    fn dim_expr(&self, expr: &ast::DimExpr) -> Option<Dim> {
        Some(match expr {
            ast::DimExpr::Int(value, _) => Dim::constant(*value as i64),
            ast::DimExpr::Name(ident) => self.env.dims.get(ident.name.as_str())?.clone(),
            ast::DimExpr::Binary(op, a, b, _) => {
                let (a, b) = (self.dim_expr(a)?, self.dim_expr(b)?);
                match op {
                    ast::DimOp::Add => a.add(&b),
                    ast::DimOp::Sub => a.sub(&b),
                    ast::DimOp::Mul => a.mul(&b),
                    ast::DimOp::Div => a.div(&b),
                    ast::DimOp::Rem => a.rem(&b),
                }
            }
            ast::DimExpr::Error(_) => return None,
        })
    }

    /// Resolves an explicit argument of an `f32` generic to its value.
    fn number_arg(&self, arg: &ast::GenericArg, span: Span) -> Result<f64> {
        match arg {
            ast::GenericArg::Number(value, _) => Ok(*value),
            ast::GenericArg::Dim(ast::DimExpr::Int(value, _)) => Ok(*value as f64),
            ast::GenericArg::Dim(ast::DimExpr::Name(ident)) => match self.env.numbers.get(ident.name.as_str()) {
                Some(ty::Number::Known(value)) => Ok(*value),
                _ => Err(unsupported(span, "a number that does not resolve")),
            },
            _ => Err(unsupported(span, "a type where a number is expected")),
        }
    }

    fn elem_arg(&self, arg: &ast::GenericArg, span: Span) -> Result<Dtype> {
        if let ast::GenericArg::Dim(ast::DimExpr::Name(ident)) = arg {
            if let Some(dtype) = Dtype::parse(&ident.name) {
                return Ok(dtype);
            }
            if let Some(ty::Elem::Known(dtype)) = self.env.elems.get(ident.name.as_str()) {
                return Ok(*dtype);
            }
        }
        Err(unsupported(span, "an element type that does not resolve"))
    }

    fn call(
        &mut self,
        callee: &ast::Ident,
        generics: &[ast::GenericArg],
        args: &[ast::Arg],
        span: Span,
    ) -> Result<Val> {
        if builtin::lookup(&callee.name).is_some() {
            return self.builtin(callee, generics, args, span);
        }
        let own = self.instance.as_ref().and_then(|instance| match self.in_trait {
            true => self.lowerer.method(instance, &callee.name),
            false => self.lowerer.program.blocks[instance.block].fns.get(&callee.name).copied(),
        });
        let fn_id = match own {
            Some(id) => id,
            None => match self.lowerer.scope_item(self.module, &callee.name) {
                Some(ItemRef::Fn(id)) => id,
                _ => return Err(unsupported(callee.span, format!("unknown function `{}`", callee.name))),
            },
        };
        let args = args.iter().map(|arg| self.expr(&arg.value)).collect::<Result<Vec<_>>>()?;
        let instance = if own.is_some() { self.instance.clone() } else { None };
        self.inline(fn_id, instance, generics, args, span)
    }

    /// Inlines a call: binds the callee's generics (given or from the
    /// arguments' shapes) and lowers its body; intrinsics become nodes.
    fn inline(
        &mut self,
        fn_id: usize,
        instance: Option<Instance>,
        explicit: &[ast::GenericArg],
        args: Vec<Val>,
        span: Span,
    ) -> Result<Val> {
        let program = self.lowerer.program;
        let function = &program.fns[fn_id];
        let in_trait = program.is_trait_function(function);
        let mut env = match (&instance, in_trait) {
            (Some(instance), true) => instance.bound.as_ref().map_or_else(Subst::default, |bound| bound.env.clone()),
            (Some(instance), false) => instance.env.clone(),
            (None, _) => Subst::default(),
        };
        for (generic, arg) in function.generics.iter().zip(explicit) {
            match generic.kind {
                GenericKind::Dim => {
                    let dim = self.dim_arg(arg, span)?;
                    env.dims.insert(generic.name.clone(), dim);
                }
                GenericKind::Float => {
                    let dtype = self.elem_arg(arg, span)?;
                    env.elems.insert(generic.name.clone(), ty::Elem::Known(dtype));
                }
                GenericKind::Number => {
                    let value = self.number_arg(arg, span)?;
                    env.numbers.insert(generic.name.clone(), ty::Number::Known(value));
                }
                GenericKind::Shape => return Err(unsupported(span, "an explicit variadic shape")),
                // Refused by the checker: a function has no block generics.
                GenericKind::Block => return Err(unsupported(span, "a block generic of a function")),
            }
        }
        let own: Vec<_> = function.generics.iter().map(|g| g.name.clone()).collect();
        for ((_, param_ty, _), arg) in function.params.iter().zip(&args) {
            if let (Ty::Tensor(param), Val::Tensor(value)) = (param_ty, arg) {
                let shape = self.builder.shape(*value).to_vec();
                let dtype = self.builder.dtype(*value);
                if let ty::Elem::Generic(name) = &param.elem {
                    if own.contains(name) {
                        env.elems.entry(name.clone()).or_insert(ty::Elem::Known(dtype));
                    }
                }
                let shape_at = param.axes.iter().position(|a| matches!(a, Axis::Shape(_)));
                let after = shape_at.map_or(0, |at| param.axes.len() - at - 1);
                for (at, axis) in param.axes.iter().enumerate() {
                    let arg_at = match shape_at {
                        Some(s) if at > s => shape.len() - after + (at - s - 1),
                        _ => at,
                    };
                    match axis {
                        Axis::Shape(name) if own.contains(name) => {
                            env.shapes.entry(name.clone()).or_insert_with(|| {
                                shape[at..shape.len() - after].iter().cloned().map(Axis::Dim).collect()
                            });
                        }
                        Axis::Dim(dim) => {
                            if let Some(name) = dim.as_generic() {
                                if own.contains(name) && arg_at < shape.len() {
                                    env.dims.entry(name.clone()).or_insert_with(|| shape[arg_at].clone());
                                }
                            }
                        }
                        _ => {}
                    }
                }
            }
        }
        let kernel = super::library::kernel_of(program.module_name(function.module), &function.name)
            .filter(|_| self.lowerer.lowering.library_kernels);
        if function.decl.kind == ast::FnKind::Intrinsic || kernel.is_some() {
            let intrinsic = match kernel {
                Some(kernel) => kernel,
                None => Intrinsic::from_name(&function.name)
                    .ok_or_else(|| unsupported(span, format!("no intrinsic `{}`", function.name)))?,
            };
            let (shape, dtype) = self.lowerer.tensor_type(&function.ret, &env, span)?;
            let mut values = Vec::new();
            for ((_, param_ty, _), arg) in function.params.iter().zip(args) {
                let value = match (param_ty, arg) {
                    // An absent mask admits every key.
                    (Ty::Option(Some(inner)), Val::Option(None)) => {
                        let (shape, _) = self.lowerer.tensor_type(inner, &env, span)?;
                        Val::Tensor(self.builder.compute(shape, Scalar::Bool(true)))
                    }
                    (Ty::Option(Some(_)), Val::Option(Some(inner))) => *inner,
                    (_, arg) => arg,
                };
                let param_ty = match param_ty {
                    Ty::Option(Some(inner)) => inner,
                    other => other,
                };
                let (_, param_dtype) = self.lowerer.tensor_type(param_ty, &env, span)?;
                values.push(self.tensor(value, span, Some(param_dtype))?);
            }
            let node = Node { kind: NodeKind::Intrinsic(intrinsic, values), shape, dtype, source: None };
            return Ok(Val::Tensor(self.builder.push(node)));
        }
        let mut locals = HashMap::new();
        for ((name, param_ty, _), arg) in function.params.iter().zip(args) {
            let arg = match (param_ty, arg) {
                (Ty::Tensor(tensor), Val::Literal(value, is_float)) if tensor.axes.is_empty() => {
                    let dtype = env.dtype(&tensor.elem);
                    Val::Tensor(self.builder.compute(Vec::new(), literal(value, is_float, dtype)))
                }
                (_, arg) => arg,
            };
            locals.insert(name.clone(), arg);
        }
        let mut generics = function.generics.clone();
        if let Some(block) = function.block {
            generics.extend(program.blocks[block].generics.iter().cloned());
        }
        let body = function.decl.body.as_deref().unwrap_or_default();
        let caller_place = self.place.clone();
        let mut frame = Frame::new(self.lowerer, self.builder, instance, function.module, env, locals);
        if frame.place.is_empty() {
            frame.place = caller_place;
        }
        frame.generics = generics;
        frame.in_trait = in_trait;
        frame.body(body)
    }

    fn list_dims(&self, list: &Expr) -> Result<Vec<Dim>> {
        let ExprKind::List(items) = &list.kind else { return Err(unsupported(list.span, "expected a list")) };
        items.iter().map(|item| self.static_dim(item).ok_or_else(|| unsupported(item.span, "not a dim"))).collect()
    }

    fn builtin(
        &mut self,
        callee: &ast::Ident,
        generics: &[ast::GenericArg],
        args: &[ast::Arg],
        span: Span,
    ) -> Result<Val> {
        let positional: Vec<&Expr> = args.iter().filter(|a| a.name.is_none()).map(|a| &a.value).collect();
        let signature =
            builtin::lookup(&callee.name).ok_or_else(|| unsupported(callee.span, format!("`{}`", callee.name)))?;
        match signature.builtin {
            Builtin::Reshape => {
                let value = self.expr(positional[0])?;
                let value = self.tensor(value, span, None)?;
                let shape = self.list_dims(positional[1])?;
                Ok(Val::Tensor(self.reshape(value, shape)))
            }
            Builtin::Permute => {
                let value = self.expr(positional[0])?;
                let value = self.tensor(value, span, None)?;
                let ExprKind::List(items) = &positional[1].kind else {
                    return Err(unsupported(span, "permute takes a list"));
                };
                // The checker admits only integer literals here; anything
                // else is refused, never read as axis 0.
                let order: Vec<usize> = items
                    .iter()
                    .map(|i| match i.kind {
                        ExprKind::Int(v) => Ok(v as usize),
                        _ => Err(unsupported(i.span, "a permutation's axis that is not an integer literal")),
                    })
                    .collect::<std::result::Result<_, _>>()?;
                let shape = self.builder.shape(value).to_vec();
                let out_shape: Vec<Dim> = order.iter().map(|&at| shape[at].clone()).collect();
                let mut positions = vec![Scalar::Int(0, Dtype::I64); shape.len()];
                for (out_axis, &in_axis) in order.iter().enumerate() {
                    positions[in_axis] = Scalar::Index(out_axis as u32, Dtype::I64);
                }
                let dtype = self.builder.dtype(value);
                Ok(Val::Tensor(self.builder.compute(out_shape, Scalar::Load(value, positions, dtype))))
            }
            Builtin::Concat => {
                let axis_arg = args.iter().find(|a| a.name.is_some()).map(|a| &a.value);
                let axis = match axis_arg.map(|e| &e.kind) {
                    Some(ExprKind::Int(v)) => *v as i64,
                    Some(ExprKind::Unary(UnOp::Neg, inner)) => match inner.kind {
                        ExprKind::Int(v) => -(v as i64),
                        _ => return Err(unsupported(span, "concat needs `axis = N`")),
                    },
                    _ => return Err(unsupported(span, "concat needs `axis = N`")),
                };
                let mut parts = Vec::new();
                for part in &positional {
                    let value = self.expr(part)?;
                    parts.push(self.tensor(value, span, None)?);
                }
                Ok(Val::Tensor(self.concat(&parts, axis)))
            }
            Builtin::Iota => {
                let dtype = self.elem_arg(&generics[0], span)?;
                let length =
                    self.static_dim(positional[0]).ok_or_else(|| unsupported(span, "iota of a run-time length"))?;
                Ok(Val::Tensor(self.builder.compute(vec![length], cast(Scalar::Index(0, Dtype::I64), dtype))))
            }
            Builtin::Fill => {
                let dtype = self.elem_arg(&generics[0], span)?;
                let shape = self.list_dims(positional[0])?;
                let value = self.expr(positional[1])?;
                let value = self.tensor(value, span, Some(dtype))?;
                let scalar = cast(Scalar::Load(value, Vec::new(), self.builder.dtype(value)), dtype);
                Ok(Val::Tensor(self.builder.compute(shape, scalar)))
            }
            Builtin::Cast => {
                let dtype = self.elem_arg(&generics[0], span)?;
                let value = self.expr(positional[0])?;
                let value = self.tensor(value, span, None)?;
                Ok(Val::Tensor(self.map(&[value], |loads| cast(loads[0].clone(), dtype))))
            }
            Builtin::Select => {
                let cond = self.expr(positional[0])?;
                let cond = self.tensor(cond, span, Some(Dtype::Bool))?;
                let a = self.expr(positional[1])?;
                let b = self.expr(positional[2])?;
                let dtype = self.dtype_of(&a).or(self.dtype_of(&b));
                let a = self.tensor(a, span, dtype)?;
                let b = self.tensor(b, span, dtype)?;
                Ok(Val::Tensor(self.map(&[cond, a, b], |l| {
                    Scalar::Select(Box::new(l[0].clone()), Box::new(l[1].clone()), Box::new(l[2].clone()), l[1].dtype())
                })))
            }
            Builtin::Max | Builtin::Min => {
                let a = self.expr(positional[0])?;
                let b = self.expr(positional[1])?;
                let op = if signature.builtin == Builtin::Max { BinaryOp::Max } else { BinaryOp::Min };
                self.binary(op, a, b, span)
            }
            Builtin::Some => Ok(Val::Option(Some(Box::new(self.expr(positional[0])?)))),
            Builtin::UnwrapOr => match self.expr(positional[0])? {
                Val::Option(Some(inner)) => Ok(*inner),
                _ => self.expr(positional[1]),
            },
            Builtin::Assert => {
                let cond = self.expr(positional[0])?;
                let cond = self.tensor(cond, span, Some(Dtype::Bool))?;
                let ExprKind::Str(message) = &positional[1].kind else {
                    return Err(unsupported(span, "assert takes a message"));
                };
                // Which instance failed: the same check runs in every layer.
                let message =
                    if self.place.is_empty() { message.clone() } else { format!("{message} (in `{}`)", self.place) };
                self.builder.push(Node {
                    kind: NodeKind::Assert(cond, message),
                    shape: Vec::new(),
                    dtype: Dtype::Bool,
                    source: None,
                });
                Ok(Val::Unit)
            }
            Builtin::Math(op) => match self.expr(positional[0])? {
                Val::Literal(value, _) => {
                    let value = self.builder.compute(Vec::new(), Scalar::Float(value, Dtype::F32));
                    Ok(Val::Tensor(self.map(&[value], |l| Scalar::Unary(op, Box::new(l[0].clone()), l[0].dtype()))))
                }
                value => {
                    let value = self.tensor(value, span, None)?;
                    Ok(Val::Tensor(self.map(&[value], |l| Scalar::Unary(op, Box::new(l[0].clone()), l[0].dtype()))))
                }
            },
        }
    }

    /// The same elements in a new shape, in row-major order.
    /// A reshape reads each input element at the output index's position
    /// in row-major order. Axes are first matched in groups of equal
    /// element count (`[B, S, 4096]` to `[B, S, 32, 128]`: `B`, `S`, and
    /// `4096 = 32 · 128`), so each input position depends on its own
    /// group's indices only, and a group with one input axis needs no
    /// division: most reshapes become plain index arithmetic.
    fn reshape(&mut self, value: Value, shape: Vec<Dim>) -> Value {
        let from = self.builder.shape(value).to_vec();
        let dtype = self.builder.dtype(value);
        if from == shape {
            return value;
        }
        let mut positions = Vec::with_capacity(from.len());
        let (mut input, mut output) = (0, 0);
        while input < from.len() || output < shape.len() {
            let (inputs, outputs) = reshape_group(&from[input..], &shape[output..]);
            positions.extend(group_positions(&from[input..input + inputs], &shape[output..output + outputs], output));
            input += inputs;
            output += outputs;
        }
        self.builder.compute(shape, Scalar::Load(value, positions, dtype))
    }

    fn concat(&mut self, parts: &[Value], axis: i64) -> Value {
        let first = self.builder.shape(parts[0]).to_vec();
        let axis = if axis < 0 { (first.len() as i64 + axis) as usize } else { axis as usize };
        let dtype = self.builder.dtype(parts[0]);
        let index = |k: usize| Scalar::Index(k as u32, Dtype::I64);
        // Nested selects from the last part back: lazily, only one loads.
        let mut offsets = Vec::new();
        let mut total = Dim::default();
        for part in parts {
            offsets.push(total.clone());
            total = total.add(&self.builder.shape(*part)[axis]);
        }
        let load = |part: Value, offset: &Dim| {
            let positions = (0..first.len())
                .map(|k| {
                    if k == axis {
                        Scalar::Binary(
                            BinaryOp::Sub,
                            Box::new(index(k)),
                            Box::new(Scalar::Dim(offset.clone())),
                            Dtype::I64,
                        )
                    } else {
                        index(k)
                    }
                })
                .collect();
            Scalar::Load(part, positions, dtype)
        };
        let last = parts.len() - 1;
        let mut scalar = load(parts[last], &offsets[last]);
        for at in (0..last).rev() {
            let inside = Scalar::Binary(
                BinaryOp::Cmp(CmpOp::Lt),
                Box::new(index(axis)),
                Box::new(Scalar::Dim(offsets[at + 1].clone())),
                Dtype::Bool,
            );
            scalar = Scalar::Select(Box::new(inside), Box::new(load(parts[at], &offsets[at])), Box::new(scalar), dtype);
        }
        let mut shape = first;
        shape[axis] = total;
        self.builder.compute(shape, scalar)
    }

    /// `let y[i, j] = body`: one `Compute` over the indices' ranges.
    fn index_definition(&mut self, vars: &[ast::IndexVar], body: &Expr) -> Result<Value> {
        let depth = self.indices.len();
        for var in vars {
            let state = if var.variadic {
                IndexVar::Group { ids: None, extents: Vec::new() }
            } else {
                IndexVar::One { id: self.builder.fresh_index(), extent: None }
            };
            self.indices.push((var.name.name.clone(), state));
        }
        let scalar = self.elem(body);
        let frame: Vec<(String, IndexVar)> = self.indices.drain(depth..).collect();
        let scalar = self.scalar(scalar?, body.span, None)?;
        let mut shape = Vec::new();
        let mut renames = HashMap::new();
        for (name, var) in frame {
            match var {
                IndexVar::One { id, extent: Some(extent) } => {
                    renames.insert(id, shape.len() as u32);
                    shape.push(extent);
                }
                IndexVar::Group { ids: Some(ids), extents } => {
                    for (id, extent) in ids.into_iter().zip(extents) {
                        renames.insert(id, shape.len() as u32);
                        shape.push(extent);
                    }
                }
                _ => return Err(unsupported(body.span, format!("index `{name}` has no range"))),
            }
        }
        Ok(self.builder.compute(shape, rename(scalar, &renames)))
    }

    /// An element-level result as a scalar; a rank-0 tensor is loaded, a
    /// literal takes `dtype`.
    fn scalar(&mut self, elem: Elem, span: Span, dtype: Option<Dtype>) -> Result<Scalar> {
        match elem {
            Elem::Scalar(scalar) => Ok(scalar),
            Elem::Val(Val::Literal(value, is_float)) => Ok(literal(value, is_float, dtype)),
            Elem::Val(Val::Dim(dim)) => Ok(cast(Scalar::Dim(dim), dtype.filter(|d| d.is_int()).unwrap_or(Dtype::I64))),
            Elem::Val(Val::Tensor(value)) if self.builder.shape(value).is_empty() => {
                Ok(Scalar::Load(value, Vec::new(), self.builder.dtype(value)))
            }
            Elem::Val(other) => Err(unsupported(span, format!("{other:?} where one element is expected"))),
        }
    }

    fn elem_dtype(&self, elem: &Elem) -> Option<Dtype> {
        match elem {
            Elem::Scalar(scalar) => Some(scalar.dtype()),
            Elem::Val(Val::Tensor(value)) => Some(self.builder.dtype(*value)),
            _ => None,
        }
    }

    fn find_index(&mut self, name: &str) -> Option<&mut IndexVar> {
        self.indices.iter_mut().rev().find(|(n, _)| n == name).map(|(_, var)| var)
    }

    /// An element-level expression (inside an index definition).
    fn elem(&mut self, expr: &Expr) -> Result<Elem> {
        match &expr.kind {
            ExprKind::Name(name) => {
                if let Some(var) = self.find_index(&name.name) {
                    return match var {
                        IndexVar::One { id, .. } => Ok(Elem::Scalar(Scalar::Index(*id, Dtype::I64))),
                        IndexVar::Group { .. } => Err(unsupported(name.span, "a variadic index as a value")),
                    };
                }
                Ok(Elem::Val(self.expr(expr)?))
            }
            ExprKind::Index { base, items } => {
                let base = self.elem(base)?;
                let Elem::Val(base) = base else { return Err(unsupported(expr.span, "indexing an element")) };
                let base = self.tensor(base, expr.span, None)?;
                self.load(base, items, expr.span).map(Elem::Scalar)
            }
            ExprKind::Unary(op, operand) => {
                let inner = self.elem(operand)?;
                if let (UnOp::Neg, Elem::Val(Val::Literal(v, f))) = (op, &inner) {
                    return Ok(Elem::Val(Val::Literal(-v, *f)));
                }
                let scalar = self.scalar(inner, expr.span, None)?;
                let dtype = scalar.dtype();
                let op = if *op == UnOp::Neg { UnaryOp::Neg } else { UnaryOp::Not };
                Ok(Elem::Scalar(Scalar::Unary(op, Box::new(scalar), dtype)))
            }
            ExprKind::Binary(op, left, right) => {
                if let Some(dim) = self.static_dim(expr) {
                    return Ok(Elem::Val(Val::Dim(dim)));
                }
                let left = self.elem(left)?;
                let right = self.elem(right)?;
                self.elem_binary(binary_op(*op), left, right, expr.span)
            }
            ExprKind::Reduce { op, acc, index, body } => {
                let id = self.builder.fresh_index();
                self.indices.push((index.name.name.clone(), IndexVar::One { id, extent: None }));
                let body_elem = self.elem(body);
                let (_, var) = self.indices.pop().expect("pushed above");
                let acc = acc
                    .as_ref()
                    .map(|acc| self.elem_arg(&ast::GenericArg::Dim(ast::DimExpr::Name(acc.clone())), expr.span))
                    .transpose()?;
                let body_scalar = self.scalar(body_elem?, body.span, acc)?;
                let IndexVar::One { extent: Some(extent), .. } = var else {
                    return Err(unsupported(index.name.span, "a reduction index without a range"));
                };
                let dtype = acc.unwrap_or(body_scalar.dtype());
                let op = match op {
                    ast::Reduction::Sum => ReduceOp::Sum,
                    ast::Reduction::Max => ReduceOp::Max,
                    ast::Reduction::Min => ReduceOp::Min,
                };
                Ok(Elem::Scalar(Scalar::Reduce { op, index: id, extent, body: Box::new(body_scalar), dtype }))
            }
            ExprKind::Call { callee, generics, args }
                if builtin::lookup(&callee.name).is_some_and(|signature| signature.is_elementwise()) =>
            {
                let signature = builtin::lookup(&callee.name).expect("matched above");
                let mut elems = Vec::new();
                for arg in args {
                    elems.push(self.elem(&arg.value)?);
                }
                match signature.builtin {
                    Builtin::Cast => {
                        let dtype = self.elem_arg(&generics[0], expr.span)?;
                        let inner = elems.pop().expect("one argument");
                        Ok(Elem::Scalar(cast(self.scalar(inner, expr.span, Some(dtype))?, dtype)))
                    }
                    Builtin::Select => {
                        let b = elems.pop().expect("three arguments");
                        let a = elems.pop().expect("three arguments");
                        let c = elems.pop().expect("three arguments");
                        self.elem_select(c, a, b, expr.span)
                    }
                    Builtin::Max | Builtin::Min => {
                        let b = elems.pop().expect("two arguments");
                        let a = elems.pop().expect("two arguments");
                        let op = if signature.builtin == Builtin::Max { BinaryOp::Max } else { BinaryOp::Min };
                        self.elem_binary(op, a, b, expr.span)
                    }
                    Builtin::Math(op) => {
                        let inner = elems.pop().expect("one argument");
                        let scalar = self.scalar(inner, expr.span, Some(Dtype::F32))?;
                        let dtype = scalar.dtype();
                        Ok(Elem::Scalar(Scalar::Unary(op, Box::new(scalar), dtype)))
                    }
                    whole => unreachable!("{whole:?} is not elementwise (`Signature::is_elementwise`)"),
                }
            }
            ExprKind::If { cond, then, otherwise } => {
                let (c, a, b) = (self.elem(cond)?, self.elem(then)?, self.elem(otherwise)?);
                self.elem_select(c, a, b, expr.span)
            }
            _ => Ok(Elem::Val(self.expr(expr)?)),
        }
    }

    /// `select(c, a, b)` or `if c { a } else { b }` on elements: only the
    /// chosen side is evaluated.
    fn elem_select(&mut self, c: Elem, a: Elem, b: Elem, span: Span) -> Result<Elem> {
        let dtype = self.elem_dtype(&a).or(self.elem_dtype(&b));
        let c = self.scalar(c, span, Some(Dtype::Bool))?;
        let a = self.scalar(a, span, dtype)?;
        let b = self.scalar(b, span, dtype)?;
        let dtype = a.dtype();
        Ok(Elem::Scalar(Scalar::Select(Box::new(c), Box::new(a), Box::new(b), dtype)))
    }

    fn elem_binary(&mut self, op: BinaryOp, left: Elem, right: Elem, span: Span) -> Result<Elem> {
        if let (Elem::Val(left @ Val::Literal(..)), Elem::Val(right @ Val::Literal(..))) = (&left, &right) {
            return match self.binary(op, left.clone(), right.clone(), span)? {
                value @ Val::Literal(..) => Ok(Elem::Val(value)),
                value => Ok(Elem::Val(value)),
            };
        }
        let dtype = self.elem_dtype(&left).or(self.elem_dtype(&right));
        let left = self.scalar(left, span, dtype)?;
        let right = self.scalar(right, span, dtype.or(Some(left.dtype())))?;
        let (left, right) = match (left.dtype(), right.dtype()) {
            (a, b) if a == b => (left, right),
            (a, b) if a.is_int() && b.is_int() => (cast(left, Dtype::I64), cast(right, Dtype::I64)),
            _ => (left, right),
        };
        let dtype = result_dtype(op, left.dtype());
        Ok(Elem::Scalar(Scalar::Binary(op, Box::new(left), Box::new(right), dtype)))
    }

    /// `x[...]` inside an index definition: index variables set their
    /// ranges from the axes they index.
    fn load(&mut self, base: Value, items: &[IndexItem], span: Span) -> Result<Scalar> {
        let shape = self.builder.shape(base).to_vec();
        let dtype = self.builder.dtype(base);
        let fixed = items.iter().filter(|i| !matches!(i, IndexItem::Variadic(_))).count();
        let mut positions = Vec::with_capacity(shape.len());
        let mut axis = 0;
        for item in items {
            match item {
                IndexItem::Variadic(name) => {
                    let count = shape.len() - fixed;
                    let extents = shape[axis..axis + count].to_vec();
                    axis += count;
                    let existing = match self.find_index(&name.name) {
                        Some(IndexVar::Group { ids, .. }) => ids.clone(),
                        _ => return Err(unsupported(name.span, "an unknown variadic index")),
                    };
                    let ids = match existing {
                        Some(ids) => ids,
                        None => {
                            let fresh: Vec<u32> = (0..count).map(|_| self.builder.fresh_index()).collect();
                            if let Some(IndexVar::Group { ids, extents: slot }) = self.find_index(&name.name) {
                                *ids = Some(fresh.clone());
                                *slot = extents;
                            }
                            fresh
                        }
                    };
                    positions.extend(ids.into_iter().map(|id| Scalar::Index(id, Dtype::I64)));
                }
                IndexItem::At(position) => {
                    let dim = shape.get(axis).cloned().ok_or_else(|| unsupported(span, "too many positions"))?;
                    axis += 1;
                    if let ExprKind::Name(name) = &position.kind {
                        if let Some(IndexVar::One { id, extent }) = self.find_index(&name.name) {
                            if extent.is_none() {
                                *extent = Some(dim);
                            }
                            positions.push(Scalar::Index(*id, Dtype::I64));
                            continue;
                        }
                    }
                    let elem = self.elem(position)?;
                    let scalar = self.scalar(elem, position.span, Some(Dtype::I64))?;
                    positions.push(cast(scalar, Dtype::I64));
                }
                IndexItem::Full(s) | IndexItem::Range(_, _, s) => {
                    return Err(unsupported(*s, "a slice inside an index definition"))
                }
            }
        }
        Ok(Scalar::Load(base, positions, dtype))
    }
}

/// Renumbers index variables (an index definition's become its axes).
fn rename(scalar: Scalar, renames: &HashMap<u32, u32>) -> Scalar {
    let go = |s: Box<Scalar>| Box::new(rename(*s, renames));
    match scalar {
        Scalar::Index(id, dtype) => Scalar::Index(*renames.get(&id).unwrap_or(&id), dtype),
        Scalar::Load(value, positions, dtype) => {
            Scalar::Load(value, positions.into_iter().map(|p| rename(p, renames)).collect(), dtype)
        }
        Scalar::Unary(op, a, dtype) => Scalar::Unary(op, go(a), dtype),
        Scalar::Binary(op, a, b, dtype) => Scalar::Binary(op, go(a), go(b), dtype),
        Scalar::Select(c, a, b, dtype) => Scalar::Select(go(c), go(a), go(b), dtype),
        Scalar::Cast(a, dtype) => Scalar::Cast(go(a), dtype),
        Scalar::Reduce { op, index, extent, body, dtype } => {
            Scalar::Reduce { op, index, extent, body: go(body), dtype }
        }
        other => other,
    }
}

/// The fewest leading input and output axes with equal element counts (the
/// rest of both when none are fewer). Where one side is used up, the
/// other's remaining axes are all 1.
fn reshape_group(from: &[Dim], to: &[Dim]) -> (usize, usize) {
    let product = |dims: &[Dim]| dims.iter().fold(Dim::constant(1), |total, dim| total.mul(dim));
    if from.is_empty() || to.is_empty() {
        return (from.len(), to.len());
    }
    for total in 2..=from.len() + to.len() {
        for inputs in 1..total.min(from.len() + 1) {
            let outputs = total - inputs;
            if outputs <= to.len() && product(&from[..inputs]) == product(&to[..outputs]) {
                return (inputs, outputs);
            }
        }
    }
    (from.len(), to.len())
}

/// The input positions of one group: the output indices (numbered from
/// `first`) flattened in row-major order, then split over the input axes;
/// axes of size 1 are skipped on both sides, and a lone input axis takes
/// the flat position as it is.
fn group_positions(from: &[Dim], to: &[Dim], first: usize) -> Vec<Scalar> {
    let one = Dim::constant(1);
    let mut flat: Option<Scalar> = None;
    for (at, dim) in to.iter().enumerate() {
        if *dim == one {
            continue;
        }
        let index = Scalar::Index((first + at) as u32, Dtype::I64);
        flat = Some(match flat {
            None => index,
            Some(outer) => {
                let scaled =
                    Scalar::Binary(BinaryOp::Mul, Box::new(outer), Box::new(Scalar::Dim(dim.clone())), Dtype::I64);
                Scalar::Binary(BinaryOp::Add, Box::new(scaled), Box::new(index), Dtype::I64)
            }
        });
    }
    let flat = flat.unwrap_or(Scalar::Int(0, Dtype::I64));
    let sized: Vec<usize> = (0..from.len()).filter(|&at| from[at] != one).collect();
    let mut positions = vec![Scalar::Int(0, Dtype::I64); from.len()];
    if let [only] = sized[..] {
        positions[only] = flat;
        return positions;
    }
    let mut stride = Dim::constant(1);
    for &at in sized.iter().rev() {
        let divided = if stride == one {
            flat.clone()
        } else {
            Scalar::Binary(BinaryOp::Div, Box::new(flat.clone()), Box::new(Scalar::Dim(stride.clone())), Dtype::I64)
        };
        positions[at] = if at == sized[0] {
            divided
        } else {
            Scalar::Binary(BinaryOp::Rem, Box::new(divided), Box::new(Scalar::Dim(from[at].clone())), Dtype::I64)
        };
        stride = stride.mul(&from[at]);
    }
    positions
}

/// Two literals combined as the program would combine them at run time
/// (`numerics`): integers in i64 (wrapping, Euclidean division and
/// remainder, by zero giving 0), floats in f64 as soon as either is one.
fn fold(op: BinaryOp, (a, a_float): (f64, bool), (b, b_float): (f64, bool)) -> Val {
    if a_float || b_float {
        Val::Literal(linnet_ir::numerics::float(op, a, b), true)
    } else {
        Val::Literal(linnet_ir::numerics::integer(op, a as i64, b as i64) as f64, false)
    }
}
