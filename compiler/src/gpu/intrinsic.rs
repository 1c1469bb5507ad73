//! The intrinsics as MLIR kernels (in `emit`'s calling convention), each
//! independent work items with sequential loops inside, computing what
//! `crate::intrinsics` defines in f32:
//! - attention: a warp per query row and head, one pass over the keys with
//!   an online softmax, the row's elements spread over the lanes (the
//!   head's width must be known when the model is built);
//! - the gated delta rule: a warp per (batch row, value head, value
//!   column). A column of the state evolves on its own (its recall, update
//!   and read involve no other column), so each warp walks the tokens with
//!   its column's cells in its lanes' registers, in f32 as the state is
//!   (the key width must be known when the model is built);
//! - cache writes: one work item per element written, copied in its stored
//!   type (exact); the cache is the kernel's output, changed in place. A
//!   position or span outside the cache writes nothing and raises
//!   [`Fault::OutsideCache`].

use super::emit::{Combine, Emitter, Fault, Form, Kernel, Unsupported, Warp, LANES};
use crate::ir::{Entry, Intrinsic, NodeKind, Value};
use crate::sema::dim::Dim;
use crate::sema::ty::Dtype;

/// The kernel of intrinsic node `at` of `entry`. A cache
/// write's kernel takes the cache as its output and the other arguments as
/// its loads; every other intrinsic's, all its arguments.
pub fn intrinsic_kernel(entry: &Entry, at: usize, form: Form) -> Result<Kernel, Unsupported> {
    let node = &entry.nodes[at];
    let NodeKind::Intrinsic(intrinsic, args) = &node.kind else { return Err(Unsupported("not an intrinsic node".into())) };
    let mut emitter = Emitter::new(entry, form);
    let operands = Operands { entry, args };
    match intrinsic {
        Intrinsic::GroupedAttention | Intrinsic::GroupedAttentionRows => {
            emitter.loads = args.clone();
            attention(&mut emitter, &operands, *intrinsic == Intrinsic::GroupedAttentionRows, node.dtype)?;
        }
        Intrinsic::GatedDeltaRule | Intrinsic::GatedDeltaStep => {
            emitter.loads = args.clone();
            delta_rule(&mut emitter, &operands, *intrinsic == Intrinsic::GatedDeltaRule)?;
        }
        Intrinsic::WriteAt | Intrinsic::WriteSpan | Intrinsic::WriteRows | Intrinsic::WriteSlots => {
            emitter.loads = args[1..].to_vec();
            write_cache(&mut emitter, &operands, *intrinsic);
        }
    }
    Ok(emitter.finish(at, node.dtype))
}

/// An intrinsic's arguments: their shapes and types.
struct Operands<'e> {
    entry: &'e Entry,
    args: &'e [Value],
}

impl Operands<'_> {
    fn shape(&self, arg: usize) -> &[Dim] {
        &self.entry.nodes[self.args[arg].index()].shape
    }

    fn dtype(&self, arg: usize) -> Dtype {
        self.entry.nodes[self.args[arg].index()].dtype
    }

    /// Axis `axis` of argument `arg`, counted from the end when negative,
    /// as an index.
    fn size(&self, emitter: &mut Emitter, arg: usize, axis: isize) -> String {
        let shape = self.shape(arg);
        let axis = if axis < 0 { (shape.len() as isize + axis) as usize } else { axis as usize };
        emitter.dim_index(&shape[axis])
    }
}

/// `%in{load}`: the name of a load (loads are the arguments, in order).
fn load_name(load: usize) -> String {
    format!("%in{load}")
}

/// The keys attention takes at a time.
const KEYS_PER_STEP: usize = 4;

/// A row's elements spread over a warp's lanes: lane `l` holds elements
/// `l`, `l + 32`, …, one per slot, as many slots as a row of `width`
/// needs (the width known when the model is built).
struct Spread {
    width: i64,
    /// The width, as an index.
    size: String,
    zero: String,
}

impl Spread {
    fn new(e: &mut Emitter, width: i64) -> Spread {
        Spread { width, size: e.index_constant(width), zero: e.index_constant(0) }
    }

    fn slots(&self) -> usize {
        ((self.width + i64::from(LANES) - 1) / i64::from(LANES)) as usize
    }

