//! The built-in functions' typing rules: `reshape` (element counts
//! equal), `permute`, `concat`, `iota`, `fill`, `cast`, `select`, the
//! elementwise math functions, `max`/`min`, options, and `assert`. Their
//! signatures (element type, arity, named argument) are
//! `crate::builtin`'s table, checked here before the rule runs.

use super::body::BodyChecker;
use super::ty::{compare, Axis, TensorTy, Ty};
use crate::builtin::{self, Builtin, Elements};
use crate::code::Code;
use crate::diagnostic::Diagnostic;
use crate::source::Span;
use crate::syntax::ast::{self, Expr, ExprKind, UnOp};
use linnet_ir::dim::Dim;

fn shape_text(axes: &[Axis]) -> String {
    let axes: Vec<String> = axes.iter().map(Axis::to_string).collect();
    format!("[{}]", axes.join(", "))
}

impl BodyChecker<'_, '_> {
    /// `None` when `callee` is not a built-in.
    pub(super) fn check_builtin(
        &mut self,
        callee: &ast::Ident,
        generics: &[ast::GenericArg],
        args: &[ast::Arg],
        span: Span,
    ) -> Option<Ty> {
        let signature = builtin::lookup(&callee.name)?;
        let name = signature.name;
        if signature.element_type != (generics.len() == 1) || generics.len() > 1 {
            let message = if signature.element_type {
                format!("`{name}` takes one element type: `{name}<i32>(...)`")
            } else {
                format!("`{name}` takes no generic arguments")
            };
            return Some(self.error(Diagnostic::error(Code::GenericCount, callee.span, message).with_label("here")));
        }
        for arg in args {
            if let Some(label) = &arg.name {
                if signature.named != Some(label.name.as_str()) {
                    let help = match signature.named {
                        Some(named) => format!("only `{named} = ...` is named"),
                        None => "pass it by position".to_string(),
                    };
                    return Some(
                        self.error(
                            Diagnostic::error(
                                Code::NamedArgument,
                                label.span,
                                format!("`{name}` has no argument `{}`", label.name),
                            )
                            .with_label(help),
                        ),
                    );
                }
            }
        }
        let positional: Vec<&Expr> = args.iter().filter(|arg| arg.name.is_none()).map(|arg| &arg.value).collect();
        if let Some(arity) = signature.arity {
            if positional.len() != arity {
                return Some(
                    self.error(
                        Diagnostic::error(
                            if positional.len() < arity { Code::MissingArgument } else { Code::ExtraArgument },
                            span,
                            format!("`{name}` takes {arity} argument(s), {} given", positional.len()),
                        )
                        .with_label("in this call"),
                    ),
                );
            }
        }
        Some(match signature.builtin {
            Builtin::Reshape => self.reshape(positional[0], positional[1]),
            Builtin::Permute => self.permute(positional[0], positional[1]),
            Builtin::Concat => self.concat(&positional, args, span),
            Builtin::Iota => self.iota(&generics[0], positional[0]),
            Builtin::Fill => self.fill(&generics[0], positional[0], positional[1]),
            Builtin::Cast => self.cast(&generics[0], positional[0]),
            Builtin::Select => self.select(positional[0], positional[1], positional[2], span),
            Builtin::Max | Builtin::Min => self.elementwise_pair(name, positional[0], positional[1], span),
            Builtin::Some => {
                let inner = self.check_expr(positional[0]);
                Ty::Option(Some(Box::new(inner)))
            }
            Builtin::UnwrapOr => self.unwrap_or(positional[0], positional[1]),
            Builtin::Assert => self.assert(positional[0], positional[1]),
            Builtin::Math(_) => {
                self.math(name, signature.elements.expect("a math function says its elements"), positional[0])
            }
        })
    }

    fn tensor_arg(&mut self, expr: &Expr, what: &str) -> Option<TensorTy> {
        let ty = self.check_expr(expr);
        self.as_tensor(ty, expr.span, what)
    }

