//! The innermost loop of an elementwise float node in vectors: four f32
//! lanes (Cranelift's 128-bit vectors) over consecutive positions of the
//! node's last axis, with the scalar code for the tail and for any four
//! positions where a load would fall outside its value. There the scalar
//! code, lazy as the definition is, decides: it reports the error, or
//! takes the branch that reads nowhere outside.
//!
//! What varies along the last axis is computed in lanes: loads whose last
//! position is that axis plus an offset (one vector load of f32 or bf16
//! elements), float arithmetic, comparisons as masks, selects, `exp` (as
//! `codegen::expf` computes it), rounding to bf16, and
//! reductions whose body varies. Anything else that varies (a gather,
//! integer arithmetic, `log`, `tanh`, f16) is computed lane by lane by the
//! scalar code; what does not vary is computed once by the scalar code and
//! splatted. Lanes compute in f32 where the scalar code uses f64: the
//! numerics a compiled backend may use (`docs/language.md`).

use super::{float_condition, Lowerer, Store, Stored};
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{types, Endianness, InstBuilder, MemFlagsData, Type};
use cranelift_frontend::Variable;
use linnet_ir::Dtype;
use linnet_ir::{BinaryOp, ReduceOp, Scalar, UnaryOp, Value};
use linnet_kernels::expf;
use std::collections::HashSet;

type ClValue = cranelift_codegen::ir::Value;

/// Positions computed at once.
const VECTOR_LANES: i64 = 4;
const F32X4: Type = types::F32X4;
const I32X4: Type = types::I32X4;

/// A value in lanes: floats as f32x4, bools as i32x4 masks (all ones for
/// true).
#[derive(Clone, Copy)]
enum Lanes {
    F(ClValue),
    M(ClValue),
}

/// The subexpressions of a node that vary along its last axis (those that
/// read its index), by address.
struct Varying {
    inner: u32,
    set: HashSet<*const Scalar>,
}

impl Varying {
    fn of(scalar: &Scalar, inner: u32) -> Varying {
        fn mark(scalar: &Scalar, inner: u32, set: &mut HashSet<*const Scalar>) -> bool {
            let mut varies = matches!(scalar, Scalar::Index(index, _) if *index == inner);
            scalar.for_each_child(&mut |child| varies |= mark(child, inner, set));
            if varies {
                set.insert(scalar as *const Scalar);
            }
            varies
        }
        let mut set = HashSet::new();
        mark(scalar, inner, &mut set);
        Varying { inner, set }
    }

    fn has(&self, scalar: &Scalar) -> bool {
        self.set.contains(&(scalar as *const Scalar))
    }

    /// Whether a load position is the last axis plus an offset that does
    /// not vary: consecutive lanes read consecutive elements.
    fn is_unit_stride(&self, position: &Scalar) -> bool {
        let is_inner = |s: &Scalar| matches!(s, Scalar::Index(index, _) if *index == self.inner);
        match position {
            Scalar::Binary(BinaryOp::Add, a, b, _) => (is_inner(a) && !self.has(b)) || (is_inner(b) && !self.has(a)),
            Scalar::Binary(BinaryOp::Sub, a, b, _) => is_inner(a) && !self.has(b),
            other => is_inner(other),
        }
    }
}

/// Whether values of `dtype` are computed in lanes: f32 and bf16 (stored
/// as f32); f16 rounds through the scalar code.
pub(super) fn in_lanes_float(dtype: Dtype) -> bool {
    matches!(dtype, Dtype::F32 | Dtype::Bf16)
}

/// Unaligned vector accesses that cannot trap (every position is checked).
fn vector_flags() -> MemFlagsData {
    MemFlagsData::new().with_notrap()
}

/// Bit casts between vector types, lane order as stored.
fn lane_order() -> MemFlagsData {
    MemFlagsData::new().with_endianness(Endianness::Little)
}

