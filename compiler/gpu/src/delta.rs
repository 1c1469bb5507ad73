//! The gated delta rule as kernels in `emit`'s convention, computing what
//! `linnet_exec::reference` defines in f32: `gated_delta_rule` (q, k `[B, S,
//! KH, KD]`, v `[B, S, VH, VD]`, decay and beta `[B, S, VH]`) or
//! `gated_delta_step` (the same without S), the state `[B, VH, KD, VD]`
//! and the scale; the output `[B, S + KD, VH, VD]` holds each token's
//! read, then the final state.
//!
//! A column of the state evolves on its own (its recall, update and read
//! involve no other column), so a warp per (batch row, value head, value
//! column) keeps its column's cells in its lanes' registers, lane `l` the
//! cells `l`, `l + 32`, …, in f32 as the state is (the key width must be
//! known when the model is built), and walks the tokens one at a time as
//! the reference does: the decay, the recall (the lanes' shares summed
//! across the warp), the update along the key, the read. A decode step is
//! a walk of one token, so a token's read and the state after it are the
//! same bits whether it came in a decode step, a prefill, or a prefill in
//! parts (the contract's batch invariance): no chunk of tokens is solved
//! together, whose sums would follow where a span starts.

use super::emit::{Combine, Emitter, Form, Kernel, ModelEntry, Unsupported, Warp};
use super::intrinsic::{load_name, Operands, Spread};
use linnet_ir::Dtype;
use linnet_ir::Value;

/// The kernels of delta rule node `at` of `entry` (`span`: over S tokens,
/// else one step), in launch order.
pub fn delta_rule_kernels(
    entry: ModelEntry<'_>,
    at: usize,
    form: Form,
    args: &[Value],
    span: bool,
) -> Result<Vec<Kernel>, Unsupported> {
    let operands = Operands { entry, args };
    let key_width = operands.shape(0)[operands.shape(0).len() - 1]
        .as_constant()
        .ok_or_else(|| Unsupported("a delta rule whose key width is known only when the model runs".into()))?;
    let plan = Plan { entry, at, form, args, operands, key_width, span };
    Ok(vec![walk(&plan).finish(Dtype::F32)])
}

/// What the node's kernels share.
struct Plan<'a> {
    entry: ModelEntry<'a>,
    at: usize,
    form: Form,
    args: &'a [Value],
    operands: Operands<'a>,
    key_width: i64,
    span: bool,
}

/// A kernel's sizes (indices) and the loads' names.
struct Sizes {
    batch: String,
    tokens: String,
    key_heads: String,
    value_heads: String,
    value_dim: String,
    /// The rows of the output: the tokens, then the state's.
    rows: String,
    /// Value heads to a key head.
    group: String,
    spread: Spread,
    zero: String,
}

impl Plan<'_> {
    /// An emitter for the node's kernel and its sizes.
    fn emitter(&self) -> (Emitter<'_>, Sizes) {
        let mut e = Emitter::new(self.entry, self.at, 0, self.form);
        e.loads = self.args.to_vec();
        let o = &self.operands;
        let batch = o.size(&mut e, 0, 0);
        let tokens = if self.span { o.size(&mut e, 0, 1) } else { e.index_constant(1) };
        let key_heads = o.size(&mut e, 0, -2);
        let (value_heads, value_dim) = (o.size(&mut e, 2, -2), o.size(&mut e, 2, -1));
        let spread = Spread::new(&mut e, self.key_width);
        let rows = e.add(&tokens, &spread.size);
        let group = e.op(format!("arith.divui {value_heads}, {key_heads} : index"));
        let zero = e.index_constant(0);
        (e, Sizes { batch, tokens, key_heads, value_heads, value_dim, rows, group, spread, zero })
    }
}

/// A warp's column: its batch row, value head, key head and value column.
struct Column {
    b: String,
    h: String,
    kh: String,
    j: String,
}