    fn dims_list(&mut self, list: &Expr, function: &str) -> Option<Vec<Dim>> {
        let ExprKind::List(items) = &list.kind else {
            self.error(
                Diagnostic::error(
                    Code::TypeMismatch,
                    list.span,
                    format!("`{function}` takes a list of dims: `[B * S, H]`"),
                )
                .with_label("not a list"),
            );
            return None;
        };
        let mut dims = Vec::with_capacity(items.len());
        for item in items {
            match self.static_dim(item) {
                Some(dim) => dims.push(self.facts.normalize(&dim)),
                None => {
                    self.error(
                        Diagnostic::error(
                            Code::DynamicShape,
                            item.span,
                            "a shape is made of dims known before running",
                        )
                        .with_label("not a dim: use generics and integer literals"),
                    );
                    return None;
                }
            }
        }
        Some(dims)
    }

    fn reshape(&mut self, value: &Expr, list: &Expr) -> Ty {
        let tensor = self.tensor_arg(value, "the argument of `reshape`");
        let dims = self.dims_list(list, "reshape");
        let (Some(tensor), Some(dims)) = (tensor, dims) else { return Ty::Error };
        let target = TensorTy { axes: dims.into_iter().map(Axis::Dim).collect(), elem: tensor.elem.clone() };
        let (from, to) = (tensor.element_count(), target.element_count());
        if !self.facts.equal(&from, &to) {
            return self.error(
                Diagnostic::error(
                    Code::ReshapeSize,
                    list.span,
                    format!(
                        "reshape from {} to {} changes the element count: {} vs {}",
                        shape_text(&tensor.axes),
                        shape_text(&target.axes),
                        self.facts.normalize(&from),
                        self.facts.normalize(&to)
                    ),
                )
                .with_label(format!("{} elements", self.facts.normalize(&to)))
                .with_secondary(value.span, format!("{} elements", self.facts.normalize(&from))),
            );
        }
        Ty::Tensor(target)
    }

    fn permute(&mut self, value: &Expr, list: &Expr) -> Ty {
        let Some(tensor) = self.tensor_arg(value, "the argument of `permute`") else { return Ty::Error };
        let order: Option<Vec<usize>> = match &list.kind {
            ExprKind::List(items) => items
                .iter()
                .map(|item| match item.kind {
                    ExprKind::Int(axis) => usize::try_from(axis).ok(),
                    _ => None,
                })
                .collect(),
            _ => None,
        };
        let Some(order) = order else {
            return self.error(
                Diagnostic::error(
                    Code::BadPermutation,
                    list.span,
                    "`permute` takes a list of axis numbers: `[0, 2, 1, 3]`",
                )
                .with_label("not a list of integers"),
            );
        };
        if !tensor.rank_known() {
            return self.error(
                Diagnostic::error(
                    Code::BadPermutation,
                    value.span,
                    format!("`{tensor}` has a variadic shape; its axes cannot be permuted"),
                )
                .with_label("rank unknown"),
            );
        }
        let mut sorted = order.clone();
        sorted.sort_unstable();
        if sorted != (0..tensor.axes.len()).collect::<Vec<_>>() {
            return self.error(
                Diagnostic::error(
                    Code::BadPermutation,
                    list.span,
                    format!("{order:?} is not a permutation of the {} axes of `{tensor}`", tensor.axes.len()),
                )
                .with_label(format!("name each of 0..{} once", tensor.axes.len())),
            );
        }
        Ty::Tensor(TensorTy { axes: order.iter().map(|&at| tensor.axes[at].clone()).collect(), elem: tensor.elem })
    }