impl Lowerer<'_, '_> {
    /// The last axis (`axis`, index `inner`) over `start..end`: four
    /// positions at a time in lanes, the rest, and any four whose loads
    /// would fall outside, by `element` (the scalar code for the position
    /// in `axis`, which stores it and advances the flat position).
    pub(super) fn lanes_loop(
        &mut self,
        store: &Store,
        axis: Variable,
        inner: u32,
        start: ClValue,
        end: ClValue,
        element: &mut dyn FnMut(&mut Self),
    ) {
        let varying = Varying::of(store.scalar, inner);
        let limit = self.builder.declare_var(types::I64);
        // The first of the four positions the lanes take: the code that
        // computes a value lane by lane moves `axis` to each lane's, and a
        // load outside its value leaves it there on the way to `fallback`.
        let four_from = self.builder.declare_var(types::I64);
        self.builder.def_var(axis, start);
        let [head, body, fallback, scalar, exit] = std::array::from_fn(|_| self.builder.create_block());
        self.builder.ins().jump(head, &[]);

        self.builder.switch_to_block(head);
        let at = self.builder.use_var(axis);
        let last = self.builder.ins().iadd_imm_s(at, VECTOR_LANES);
        let fits = self.builder.ins().icmp(IntCC::SignedLessThanOrEqual, last, end);
        self.builder.def_var(limit, end);
        self.builder.ins().brif(fits, body, &[], scalar, &[]);

        self.builder.switch_to_block(body);
        self.builder.seal_block(body);
        let at = self.builder.use_var(axis);
        self.builder.def_var(four_from, at);
        let outer_failure = self.bounds_failure.replace(fallback);
        let value = self.floats(store.scalar, &varying);
        // Every expression in lanes comes out rounded to its own type
        // already: a second rounding to the same type would change nothing.
        let value = if store.scalar.dtype() == store.dtype { value } else { self.lanes_round(value, store.dtype) };
        self.bounds_failure = outer_failure;
        let flat = self.builder.use_var(store.flat);
        let bytes = self.builder.ins().imul_imm_s(flat, 4);
        let address = self.builder.ins().iadd(store.out, bytes);
        self.builder.ins().store(vector_flags(), value, address, 0);
        let next_flat = self.builder.ins().iadd_imm_s(flat, VECTOR_LANES);
        self.builder.def_var(store.flat, next_flat);
        let at = self.builder.use_var(axis);
        let next = self.builder.ins().iadd_imm_s(at, VECTOR_LANES);
        self.builder.def_var(axis, next);
        self.builder.ins().jump(head, &[]);

        // Four positions the lanes could not take: the scalar code's.
        self.builder.switch_to_block(fallback);
        self.builder.seal_block(fallback);
        let at = self.builder.use_var(four_from);
        self.builder.def_var(axis, at);
        let four_on = self.builder.ins().iadd_imm_s(at, VECTOR_LANES);
        self.builder.def_var(limit, four_on);
        self.builder.ins().jump(scalar, &[]);

        // The scalar code up to the limit; the loop is done when that was
        // the end.
        self.builder.switch_to_block(scalar);
        self.builder.seal_block(scalar);
        let (at, until) = (self.builder.use_var(axis), self.builder.use_var(limit));
        self.counted_from(axis, Some(at), until, element);
        let until = self.builder.use_var(limit);
        let finished = self.builder.ins().icmp(IntCC::Equal, until, end);
        self.builder.ins().brif(finished, exit, &[], head, &[]);
        self.builder.seal_block(head);

        self.builder.switch_to_block(exit);
        self.builder.seal_block(exit);
    }

