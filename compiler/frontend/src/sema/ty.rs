//! Types as the checker sees them: element types, tensors whose axes are
//! [`Dim`]s or variadic shapes, tuples, options, dims used as values, and
//! sub-blocks. A scalar is a tensor of rank 0. [`Subst`] maps a callee's
//! generics to the caller's dims, shapes, element types, numbers and
//! blocks.

use super::facts::Facts;
use crate::code::Code;
use linnet_ir::dim::{Atom, Dim, Symbol};
use linnet_ir::Dtype;
use std::collections::HashMap;
use std::fmt;

/// An element type: known, a `Float` generic, or a literal's that adapts
/// to its context (`0.0` is any float, `0` any number).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Elem {
    Known(Dtype),
    Generic(Symbol),
    IntLiteral,
    FloatLiteral,
}

impl Elem {
    pub fn is_float(&self) -> bool {
        match self {
            Elem::Known(dtype) => dtype.is_float(),
            Elem::Generic(_) | Elem::FloatLiteral => true,
            Elem::IntLiteral => false,
        }
    }

    pub fn is_int(&self) -> bool {
        match self {
            Elem::Known(dtype) => dtype.is_int(),
            Elem::IntLiteral => true,
            _ => false,
        }
    }

    pub fn is_numeric(&self) -> bool {
        self.is_float() || self.is_int()
    }

    pub fn is_bool(&self) -> bool {
        *self == Elem::Known(Dtype::Bool)
    }

    pub fn is_literal(&self) -> bool {
        matches!(self, Elem::IntLiteral | Elem::FloatLiteral)
    }

    /// The element type two operands share, literals adapting.
    pub fn unify(&self, other: &Elem) -> Option<Elem> {
        match (self, other) {
            (a, b) if a == b => Some(a.clone()),
            (Elem::IntLiteral, Elem::FloatLiteral) | (Elem::FloatLiteral, Elem::IntLiteral) => Some(Elem::FloatLiteral),
            (Elem::IntLiteral, b) | (b, Elem::IntLiteral) if b.is_numeric() => Some(b.clone()),
            (Elem::FloatLiteral, b) | (b, Elem::FloatLiteral) if b.is_float() => Some(b.clone()),
            _ => None,
        }
    }

    /// Whether a value of type `self` may stand where `expected` is wanted.
    pub fn fits(&self, expected: &Elem) -> bool {
        match self {
            Elem::IntLiteral => expected.is_numeric(),
            Elem::FloatLiteral => expected.is_float(),
            _ => self == expected,
        }
    }
}

impl fmt::Display for Elem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Elem::Known(dtype) => f.write_str(dtype.name()),
            Elem::Generic(name) => f.write_str(name),
            Elem::IntLiteral => f.write_str("integer literal"),
            Elem::FloatLiteral => f.write_str("float literal"),
        }
    }
}

/// The value of a number setting (an `f32` generic): known, or another
/// number generic's.
#[derive(Clone, Debug, PartialEq)]
pub enum Number {
    Known(f64),
    Generic(Symbol),
}

impl fmt::Display for Number {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Number::Known(value) => write!(f, "{value:?}"),
            Number::Generic(name) => f.write_str(name),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Axis {
    Dim(Dim),
    /// A variadic shape `*S`: any number of axes.
    Shape(Symbol),
}

impl fmt::Display for Axis {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Axis::Dim(dim) => write!(f, "{dim}"),
            Axis::Shape(name) => write!(f, "*{name}"),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorTy {
    pub axes: Vec<Axis>,
    pub elem: Elem,
}

impl TensorTy {
    pub fn scalar(elem: Elem) -> TensorTy {
        TensorTy { axes: Vec::new(), elem }
    }

    pub fn rank_known(&self) -> bool {
        self.axes.iter().all(|axis| matches!(axis, Axis::Dim(_)))
    }