    fn concat(&mut self, parts: &[&Expr], args: &[ast::Arg], span: Span) -> Ty {
        let axis_arg = args.iter().find(|arg| arg.name.is_some()).map(|arg| &arg.value);
        let axis = axis_arg.and_then(|expr| match &expr.kind {
            ExprKind::Int(value) => i64::try_from(*value).ok(),
            ExprKind::Unary(UnOp::Neg, inner) => match inner.kind {
                ExprKind::Int(value) => i64::try_from(value).ok().map(|v| -v),
                _ => None,
            },
            _ => None,
        });
        let tensors: Vec<Option<TensorTy>> =
            parts.iter().map(|part| self.tensor_arg(part, "an argument of `concat`")).collect();
        let Some(axis) = axis else {
            return self.error(
                Diagnostic::error(
                    Code::MissingArgument,
                    axis_arg.map_or(span, |e| e.span),
                    "`concat` needs `axis = N`, an integer (negative counts from the end)",
                )
                .with_label("give the axis"),
            );
        };
        if parts.len() < 2 {
            return self.error(
                Diagnostic::error(Code::MissingArgument, span, "`concat` joins two or more tensors")
                    .with_label("in this call"),
            );
        }
        let Some(tensors) = tensors.into_iter().collect::<Option<Vec<_>>>() else { return Ty::Error };
        let first = &tensors[0];
        let rank = first.axes.len() as i64;
        let at = if axis < 0 { rank + axis } else { axis };
        if at < 0 || at >= rank || !matches!(first.axes[at as usize], Axis::Dim(_)) {
            return self.error(
                Diagnostic::error(
                    Code::BadAxis,
                    axis_arg.map_or(span, |e| e.span),
                    format!("axis {axis} is not a fixed axis of `{first}`"),
                )
                .with_label("out of range"),
            );
        }
        let at = at as usize;
        let mut length = Dim::default();
        for (part, tensor) in parts.iter().zip(&tensors) {
            if tensor.elem.unify(&first.elem).is_none() {
                return self.error(
                    Diagnostic::error(
                        Code::DtypeMismatch,
                        part.span,
                        format!("`concat` joins tensors of one element type: {} and {}", first.elem, tensor.elem),
                    )
                    .with_label("cast it"),
                );
            }
            let same_rank = tensor.axes.len() == first.axes.len();
            let others_equal = same_rank
                && tensor.axes.iter().zip(&first.axes).enumerate().all(|(i, (a, b))| {
                    i == at
                        || match (a, b) {
                            (Axis::Dim(a), Axis::Dim(b)) => self.facts.equal(a, b),
                            (a, b) => a == b,
                        }
                });
            let Some(Axis::Dim(dim)) = tensor.axes.get(at).filter(|_| others_equal) else {
                return self.error(
                    Diagnostic::error(
                        Code::ShapeMismatch,
                        part.span,
                        format!(
                            "`concat` along axis {axis}: {} does not fit {}",
                            shape_text(&tensor.axes),
                            shape_text(&first.axes)
                        ),
                    )
                    .with_label("every other axis must be equal")
                    .with_secondary(parts[0].span, shape_text(&first.axes)),
                );
            };
            length = length.add(dim);
        }
        let mut axes = first.axes.clone();
        axes[at] = Axis::Dim(self.facts.normalize(&length));
        Ty::Tensor(TensorTy { axes, elem: first.elem.clone() })
    }

    fn iota(&mut self, elem: &ast::GenericArg, count: &Expr) -> Ty {
        let elem = self.elem_arg(elem);
        let Some(length) = self.static_dim(count) else {
            return self.error(
                Diagnostic::error(Code::DynamicShape, count.span, "`iota` takes a dim known before running")
                    .with_label("not a dim"),
            );
        };
        match elem {
            Some(elem) if elem.is_int() => Ty::Tensor(TensorTy { axes: vec![Axis::Dim(length)], elem }),
            Some(elem) => self.error(
                Diagnostic::error(Code::DtypeMismatch, count.span, format!("`iota` counts in i32 or i64, not {elem}"))
                    .with_label("use iota<i32> or iota<i64>"),
            ),
            None => Ty::Error,
        }
    }

    fn fill(&mut self, elem: &ast::GenericArg, list: &Expr, value: &Expr) -> Ty {
        let elem = self.elem_arg(elem);
        let dims = self.dims_list(list, "fill");
        let value_ty = self.tensor_arg(value, "the value of `fill`");
        let (Some(elem), Some(dims), Some(value_ty)) = (elem, dims, value_ty) else { return Ty::Error };
        if !value_ty.axes.is_empty() || !value_ty.elem.fits(&elem) {
            return self.error(
                Diagnostic::error(
                    Code::DtypeMismatch,
                    value.span,
                    format!("`fill<{elem}>` takes a {elem} scalar, found `{value_ty}`"),
                )
                .with_label("not a fitting scalar"),
            );
        }
        Ty::Tensor(TensorTy { axes: dims.into_iter().map(Axis::Dim).collect(), elem })
    }

    fn cast(&mut self, elem: &ast::GenericArg, value: &Expr) -> Ty {
        let elem = self.elem_arg(elem);
        let tensor = self.tensor_arg(value, "the argument of `cast`");
        match (elem, tensor) {
            (Some(elem), Some(tensor)) => Ty::Tensor(TensorTy { axes: tensor.axes, elem }),
            _ => Ty::Error,
        }
    }