    /// Slot `slot`'s element of `lane`: its position in the row (0 past
    /// the width, so that it can be read) and, where the width is no
    /// multiple of a warp, whether it is one of the row's.
    fn position(&self, e: &mut Emitter, lane: &str, slot: usize) -> (String, Option<String>) {
        let first = e.index_constant(slot as i64 * i64::from(LANES));
        let position = e.add(&first, lane);
        if self.width % i64::from(LANES) == 0 {
            return (position, None);
        }
        let within = e.op(format!("arith.cmpi ult, {position}, {} : index", self.size));
        (e.op(format!("arith.select {within}, {position}, {} : index", self.zero)), Some(within))
    }

    /// Slot `slot`'s element of `lane` in `argument` (of `dtype`), at
    /// `at(position)`; 0 past the width.
    fn load(&self, e: &mut Emitter, lane: &str, slot: usize, argument: &str, dtype: Dtype, at: impl FnOnce(&mut Emitter, &str) -> String) -> String {
        let (position, within) = self.position(e, lane, slot);
        let at = at(e, &position);
        let x = e.load_element(argument, &at, dtype);
        match within {
            Some(within) => {
                let nothing = e.op("arith.constant 0.0 : f32".into());
                e.op(format!("arith.select {within}, {x}, {nothing} : f32"))
            }
            None => x,
        }
    }

    /// Stores `value` as slot `slot`'s element of `lane` in the output, at
    /// `at(position)`; nothing past the width.
    fn store(&self, e: &mut Emitter, lane: &str, slot: usize, value: String, dtype: Dtype, at: impl FnOnce(&mut Emitter, &str) -> String) {
        let (position, within) = self.position(e, lane, slot);
        let at = at(e, &position);
        match within {
            Some(within) => e.when(&within, |e| e.store_element(value, "%out", &at, dtype)),
            None => e.store_element(value, "%out", &at, dtype),
        }
    }
}