    /// The number of elements, a variadic shape counting as `|S|`.
    pub fn element_count(&self) -> Dim {
        self.axes.iter().fold(Dim::constant(1), |count, axis| match axis {
            Axis::Dim(dim) => count.mul(dim),
            Axis::Shape(name) => count.mul(&Dim::atom(Atom::ShapeSize(name.clone()))),
        })
    }
}

impl fmt::Display for TensorTy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.axes.is_empty() {
            return write!(f, "{}", self.elem);
        }
        let axes: Vec<String> = self.axes.iter().map(Axis::to_string).collect();
        write!(f, "Tensor[{}; {}]", axes.join(", "), self.elem)
    }
}

/// A sub-block and the generic arguments it was declared with. A sub
/// whose block is a generic of the enclosing block (`sub mlp: F`) is
/// abstract: `generic` names it, and `block` is its bound's trait, whose
/// signatures are all that the enclosing block may use.
#[derive(Clone, Debug, PartialEq)]
pub struct SubTy {
    pub block: usize,
    pub args: Subst,
    pub generic: Option<Symbol>,
}

impl SubTy {
    pub fn concrete(block: usize, args: Subst) -> SubTy {
        SubTy { block, args, generic: None }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub enum Ty {
    Tensor(TensorTy),
    Tuple(Vec<Ty>),
    /// `None` inside: the type of `none`, which fits any option.
    Option(Option<Box<Ty>>),
    /// A generic or dim expression used as a value: `S`, `Width - 1`.
    DimValue(Dim),
    Sub(SubTy),
    SubArray(SubTy, Dim),
    Unit,
    /// Already reported; silences what follows from it.
    Error,
}

impl Ty {
    pub fn scalar(dtype: Dtype) -> Ty {
        Ty::Tensor(TensorTy::scalar(Elem::Known(dtype)))
    }

    pub fn as_tensor(&self) -> Option<&TensorTy> {
        match self {
            Ty::Tensor(tensor) => Some(tensor),
            _ => None,
        }
    }

    pub fn is_error(&self) -> bool {
        matches!(self, Ty::Error)
    }

    /// For messages: what kind of thing this is.
    pub fn describe(&self) -> String {
        match self {
            Ty::Sub(_) => "a sub-block".into(),
            Ty::SubArray(..) => "an array of sub-blocks".into(),
            Ty::DimValue(dim) => format!("the dim `{dim}`"),
            other => format!("`{other}`"),
        }
    }
}

impl fmt::Display for Ty {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Ty::Tensor(tensor) => write!(f, "{tensor}"),
            Ty::Tuple(items) => {
                let items: Vec<String> = items.iter().map(Ty::to_string).collect();
                write!(f, "({})", items.join(", "))
            }
            Ty::Option(Some(inner)) => write!(f, "Option<{inner}>"),
            Ty::Option(None) => f.write_str("Option<_>"),
            Ty::DimValue(dim) => write!(f, "Dim({dim})"),
            Ty::Sub(_) => f.write_str("block"),
            Ty::SubArray(_, count) => write!(f, "[block; {count}]"),
            Ty::Unit => f.write_str("()"),
            Ty::Error => f.write_str("{unknown}"),
        }
    }
}

/// Values for generics: dims, variadic shapes, element types, numbers and
/// blocks.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Subst {
    pub dims: HashMap<Symbol, Dim>,
    pub shapes: HashMap<Symbol, Vec<Axis>>,
    pub elems: HashMap<Symbol, Elem>,
    pub numbers: HashMap<Symbol, Number>,
    pub blocks: HashMap<Symbol, SubTy>,
}

impl Subst {
    pub fn is_bound(&self, name: &Symbol) -> bool {
        self.dims.contains_key(name)
            || self.shapes.contains_key(name)
            || self.elems.contains_key(name)
            || self.numbers.contains_key(name)
            || self.blocks.contains_key(name)
    }

    /// The number `number` stands for under these values.
    pub fn number(&self, number: &Number) -> Number {
        match number {
            Number::Generic(name) => self.numbers.get(name).cloned().unwrap_or_else(|| number.clone()),
            known => known.clone(),
        }
    }

