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
//! known when the model is built).
//!
//! - A decode step (`gated_delta_step`) is one kernel that takes its token
//!   as the reference does: the decay, the recall (the lanes' shares
//!   summed across the warp), the update along the key, the read.
//! - A span (`gated_delta_rule`) is taken in chunks of [`CHUNK`] tokens, as
//!   flash-linear-attention's chunked form takes it, so that a warp does
//!   not wait on two sums across the warp for every token. In a chunk
//!   whose first state is `S`, with `G_t` the decays of its tokens up to
//!   `t` summed, token `t`'s update is a triangular system,
//!   `u_t = β_t (v_t − e^{G_t} Sᵀk_t − Σ_{s<t} e^{G_t−G_s} (k_t·k_s) u_s)`,
//!   its read is `scale · (e^{G_t} Sᵀq_t + Σ_{s≤t} e^{G_t−G_s} (q_t·k_s) u_s)`
//!   and the chunk's last state is `e^{G_last} S + Σ_s e^{G_last−G_s} k_s u_sᵀ`.
//!   Two kernels share a scratch:
//!   1. `gram`: a warp per (batch row, value head, chunk, token `s`), lane
//!      `t`, computes what every column of the head shares: `A[t][s] =
//!      β_t e^{G_t−G_s} k_t·k_s` (for `t > s`), `B[t][s] = e^{G_t−G_s}
//!      q_t·k_s` (for `t ≥ s`), `e^{G_s}` and `e^{G_last−G_s}` ([`Block`]).
//!   2. the walk: for each chunk, the warp's lanes' shares of `Sᵀk_t` and
//!      `Sᵀq_t` for every token of the chunk are summed across the warp
//!      together, token `t`'s in lane `t` ([`Emitter::scatter_sums`]).
//!      Lane `t` then holds token `t`'s update and read, and the system is
//!      solved forward: at step `s`, lane `s`'s update is final; every
//!      lane `t` takes `A[t][s] u_s` off its update and adds `B[t][s] u_s`
//!      to its read, and the cells learn `e^{G_last−G_s} k_s u_s`.
//!
//!   Tokens past the span (in its last chunk) read its last token, have
//!   no update (0, so they change nothing) and are not stored.

use super::emit::{Combine, Emitter, Form, Kernel, ModelEntry, Scratch, Unsupported, Warp, WARP_LANES};
use super::intrinsic::{load_name, Operands, Spread};
use linnet_ir::dim::Dim;
use linnet_ir::Dtype;
use linnet_ir::Value;

/// The tokens of a chunk: one to a lane.
const CHUNK: usize = WARP_LANES as usize;

/// Where a chunk's shared values lie in its block of the scratch: `A` and
/// `B` (`[s][t]`, so that the lanes `t` of a step `s` read them together),
/// then `e^{G_s}` and `e^{G_last−G_s}`, each `[s]`.
struct Block;

impl Block {
    const A: usize = 0;
    const B: usize = CHUNK * CHUNK;
    const GATE: usize = 2 * CHUNK * CHUNK;
    const TAIL: usize = 2 * CHUNK * CHUNK + CHUNK;
    const SIZE: usize = 2 * CHUNK * CHUNK + 2 * CHUNK;
}

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
    Ok(if span {
        vec![gram(&plan).finish_stage(Dtype::F32, "gram"), walk_chunks(&plan).finish(Dtype::F32)]
    } else {
        vec![step(&plan).finish(Dtype::F32)]
    })
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
    chunks: String,
    spread: Spread,
    zero: String,
}