impl Column {
    fn of(e: &mut Emitter<'_>, s: &Sizes, item: &str) -> Column {
        let position = e.split(item, &[&s.batch, &s.value_heads, &s.value_dim]);
        let [b, h, j] = [0, 1, 2].map(|axis| position[axis].clone());
        let kh = e.op(format!("arith.divui {h}, {} : index", s.group));
        Column { b, h, kh, j }
    }

    /// Where token `t`'s key (and query) row starts.
    fn key_at(&self, e: &mut Emitter<'_>, s: &Sizes, t: &str) -> String {
        let row = e.flat(&[&self.b, t, &self.kh], &[&s.batch, &s.tokens, &s.key_heads]);
        e.mul(&row, &s.spread.size)
    }

    /// Where token `t`'s decay and rate are.
    fn gate_at(&self, e: &mut Emitter<'_>, s: &Sizes, t: &str) -> String {
        e.flat(&[&self.b, t, &self.h], &[&s.batch, &s.tokens, &s.value_heads])
    }

    /// Where token `t`'s value is, in this column.
    fn value_at(&self, e: &mut Emitter<'_>, s: &Sizes, t: &str) -> String {
        e.flat(&[&self.b, t, &self.h, &self.j], &[&s.batch, &s.tokens, &s.value_heads, &s.value_dim])
    }

    /// Where row `row` of the output is, in this column.
    fn out_at(&self, e: &mut Emitter<'_>, s: &Sizes, row: &str) -> String {
        e.flat(&[&self.b, row, &self.h, &self.j], &[&s.batch, &s.rows, &s.value_heads, &s.value_dim])
    }

    /// The column's cells from the state, in the lanes.
    fn initial_cells(&self, e: &mut Emitter<'_>, s: &Sizes, plan: &Plan<'_>, warp: &Warp) -> Vec<String> {
        let (state, dtype, slots) = (load_name(5), plan.operands.dtype(5), s.spread.slots());
        let sizes = [s.batch.as_str(), &s.value_heads, &s.spread.size, &s.value_dim];
        e.in_lanes(warp, &[], slots, |e, lane, _| {
            (0..slots)
                .map(|slot| {
                    s.spread.load(e, lane, slot, &state, dtype, |e, i| e.flat(&[&self.b, &self.h, i, &self.j], &sizes))
                })
                .collect()
        })
    }

    /// Stores the final cells in the output's last rows.
    fn store_cells(&self, e: &mut Emitter<'_>, s: &Sizes, warp: &Warp, cells: &[String]) {
        e.in_lanes(warp, cells, 0, |e, lane, cells| {
            for (slot, memory) in cells.iter().enumerate() {
                s.spread.store(e, lane, slot, memory.clone(), ("%out", Dtype::F32), |e, i| {
                    let row = e.add(&s.tokens, i);
                    self.out_at(e, s, &row)
                });
            }
            Vec::new()
        });
    }
}

/// The scale, an f32.
fn scale(e: &mut Emitter<'_>, plan: &Plan<'_>, s: &Sizes) -> String {
    e.load_element(&load_name(6), &s.zero, plan.operands.dtype(6))
}

/// The kernel: a warp per (batch row, value head, value column) walks the
/// tokens (one, in a decode step), carrying its cells from one to the
/// next ([`token`]), and stores the last cells.
fn walk<'a>(plan: &'a Plan<'a>) -> Emitter<'a> {
    let (mut e, s) = plan.emitter();
    let o = &plan.operands;
    let values = o.shape(2);
    let work = [o.shape(0)[0].clone(), values[values.len() - 2].clone(), values[values.len() - 1].clone()];
    e.parallel_in_warps(&work, |e, item, warp| {
        let column = Column::of(e, &s, item);
        let scale = scale(e, plan, &s);
        let cells = column.initial_cells(e, &s, plan, warp);
        let lane_type = e.lane_type();
        let carried: Vec<(String, &str)> = cells.iter().map(|cell| (cell.clone(), lane_type.as_str())).collect();
        let last = e
            .for_range(&s.zero, &s.tokens, &carried, |e, t, cells| token(e, plan, &s, &column, warp, &scale, cells, t));
        column.store_cells(e, &s, warp, &last);
    });
    e
}