/// `grouped_attention` (mask `[Q, K]`, row `i`) and
/// `grouped_attention_rows` (mask `[B, 1, K]`, row `b`): q `[B, H, Q, D]`,
/// k and v `[B, KvH, K, D]`, the scale, the mask; the output is q's shape
/// and type. A row its mask admits no key of weighs every key alike.
///
/// A warp per query row and head, in one pass over the keys (an online
/// softmax, as flash attention's): lane `l` holds the row's elements `l`,
/// `l + 32`, … of the query and of the weighted sum, so each key's row is
/// read by the warp together; a key's score is the lanes' shares of the
/// dot product summed across the warp; the running maximum rescales the
/// sums so far. The keys go [`KEYS_PER_STEP`] at a time, so that their sums
/// across the warp overlap; a step none of whose keys the mask admits is
/// skipped by the whole warp, and a key it does not admit weighs 0.
fn attention(emitter: &mut Emitter, operands: &Operands, rows_mask: bool, dtype: Dtype) -> Result<(), Unsupported> {
    let width = operands.shape(0)[3]
        .as_constant()
        .ok_or_else(|| Unsupported("attention whose head width is known only when the model runs".into()))?;
    let (q, k, v, scale, mask) = (load_name(0), load_name(1), load_name(2), load_name(3), load_name(4));
    let (kd, scale_dtype) = (operands.dtype(1), operands.dtype(3));
    let (qd, vd) = (operands.dtype(0), operands.dtype(2));
    let [batch, heads, queries] = [0, 1, 2].map(|axis| operands.size(emitter, 0, axis));
    let (kv_heads, keys) = (operands.size(emitter, 1, 1), operands.size(emitter, 1, 2));
    let spread = Spread::new(emitter, width);
    let (slots, width_index) = (spread.slots(), spread.size.clone());
    let group = emitter.op(format!("arith.divui {heads}, {kv_heads} : index"));
    let zero = emitter.index_constant(0);
    emitter.parallel_in_warps(&operands.shape(0)[..3], |e, row, warp| {
        let position = e.split(row, &[&batch, &heads, &queries]);
        let (b, h, i) = (&position[0], &position[1], &position[2]);
        let kv = e.op(format!("arith.divui {h}, {group} : index"));
        let q_at = e.mul(row, &width_index);
        let kv_row = e.flat(&[b, &kv], &[&batch, &kv_heads]);
        let first_key = e.mul(&kv_row, &keys);
        let mask_at = e.mul(if rows_mask { b } else { i }, &keys);
        let scale = e.load_element(&scale, &zero, scale_dtype);
        let none = e.op("arith.constant false".into());
        let any = e.for_range(&zero, &keys, &[(none, "i1")], |e, j, carried| {
            let at = e.add(&mask_at, j);
            let admitted = e.load_element(&mask, &at, Dtype::Bool);
            vec![e.op(format!("arith.ori {}, {admitted} : i1", carried[0]))]
        })[0]
            .clone();
        let none_admitted = e.not(&any);
        let queries = e.in_lanes(warp, &[], slots, |e, lane, _| (0..slots).map(|slot| spread.load(e, lane, slot, &q, qd, |e, d| e.add(&q_at, d))).collect());
        let lane_type = e.lane_type();
        let lowest = e.op("arith.constant 0xFF800000 : f32".into());
        let nothing = e.op("arith.constant 0.0 : f32".into());
        let mut carried: Vec<(String, &str)> = vec![(lowest, "f32"), (nothing, "f32")];
        let zeros = e.lanes_zero();
        carried.extend((0..slots).map(|_| (zeros.clone(), lane_type.as_str())));
        let types: Vec<&str> = carried.iter().map(|(_, ty)| *ty).collect();
        // The keys a step takes: each one's row in k and v (the first key's
        // past the last) and whether it counts.
        let step = e.index_constant(KEYS_PER_STEP as i64);
        let results = e.for_steps(&zero, &keys, &step, &carried, |e, first, so_far| {
            let taken: Vec<(String, String)> = (0..KEYS_PER_STEP)
                .map(|offset| {
                    let offset = e.index_constant(offset as i64);
                    let j = e.add(first, &offset);
                    let inside = e.op(format!("arith.cmpi ult, {j}, {keys} : index"));
                    let j = e.op(format!("arith.select {inside}, {j}, {zero} : index"));
                    let at = e.add(&mask_at, &j);
                    let allowed = e.load_element(&mask, &at, Dtype::Bool);
                    let admitted = e.op(format!("arith.ori {allowed}, {none_admitted} : i1"));
                    let admitted = e.op(format!("arith.andi {admitted}, {inside} : i1"));
                    let key = e.add(&first_key, &j);
                    (e.mul(&key, &width_index), admitted)
                })
                .collect();
            let mut any_taken = taken[0].1.clone();
            for (_, admitted) in &taken[1..] {
                any_taken = e.op(format!("arith.ori {any_taken}, {admitted} : i1"));
            }
            e.if_else(
                &any_taken,
                &types,
                |e| {
                    let (top, total, sums) = (&so_far[0], &so_far[1], &so_far[2..]);
                    let shares = e.in_lanes(warp, &queries, KEYS_PER_STEP, |e, lane, queries| {
                        taken
                            .iter()
                            .map(|(key_at, _)| {
                                let mut dot = e.op("arith.constant 0.0 : f32".into());
                                for (slot, query) in queries.iter().enumerate() {
                                    let (d, _) = spread.position(e, lane, slot);
                                    let at = e.add(key_at, &d);
                                    let x = e.load_element(&k, &at, kd);
                                    dot = e.op(format!("math.fma {query}, {x}, {dot} : f32"));
                                }
                                dot
                            })
                            .collect()
                    });
                    let dots = e.combine_lanes(&shares, Combine::Add);
                    let (masked, left_out) = (e.op("arith.constant -1.0e30 : f32".into()), e.op("arith.constant 0xFF800000 : f32".into()));
                    let scores: Vec<String> = dots
                        .iter()
                        .zip(&taken)
                        .map(|(dot, (_, admitted))| {
                            let scaled = e.op(format!("arith.mulf {dot}, {scale} : f32"));
                            let score = e.op(format!("arith.select {any}, {scaled}, {masked} : f32"));
                            e.op(format!("arith.select {admitted}, {score}, {left_out} : f32"))
                        })
                        .collect();
                    let mut new_top = top.clone();
                    for score in &scores {
                        new_top = e.op(format!("arith.maximumf {new_top}, {score} : f32"));
                    }
                    let shift = e.op(format!("arith.subf {top}, {new_top} : f32"));
                    let rescale = e.op(format!("math.exp {shift} : f32"));
                    let mut new_total = e.op(format!("arith.mulf {total}, {rescale} : f32"));
                    let weights: Vec<String> = scores
                        .iter()
                        .map(|score| {
                            let shift = e.op(format!("arith.subf {score}, {new_top} : f32"));
                            let weight = e.op(format!("math.exp {shift} : f32"));
                            new_total = e.op(format!("arith.addf {new_total}, {weight} : f32"));
                            weight
                        })
                        .collect();
                    let sums = e.in_lanes(warp, sums, slots, |e, lane, sums| {
                        sums.iter()
                            .enumerate()
                            .map(|(slot, sum)| {
                                let (d, _) = spread.position(e, lane, slot);
                                let mut sum = e.op(format!("arith.mulf {sum}, {rescale} : f32"));
                                for ((value_at, _), weight) in taken.iter().zip(&weights) {
                                    let at = e.add(value_at, &d);
                                    let x = e.load_element(&v, &at, vd);
                                    sum = e.op(format!("math.fma {weight}, {x}, {sum} : f32"));
                                }
                                sum
                            })
                            .collect()
                    });
                    [vec![new_top, new_total], sums].concat()
                },
                |_| so_far.to_vec(),
            )
        });
        let (total, sums) = (&results[1], &results[2..]);
        e.in_lanes(warp, sums, 0, |e, lane, sums| {
            for (slot, sum) in sums.iter().enumerate() {
                let value = e.op(format!("arith.divf {sum}, {total} : f32"));
                spread.store(e, lane, slot, value, dtype, |e, d| e.add(&q_at, d));
            }
            Vec::new()
        });
    });
    Ok(())
}

