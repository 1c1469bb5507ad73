//! The instantiation's footprint: the bytes of its parameters and states
//! and how many parameter tensors it has, counted in overflow-free
//! arithmetic before anything is enumerated or allocated from them. A card
//! whose generics would need more than any machine holds is refused at the
//! value that makes it so, with the size it would need.

use super::instantiate::Values;
use super::program::Program;
use super::ty::{Axis, Elem, SubTy, Ty};
use crate::code::Code;
use crate::diagnostic::Diagnostic;
use linnet_ir::dim::{Dim, EvalError, Symbol};
use linnet_ir::plan::human_bytes;

/// The most bytes of parameters, or of states, an instantiation may need:
/// 1 PiB, beyond any machine's memory and far within 64-bit sizes.
pub const MAX_BYTES: u128 = 1 << 50;

/// The most parameter tensors an instantiation may have (each one is a
/// binding and a checkpoint lookup).
pub const MAX_TENSORS: u128 = 1 << 20;

#[derive(Default, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Footprint {
    pub param_bytes: u128,
    pub state_bytes: u128,
    pub tensors: u128,
}

impl Footprint {
    /// How far over its limits this is: above 1 when over one of them.
    fn excess(&self) -> f64 {
        let ratio = |value: u128, limit: u128| value as f64 / limit as f64;
        ratio(self.param_bytes, MAX_BYTES).max(ratio(self.state_bytes, MAX_BYTES)).max(ratio(self.tensors, MAX_TENSORS))
    }
}

/// A dim's value; an overflow counts as larger than anything, a negative
/// or unknown value (reported by the clauses) as nothing.
fn size(dim: &Dim, values: &Values) -> u128 {
    match dim.value_under(&values.dims) {
        Ok(value) => u128::try_from(value).unwrap_or(0),
        Err(EvalError::Overflow) => u128::MAX,
        Err(_) => 0,
    }
}

fn tensor_bytes(ty: &Ty, values: &Values) -> u128 {
    let Some(tensor) = ty.as_tensor() else { return 0 };
    let elem_bytes = match &tensor.elem {
        Elem::Known(dtype) => dtype.bytes(),
        Elem::Generic(name) => values.elems.get(name).map_or(0, |dtype| dtype.bytes()),
        Elem::IntLiteral | Elem::FloatLiteral => 0,
    };
    tensor.axes.iter().fold(elem_bytes as u128, |bytes, axis| match axis {
        Axis::Dim(dim) => bytes.saturating_mul(size(dim, values)),
        Axis::Shape(_) => bytes,
    })
}

/// The footprint of one instance of `block` with `values`; arrays of
/// sub-blocks count one instance times their length, never each one.
pub fn of(program: &Program, block: usize, values: &Values) -> Footprint {
    let sig = &program.blocks[block];
    let mut total = Footprint::default();
    for (_, ty, _) in &sig.params {
        total.param_bytes = total.param_bytes.saturating_add(tensor_bytes(ty, values));
        total.tensors = total.tensors.saturating_add(1);
    }
    for (_, ty, _) in &sig.states {
        total.state_bytes = total.state_bytes.saturating_add(tensor_bytes(ty, values));
    }
    for sub in &sig.subs {
        let Some((target, inner)) = sub.target.as_ref().and_then(|target| values.instance(target)) else { continue };
        let count = match &sub.ty {
            Ty::SubArray(_, count) => size(count, values),
            _ => 1,
        };
        let one = of(program, target, &inner);
        total.param_bytes = total.param_bytes.saturating_add(one.param_bytes.saturating_mul(count));
        total.state_bytes = total.state_bytes.saturating_add(one.state_bytes.saturating_mul(count));
        total.tensors = total.tensors.saturating_add(one.tensors.saturating_mul(count));
    }
    total
}

/// Refuses an instantiation over the limits, pointing at the generic whose
/// value, set to 1, would shrink it most. Returns whether it is within.
/// `root` is the root's instance over the generics the model card sets,
/// `values` their values.
pub fn check(program: &Program, root: &SubTy, values: &Values, diagnostics: &mut Vec<Diagnostic>) -> bool {
    let of_root = |values: &Values| {
        values.instance(root).map_or_else(Footprint::default, |(block, inner)| of(program, block, &inner))
    };
    let footprint = of_root(values);
    if footprint.excess() <= 1.0 {
        return true;
    }
    let mut names: Vec<&Symbol> = values.dims.iter().filter(|(_, value)| **value > 1).map(|(name, _)| name).collect();
    names.sort();
    let culprit = names.into_iter().min_by(|a, b| {
        let shrunk = |name: &Symbol| {
            let mut trial = values.clone();
            trial.dims.insert(name.clone(), 1);
            of_root(&trial).excess()
        };
        shrunk(a).total_cmp(&shrunk(b))
    });
    let needs = |what: &str, bytes: u128| {
        format!(
            "{what} would need {} ({bytes} bytes), more than the {} a model may have",
            human_bytes(bytes),
            human_bytes(MAX_BYTES)
        )
    };
    let message = if footprint.param_bytes > MAX_BYTES {
        needs("the parameters", footprint.param_bytes)
    } else if footprint.state_bytes > MAX_BYTES {
        needs("the states", footprint.state_bytes)
    } else {
        format!("the model would have {} parameter tensors, more than the {MAX_TENSORS} it may have", footprint.tensors)
    };
    let at = culprit.and_then(|name| values.spans.get(name).map(|span| (name, *span)));
    let diagnostic = match at {
        Some((name, span)) => Diagnostic::error(Code::ModelTooLarge, span, message)
            .with_label(format!("`{name} = {}` makes it so", values.dims[name])),
        None => Diagnostic::error(Code::ModelTooLarge, program.blocks[root.block].decl.name.span, message),
    };
    diagnostics.push(diagnostic);
    false
}