    /// `scalar` in lanes.
    fn lanes(&mut self, scalar: &Scalar, varying: &Varying) -> Lanes {
        if let Some(address) = self.total_at(scalar) {
            // An epilogue's sum: four totals the product left in place.
            return Lanes::F(self.builder.ins().load(F32X4, vector_flags(), address, 0));
        }
        if !varying.has(scalar) {
            return self.splat(scalar);
        }
        if !self.computes_in_lanes(scalar, varying) {
            return self.lane_by_lane(scalar, varying.inner);
        }
        match scalar {
            Scalar::Load(value, positions, _) => Lanes::F(self.lanes_load(*value, positions)),
            Scalar::Unary(UnaryOp::Not, a, _) => {
                let mask = self.mask(a, varying);
                Lanes::M(self.builder.ins().bnot(mask))
            }
            Scalar::Unary(op, a, dtype) => {
                let x = self.floats(a, varying);
                let y = match op {
                    UnaryOp::Neg => self.builder.ins().fneg(x),
                    UnaryOp::Abs => self.builder.ins().fabs(x),
                    UnaryOp::Sqrt => self.builder.ins().sqrt(x),
                    UnaryOp::Rsqrt => {
                        let root = self.builder.ins().sqrt(x);
                        let one = self.constant(1.0);
                        self.builder.ins().fdiv(one, root)
                    }
                    UnaryOp::Exp => self.lanes_exp(x),
                    _ => unreachable!("computes_in_lanes admits these unary operations only"),
                };
                Lanes::F(self.lanes_round(y, *dtype))
            }
            Scalar::Binary(BinaryOp::Cmp(cmp), a, b, _) => {
                let (x, y) = (self.floats(a, varying), self.floats(b, varying));
                let cc = float_condition(*cmp);
                Lanes::M(self.builder.ins().fcmp(cc, x, y))
            }
            Scalar::Binary(op @ (BinaryOp::And | BinaryOp::Or), a, b, _) => {
                let (x, y) = (self.mask(a, varying), self.mask(b, varying));
                Lanes::M(if *op == BinaryOp::And {
                    self.builder.ins().band(x, y)
                } else {
                    self.builder.ins().bor(x, y)
                })
            }
            Scalar::Binary(op, a, b, dtype) => {
                let (x, y) = (self.floats(a, varying), self.floats(b, varying));
                let value = match op {
                    BinaryOp::Add => self.builder.ins().fadd(x, y),
                    BinaryOp::Sub => self.builder.ins().fsub(x, y),
                    BinaryOp::Mul => self.builder.ins().fmul(x, y),
                    BinaryOp::Div => self.builder.ins().fdiv(x, y),
                    BinaryOp::Max => self.lanes_extremum(x, y, true),
                    BinaryOp::Min => self.lanes_extremum(x, y, false),
                    _ => unreachable!("computes_in_lanes admits these binary operations only"),
                };
                Lanes::F(self.lanes_round(value, *dtype))
            }
            Scalar::Select(c, a, b, _) if varying.has(c) => {
                let mask = self.mask(c, varying);
                let (x, y) = (self.floats(a, varying), self.floats(b, varying));
                Lanes::F(self.blend(mask, x, y))
            }
            Scalar::Select(c, a, b, _) => {
                // A condition the same in every lane: lazy, as the scalar code.
                let reg = self.scalar(c);
                let cond = self.b(reg);
                let (then, otherwise, merge) =
                    (self.builder.create_block(), self.builder.create_block(), self.builder.create_block());
                let result = self.builder.append_block_param(merge, F32X4);
                self.builder.ins().brif(cond, then, &[], otherwise, &[]);
                for (block, side) in [(then, a), (otherwise, b)] {
                    self.builder.switch_to_block(block);
                    self.builder.seal_block(block);
                    let value = self.floats(side, varying);
                    self.builder.ins().jump(merge, &[value.into()]);
                }
                self.builder.switch_to_block(merge);
                self.builder.seal_block(merge);
                Lanes::F(result)
            }
            Scalar::Cast(a, dtype) => {
                let x = self.floats(a, varying);
                Lanes::F(self.lanes_round(x, *dtype))
            }
            Scalar::Reduce { op, index, extent, body, dtype } => {
                self.extents.insert(*index, extent.clone());
                let extent = self.dim(extent);
                let total = self.lanes_reduce(*op, *index, extent, body, varying);
                Lanes::F(self.lanes_round(total, *dtype))
            }
            Scalar::Index(..) | Scalar::Dim(_) | Scalar::Float(..) | Scalar::Int(..) | Scalar::Bool(_) => {
                unreachable!("computes_in_lanes admits no integer, and constants do not vary")
            }
        }
    }