    pub fn dim(&self, dim: &Dim) -> Dim {
        dim.map_atoms(&mut |atom| match atom {
            Atom::Generic(name) => self.dims.get(name).cloned(),
            Atom::ShapeSize(name) => self
                .shapes
                .get(name)
                .map(|axes| TensorTy { axes: axes.clone(), elem: Elem::IntLiteral }.element_count()),
            _ => None,
        })
    }

    /// The element type `elem` stands for, where it is known.
    pub fn dtype(&self, elem: &Elem) -> Option<Dtype> {
        match self.elem(elem) {
            Elem::Known(dtype) => Some(dtype),
            _ => None,
        }
    }

    /// The dims of a tensor type's axes, where no variadic shape is left
    /// unbound.
    pub fn shape(&self, tensor: &TensorTy) -> Option<Vec<Dim>> {
        self.tensor(tensor)
            .axes
            .into_iter()
            .map(|axis| match axis {
                Axis::Dim(dim) => Some(dim),
                Axis::Shape(_) => None,
            })
            .collect()
    }

    pub fn elem(&self, elem: &Elem) -> Elem {
        match elem {
            Elem::Generic(name) => self.elems.get(name).cloned().unwrap_or_else(|| elem.clone()),
            other => other.clone(),
        }
    }

    pub fn tensor(&self, tensor: &TensorTy) -> TensorTy {
        let mut axes = Vec::with_capacity(tensor.axes.len());
        for axis in &tensor.axes {
            match axis {
                Axis::Dim(dim) => axes.push(Axis::Dim(self.dim(dim))),
                Axis::Shape(name) => match self.shapes.get(name) {
                    Some(bound) => axes.extend(bound.iter().cloned()),
                    None => axes.push(axis.clone()),
                },
            }
        }
        TensorTy { axes, elem: self.elem(&tensor.elem) }
    }

    pub fn ty(&self, ty: &Ty) -> Ty {
        match ty {
            Ty::Tensor(tensor) => Ty::Tensor(self.tensor(tensor)),
            Ty::Tuple(items) => Ty::Tuple(items.iter().map(|item| self.ty(item)).collect()),
            Ty::Option(inner) => Ty::Option(inner.as_ref().map(|inner| Box::new(self.ty(inner)))),
            Ty::DimValue(dim) => Ty::DimValue(self.dim(dim)),
            Ty::Sub(sub) => Ty::Sub(self.sub(sub)),
            Ty::SubArray(sub, count) => Ty::SubArray(self.sub(sub), self.dim(count)),
            Ty::Unit | Ty::Error => ty.clone(),
        }
    }

    /// A sub's block and arguments with these values: an abstract sub
    /// becomes the block its generic is bound to here.
    pub fn sub(&self, sub: &SubTy) -> SubTy {
        if let Some(bound) = sub.generic.as_ref().and_then(|generic| self.blocks.get(generic)) {
            return bound.clone();
        }
        let args = Subst {
            dims: sub.args.dims.iter().map(|(k, v)| (k.clone(), self.dim(v))).collect(),
            shapes: sub.args.shapes.clone(),
            elems: sub.args.elems.iter().map(|(k, v)| (k.clone(), self.elem(v))).collect(),
            numbers: sub.args.numbers.iter().map(|(k, v)| (k.clone(), self.number(v))).collect(),
            blocks: sub.args.blocks.iter().map(|(k, v)| (k.clone(), self.sub(v))).collect(),
        };
        SubTy { block: sub.block, args, generic: sub.generic.clone() }
    }
}

