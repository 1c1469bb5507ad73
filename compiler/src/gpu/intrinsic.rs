//! The intrinsics as MLIR kernels (in `emit`'s calling convention), each
//! independent work items with sequential loops inside, computing what
//! `crate::intrinsics` defines in f32:
//! - attention: its own kernels (`attention`), which share the helpers
//!   here;
//! - the gated delta rule: a warp per (batch row, value head, value
//!   column). A column of the state evolves on its own (its recall, update
//!   and read involve no other column), so each warp walks the tokens with
//!   its column's cells in its lanes' registers, in f32 as the state is
//!   (the key width must be known when the model is built);
//! - cache writes: one work item per element written, copied in its stored
//!   type (exact); the cache is the kernel's output, changed in place. A
//!   position or span outside the cache writes nothing and raises
//!   [`Fault::OutsideCache`]; after a node of the call raised a fault,
//!   nothing is written.

use super::emit::{Combine, Emitter, Fault, Form, Kernel, Unsupported, Warp, LANES};
use crate::ir::{Entry, Intrinsic, NodeKind, Value};
use crate::sema::dim::Dim;
use crate::sema::ty::Dtype;

/// The kernels of intrinsic node `at` of `entry`, in launch order. A cache
/// write's kernel takes the cache as its output and the other arguments as
/// its loads; every other intrinsic's, all its arguments.
pub fn intrinsic_kernels(entry: &Entry, at: usize, form: Form) -> Result<Vec<Kernel>, Unsupported> {
    let node = &entry.nodes[at];
    let NodeKind::Intrinsic(intrinsic, args) = &node.kind else { return Err(Unsupported("not an intrinsic node".into())) };
    let mut emitter = Emitter::new(entry, at, 0, form);
    let operands = Operands { entry, args };
    match intrinsic {
        Intrinsic::GroupedAttention | Intrinsic::GroupedAttentionRows => {
            return super::attention::attention_kernels(entry, at, form, args, *intrinsic == Intrinsic::GroupedAttentionRows);
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
    Ok(vec![emitter.finish(node.dtype)])
}

/// An intrinsic's arguments: their shapes and types.
pub(super) struct Operands<'e> {
    pub(super) entry: &'e Entry,
    pub(super) args: &'e [Value],
}

impl Operands<'_> {
    pub(super) fn shape(&self, arg: usize) -> &[Dim] {
        &self.entry.nodes[self.args[arg].index()].shape
    }

    pub(super) fn dtype(&self, arg: usize) -> Dtype {
        self.entry.nodes[self.args[arg].index()].dtype
    }

    /// Axis `axis` of argument `arg`, counted from the end when negative,
    /// as an index.
    pub(super) fn size(&self, emitter: &mut Emitter, arg: usize, axis: isize) -> String {
        let shape = self.shape(arg);
        let axis = if axis < 0 { (shape.len() as isize + axis) as usize } else { axis as usize };
        emitter.dim_index(&shape[axis])
    }
}

/// `%in{load}`: the name of a load (loads are the arguments, in order).
pub(super) fn load_name(load: usize) -> String {
    format!("%in{load}")
}

/// A row's elements spread over a warp's lanes: lane `l` holds elements
/// `l`, `l + 32`, …, one per slot, as many slots as a row of `width`
/// needs (the width known when the model is built).
pub(super) struct Spread {
    width: i64,
    /// The width, as an index.
    pub(super) size: String,
    zero: String,
}

impl Spread {
    pub(super) fn new(e: &mut Emitter, width: i64) -> Spread {
        Spread { width, size: e.index_constant(width), zero: e.index_constant(0) }
    }

    pub(super) fn slots(&self) -> usize {
        ((self.width + i64::from(LANES) - 1) / i64::from(LANES)) as usize
    }

    /// Slot `slot`'s element of `lane`: its position in the row (0 past
    /// the width, so that it can be read) and, where the width is no
    /// multiple of a warp, whether it is one of the row's.
    pub(super) fn position(&self, e: &mut Emitter, lane: &str, slot: usize) -> (String, Option<String>) {
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
    pub(super) fn load(&self, e: &mut Emitter, lane: &str, slot: usize, argument: &str, dtype: Dtype, at: impl FnOnce(&mut Emitter, &str) -> String) -> String {
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

    /// Stores `value` as slot `slot`'s element of `lane` in `target` (an
    /// argument and its dtype), at `at(position)`; nothing past the width.
    pub(super) fn store(&self, e: &mut Emitter, lane: &str, slot: usize, value: String, target: (&str, Dtype), at: impl FnOnce(&mut Emitter, &str) -> String) {
        let (argument, dtype) = target;
        let (position, within) = self.position(e, lane, slot);
        let at = at(e, &position);
        match within {
            Some(within) => e.when(&within, |e| e.store_element(value, argument, &at, dtype)),
            None => e.store_element(value, argument, &at, dtype),
        }
    }
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
                spread.store(e, lane, slot, memory.clone(), ("%out", Dtype::F32), |e, i| {
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
    // A write after the node a call fails at writes nothing.
    emitter.parallel(&work, |e, item| e.unless_faulted(|e| {
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
                e.fault(Fault::RequestOutsideX, &[&request, &x_rows_i64]);
                e.line("} else {".into());
                let request = e.op(format!("arith.index_cast {request} : i64 to index"));
                let from = e.flat(&[&request, a, l, w], &[&x_rows, &axis, &span, &width]);
                copy(e, &x, &from, &to, dtype);
                e.line("}".into());
            });
        });
    }));
}

/// Copies element `from` of `source` to element `to` of the output, in
/// their stored type.
fn copy(emitter: &mut Emitter, source: &str, from: &str, to: &str, dtype: Dtype) {
    let ty = super::emit::stored(dtype);
    let element = emitter.op(format!("memref.load {source}[{from}] : memref<?x{ty}>"));
    emitter.line(format!("memref.store {element}, %out[{to}] : memref<?x{ty}>"));
}
