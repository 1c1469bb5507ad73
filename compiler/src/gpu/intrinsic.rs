//! The intrinsics as MLIR kernels (in `emit`'s calling convention), each
//! independent work items with sequential loops inside, computing what
//! `crate::intrinsics` defines in f32:
//! - attention: a warp per query row and head, one pass over the keys with
//!   an online softmax, the row's elements spread over the lanes (the
//!   head's width must be known when the model is built);
//! - the gated delta rule: one work item per (batch row, value head, value
//!   column). A column of the state evolves on its own (its recall, update
//!   and read involve no other column), so each item walks the tokens with
//!   its column held in the output's final-state rows, which are f32, as
//!   the state is: rounded after every decay and update, as the reference;
//! - cache writes: one work item per element written, copied in its stored
//!   type (exact); the cache is the kernel's output, changed in place. A
//!   position or span outside the cache writes nothing and raises
//!   [`Fault::OutsideCache`].

use super::emit::{Combine, Emitter, Fault, Form, Kernel, Unsupported, LANES};
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
            delta_rule(&mut emitter, &operands, *intrinsic == Intrinsic::GatedDeltaRule);
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
/// sums so far. A masked key is skipped by the whole warp.
fn attention(emitter: &mut Emitter, operands: &Operands, rows_mask: bool, dtype: Dtype) -> Result<(), Unsupported> {
    let width = operands.shape(0)[3]
        .as_constant()
        .ok_or_else(|| Unsupported("attention whose head width is known only when the model runs".into()))?;
    // A lane's elements of a row: `slot * LANES + lane` for each slot.
    let slots = (width + i64::from(LANES) - 1) / i64::from(LANES);
    let ragged = width % i64::from(LANES) != 0;
    let (q, k, v, scale, mask) = (load_name(0), load_name(1), load_name(2), load_name(3), load_name(4));
    let (kd, scale_dtype) = (operands.dtype(1), operands.dtype(3));
    let (qd, vd) = (operands.dtype(0), operands.dtype(2));
    let [batch, heads, queries] = [0, 1, 2].map(|axis| operands.size(emitter, 0, axis));
    let (kv_heads, keys) = (operands.size(emitter, 1, 1), operands.size(emitter, 1, 2));
    let width_index = emitter.index_constant(width);
    let group = emitter.op(format!("arith.divui {heads}, {kv_heads} : index"));
    let zero = emitter.index_constant(0);
    // Element `slot` of this lane in the row from `row_at`: its position
    // (0 past the width) and whether it is one of the row's.
    let element = |e: &mut Emitter, row_at: &str, lane: &str, slot: i64| {
        let first = e.index_constant(slot * i64::from(LANES));
        let d = e.add(&first, lane);
        let within = ragged.then(|| e.op(format!("arith.cmpi ult, {d}, {width_index} : index")));
        let d = match &within {
            Some(within) => e.op(format!("arith.select {within}, {d}, {zero} : index")),
            None => d,
        };
        (e.add(row_at, &d), within)
    };
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
        let queries = e.in_lanes(warp, &[], slots as usize, |e, lane, _| {
            (0..slots)
                .map(|slot| {
                    let (at, within) = element(e, &q_at, lane, slot);
                    let x = e.load_element(&q, &at, qd);
                    match within {
                        Some(within) => {
                            let nothing = e.op("arith.constant 0.0 : f32".into());
                            e.op(format!("arith.select {within}, {x}, {nothing} : f32"))
                        }
                        None => x,
                    }
                })
                .collect()
        });
        let lane_type = e.lane_type();
        let lowest = e.op("arith.constant 0xFF800000 : f32".into());
        let nothing = e.op("arith.constant 0.0 : f32".into());
        let mut carried: Vec<(String, &str)> = vec![(lowest, "f32"), (nothing, "f32")];
        let zeros = e.lanes_zero();
        carried.extend((0..slots).map(|_| (zeros.clone(), lane_type.as_str())));
        let types: Vec<&str> = carried.iter().map(|(_, ty)| *ty).collect();
        let results = e.for_range(&zero, &keys, &carried, |e, j, so_far| {
            let at = e.add(&mask_at, j);
            let allowed = e.load_element(&mask, &at, Dtype::Bool);
            let admitted = e.op(format!("arith.ori {allowed}, {none_admitted} : i1"));
            e.if_else(
                &admitted,
                &types,
                |e| {
                    let (top, total, sums) = (&so_far[0], &so_far[1], &so_far[2..]);
                    let key = e.add(&first_key, j);
                    let key_at = e.mul(&key, &width_index);
                    let shares = e.in_lanes(warp, &queries, 1, |e, lane, queries| {
                        let mut dot = e.op("arith.constant 0.0 : f32".into());
                        for (slot, query) in queries.iter().enumerate() {
                            let (at, _) = element(e, &key_at, lane, slot as i64);
                            let x = e.load_element(&k, &at, kd);
                            dot = e.op(format!("math.fma {query}, {x}, {dot} : f32"));
                        }
                        vec![dot]
                    });
                    let dot = e.combine_lanes(&shares[0], Combine::Add);
                    let scaled = e.op(format!("arith.mulf {dot}, {scale} : f32"));
                    let masked = e.op("arith.constant -1.0e30 : f32".into());
                    let score = e.op(format!("arith.select {any}, {scaled}, {masked} : f32"));
                    let new_top = e.op(format!("arith.maximumf {top}, {score} : f32"));
                    let shift = e.op(format!("arith.subf {top}, {new_top} : f32"));
                    let rescale = e.op(format!("math.exp {shift} : f32"));
                    let shift = e.op(format!("arith.subf {score}, {new_top} : f32"));
                    let weight = e.op(format!("math.exp {shift} : f32"));
                    let scaled_total = e.op(format!("arith.mulf {total}, {rescale} : f32"));
                    let new_total = e.op(format!("arith.addf {scaled_total}, {weight} : f32"));
                    let sums = e.in_lanes(warp, sums, slots as usize, |e, lane, sums| {
                        sums.iter()
                            .enumerate()
                            .map(|(slot, sum)| {
                                let (at, _) = element(e, &key_at, lane, slot as i64);
                                let x = e.load_element(&v, &at, vd);
                                let kept = e.op(format!("arith.mulf {sum}, {rescale} : f32"));
                                e.op(format!("math.fma {weight}, {x}, {kept} : f32"))
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
                let (at, within) = element(e, &q_at, lane, slot as i64);
                let value = e.op(format!("arith.divf {sum}, {total} : f32"));
                match within {
                    Some(within) => e.when(&within, |e| e.store_element(value, "%out", &at, dtype)),
                    None => e.store_element(value, "%out", &at, dtype),
                }
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
fn delta_rule(emitter: &mut Emitter, operands: &Operands, spans: bool) {
    let (q, k, v, decay, beta, state, scale) = (load_name(0), load_name(1), load_name(2), load_name(3), load_name(4), load_name(5), load_name(6));
    let (qd, kd, vd) = (operands.dtype(0), operands.dtype(1), operands.dtype(2));
    let (decay_dtype, beta_dtype, state_dtype, scale_dtype) = (operands.dtype(3), operands.dtype(4), operands.dtype(5), operands.dtype(6));
    let batch = operands.size(emitter, 0, 0);
    let tokens = if spans { operands.size(emitter, 0, 1) } else { emitter.index_constant(1) };
    let (key_heads, key_dim) = (operands.size(emitter, 0, -2), operands.size(emitter, 0, -1));
    let (value_heads, value_dim) = (operands.size(emitter, 2, -2), operands.size(emitter, 2, -1));
    let rows = emitter.add(&tokens, &key_dim);
    let group = emitter.op(format!("arith.divui {value_heads}, {key_heads} : index"));
    let zero = emitter.index_constant(0);
    let (q_shape, v_shape) = (operands.shape(0), operands.shape(2));
    let work = [q_shape[0].clone(), v_shape[v_shape.len() - 2].clone(), v_shape[v_shape.len() - 1].clone()];
    emitter.parallel(&work, |e, item| {
        let position = e.split(item, &[&batch, &value_heads, &value_dim]);
        let (b, h, j) = (&position[0], &position[1], &position[2]);
        let kh = e.op(format!("arith.divui {h}, {group} : index"));
        let scale = e.load_element(&scale, &zero, scale_dtype);
        // Cell `i` of this column: in the output's final-state rows.
        let cell = |e: &mut Emitter, i: &str| {
            let row = e.add(&tokens, i);
            e.flat(&[b, &row, h, j], &[&batch, &rows, &value_heads, &value_dim])
        };
        e.for_range(&zero, &key_dim, &[], |e, i, _| {
            let from = e.flat(&[b, h, i, j], &[&batch, &value_heads, &key_dim, &value_dim]);
            let initial = e.load_element(&state, &from, state_dtype);
            let to = cell(e, i);
            e.store_element(initial, "%out", &to, Dtype::F32);
            Vec::new()
        });
        e.for_range(&zero, &tokens, &[], |e, t, _| {
            let gate_at = e.flat(&[b, t, h], &[&batch, &tokens, &value_heads]);
            let decay = e.load_element(&decay, &gate_at, decay_dtype);
            let forget = e.op(format!("math.exp {decay} : f32"));
            let rate = e.load_element(&beta, &gate_at, beta_dtype);
            let key_head = e.flat(&[b, t, &kh], &[&batch, &tokens, &key_heads]);
            let key_at = e.mul(&key_head, &key_dim);
            let value_at = e.flat(&[b, t, h, j], &[&batch, &tokens, &value_heads, &value_dim]);
            let value = e.load_element(&v, &value_at, vd);
            // The state decays, and recalls the value the key holds.
            let nothing = e.op("arith.constant 0.0 : f32".into());
            let recalled = e.for_range(&zero, &key_dim, &[(nothing.clone(), "f32")], |e, i, carried| {
                let at = cell(e, i);
                let memory = e.load_element("%out", &at, Dtype::F32);
                let memory = e.op(format!("arith.mulf {memory}, {forget} : f32"));
                e.store_element(memory.clone(), "%out", &at, Dtype::F32);
                let key_index = e.add(&key_at, i);
                let key = e.load_element(&k, &key_index, kd);
                vec![e.op(format!("math.fma {memory}, {key}, {} : f32", carried[0]))]
            })[0]
                .clone();
            let error = e.op(format!("arith.subf {value}, {recalled} : f32"));
            let update = e.op(format!("arith.mulf {error}, {rate} : f32"));
            // It learns the update along the key, and is read by the query.
            let read = e.for_range(&zero, &key_dim, &[(nothing, "f32")], |e, i, carried| {
                let at = cell(e, i);
                let key_index = e.add(&key_at, i);
                let key = e.load_element(&k, &key_index, kd);
                let memory = e.load_element("%out", &at, Dtype::F32);
                let memory = e.op(format!("math.fma {key}, {update}, {memory} : f32"));
                e.store_element(memory.clone(), "%out", &at, Dtype::F32);
                let query = e.load_element(&q, &key_index, qd);
                vec![e.op(format!("math.fma {memory}, {query}, {} : f32", carried[0]))]
            })[0]
                .clone();
            let read = e.op(format!("arith.mulf {read}, {scale} : f32"));
            let out_at = e.flat(&[b, t, h, j], &[&batch, &rows, &value_heads, &value_dim]);
            e.store_element(read, "%out", &out_at, Dtype::F32);
            Vec::new()
        });
    });
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