/// Binds the callee's own generics that appear bare in a parameter type to
/// what the argument has there.
pub fn infer(param: &Ty, arg: &Ty, own: &[Symbol], subst: &mut Subst) {
    match (param, arg) {
        (Ty::Tensor(p), Ty::Tensor(a)) => {
            if let Elem::Generic(name) = &p.elem {
                if own.contains(name) && !subst.elems.contains_key(name) && !a.elem.is_literal() {
                    subst.elems.insert(name.clone(), a.elem.clone());
                }
            }
            let shape_at = p.axes.iter().position(|axis| matches!(axis, Axis::Shape(_)));
            let pairs: Vec<(&Axis, &Axis)> = match shape_at {
                Some(at) => {
                    let after = p.axes.len() - at - 1;
                    if a.axes.len() < at + after {
                        return;
                    }
                    if let Axis::Shape(name) = &p.axes[at] {
                        if own.contains(name) && !subst.shapes.contains_key(name) {
                            subst.shapes.insert(name.clone(), a.axes[at..a.axes.len() - after].to_vec());
                        }
                    }
                    let tail = &a.axes[a.axes.len() - after..];
                    p.axes[..at].iter().zip(&a.axes[..at]).chain(p.axes[at + 1..].iter().zip(tail)).collect()
                }
                None if p.axes.len() == a.axes.len() => p.axes.iter().zip(&a.axes).collect(),
                None => return,
            };
            for (p, a) in pairs {
                if let (Axis::Dim(p), Axis::Dim(a)) = (p, a) {
                    if let Some(name) = p.as_generic() {
                        if own.contains(name) && !subst.dims.contains_key(name) {
                            subst.dims.insert(name.clone(), a.clone());
                        }
                    }
                }
            }
        }
        (Ty::Tuple(ps), Ty::Tuple(xs)) => {
            for (p, a) in ps.iter().zip(xs) {
                infer(p, a, own, subst);
            }
        }
        (Ty::Option(Some(p)), Ty::Option(Some(a))) => infer(p, a, own, subst),
        _ => {}
    }
}

/// Why two types differ, for a diagnostic.
pub enum Mismatch {
    /// Different structure: a tensor for a tuple, say.
    Type,
    /// Different ranks, dims or variadic shapes.
    Shape,
    /// Same shape, different element types.
    Dtype,
}

impl Mismatch {
    pub fn code(&self) -> Code {
        match self {
            Mismatch::Type => Code::TypeMismatch,
            Mismatch::Shape => Code::ShapeMismatch,
            Mismatch::Dtype => Code::DtypeMismatch,
        }
    }
}

/// Whether `found` may stand where `expected` is wanted, dims compared
/// under `facts`.
pub fn compare(expected: &Ty, found: &Ty, facts: &Facts) -> Result<(), Mismatch> {
    match (expected, found) {
        (Ty::Error, _) | (_, Ty::Error) => Ok(()),
        (Ty::Tensor(e), Ty::Tensor(f)) => {
            if e.axes.len() != f.axes.len() {
                return Err(Mismatch::Shape);
            }
            let mut shape_differs = false;
            for (a, b) in e.axes.iter().zip(&f.axes) {
                match (a, b) {
                    (Axis::Dim(a), Axis::Dim(b)) => shape_differs |= !facts.equal(a, b),
                    (Axis::Shape(a), Axis::Shape(b)) if a == b => {}
                    _ => return Err(Mismatch::Shape),
                }
            }
            if shape_differs {
                Err(Mismatch::Shape)
            } else if !f.elem.fits(&e.elem) {
                Err(Mismatch::Dtype)
            } else {
                Ok(())
            }
        }
        (Ty::Tuple(e), Ty::Tuple(f)) if e.len() == f.len() => {
            e.iter().zip(f).try_for_each(|(e, f)| compare(e, f, facts))
        }
        (Ty::Option(_), Ty::Option(None)) => Ok(()),
        (Ty::Option(Some(e)), Ty::Option(Some(f))) => compare(e, f, facts),
        (Ty::DimValue(a), Ty::DimValue(b)) if facts.equal(a, b) => Ok(()),
        (Ty::Unit, Ty::Unit) => Ok(()),
        _ => Err(Mismatch::Type),
    }
}