/// `gated_delta_rule` (q, k `[B, S, KH, KD]`, v `[B, S, VH, VD]`, decay and
/// beta `[B, S, VH]`) or `gated_delta_step` (the same without S), the
/// state `[B, VH, KD, VD]` and the scale; the output `[B, S + KD, VH, VD]`
/// holds each token's read, then the final state.
///
/// A warp per (batch row, value head, value column): a column of the state
/// evolves on its own (its recall, update and read involve no other
/// column), and lane `l` holds its cells `l`, `l + 32`, … in registers
/// through the tokens, reading the keys' and queries' elements of the same
/// positions (the warp reads each row together). A token's recall and
/// read are the lanes' shares summed across the warp.
fn delta_rule(emitter: &mut Emitter, operands: &Operands, spans: bool) -> Result<(), Unsupported> {
    let key_width = operands.shape(0)[operands.shape(0).len() - 1]
        .as_constant()
        .ok_or_else(|| Unsupported("a delta rule whose key width is known only when the model runs".into()))?;
    let (q, k, v, decay, beta, state, scale) = (load_name(0), load_name(1), load_name(2), load_name(3), load_name(4), load_name(5), load_name(6));
    let (qd, kd, vd) = (operands.dtype(0), operands.dtype(1), operands.dtype(2));
    let (decay_dtype, beta_dtype, state_dtype, scale_dtype) = (operands.dtype(3), operands.dtype(4), operands.dtype(5), operands.dtype(6));
    let batch = operands.size(emitter, 0, 0);
    let tokens = if spans { operands.size(emitter, 0, 1) } else { emitter.index_constant(1) };
    let key_heads = operands.size(emitter, 0, -2);
    // A column's cells spread over the lanes.
    let spread = Spread::new(emitter, key_width);
    let (slots, key_dim) = (spread.slots(), spread.size.clone());
    let (value_heads, value_dim) = (operands.size(emitter, 2, -2), operands.size(emitter, 2, -1));
    let rows = emitter.add(&tokens, &key_dim);
    let group = emitter.op(format!("arith.divui {value_heads}, {key_heads} : index"));
    let zero = emitter.index_constant(0);
    let (q_shape, v_shape) = (operands.shape(0), operands.shape(2));
    let work = [q_shape[0].clone(), v_shape[v_shape.len() - 2].clone(), v_shape[v_shape.len() - 1].clone()];
    emitter.parallel_in_warps(&work, |e, item, warp| {
        let position = e.split(item, &[&batch, &value_heads, &value_dim]);
        let (b, h, j) = (&position[0], &position[1], &position[2]);
        let kh = e.op(format!("arith.divui {h}, {group} : index"));
        let scale = e.load_element(&scale, &zero, scale_dtype);
        let initial = e.in_lanes(warp, &[], slots, |e, lane, _| {
            (0..slots).map(|slot| spread.load(e, lane, slot, &state, state_dtype, |e, i| e.flat(&[b, h, i, j], &[&batch, &value_heads, &key_dim, &value_dim]))).collect()
        });
        let lane_type = e.lane_type();
        let carried: Vec<(String, &str)> = initial.iter().map(|cells| (cells.clone(), lane_type.as_str())).collect();
        let last = e.for_range(&zero, &tokens, &carried, |e, t, cells| {
            let gate_at = e.flat(&[b, t, h], &[&batch, &tokens, &value_heads]);
            let decay = e.load_element(&decay, &gate_at, decay_dtype);
            let forget = e.op(format!("math.exp {decay} : f32"));
            let rate = e.load_element(&beta, &gate_at, beta_dtype);
            let key_head = e.flat(&[b, t, &kh], &[&batch, &tokens, &key_heads]);
            let key_at = e.mul(&key_head, &key_dim);
            let value_at = e.flat(&[b, t, h, j], &[&batch, &tokens, &value_heads, &value_dim]);
            let value = e.load_element(&v, &value_at, vd);
            // The state decays, and recalls the value the key holds.
            let (decayed, recalled) = changed_cells(e, warp, cells, |e, lane, slot, memory| {
                let memory = e.op(format!("arith.mulf {memory}, {forget} : f32"));
                let key = spread.load(e, lane, slot, &k, kd, |e, i| e.add(&key_at, i));
                (memory, key)
            });
            let error = e.op(format!("arith.subf {value}, {recalled} : f32"));
            let update = e.op(format!("arith.mulf {error}, {rate} : f32"));
            // It learns the update along the key, and is read by the query.
            let (learned, read) = changed_cells(e, warp, &decayed, |e, lane, slot, memory| {
                let key = spread.load(e, lane, slot, &k, kd, |e, i| e.add(&key_at, i));
                let memory = e.op(format!("math.fma {key}, {update}, {memory} : f32"));
                let query = spread.load(e, lane, slot, &q, qd, |e, i| e.add(&key_at, i));
                (memory, query)
            });
            let read = e.op(format!("arith.mulf {read}, {scale} : f32"));
            let out_at = e.flat(&[b, t, h, j], &[&batch, &rows, &value_heads, &value_dim]);
            e.store_element(read, "%out", &out_at, Dtype::F32);
            learned
        });
        // The final state, in the output's last rows.
        e.in_lanes(warp, &last, 0, |e, lane, cells| {
            for (slot, memory) in cells.iter().enumerate() {
                spread.store(e, lane, slot, memory.clone(), Dtype::F32, |e, i| {
                    let row = e.add(&tokens, i);
                    e.flat(&[b, &row, h, j], &[&batch, &rows, &value_heads, &value_dim])
                });
            }
            Vec::new()
        });
    });
    Ok(())
}