impl Plan<'_> {
    /// The chunks of the span: `ceil(S / CHUNK)`.
    fn chunks(&self) -> Dim {
        self.operands.shape(0)[1].add(&Dim::constant(CHUNK as i64 - 1)).div(&Dim::constant(CHUNK as i64))
    }

    /// A [`Block`] for each (batch row, value head, chunk).
    fn scratch(&self) -> Scratch {
        let heads = self.operands.shape(2)[0].mul(&self.operands.shape(2)[2]);
        Scratch { dtype: Dtype::F32, elements: heads.mul(&self.chunks()).mul(&Dim::constant(Block::SIZE as i64)) }
    }

    /// An emitter for the node's kernel `stage` (they take the same
    /// arguments) and its sizes.
    fn emitter(&self, stage: usize) -> (Emitter<'_>, Sizes) {
        let mut e = Emitter::new(self.entry, self.at, stage, self.form);
        e.loads = self.args.to_vec();
        let o = &self.operands;
        let batch = o.size(&mut e, 0, 0);
        let (tokens, chunks) = if self.span {
            e.scratch(self.scratch());
            (o.size(&mut e, 0, 1), e.dim_index(&self.chunks()))
        } else {
            (e.index_constant(1), e.index_constant(1))
        };
        let key_heads = o.size(&mut e, 0, -2);
        let (value_heads, value_dim) = (o.size(&mut e, 2, -2), o.size(&mut e, 2, -1));
        let spread = Spread::new(&mut e, self.key_width);
        let rows = e.add(&tokens, &spread.size);
        let group = e.op(format!("arith.divui {value_heads}, {key_heads} : index"));
        let zero = e.index_constant(0);
        (e, Sizes { batch, tokens, key_heads, value_heads, value_dim, rows, group, chunks, spread, zero })
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

/// A decode step: a warp per (batch row, value head, value column) takes
/// its token as the reference does. A token's recall and read are the
/// lanes' shares summed across the warp.
fn step<'a>(plan: &'a Plan<'a>) -> Emitter<'a> {
    let (mut e, s) = plan.emitter(0);
    let (q, k, v, decay, beta) = (load_name(0), load_name(1), load_name(2), load_name(3), load_name(4));
    let o = &plan.operands;
    let work = [o.shape(0)[0].clone(), o.shape(2)[1].clone(), o.shape(2)[2].clone()];
    e.parallel_in_warps(&work, |e, item, warp| {
        let column = Column::of(e, &s, item);
        let scale = scale(e, plan, &s);
        let cells = column.initial_cells(e, &s, plan, warp);
        let gate_at = column.gate_at(e, &s, &s.zero);
        let forget = e.load_element(&decay, &gate_at, o.dtype(3));
        let forget = e.op(format!("math.exp {forget} : f32"));
        let rate = e.load_element(&beta, &gate_at, o.dtype(4));
        let key_at = column.key_at(e, &s, &s.zero);
        let value_at = column.value_at(e, &s, &s.zero);
        let value = e.load_element(&v, &value_at, o.dtype(2));
        // The state decays, and recalls the value the key holds.
        let (decayed, recalled) = changed_cells(e, warp, &cells, |e, lane, slot, memory| {
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
        let out_at = column.out_at(e, &s, &s.zero);
        e.store_element(read, "%out", &out_at, Dtype::F32);
        column.store_cells(e, &s, warp, &learned);
    });
    e
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

/// A chunk of the span: where its tokens start, how many it has, its
/// block in the scratch.
struct Chunk {
    first: String,
    count: String,
    /// Its last token, in the chunk.
    last: String,
    block: String,
}

impl Chunk {
    fn of(e: &mut Emitter<'_>, s: &Sizes, column: &Column, chunk: &str) -> Chunk {
        let size = e.index_constant(CHUNK as i64);
        let first = e.mul(chunk, &size);
        let left = e.op(format!("arith.subi {}, {first} : index", s.tokens));
        let count = e.op(format!("arith.minui {left}, {size} : index"));
        let one = e.index_constant(1);
        let last = e.op(format!("arith.subi {count}, {one} : index"));
        let number = e.flat(&[&column.b, &column.h, chunk], &[&s.batch, &s.value_heads, &s.chunks]);
        let block_size = e.index_constant(Block::SIZE as i64);
        let block = e.mul(&number, &block_size);
        Chunk { first, count, last, block }
    }

    /// `t` (an index), or the chunk's last where `t` is past it.
    fn within(&self, e: &mut Emitter<'_>, t: &str) -> String {
        e.op(format!("arith.minui {t}, {} : index", self.last))
    }

    /// The span's token `t` of the chunk (an index), or its last where `t`
    /// is past it (a token that can be read).
    fn token(&self, e: &mut Emitter<'_>, t: &str) -> String {
        let within = self.within(e, t);
        e.add(&self.first, &within)
    }

    /// Whether `t` (an index) is one of the chunk's tokens.
    fn holds(&self, e: &mut Emitter<'_>, t: &str) -> String {
        e.op(format!("arith.cmpi ult, {t}, {} : index", self.count))
    }

    /// `G_t`: the decays of the chunk's tokens up to `t` (or its last, where
    /// `t` is past it), added in order (so the same `t` gives the same bits
    /// in every lane).
    fn decayed(&self, e: &mut Emitter<'_>, s: &Sizes, column: &Column, decay: (&str, Dtype), t: &str) -> String {
        let within = self.within(e, t);
        let one = e.index_constant(1);
        let end = e.add(&within, &one);
        let none = e.op("arith.constant 0.0 : f32".into());
        e.for_range(&s.zero, &end, &[(none, "f32")], |e, r, sum| {
            let token = e.add(&self.first, r);
            let at = column.gate_at(e, s, &token);
            let g = e.load_element(decay.0, &at, decay.1);
            vec![e.op(format!("arith.addf {}, {g} : f32", sum[0]))]
        })
        .remove(0)
    }

    /// Where element `offset + plus` of the block is in the scratch
    /// (`offset` one of [`Block`]'s, `plus` an index).
    fn place(&self, e: &mut Emitter<'_>, offset: usize, plus: &str) -> String {
        let offset = e.index_constant(offset as i64);
        let from = e.add(&self.block, &offset);
        e.add(&from, plus)
    }

    /// Element `offset + plus` of the block ([`Chunk::place`]).
    fn shared(&self, e: &mut Emitter<'_>, offset: usize, plus: &str) -> String {
        let at = self.place(e, offset, plus);
        e.load_element("%scratch", &at, Dtype::F32)
    }
}

/// Kernel 1: each chunk's [`Block`], a warp per (batch row, value head,
/// chunk, token `s`), lane `t`: `A[t][s]`, `B[t][s]`, and from lane 0
/// `e^{G_s}` and `e^{G_last−G_s}`.
fn gram<'a>(plan: &'a Plan<'a>) -> Emitter<'a> {
    let (mut e, s) = plan.emitter(0);
    let (q, k, decay, beta) = (load_name(0), load_name(1), load_name(3), load_name(4));
    let o = &plan.operands;
    let work = [o.shape(0)[0].clone(), o.shape(2)[2].clone(), plan.chunks(), Dim::constant(CHUNK as i64)];
    e.parallel_in_warps(&work, |e, item, warp| {
        let size = e.index_constant(CHUNK as i64);
        let position = e.split(item, &[&s.batch, &s.value_heads, &s.chunks, &size]);
        let (chunk, source) = (position[2].clone(), position[3].clone());
        let kh = e.op(format!("arith.divui {}, {} : index", position[1], s.group));
        // What every column of the head shares: no column of its own.
        let column = Column { b: position[0].clone(), h: position[1].clone(), kh, j: s.zero.clone() };
        let chunk = Chunk::of(e, &s, &column, &chunk);
        let decay = (decay.as_str(), o.dtype(3));
        let g_source = chunk.decayed(e, &s, &column, decay, &source);
        let g_last = chunk.decayed(e, &s, &column, decay, &chunk.last);
        let source_token = chunk.token(e, &source);
        let source_key = column.key_at(e, &s, &source_token);
        let width = &s.spread.size;
        e.in_lanes(warp, &[], 0, |e, t, _| {
            let token = chunk.token(e, t);
            let key_at = column.key_at(e, &s, &token);
            let none = e.op("arith.constant 0.0 : f32".into());
            let dots = e.for_range(&s.zero, width, &[(none.clone(), "f32"), (none.clone(), "f32")], |e, i, dots| {
                let other = e.add(&source_key, i);
                let other = e.load_element(&k, &other, o.dtype(1));
                let at = e.add(&key_at, i);
                let key = e.load_element(&k, &at, o.dtype(1));
                let query = e.load_element(&q, &at, o.dtype(0));
                vec![
                    e.op(format!("math.fma {key}, {other}, {} : f32", dots[0])),
                    e.op(format!("math.fma {query}, {other}, {} : f32", dots[1])),
                ]
            });
            let g = chunk.decayed(e, &s, &column, decay, t);
            let apart = e.op(format!("arith.subf {g}, {g_source} : f32"));
            let between = e.op(format!("math.exp {apart} : f32"));
            let gate_at = column.gate_at(e, &s, &token);
            let rate = e.load_element(&beta, &gate_at, o.dtype(4));
            let held = chunk.holds(e, t);
            let after = e.op(format!("arith.cmpi ugt, {t}, {source} : index"));
            let from = e.op(format!("arith.cmpi uge, {t}, {source} : index"));
            let (recalls, reads) =
                (e.op(format!("arith.andi {held}, {after} : i1")), e.op(format!("arith.andi {held}, {from} : i1")));
            let weight = e.op(format!("arith.mulf {rate}, {between} : f32"));
            let a = e.op(format!("arith.mulf {weight}, {} : f32", dots[0]));
            let a = e.op(format!("arith.select {recalls}, {a}, {none} : f32"));
            let b = e.op(format!("arith.mulf {between}, {} : f32", dots[1]));
            let b = e.op(format!("arith.select {reads}, {b}, {none} : f32"));
            let row = e.mul(&source, &size);
            let at = e.add(&row, t);
            for (offset, value) in [(Block::A, a), (Block::B, b)] {
                let at = chunk.place(e, offset, &at);
                e.store_element(value, "%scratch", &at, Dtype::F32);
            }
            let first = e.op(format!("arith.cmpi eq, {t}, {} : index", s.zero));
            e.when(&first, |e| {
                let gate = e.op(format!("math.exp {g_source} : f32"));
                let to_last = e.op(format!("arith.subf {g_last}, {g_source} : f32"));
                let tail = e.op(format!("math.exp {to_last} : f32"));
                for (offset, value) in [(Block::GATE, gate), (Block::TAIL, tail)] {
                    let at = chunk.place(e, offset, &source);
                    e.store_element(value, "%scratch", &at, Dtype::F32);
                }
            });
            Vec::new()
        });
    });
    e
}

/// Kernel 2: a warp per (batch row, value head, value column) walks the
/// chunks, solving each chunk's updates forward a token at a time with
/// token `t`'s update and read in lane `t`.
fn walk_chunks<'a>(plan: &'a Plan<'a>) -> Emitter<'a> {
    let (mut e, s) = plan.emitter(1);
    let (q, k, v, beta) = (load_name(0), load_name(1), load_name(2), load_name(4));
    let o = &plan.operands;
    let work = [o.shape(0)[0].clone(), o.shape(2)[2].clone(), o.shape(2)[3].clone()];
    e.parallel_in_warps(&work, |e, item, warp| {
        let column = Column::of(e, &s, item);
        let scale = scale(e, plan, &s);
        let cells = column.initial_cells(e, &s, plan, warp);
        let lane_type = e.lane_type();
        let carried: Vec<(String, &str)> = cells.iter().map(|cell| (cell.clone(), lane_type.as_str())).collect();
        let last = e.for_range(&s.zero, &s.chunks, &carried, |e, number, cells| {
            let chunk = Chunk::of(e, &s, &column, number);
            // The lanes' shares of Sᵀk_t, then of Sᵀq_t, for every token t.
            let shares = e.in_lanes(warp, cells, 2 * CHUNK, |e, lane, cells| {
                let mut shares = Vec::with_capacity(2 * CHUNK);
                for (row, load) in [(&k, o.dtype(1)), (&q, o.dtype(0))] {
                    for t in 0..CHUNK {
                        let t = e.index_constant(t as i64);
                        let token = chunk.token(e, &t);
                        let key_at = column.key_at(e, &s, &token);
                        let mut share = e.op("arith.constant 0.0 : f32".into());
                        for (slot, memory) in cells.iter().enumerate() {
                            let element = s.spread.load(e, lane, slot, row, load, |e, i| e.add(&key_at, i));
                            share = e.op(format!("math.fma {memory}, {element}, {share} : f32"));
                        }
                        shares.push(share);
                    }
                }
                shares
            });
            let recalled = e.scatter_sums(warp, &shares[..CHUNK]);
            let read = e.scatter_sums(warp, &shares[CHUNK..]);
            // Lane t: token t's update and read before the chunk's other
            // tokens' updates.
            let mut solved = e.in_lanes(warp, &[recalled, read], 2, |e, t, own| {
                let token = chunk.token(e, t);
                let gate = chunk.shared(e, Block::GATE, t);
                let value_at = column.value_at(e, &s, &token);
                let value = e.load_element(&v, &value_at, o.dtype(2));
                let gate_at = column.gate_at(e, &s, &token);
                let rate = e.load_element(&beta, &gate_at, o.dtype(4));
                let recalled = e.op(format!("arith.mulf {gate}, {} : f32", own[0]));
                let error = e.op(format!("arith.subf {value}, {recalled} : f32"));
                let update = e.op(format!("arith.mulf {error}, {rate} : f32"));
                let held = chunk.holds(e, t);
                let none = e.op("arith.constant 0.0 : f32".into());
                let update = e.op(format!("arith.select {held}, {update}, {none} : f32"));
                vec![update, e.op(format!("arith.mulf {gate}, {} : f32", own[1]))]
            });
            let gate_last = chunk.shared(e, Block::GATE, &chunk.last);
            let mut cells = e.in_lanes(warp, cells, cells.len(), |e, _, cells| {
                cells.iter().map(|cell| e.op(format!("arith.mulf {cell}, {gate_last} : f32"))).collect()
            });
            for source in 0..CHUNK {
                let update = e.lane_value(warp, &solved[0], source as u32);
                let row = e.index_constant((source * CHUNK) as i64);
                solved = e.in_lanes(warp, &solved, 2, |e, t, own| {
                    let at = e.add(&row, t);
                    let a = chunk.shared(e, Block::A, &at);
                    let b = chunk.shared(e, Block::B, &at);
                    let taken = e.op(format!("arith.negf {a} : f32"));
                    vec![
                        e.op(format!("math.fma {taken}, {update}, {} : f32", own[0])),
                        e.op(format!("math.fma {b}, {update}, {} : f32", own[1])),
                    ]
                });
                let source = e.index_constant(source as i64);
                let tail = chunk.shared(e, Block::TAIL, &source);
                let learned = e.op(format!("arith.mulf {tail}, {update} : f32"));
                let token = chunk.token(e, &source);
                let key_at = column.key_at(e, &s, &token);
                cells = e.in_lanes(warp, &cells, cells.len(), |e, lane, cells| {
                    let mut changed = Vec::with_capacity(cells.len());
                    for (slot, memory) in cells.iter().enumerate() {
                        let key = s.spread.load(e, lane, slot, &k, o.dtype(1), |e, i| e.add(&key_at, i));
                        changed.push(e.op(format!("math.fma {key}, {learned}, {memory} : f32")));
                    }
                    changed
                });
            }
            e.in_lanes(warp, &solved[1..], 0, |e, t, read| {
                let held = chunk.holds(e, t);
                e.when(&held, |e| {
                    let token = e.add(&chunk.first, t);
                    let out_at = column.out_at(e, &s, &token);
                    let read = e.op(format!("arith.mulf {}, {scale} : f32", read[0]));
                    e.store_element(read, "%out", &out_at, Dtype::F32);
                });
                Vec::new()
            });
            cells
        });
        column.store_cells(e, &s, warp, &last);
    });
    e
}
