//! The intrinsics as MLIR kernels (in `emit`'s calling convention), each
//! independent work items with sequential loops inside, computing what
//! `linnet_exec::reference` defines in f32:
//! - attention: its own kernels (`attention`), which share the helpers
//!   here;
//! - the gated delta rule: its own kernels (`delta`);
//! - cache writes: one work item per element written, copied in its stored
//!   type (exact); the cache is the kernel's output, changed in place. A
//!   position or span outside the cache writes nothing and raises
//!   [`Fault::OutsideCache`]; after a node of the call raised a fault,
//!   nothing is written.

use super::emit::{Emitter, Fault, Form, Kernel, ModelEntry, Unsupported, WARP_LANES};
use linnet_ir::dim::Dim;
use linnet_ir::Dtype;
use linnet_ir::{Intrinsic, NodeKind, Value};

/// The kernels of intrinsic node `at` of `entry`, in launch order. A cache
/// write's kernel takes the cache as its output and the other arguments as
/// its loads; every other intrinsic's, all its arguments.
pub fn intrinsic_kernels(entry: ModelEntry<'_>, at: usize, form: Form) -> Result<Vec<Kernel>, Unsupported> {
    let node = &entry.nodes[at];
    let NodeKind::Intrinsic(intrinsic, args) = &node.kind else {
        return Err(Unsupported("not an intrinsic node".into()));
    };
    let mut emitter = Emitter::new(entry, at, 0, form);
    let operands = Operands { entry, args };
    match intrinsic {
        Intrinsic::GroupedAttention | Intrinsic::GroupedAttentionRows | Intrinsic::GroupedAttentionSinks => {
            return super::attention::attention_kernels(entry, at, form, args);
        }
        Intrinsic::GatedDeltaRule | Intrinsic::GatedDeltaStep => {
            return super::delta::delta_rule_kernels(entry, at, form, args, *intrinsic == Intrinsic::GatedDeltaRule);
        }
        Intrinsic::WriteAt | Intrinsic::WriteSpan | Intrinsic::WriteRows => {
            emitter.loads = args[1..].to_vec();
            write_cache(&mut emitter, &operands, *intrinsic);
        }
        Intrinsic::WriteSlots => {
            emitter.loads = args[1..].to_vec();
            write_slots(&mut emitter, &operands);
        }
    }
    Ok(vec![emitter.finish(node.dtype)])
}

/// An intrinsic's arguments: their shapes and types.
pub(super) struct Operands<'e> {
    pub(super) entry: ModelEntry<'e>,
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
        ((self.width + i64::from(WARP_LANES) - 1) / i64::from(WARP_LANES)) as usize
    }

    /// Slot `slot`'s element of `lane`: its position in the row (0 past
    /// the width, so that it can be read) and, where the width is no
    /// multiple of a warp, whether it is one of the row's.
    pub(super) fn position(&self, e: &mut Emitter, lane: &str, slot: usize) -> (String, Option<String>) {
        let first = e.index_constant(slot as i64 * i64::from(WARP_LANES));
        let position = e.add(&first, lane);
        if self.width % i64::from(WARP_LANES) == 0 {
            return (position, None);
        }
        let within = e.op(format!("arith.cmpi ult, {position}, {} : index", self.size));
        (e.op(format!("arith.select {within}, {position}, {} : index", self.zero)), Some(within))
    }

    /// Slot `slot`'s element of `lane` in `argument` (of `dtype`), at
    /// `at(position)`; 0 past the width.
    pub(super) fn load(
        &self,
        e: &mut Emitter,
        lane: &str,
        slot: usize,
        argument: &str,
        dtype: Dtype,
        at: impl FnOnce(&mut Emitter, &str) -> String,
    ) -> String {
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
    pub(super) fn store(
        &self,
        e: &mut Emitter,
        lane: &str,
        slot: usize,
        value: String,
        target: (&str, Dtype),
        at: impl FnOnce(&mut Emitter, &str) -> String,
    ) {
        let (argument, dtype) = target;
        let (position, within) = self.position(e, lane, slot);
        let at = at(e, &position);
        match within {
            Some(within) => e.when(&within, |e| e.store_element(value, argument, &at, dtype)),
            None => e.store_element(value, argument, &at, dtype),
        }
    }
}

/// The cache writes: `write_at` and `write_span` (x `[R, A, S, W]` at
/// `pos..pos + S` of every row), `write_rows` (x `[R, A, 1, W]`, row `r` at
/// `positions[r]`).
fn write_cache(emitter: &mut Emitter, operands: &Operands, intrinsic: Intrinsic) {
    let dtype = operands.dtype(0);
    let x = load_name(0);
    let [_, axis, length, width] = [0, 1, 2, 3].map(|at| operands.size(emitter, 0, at));
    let [rows, _, span, _] = [0, 1, 2, 3].map(|at| operands.size(emitter, 1, at));
    let zero = emitter.index_constant(0);
    // Each work item is one element of `x`.
    let work = operands.shape(1).to_vec();
    let shared_start = matches!(intrinsic, Intrinsic::WriteAt | Intrinsic::WriteSpan);
    // A write after the node a call fails at writes nothing.
    emitter.parallel(&work, |e, item| {
        e.unless_faulted(|e| {
            let position = e.split(item, &[&rows, &axis, &span, &width]);
            let (row, a, l, w) = (&position[0], &position[1], &position[2], &position[3]);
            // The first position written: `pos`, or `write_rows`' own
            // row's position, checked against the cache.
            let (first, inside) = if shared_start {
                // `pos + span <= length`: `pos` in `0..length - span + 1`.
                let start = e.load_element(&load_name(1), &zero, operands.dtype(2));
                let room = e.op(format!("arith.subi {length}, {span} : index"));
                let room = e.op(format!("arith.index_cast {room} : index to i64"));
                let one = e.op("arith.constant 1 : i64".into());
                let starts = e.op(format!("arith.addi {room}, {one} : i64"));
                let inside = e.inside(&start, &starts);
                let outside = e.not(&inside);
                e.when(&outside, |e| e.fault(Fault::OutsideCache, &[]));
                (start, inside)
            } else {
                let at = e.load_element(&load_name(1), row, operands.dtype(2));
                let length_i64 = e.op(format!("arith.index_cast {length} : index to i64"));
                let inside = e.inside(&at, &length_i64);
                let outside = e.not(&inside);
                e.when(&outside, |e| e.fault(Fault::OutsideCache, &[]));
                (at, inside)
            };
            e.when(&inside, |e| {
                let first = e.op(format!("arith.index_cast {first} : i64 to index"));
                let to_position = e.add(&first, l);
                let to = e.flat(&[row, a, &to_position, w], &[&rows, &axis, &length, &width]);
                copy(e, &x, item, &to, dtype);
            });
        })
    });
}