/// Every lane's cells (values of the lane type) changed by `change`, which
/// is given the lane, the slot and the cell and gives the new cell and
/// what it is weighed by; the new cells, and the column's weighted sum
/// (across the warp).
fn changed_cells(e: &mut Emitter, warp: &Warp, cells: &[String], change: impl Fn(&mut Emitter, &str, usize, &str) -> (String, String)) -> (Vec<String>, String) {
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

/// The cache writes: `write_at` and `write_span` (x `[R, A, S, W]` at
/// `pos..pos + S` of every row), `write_rows` (x `[R, A, 1, W]`, row `r` at
/// `positions[r]`, skipped when outside), `write_slots` (x `[M, A, S, W]`,
/// request `m` into row `slots[m]` at `start..start + S`).
fn write_cache(emitter: &mut Emitter, operands: &Operands, intrinsic: Intrinsic) {
    let dtype = operands.dtype(0);
    let x = load_name(0);
    let [cache_rows, axis, length, width] = [0, 1, 2, 3].map(|at| operands.size(emitter, 0, at));
    let [x_rows, _, span, _] = [0, 1, 2, 3].map(|at| operands.size(emitter, 1, at));
    let zero = emitter.index_constant(0);
    // Each work item is one element of `x` (one of a cache row's span for
    // `write_slots`, whose rows are the cache's).
    let rows = if intrinsic == Intrinsic::WriteSlots { cache_rows.clone() } else { x_rows.clone() };
    let mut work = operands.shape(1).to_vec();
    if intrinsic == Intrinsic::WriteSlots {
        work[0] = operands.shape(0)[0].clone();
    }
    let (start_dtype, start_load) = match intrinsic {
        Intrinsic::WriteAt | Intrinsic::WriteSpan => (Some(operands.dtype(2)), load_name(1)),
        Intrinsic::WriteSlots => (Some(operands.dtype(3)), load_name(2)),
        _ => (None, String::new()),
    };
    emitter.parallel(&work, |e, item| {
        let position = e.split(item, &[&rows, &axis, &span, &width]);
        let (row, a, l, w) = (&position[0], &position[1], &position[2], &position[3]);
        // The first position written: `pos`/`start`, checked against the
        // cache; `write_rows`' own row's position, skipped when outside.
        let (first, inside) = match start_dtype {
            Some(start_dtype) => {
                // `start + span <= length`: `start` in `0..length - span + 1`.
                let start = e.load_element(&start_load, &zero, start_dtype);
                let room = e.op(format!("arith.subi {length}, {span} : index"));
                let room = e.op(format!("arith.index_cast {room} : index to i64"));
                let one = e.op("arith.constant 1 : i64".into());
                let starts = e.op(format!("arith.addi {room}, {one} : i64"));
                let inside = e.inside(&start, &starts);
                let outside = e.not(&inside);
                e.when(&outside, |e| e.fault(Fault::OutsideCache, &[]));
                (start, inside)
            }
            None => {
                let at = e.load_element(&load_name(1), row, operands.dtype(2));
                let length_i64 = e.op(format!("arith.index_cast {length} : index to i64"));
                let inside = e.inside(&at, &length_i64);
                (at, inside)
            }
        };
        e.when(&inside, |e| {
            let first = e.op(format!("arith.index_cast {first} : i64 to index"));
            let to_position = e.add(&first, l);
            let to = e.flat(&[row, a, &to_position, w], &[&cache_rows, &axis, &length, &width]);
            if intrinsic != Intrinsic::WriteSlots {
                copy(e, &x, item, &to, dtype);
                return;
            }
            // The request written into this row: 1 + its number, summed
            // over the slots that name the row (as the Linnet body), or 0.
            let slots = load_name(1);
            let (row_i64, none) = (e.op(format!("arith.index_cast {row} : index to i64")), e.op("arith.constant 0 : i64".into()));
            let owner = e.for_range(&zero, &x_rows, &[(none.clone(), "i64")], |e, m, carried| {
                let slot = e.load_element(&slots, m, operands.dtype(2));
                let named = e.op(format!("arith.cmpi eq, {slot}, {row_i64} : i64"));
                let m = e.op(format!("arith.index_cast {m} : index to i64"));
                let one = e.op("arith.constant 1 : i64".into());
                let request = e.op(format!("arith.addi {m}, {one} : i64"));
                let sum = e.op(format!("arith.addi {}, {request} : i64", carried[0]));
                vec![e.op(format!("arith.select {named}, {sum}, {} : i64", carried[0]))]
            })[0]
                .clone();
            let written = e.op(format!("arith.cmpi sgt, {owner}, {none} : i64"));
            e.when(&written, |e| {
                let x_rows_i64 = e.op(format!("arith.index_cast {x_rows} : index to i64"));
                let beyond = e.op(format!("arith.cmpi sgt, {owner}, {x_rows_i64} : i64"));
                let one = e.op("arith.constant 1 : i64".into());
                let request = e.op(format!("arith.subi {owner}, {one} : i64"));
                e.line(format!("scf.if {beyond} {{"));
                e.fault(Fault::RequestOutsideX, &[&request]);
                e.line("} else {".into());
                let request = e.op(format!("arith.index_cast {request} : i64 to index"));
                let from = e.flat(&[&request, a, l, w], &[&x_rows, &axis, &span, &width]);
                copy(e, &x, &from, &to, dtype);
                e.line("}".into());
            });
        });
    });
}

/// Copies element `from` of `source` to element `to` of the output, in
/// their stored type.
fn copy(emitter: &mut Emitter, source: &str, from: &str, to: &str, dtype: Dtype) {
    let ty = super::emit::stored(dtype);
    let element = emitter.op(format!("memref.load {source}[{from}] : memref<?x{ty}>"));
    emitter.line(format!("memref.store {element}, %out[{to}] : memref<?x{ty}>"));
}
