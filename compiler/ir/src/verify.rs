//! The IR verifier. It checks, for every entry:
//! - a node loads or uses only values defined before it, and never the
//!   value of a `WriteState` or `Assert`;
//! - a `Load` gives one position per axis of the loaded value;
//! - an `Index(k)` names an axis of the computed tensor or an enclosing
//!   reduction's index;
//! - `Input`, `Param` and `State` numbers exist, and a `WriteState` writes a
//!   value of the state's rank and dtype;
//! - outputs are defined values.
//!
//! A failure is a compiler bug, reported with the entry and node.

use super::{Entry, Model, NodeKind, Scalar, Value};
use std::fmt;

/// The first problem the verifier found: its entry, and what it is (with
/// the node).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyError {
    pub entry: String,
    pub problem: String,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IR verifier: entry `{}`: {}", self.entry, self.problem)
    }
}

impl std::error::Error for VerifyError {}

/// What is wrong in an entry, naming the node.
struct Problem(String);

pub fn verify(model: &Model) -> Result<(), VerifyError> {
    for entry in &model.entries {
        verify_entry(model, entry).map_err(|Problem(problem)| VerifyError { entry: entry.name.clone(), problem })?;
    }
    Ok(())
}

fn is_effect(entry: &Entry, value: Value) -> bool {
    matches!(entry.nodes[value.index()].kind, NodeKind::WriteState(..) | NodeKind::Assert(..))
}

fn check_value(entry: &Entry, at: usize, value: Value) -> Result<(), Problem> {
    if value.index() >= at {
        return Err(Problem(format!("v{at} uses v{}, which is not defined before it", value.0)));
    }
    if is_effect(entry, value) {
        return Err(Problem(format!("v{at} uses v{}, which has no value", value.0)));
    }
    Ok(())
}

fn check_scalar(entry: &Entry, at: usize, scalar: &Scalar, indices: &mut Vec<u32>) -> Result<(), Problem> {
    match scalar {
        Scalar::Index(k, _) if !indices.contains(k) => {
            Err(Problem(format!("v{at} uses index i{k}, which is not in scope")))
        }
        Scalar::Load(value, positions, _) => {
            check_value(entry, at, *value)?;
            let rank = entry.nodes[value.index()].shape.len();
            if positions.len() != rank {
                return Err(Problem(format!(
                    "v{at} loads v{} of rank {rank} at {} positions",
                    value.0,
                    positions.len()
                )));
            }
            positions.iter().try_for_each(|p| check_scalar(entry, at, p, indices))
        }
        Scalar::Unary(_, a, _) | Scalar::Cast(a, _) => check_scalar(entry, at, a, indices),
        Scalar::Binary(_, a, b, _) => {
            check_scalar(entry, at, a, indices)?;
            check_scalar(entry, at, b, indices)
        }
        Scalar::Select(c, a, b, _) => {
            check_scalar(entry, at, c, indices)?;
            check_scalar(entry, at, a, indices)?;
            check_scalar(entry, at, b, indices)
        }
        Scalar::Reduce { index, body, .. } => {
            indices.push(*index);
            let result = check_scalar(entry, at, body, indices);
            indices.pop();
            result
        }
        _ => Ok(()),
    }
}

fn verify_entry(model: &Model, entry: &Entry) -> Result<(), Problem> {
    for (at, node) in entry.nodes.iter().enumerate() {
        match &node.kind {
            NodeKind::Input(k) if *k >= entry.inputs.len() => return Err(Problem(format!("v{at}: no input {k}"))),
            NodeKind::Param(k) if *k >= model.params.len() => return Err(Problem(format!("v{at}: no param {k}"))),
            NodeKind::State(k) if *k >= model.states.len() => return Err(Problem(format!("v{at}: no state {k}"))),
            NodeKind::Compute(scalar) => {
                let mut indices: Vec<u32> = (0..node.shape.len() as u32).collect();
                check_scalar(entry, at, scalar, &mut indices)?;
            }
            NodeKind::Intrinsic(_, args) => args.iter().try_for_each(|v| check_value(entry, at, *v))?,
            NodeKind::WriteState(k, value) => {
                check_value(entry, at, *value)?;
                let state = model.states.get(*k).ok_or_else(|| Problem(format!("v{at}: no state {k}")))?;
                let written = &entry.nodes[value.index()];
                if written.shape.len() != state.shape.len() || written.dtype != state.dtype {
                    return Err(Problem(format!(
                        "v{at} writes v{} of another rank or dtype into state `{}`",
                        value.0, state.path
                    )));
                }
            }
            NodeKind::Assert(value, _) => check_value(entry, at, *value)?,
            _ => {}
        }
    }
    for output in &entry.outputs {
        check_value(entry, entry.nodes.len(), *output)?;
    }
    Ok(())
}
