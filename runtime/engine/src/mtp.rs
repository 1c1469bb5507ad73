//! Drafts from a multi-token-prediction layer (`std.nn.mtp`, a card's
//! `[drafter]`): a [`Drafter`] that reads the model's hidden states. Its
//! machine's `draft` entry takes, at position `p`, the model's hidden
//! state there and the token at `p + 1`, and gives the logits of the token
//! after that and a hidden state that stands in for the model's at the
//! next position, so it drafts on from its own.
//!
//! Its cache is positional: before drafting it catches up every position
//! the model has fed since (their hidden states are the model's, the
//! refused drafts' positions rewritten), then drafts greedily, one call a
//! token. A draft is the drafter's likeliest token, so the same history
//! gives the same drafts, as the rejection rule takes them.

use crate::generate::{argmax_rows, as_f32, every_row};
use crate::speculative::Drafter;
use linnet_exec::tensor::Tensor;
use linnet_exec::{Machine, RunError};
use linnet_ir::Dtype;

/// A multi-token-prediction layer drafting for a model.
pub struct MtpDrafter<'m> {
    machine: &'m mut Machine,
    rows: usize,
    width: usize,
    dtype: Dtype,
    /// Positions the drafter's cache holds from the model's hidden states.
    caught_up: usize,
    /// The model's hidden states (`width` values each) at the positions
    /// from `caught_up` on, as far as it has fed tokens: those the cache
    /// has yet to take.
    hidden: Vec<f32>,
}

fn refused(message: String) -> RunError {
    RunError::Inputs { entry: "draft".into(), message }
}

impl<'m> MtpDrafter<'m> {
    /// A drafter on `machine`, whose `draft` entry takes `[rows, S]` tokens,
    /// `[rows, S, H]` hidden states and a position; its caches emptied.
    pub fn new(machine: &'m mut Machine) -> Result<MtpDrafter<'m>, RunError> {
        let entry = machine.model().entry("draft").ok_or_else(|| {
            refused("the drafter has no `draft` entry (a multi-token-prediction layer, std.nn.mtp's)".into())
        })?;
        let hidden = entry
            .inputs
            .get(1)
            .filter(|input| input.shape.len() == 3)
            .ok_or_else(|| refused("`draft` takes no hidden states `[rows, S, H]` second".into()))?;
        let constant = |at: usize| hidden.shape[at].as_constant().map(|size| size as usize);
        let (Some(rows), Some(width)) = (constant(0), constant(2)) else {
            return Err(refused("`draft`'s hidden states have no fixed rows and width".into()));
        };
        let dtype = hidden.dtype;
        machine.reset()?;
        Ok(MtpDrafter { machine, rows, width, dtype, caught_up: 0, hidden: Vec::new() })
    }

    /// The `draft` entry on `tokens` (the same for every row) at `position`,
    /// each with the hidden state in `hidden`: the likeliest next token and
    /// the layer's hidden state.
    fn step(&mut self, tokens: &[i64], hidden: &[f32], position: usize) -> Result<(i64, Vec<f32>), RunError> {
        let length = tokens.len();
        let inputs = vec![
            Tensor::from_i64(Dtype::I32, vec![self.rows, length], every_row(self.rows, tokens)),
            Tensor::from_f32(self.dtype, vec![self.rows, length, self.width], every_row(self.rows, hidden)),
            Tensor::from_i64(Dtype::I32, Vec::new(), vec![position as i64]),
        ];
        let mut outputs = self.machine.call("draft", inputs)?.into_iter().map(as_f32);
        let (Some(logits), Some(state)) = (outputs.next(), outputs.next()) else {
            return Err(refused("`draft` gives no logits and hidden state".into()));
        };
        let token = argmax_rows(&logits)[0];
        let state = state.as_f32().expect("widened to f32")[..self.width].to_vec();
        Ok((token, state))
    }
}

impl Drafter for MtpDrafter<'_> {
    fn reads_hidden(&self) -> bool {
        true
    }

    fn observe(&mut self, from: usize, hidden: &Tensor) -> Result<(), RunError> {
        let values = hidden.as_f32().ok_or_else(|| refused("the model's hidden states are not floats".into()))?;
        let count = hidden.shape.get(1).copied().unwrap_or(0);
        if hidden.shape.len() != 3 || hidden.shape[2] != self.width {
            return Err(refused(format!(
                "the model's hidden states are {:?}, the drafter takes a width of {}",
                hidden.shape, self.width
            )));
        }
        // The first row: every row was given the same tokens. Positions
        // before `caught_up` are the kept tokens', told again with the same
        // states: the cache holds them already.
        let first = &values[..count * self.width];
        let skipped = self.caught_up.saturating_sub(from).min(count);
        if skipped == count {
            return Ok(());
        }
        let at = (from + skipped - self.caught_up) * self.width;
        let end = at + (count - skipped) * self.width;
        self.hidden.resize(self.hidden.len().max(end), 0.0);
        self.hidden[at..end].copy_from_slice(&first[skipped * self.width..]);
        Ok(())
    }

    fn draft(&mut self, history: &[i64], room: usize) -> Result<Vec<i64>, RunError> {
        // The model has fed every token before the last: its hidden states
        // at `caught_up..last`, each with the token after it, catch up.
        let last = history.len() - 1;
        let from = self.caught_up;
        if room == 0 || from >= last || self.hidden.len() < (last - from) * self.width {
            return Ok(Vec::new());
        }
        let hidden: Vec<f32> = self.hidden.drain(..(last - from) * self.width).collect();
        let (mut token, mut state) = self.step(&history[from + 1..=last], &hidden, from)?;
        self.caught_up = last;
        let mut drafts = vec![token];
        // Then on from its own states: the token at `last + k` with the
        // state standing in for the model's at `last + k - 1`.
        while drafts.len() < room {
            (token, state) = self.step(&[token], &state, last + drafts.len() - 1)?;
            drafts.push(token);
        }
        Ok(drafts)
    }
}