    /// Whether a varying `scalar` is computed in lanes (else lane by
    /// lane): float and bool results of float and bool operands, loads of
    /// consecutive float elements.
    fn computes_in_lanes(&self, scalar: &Scalar, varying: &Varying) -> bool {
        let float = |s: &Scalar| s.dtype().is_float();
        match scalar {
            Scalar::Load(value, positions, _) => {
                let (shape, stored) = self.loaded(*value);
                matches!(stored, Stored::F32 | Stored::Bf16Bits)
                    && positions.len() == shape.len()
                    && positions.split_last().is_some_and(|(last, rows)| {
                        varying.is_unit_stride(last) && rows.iter().all(|p| !varying.has(p))
                    })
            }
            Scalar::Unary(UnaryOp::Not, a, _) => a.dtype() == Dtype::Bool,
            Scalar::Unary(op, a, dtype) => {
                matches!(op, UnaryOp::Neg | UnaryOp::Abs | UnaryOp::Sqrt | UnaryOp::Rsqrt | UnaryOp::Exp)
                    && in_lanes_float(*dtype)
                    && float(a)
            }
            Scalar::Binary(BinaryOp::Cmp(_), a, b, _) => float(a) && float(b),
            Scalar::Binary(BinaryOp::And | BinaryOp::Or, a, b, _) => {
                a.dtype() == Dtype::Bool && b.dtype() == Dtype::Bool
            }
            Scalar::Binary(op, a, b, dtype) => {
                matches!(
                    op,
                    BinaryOp::Add | BinaryOp::Sub | BinaryOp::Mul | BinaryOp::Div | BinaryOp::Max | BinaryOp::Min
                ) && in_lanes_float(*dtype)
                    && float(a)
                    && float(b)
            }
            Scalar::Select(c, a, b, dtype) => {
                c.dtype() == Dtype::Bool && in_lanes_float(*dtype) && float(a) && float(b)
            }
            Scalar::Cast(a, dtype) => in_lanes_float(*dtype) && float(a),
            Scalar::Reduce { body, dtype, .. } => in_lanes_float(*dtype) && float(body),
            Scalar::Index(..) | Scalar::Dim(_) | Scalar::Float(..) | Scalar::Int(..) | Scalar::Bool(_) => false,
        }
    }

    fn floats(&mut self, scalar: &Scalar, varying: &Varying) -> ClValue {
        match self.lanes(scalar, varying) {
            Lanes::F(value) => value,
            Lanes::M(_) => unreachable!("a float operand is never a mask"),
        }
    }

    fn mask(&mut self, scalar: &Scalar, varying: &Varying) -> ClValue {
        match self.lanes(scalar, varying) {
            Lanes::M(mask) => mask,
            Lanes::F(_) => unreachable!("a bool operand is never floats"),
        }
    }

    /// A value the same in every lane: the scalar code's, in each.
    fn splat(&mut self, scalar: &Scalar) -> Lanes {
        let reg = self.scalar(scalar);
        if scalar.dtype() == Dtype::Bool {
            let bool = self.b(reg);
            let lane = self.mask_lane(bool);
            Lanes::M(self.builder.ins().splat(I32X4, lane))
        } else {
            let wide = self.f(reg);
            let narrow = self.builder.ins().fdemote(types::F32, wide);
            Lanes::F(self.builder.ins().splat(F32X4, narrow))
        }
    }

    /// A varying value the lanes cannot compute: the scalar code's, once
    /// per lane with the last axis at the lane's position.
    fn lane_by_lane(&mut self, scalar: &Scalar, inner: u32) -> Lanes {
        let index = self.indices[&inner];
        let base = self.builder.use_var(index);
        let is_mask = scalar.dtype() == Dtype::Bool;
        let mut lanes = if is_mask {
            let zero = self.builder.ins().iconst(types::I32, 0);
            self.builder.ins().splat(I32X4, zero)
        } else {
            self.constant(0.0)
        };
        for lane in 0..VECTOR_LANES {
            let at = self.builder.ins().iadd_imm_s(base, lane);
            self.builder.def_var(index, at);
            let reg = self.scalar(scalar);
            let value = if is_mask {
                let bool = self.b(reg);
                self.mask_lane(bool)
            } else {
                let wide = self.f(reg);
                self.builder.ins().fdemote(types::F32, wide)
            };
            lanes = self.builder.ins().insertlane(lanes, value, lane as u8);
        }
        self.builder.def_var(index, base);
        if is_mask {
            Lanes::M(lanes)
        } else {
            Lanes::F(lanes)
        }
    }

