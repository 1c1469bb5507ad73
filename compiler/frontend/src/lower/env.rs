//! Generic values during lowering: every model generic is a constant, an
//! entry's generics stay symbolic, and a callee's generics are bound from
//! explicit arguments or from its arguments' shapes.

use crate::sema::ty::{Axis, Elem, TensorTy};
use linnet_ir::dim::{Atom, Dim, Symbol};
use linnet_ir::Dtype;
use std::collections::HashMap;

#[derive(Clone, Default, Debug)]
pub struct Env {
    pub dims: HashMap<Symbol, Dim>,
    pub shapes: HashMap<Symbol, Vec<Dim>>,
    pub elems: HashMap<Symbol, Dtype>,
}

impl Env {
    pub fn dim(&self, dim: &Dim) -> Dim {
        dim.map_atoms(&mut |atom| match atom {
            Atom::Generic(name) => self.dims.get(name).cloned(),
            Atom::ShapeSize(name) => {
                self.shapes.get(name).map(|dims| dims.iter().fold(Dim::constant(1), |total, d| total.mul(d)))
            }
            _ => None,
        })
    }

    pub fn elem(&self, elem: &Elem) -> Option<Dtype> {
        match elem {
            Elem::Known(dtype) => Some(*dtype),
            Elem::Generic(name) => self.elems.get(name).copied(),
            Elem::IntLiteral | Elem::FloatLiteral => None,
        }
    }

    /// The concrete (or entry-symbolic) shape of a tensor type.
    pub fn shape(&self, tensor: &TensorTy) -> Option<Vec<Dim>> {
        let mut shape = Vec::with_capacity(tensor.axes.len());
        for axis in &tensor.axes {
            match axis {
                Axis::Dim(dim) => shape.push(self.dim(dim)),
                Axis::Shape(name) => shape.extend(self.shapes.get(name)?.iter().cloned()),
            }
        }
        Some(shape)
    }
}