    fn select(&mut self, cond: &Expr, then: &Expr, otherwise: &Expr, span: Span) -> Ty {
        let cond_ty = self.tensor_arg(cond, "the condition of `select`");
        let pair = self.elementwise_pair("select", then, otherwise, span);
        let (Some(cond_ty), Ty::Tensor(values)) = (cond_ty, pair) else { return Ty::Error };
        if !cond_ty.elem.is_bool() {
            return self.error(
                Diagnostic::error(
                    Code::DtypeMismatch,
                    cond.span,
                    format!("the condition of `select` is bool, found {}", cond_ty.elem),
                )
                .with_label("compare to get a bool"),
            );
        }
        match self.broadcast(&cond_ty, &values, span, "select", cond.span, then.span) {
            Some(axes) => Ty::Tensor(TensorTy { axes, elem: values.elem }),
            None => Ty::Error,
        }
    }

    fn elementwise_pair(&mut self, name: &str, left: &Expr, right: &Expr, span: Span) -> Ty {
        let what = format!("an argument of `{name}`");
        let a = self.tensor_arg(left, &what);
        let b = self.tensor_arg(right, &what);
        let (Some(a), Some(b)) = (a, b) else { return Ty::Error };
        let Some(elem) = a.elem.unify(&b.elem) else {
            return self.error(
                Diagnostic::error(
                    Code::DtypeMismatch,
                    span,
                    format!("`{name}` takes values of one element type, found {} and {}", a.elem, b.elem),
                )
                .with_label("cast one side")
                .with_secondary(left.span, a.elem.to_string())
                .with_secondary(right.span, b.elem.to_string()),
            );
        };
        if name != "select" && !elem.is_numeric() {
            return self.error(
                Diagnostic::error(Code::DtypeMismatch, span, format!("`{name}` takes numbers, found {elem}"))
                    .with_label("not a number"),
            );
        }
        match self.broadcast(&a, &b, span, name, left.span, right.span) {
            Some(axes) => Ty::Tensor(TensorTy { axes, elem }),
            None => Ty::Error,
        }
    }

    fn math(&mut self, name: &str, elements: Elements, value: &Expr) -> Ty {
        let Some(tensor) = self.tensor_arg(value, &format!("the argument of `{name}`")) else { return Ty::Error };
        let (fits, wanted) = match elements {
            Elements::Float => (tensor.elem.is_float(), "a float"),
            Elements::Number => (tensor.elem.is_numeric(), "a number"),
        };
        if !fits {
            return self.error(
                Diagnostic::error(
                    Code::DtypeMismatch,
                    value.span,
                    format!("`{name}` takes {wanted}, found {}", tensor.elem),
                )
                .with_label(format!("cast it first, e.g. `{name}(cast<f32>(...))`")),
            );
        }
        Ty::Tensor(tensor)
    }

    fn unwrap_or(&mut self, option: &Expr, default: &Expr) -> Ty {
        let option_ty = self.check_expr(option);
        let default_ty = self.check_expr(default);
        let inner = match option_ty {
            Ty::Option(Some(inner)) => *inner,
            Ty::Option(None) => return default_ty,
            Ty::Error => return Ty::Error,
            other => {
                return self.error(
                    Diagnostic::error(
                        Code::TypeMismatch,
                        option.span,
                        format!("`unwrap_or` takes an option, found `{other}`"),
                    )
                    .with_label("not an option"),
                )
            }
        };
        match compare(&inner, &default_ty, &self.facts) {
            Ok(()) => inner,
            Err(mismatch) => self.error(
                Diagnostic::error(
                    mismatch.code(),
                    default.span,
                    format!("the default must be `{inner}`, found `{default_ty}`"),
                )
                .with_label("does not fit the option"),
            ),
        }
    }

    fn assert(&mut self, cond: &Expr, message: &Expr) -> Ty {
        let cond_ty = self.check_expr(cond);
        self.expect_bool_scalar(&cond_ty, cond.span, "an assertion");
        if !matches!(message.kind, ExprKind::Str(_)) {
            return self.error(
                Diagnostic::error(Code::TypeMismatch, message.span, "`assert` takes a message string")
                    .with_label("expected \"...\""),
            );
        }
        Ty::Unit
    }
}