    /// A bool as a mask lane: all ones for true.
    fn mask_lane(&mut self, bool: ClValue) -> ClValue {
        let wide = self.builder.ins().uextend(types::I32, bool);
        self.builder.ins().ineg(wide)
    }

    /// Four consecutive elements of `value` from the position the lanes'
    /// first reads; outside the value, the scalar code takes the four.
    fn lanes_load(&mut self, value: Value, positions: &[Scalar]) -> ClValue {
        let (last, rows) = positions.split_last().expect("computes_in_lanes admits full positions only");
        let row = self.address(value, rows);
        let reg = self.scalar(last);
        let first = self.i(reg);
        let (shape, stored) = self.loaded(value);
        let size = shape.last().cloned().expect("a load of positions has axes");
        if !self.inside(last, &size) {
            let size = self.dim(&size);
            let last_lane = self.builder.ins().iadd_imm_s(first, VECTOR_LANES - 1);
            let first_inside = self.builder.ins().icmp(IntCC::UnsignedLessThan, first, size);
            let last_inside = self.builder.ins().icmp(IntCC::UnsignedLessThan, last_lane, size);
            let inside = self.builder.ins().band(first_inside, last_inside);
            let ok = self.builder.create_block();
            let fallback = self.bounds_failure.expect("lanes run with a fallback");
            self.builder.ins().brif(inside, ok, &[], fallback, &[]);
            self.builder.switch_to_block(ok);
            self.builder.seal_block(ok);
        }
        let bytes = self.builder.ins().imul_imm_s(first, stored.bytes());
        let address = self.builder.ins().iadd(row, bytes);
        match stored {
            Stored::F32 => self.builder.ins().load(F32X4, vector_flags(), address, 0),
            Stored::Bf16Bits => {
                let bits = self.builder.ins().uload16x4(vector_flags(), address, 0);
                let high = self.builder.ins().ishl_imm_u(bits, 16);
                self.builder.ins().bitcast(F32X4, lane_order(), high)
            }
            Stored::Int | Stored::Bool | Stored::Blocks(..) => {
                unreachable!("computes_in_lanes admits f32 and bf16 loads only")
            }
        }
    }

    /// A varying reduction: the body in lanes at each position of the
    /// reduced index; as the scalar code, the first element starts it.
    fn lanes_reduce(&mut self, op: ReduceOp, index: u32, extent: ClValue, body: &Scalar, varying: &Varying) -> ClValue {
        let variable = self.builder.declare_var(types::I64);
        self.indices.insert(index, variable);
        let total = self.builder.declare_var(F32X4);
        // An empty reduction is the identity.
        let start = self.constant(match op {
            ReduceOp::Sum => 0.0,
            ReduceOp::Max => f32::NEG_INFINITY,
            ReduceOp::Min => f32::INFINITY,
        });
        self.builder.def_var(total, start);
        let first = self.builder.declare_var(types::I8);
        let yes = self.builder.ins().iconst(types::I8, 1);
        self.builder.def_var(first, yes);
        self.counted(variable, extent, &mut |this| {
            let x = this.floats(body, varying);
            let sum = this.builder.use_var(total);
            let next = match op {
                ReduceOp::Sum => this.builder.ins().fadd(sum, x),
                ReduceOp::Max => this.lanes_extremum(sum, x, true),
                ReduceOp::Min => this.lanes_extremum(sum, x, false),
            };
            let is_first = this.builder.use_var(first);
            let next = this.builder.ins().select(is_first, x, next);
            this.builder.def_var(total, next);
            let no = this.builder.ins().iconst(types::I8, 0);
            this.builder.def_var(first, no);
        });
        self.builder.use_var(total)
    }