/// `write_slots` (x `[M, A, S, W]`, request `m` into row `slots[m]` at
/// `starts[m]..starts[m] + S`, positions past the cache's end kept): one
/// work item per element of a cache row's span. A start outside
/// `0..=length` raises [`Fault::OutsideCache`], a row whose requests sum
/// past `x` [`Fault::RequestOutsideX`].
fn write_slots(emitter: &mut Emitter, operands: &Operands) {
    let dtype = operands.dtype(0);
    let x = load_name(0);
    let [cache_rows, axis, length, width] = [0, 1, 2, 3].map(|at| operands.size(emitter, 0, at));
    let [x_rows, _, span, _] = [0, 1, 2, 3].map(|at| operands.size(emitter, 1, at));
    let zero = emitter.index_constant(0);
    let mut work = operands.shape(1).to_vec();
    work[0] = operands.shape(0)[0].clone();
    let (slots, starts) = (load_name(1), load_name(2));
    emitter.parallel(&work, |e, item| {
        e.unless_faulted(|e| {
            let position = e.split(item, &[&cache_rows, &axis, &span, &width]);
            let (row, a, l, w) = (&position[0], &position[1], &position[2], &position[3]);
            let length_i64 = e.op(format!("arith.index_cast {length} : index to i64"));
            let one = e.op("arith.constant 1 : i64".into());
            let starts_end = e.op(format!("arith.addi {length_i64}, {one} : i64"));
            // The request written into this row (1 + its number) and its
            // start, each summed over the slots that name the row (as the
            // Linnet body), or 0; every start checked on the way.
            let (row_i64, none) =
                (e.op(format!("arith.index_cast {row} : index to i64")), e.op("arith.constant 0 : i64".into()));
            let found =
                e.for_range(&zero, &x_rows, &[(none.clone(), "i64"), (none.clone(), "i64")], |e, m, carried| {
                    let slot = e.load_element(&slots, m, operands.dtype(2));
                    let start = e.load_element(&starts, m, operands.dtype(3));
                    let inside = e.inside(&start, &starts_end);
                    let outside = e.not(&inside);
                    e.when(&outside, |e| e.fault(Fault::OutsideCache, &[]));
                    let named = e.op(format!("arith.cmpi eq, {slot}, {row_i64} : i64"));
                    let m = e.op(format!("arith.index_cast {m} : index to i64"));
                    let request = e.op(format!("arith.addi {m}, {one} : i64"));
                    let owner = e.op(format!("arith.addi {}, {request} : i64", carried[0]));
                    let first = e.op(format!("arith.addi {}, {start} : i64", carried[1]));
                    vec![
                        e.op(format!("arith.select {named}, {owner}, {} : i64", carried[0])),
                        e.op(format!("arith.select {named}, {first}, {} : i64", carried[1])),
                    ]
                });
            let (owner, first) = (&found[0], &found[1]);
            let l_i64 = e.op(format!("arith.index_cast {l} : index to i64"));
            let to_position = e.op(format!("arith.addi {first}, {l_i64} : i64"));
            let within = e.inside(&to_position, &length_i64);
            let named = e.op(format!("arith.cmpi sgt, {owner}, {none} : i64"));
            let written = e.op(format!("arith.andi {named}, {within} : i1"));
            e.when(&written, |e| {
                let x_rows_i64 = e.op(format!("arith.index_cast {x_rows} : index to i64"));
                let beyond = e.op(format!("arith.cmpi sgt, {owner}, {x_rows_i64} : i64"));
                let request = e.op(format!("arith.subi {owner}, {one} : i64"));
                e.line(format!("scf.if {beyond} {{"));
                e.fault(Fault::RequestOutsideX, &[&request, &x_rows_i64]);
                e.line("} else {".into());
                let request = e.op(format!("arith.index_cast {request} : i64 to index"));
                let from = e.flat(&[&request, a, l, w], &[&x_rows, &axis, &span, &width]);
                let to_position = e.op(format!("arith.index_cast {to_position} : i64 to index"));
                let to = e.flat(&[row, a, &to_position, w], &[&cache_rows, &axis, &length, &width]);
                copy(e, &x, &from, &to, dtype);
                e.line("}".into());
            });
        })
    });
}

/// Copies element `from` of `source` to element `to` of the output, in
/// their stored type.
fn copy(emitter: &mut Emitter, source: &str, from: &str, to: &str, dtype: Dtype) {
    let ty = super::emit::stored(dtype);
    let element = emitter.op(format!("memref.load {source}[{from}] : memref<?x{ty}>"));
    emitter.line(format!("memref.store {element}, %out[{to}] : memref<?x{ty}>"));
}