/// Token `t` (an index) of a warp's column, as the reference takes it:
/// the cells decay and recall the value the key holds, learn the update
/// along the key, and are read by the query (each sum the lanes' shares
/// summed across the warp); the read is stored in the token's output row.
/// The cells after it.
#[allow(clippy::too_many_arguments)]
fn token(
    e: &mut Emitter<'_>,
    plan: &Plan<'_>,
    s: &Sizes,
    column: &Column,
    warp: &Warp,
    scale: &str,
    cells: &[String],
    t: &str,
) -> Vec<String> {
    let (q, k, v, decay, beta) = (load_name(0), load_name(1), load_name(2), load_name(3), load_name(4));
    let o = &plan.operands;
    let gate_at = column.gate_at(e, s, t);
    let forget = e.load_element(&decay, &gate_at, o.dtype(3));
    let forget = e.op(format!("math.exp {forget} : f32"));
    let rate = e.load_element(&beta, &gate_at, o.dtype(4));
    let key_at = column.key_at(e, s, t);
    let value_at = column.value_at(e, s, t);
    let value = e.load_element(&v, &value_at, o.dtype(2));
    // The state decays, and recalls the value the key holds.
    let (decayed, recalled) = changed_cells(e, warp, cells, |e, lane, slot, memory| {
        let memory = e.op(format!("arith.mulf {memory}, {forget} : f32"));
        let key = s.spread.load(e, lane, slot, &k, o.dtype(1), |e, i| e.add(&key_at, i));
        (memory, key)
    });
    let error = e.op(format!("arith.subf {value}, {recalled} : f32"));
    let update = e.op(format!("arith.mulf {error}, {rate} : f32"));
    // It learns the update along the key, and is read by the query.
    let (learned, read) = changed_cells(e, warp, &decayed, |e, lane, slot, memory| {
        let key = s.spread.load(e, lane, slot, &k, o.dtype(1), |e, i| e.add(&key_at, i));
        let memory = e.op(format!("math.fma {key}, {update}, {memory} : f32"));
        let query = s.spread.load(e, lane, slot, &q, o.dtype(0), |e, i| e.add(&key_at, i));
        (memory, query)
    });
    let read = e.op(format!("arith.mulf {read}, {scale} : f32"));
    let out_at = column.out_at(e, s, t);
    e.store_element(read, "%out", &out_at, Dtype::F32);
    learned
}

/// Every lane's cells (values of the lane type) changed by `change`, which
/// is given the lane, the slot and the cell and gives the new cell and
/// what it is weighed by; the new cells, and the column's weighted sum
/// (across the warp).
fn changed_cells(
    e: &mut Emitter,
    warp: &Warp,
    cells: &[String],
    change: impl Fn(&mut Emitter, &str, usize, &str) -> (String, String),
) -> (Vec<String>, String) {
    let mut changed = e.in_lanes(warp, cells, cells.len() + 1, |e, lane, cells| {
        let mut sum = e.op("arith.constant 0.0 : f32".into());
        let mut changed: Vec<String> = Vec::with_capacity(cells.len() + 1);
        for (slot, memory) in cells.iter().enumerate() {
            let (memory, weight) = change(e, lane, slot, memory);
            sum = e.op(format!("math.fma {memory}, {weight}, {sum} : f32"));
            changed.push(memory);
        }
        changed.push(sum);
        changed
    });
    let sum = changed.pop().expect("the sum follows the cells");
    let sum = e.combine_lanes(&[sum], Combine::Add).remove(0);
    (changed, sum)
}