    /// A float sum computed by the scalar code (a norm's sum of squares,
    /// once per row) in lanes along its own index, when its body computes
    /// in lanes there: four partial sums of every fourth element, then
    /// added together, with the scalar code for the rest and for any four
    /// elements a load would read outside (where it reports the error).
    /// The order of the additions is not the scalar code's: f32 partial
    /// sums, within the contract's tolerances. Each partial sum starts at
    /// -0.0, the identity of addition, so that a sum of -0.0s is -0.0 as
    /// the scalar code's; an empty sum is 0.0, as there.
    pub(super) fn sum_in_lanes(&mut self, index: u32, extent: ClValue, body: &Scalar, dtype: Dtype) -> Option<ClValue> {
        let varying = Varying::of(body, index);
        if !(in_lanes_float(dtype)
            && body.dtype().is_float()
            && varying.has(body)
            && self.computes_in_lanes(body, &varying))
        {
            return None;
        }
        let at = self.builder.declare_var(types::I64);
        self.indices.insert(index, at);
        let zero = self.builder.ins().iconst(types::I64, 0);
        self.builder.def_var(at, zero);
        let partial = self.builder.declare_var(F32X4);
        let start = self.constant(-0.0);
        self.builder.def_var(partial, start);
        let [head, body_block, rest] = std::array::from_fn(|_| self.builder.create_block());
        self.builder.ins().jump(head, &[]);

        self.builder.switch_to_block(head);
        let first = self.builder.use_var(at);
        let last = self.builder.ins().iadd_imm_s(first, VECTOR_LANES);
        let fits = self.builder.ins().icmp(IntCC::SignedLessThanOrEqual, last, extent);
        self.builder.ins().brif(fits, body_block, &[], rest, &[]);

        self.builder.switch_to_block(body_block);
        self.builder.seal_block(body_block);
        let outer_failure = self.bounds_failure.replace(rest);
        let x = self.floats(body, &varying);
        self.bounds_failure = outer_failure;
        let sum = self.builder.use_var(partial);
        let next = self.builder.ins().fadd(sum, x);
        self.builder.def_var(partial, next);
        let first = self.builder.use_var(at);
        let next = self.builder.ins().iadd_imm_s(first, VECTOR_LANES);
        self.builder.def_var(at, next);
        self.builder.ins().jump(head, &[]);
        self.builder.seal_block(head);

        // The rest, one element at a time, from where the lanes stopped.
        self.builder.switch_to_block(rest);
        self.builder.seal_block(rest);
        let lanes = self.builder.use_var(partial);
        let mut total = self.builder.ins().extractlane(lanes, 0);
        for lane in 1..VECTOR_LANES as u8 {
            let value = self.builder.ins().extractlane(lanes, lane);
            total = self.builder.ins().fadd(total, value);
        }
        let total_variable = self.builder.declare_var(types::F32);
        self.builder.def_var(total_variable, total);
        let from = self.builder.use_var(at);
        self.counted_from(at, Some(from), extent, &mut |this| {
            let reg = this.scalar(body);
            let wide = this.f(reg);
            let value = this.builder.ins().fdemote(types::F32, wide);
            let sum = this.builder.use_var(total_variable);
            let next = this.builder.ins().fadd(sum, value);
            this.builder.def_var(total_variable, next);
        });
        let total = self.builder.use_var(total_variable);
        let zero = self.builder.ins().iconst(types::I64, 0);
        let empty = self.builder.ins().icmp(IntCC::Equal, extent, zero);
        let positive_zero = self.builder.ins().f32const(0.0);
        let total = self.builder.ins().select(empty, positive_zero, total);
        Some(self.builder.ins().fpromote(types::F64, total))
    }

    /// Lanes rounded to `dtype`: bf16 to nearest even (a NaN stays a
    /// NaN), f32 as they are.
    fn lanes_round(&mut self, x: ClValue, dtype: Dtype) -> ClValue {
        match dtype {
            Dtype::Bf16 => {
                let bits = self.builder.ins().bitcast(I32X4, lane_order(), x);
                let shifted = self.builder.ins().ushr_imm_u(bits, 16);
                let one = self.int_lanes(1);
                let odd = self.builder.ins().band(shifted, one);
                let half = self.int_lanes(0x7FFF);
                let bias = self.builder.ins().iadd(odd, half);
                let biased = self.builder.ins().iadd(bits, bias);
                let high = self.int_lanes(0xFFFF_0000u32 as i32);
                let rounded = self.builder.ins().band(biased, high);
                let quiet_bit = self.int_lanes(0x0040_0000);
                let quieted = self.builder.ins().bor(bits, quiet_bit);
                let quiet = self.builder.ins().band(quieted, high);
                let nan = self.builder.ins().fcmp(FloatCC::Unordered, x, x);
                let chosen = self.builder.ins().bitselect(nan, quiet, rounded);
                self.builder.ins().bitcast(F32X4, lane_order(), chosen)
            }
            _ => x,
        }
    }

