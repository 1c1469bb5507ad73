//! A row's states, read and written whole: what a prefix cache keeps of a
//! prompt (the caches' filled positions, the recurrent states) and puts
//! back into a row before the rest of a prompt continues it. A state's
//! row is its slice at one index of axis 0; a state written at token
//! positions (a key/value cache, `[rows, heads, positions, width]`) keeps
//! only its first positions, the ones a prompt filled.

use crate::backend::{Backend, MemoryError};
use crate::tensor::{Data, Tensor};
use crate::{Executor, RunError};
use linnet_ir::{Entry, Intrinsic, Model, NodeKind, Scalar, Value};
use std::ops::Range;
use std::sync::Arc;

/// Which of the model's states are written at token positions (`write_at`,
/// `write_span`, `write_rows` into axis 2 at the positions an entry is
/// given): caches whose positions past a prompt's end it has not filled.
/// A state written at positions computed from those (a ring, at `pos %
/// Window`) is not: it holds what a prompt left whole, as a recurrent
/// state does.
pub fn positional_states(model: &Model) -> Vec<bool> {
    let mut written_at_given = vec![false; model.states.len()];
    let mut written_otherwise = vec![false; model.states.len()];
    for entry in &model.entries {
        for node in &entry.nodes {
            let NodeKind::Intrinsic(Intrinsic::WriteAt | Intrinsic::WriteSpan | Intrinsic::WriteRows, args) =
                &node.kind
            else {
                continue;
            };
            let Some(NodeKind::State(state)) = args.first().map(|arg| &entry.nodes[arg.index()].kind) else {
                continue;
            };
            match args.get(2).is_some_and(|&at| is_given(entry, at)) {
                true => written_at_given[*state] = true,
                false => written_otherwise[*state] = true,
            }
        }
    }
    written_at_given.iter().zip(&written_otherwise).map(|(&given, &otherwise)| given && !otherwise).collect()
}

/// Whether `value` is one of `entry`'s inputs as given, read through casts
/// and reshapes (loads of its elements).
fn is_given(entry: &Entry, value: Value) -> bool {
    fn loaded(scalar: &Scalar) -> Option<Value> {
        match scalar {
            Scalar::Load(value, _, _) => Some(*value),
            Scalar::Cast(inner, _) => loaded(inner),
            _ => None,
        }
    }
    match &entry.nodes[value.index()].kind {
        NodeKind::Input(_) => true,
        NodeKind::Compute(scalar) => loaded(scalar).is_some_and(|source| is_given(entry, source)),
        _ => false,
    }
}

/// The flat ranges of `shape`'s row `row` (axis 0), only the first `length`
/// along axis 2 where given; an error says what does not fit.
fn row_ranges(shape: &[usize], row: usize, length: Option<usize>) -> Result<Vec<Range<usize>>, MemoryError> {
    let rows = *shape.first().ok_or_else(|| MemoryError("a scalar state has no rows".into()))?;
    if row >= rows {
        return Err(MemoryError(format!("row {row} is outside the state's {rows} rows")));
    }
    let row_size: usize = shape[1..].iter().product();
    let base = row * row_size;
    let Some(length) = length else { return Ok(std::iter::once(base..base + row_size).collect()) };
    let [_, outer, positions, ..] = shape[..] else {
        return Err(MemoryError(format!("a state of shape {shape:?} has no positions axis")));
    };
    if length > positions {
        return Err(MemoryError(format!("{length} positions asked of a state that holds {positions}")));
    }
    let inner: usize = shape[3..].iter().product();
    Ok((0..outer).map(|a| base + a * positions * inner..base + (a * positions + length) * inner).collect())
}

/// Row `row` of `tensor` as a tensor of one row, only the first `length`
/// along axis 2 where given.
pub fn read_row(tensor: &Tensor, row: usize, length: Option<usize>) -> Result<Tensor, MemoryError> {
    let ranges = row_ranges(&tensor.shape, row, length)?;
    let mut shape = tensor.shape.clone();
    shape[0] = 1;
    if let Some(length) = length {
        shape[2] = length;
    }
    fn gather<T: Copy>(values: &[T], ranges: &[Range<usize>]) -> Vec<T> {
        ranges.iter().flat_map(|range| values[range.clone()].iter().copied()).collect()
    }
    let data = match &tensor.data {
        Data::F32(values) => Data::F32(gather(values, &ranges).into()),
        Data::I64(values) => Data::I64(gather(values, &ranges)),
        Data::Bool(values) => Data::Bool(gather(values, &ranges)),
        Data::Bf16(_) | Data::Blocks(..) => return Err(MemoryError("a state is held as f32, i64 or bool".into())),
    };
    Ok(Tensor { dtype: tensor.dtype, shape, data })
}

/// `part` (as [`read_row`] gives it) written over row `row` of `tensor`.
pub fn write_row(tensor: &mut Tensor, row: usize, part: &Tensor) -> Result<(), MemoryError> {
    let length = (part.shape.len() > 2 && part.shape[2] != tensor.shape[2]).then(|| part.shape[2]);
    let mut expected = tensor.shape.clone();
    expected[0] = 1;
    if let Some(length) = length {
        expected[2] = length;
    }
    if part.shape != expected || part.dtype != tensor.dtype {
        return Err(MemoryError(format!(
            "a row of shape {:?} ({:?}) does not fit a state of shape {:?} ({:?})",
            part.shape, part.dtype, tensor.shape, tensor.dtype
        )));
    }
    let ranges = row_ranges(&tensor.shape, row, length)?;
    fn scatter<T: Copy>(cells: &mut [T], from: &[T], ranges: &[Range<usize>]) {
        let mut at = 0;
        for range in ranges {
            cells[range.clone()].copy_from_slice(&from[at..at + range.len()]);
            at += range.len();
        }
    }
    match (&mut tensor.data, &part.data) {
        (Data::F32(cells), Data::F32(from)) => scatter(cells, from, &ranges),
        (Data::I64(cells), Data::I64(from)) => scatter(cells, from, &ranges),
        (Data::Bool(cells), Data::Bool(from)) => scatter(cells, from, &ranges),
        _ => return Err(MemoryError("a row held otherwise than its state".into())),
    }
    Ok(())
}

impl<B: Backend> Executor<B> {
    /// Row `row` of every state, the positional ones (`positional_states`)
    /// only their first `positions`.
    pub fn state_rows(&mut self, row: usize, positions: usize) -> Result<Vec<Tensor>, RunError> {
        self.states
            .iter()
            .zip(&self.positional)
            .map(|(state, positional)| {
                self.backend.read_row(state, row, positional.then_some(positions)).map_err(RunError::Memory)
            })
            .collect()
    }

    /// Rows that [`Executor::state_rows`] gave, written back into row `row`.
    pub fn set_state_rows(&mut self, row: usize, rows: &[Tensor]) -> Result<(), RunError> {
        if rows.len() != self.states.len() {
            let message = format!("{} state rows given for the model's {} states", rows.len(), self.states.len());
            return Err(RunError::Memory(MemoryError(message)));
        }
        for (state, part) in self.states.iter_mut().zip(rows) {
            // Written in place, on a copy of its own where another holds
            // the state.
            if Arc::get_mut(state).is_none() {
                *state = Arc::new(self.backend.copy(state).map_err(RunError::Memory)?);
            }
            let buffer = Arc::get_mut(state).expect("the state is held here alone");
            self.backend.write_row(buffer, row, part).map_err(RunError::Memory)?;
        }
        Ok(())
    }
}