    /// `max` (or `min`) as the scalar code's: a NaN operand gives the other.
    fn lanes_extremum(&mut self, x: ClValue, y: ClValue, max: bool) -> ClValue {
        let either = if max { self.builder.ins().fmax(x, y) } else { self.builder.ins().fmin(x, y) };
        let x_nan = self.builder.ins().fcmp(FloatCC::Unordered, x, x);
        let y_nan = self.builder.ins().fcmp(FloatCC::Unordered, y, y);
        let unless_x = self.blend(x_nan, y, either);
        self.blend(y_nan, x, unless_x)
    }

    /// `e^x` in f32 lanes, step for step as `expf::exp` (its constants).
    fn lanes_exp(&mut self, x: ClValue) -> ClValue {
        let log2e = self.constant(std::f32::consts::LOG2_E);
        let scaled = self.builder.ins().fmul(x, log2e);
        let n = self.builder.ins().nearest(scaled);
        let ln2_high = self.constant(expf::LN2_HIGH);
        let ln2_low = self.constant(expf::LN2_LOW);
        let high = self.builder.ins().fmul(n, ln2_high);
        let r = self.builder.ins().fsub(x, high);
        let low = self.builder.ins().fmul(n, ln2_low);
        let r = self.builder.ins().fsub(r, low);
        let mut p = self.constant(expf::POLYNOMIAL[0]);
        for coefficient in &expf::POLYNOMIAL[1..] {
            let times = self.builder.ins().fmul(p, r);
            let c = self.constant(*coefficient);
            p = self.builder.ins().fadd(times, c);
        }
        let r2 = self.builder.ins().fmul(r, r);
        let p_r2 = self.builder.ins().fmul(p, r2);
        let plus_r = self.builder.ins().fadd(p_r2, r);
        let one = self.constant(1.0);
        let mut y = self.builder.ins().fadd(plus_r, one);
        let whole = self.builder.ins().fcvt_to_sint_sat(I32X4, n);
        let half = self.builder.ins().sshr_imm_s(whole, 1);
        let rest = self.builder.ins().isub(whole, half);
        for part in [half, rest] {
            let bias = self.int_lanes(127);
            let biased = self.builder.ins().iadd(part, bias);
            let exponent = self.builder.ins().ishl_imm_u(biased, 23);
            let factor = self.builder.ins().bitcast(F32X4, lane_order(), exponent);
            y = self.builder.ins().fmul(y, factor);
        }
        let largest = self.constant(expf::LARGEST);
        let smallest = self.constant(expf::SMALLEST);
        let over = self.builder.ins().fcmp(FloatCC::GreaterThan, x, largest);
        let under = self.builder.ins().fcmp(FloatCC::LessThan, x, smallest);
        let infinity = self.constant(f32::INFINITY);
        let zero = self.constant(0.0);
        let y = self.blend(over, infinity, y);
        self.blend(under, zero, y)
    }

    /// Where `mask` is set, `x`; elsewhere `y`.
    fn blend(&mut self, mask: ClValue, x: ClValue, y: ClValue) -> ClValue {
        let mask = self.builder.ins().bitcast(F32X4, lane_order(), mask);
        self.builder.ins().bitselect(mask, x, y)
    }

    fn constant(&mut self, value: f32) -> ClValue {
        let lane = self.builder.ins().f32const(value);
        self.builder.ins().splat(F32X4, lane)
    }

    fn int_lanes(&mut self, value: i32) -> ClValue {
        let lane = self.builder.ins().iconst(types::I32, i64::from(value));
        self.builder.ins().splat(I32X4, lane)
    }
}
