//! The CPU backend's code generator: each `Compute` node of an entry
//! becomes one Cranelift function that runs the node's loop nest (an
//! elementwise node, a given range of rows: of its first two axes
//! flattened when it has three or more, else of its first; so that
//! threads can share it),
//! evaluates its scalar expression (loads with bounds checks, lazy
//! selects, reductions as inner loops) and stores each element; it
//! returns 0, or 1 with the failing load site's number, position, size
//! and axis.
//! Entry dims (`B`, `S`) are read from a table at run time, so one
//! function serves every call; the model's dims are constants. The same
//! definitions go into a JIT or an object file (the crate's root).

use cranelift_codegen::control::ControlPlane;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{types, AbiParam, Block, InstBuilder, MemFlagsData, SigRef, Signature};
use cranelift_codegen::isa::CallConv;
use cranelift_codegen::Context;
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use cranelift_module::{FuncId, Linkage, Module, ModuleReloc};
use linnet_cpu::abi::{KernelRecord, LoadSite};
use linnet_cpu::helpers::{self, Helper, Shape};
use linnet_ir::analysis::Analysis;
use linnet_ir::contraction::{self, Contraction};
use linnet_ir::dim::Dim;
use linnet_ir::invariant::{self, Invariant};
use linnet_ir::quant::BlockFormat;
use linnet_ir::CmpOp;
use linnet_ir::Dtype;
use linnet_ir::{BinaryOp, Entry, NodeKind, Param, ReduceOp, Scalar, UnaryOp, Value};
use linnet_kernels::choice::Storage;
use std::collections::HashMap;

mod lanes;

/// How elementwise float nodes are compiled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Elementwise {
    /// Four f32 lanes along the last axis (`lanes`), within the contract's
    /// tolerances of the reference.
    #[default]
    Lanes,
    /// The scalar code alone: f64 arithmetic in the reference's order, bit
    /// for bit the interpreter's (what the differential tests hold it to).
    Scalar,
}

/// One compiled node: where its function is in the module, and its record.
#[derive(Clone, Debug)]
pub struct KernelDef {
    pub func: FuncId,
    pub record: KernelRecord,
}

/// A scalar in a register: floats as f64, integers as i64, bools as i8.
#[derive(Clone, Copy)]
enum Reg {
    F(ClValue),
    I(ClValue),
    B(ClValue),
}

type ClValue = cranelift_codegen::ir::Value;

/// What each row of a contraction records: the output row counter and
/// buffer, and the row's length.
struct RowCall<'c> {
    contraction: &'c Contraction<'c>,
    row: Variable,
    out: ClValue,
    columns: ClValue,
}

struct Lowerer<'b, 'f> {
    builder: &'b mut FunctionBuilder<'f>,
    /// The helper table (the kernel's fourth argument) and the signatures
    /// of its three kinds of entries.
    helpers: ClValue,
    signatures: HashMap<Shape, SigRef>,
    /// Index variables by number, and the extent each runs over.
    indices: HashMap<u32, Variable>,
    extents: HashMap<u32, Dim>,
    inputs: ClValue,
    error: ClValue,
    /// Each loaded value's argument number, shape and element kind.
    loads: Vec<(Value, Vec<Dim>, Stored)>,
    error_block: Block,
    /// Every dim that is not a constant, read from the dims table once at
    /// the top of the function.
    dims: HashMap<Dim, ClValue>,
    sites: Vec<LoadSite>,
    /// Aligned, non-trapping accesses (every address is checked first).
    flags: MemFlagsData,
    /// Invariant parts already computed, by their place in the expression.
    hoisted: HashMap<*const Scalar, Variable>,
    /// The range of rows an elementwise node computes (of the flat index
    /// over its first two axes when it has three or more; else of its first).
    rows: Option<(ClValue, ClValue)>,
    /// Where a failed bounds check goes while computing in lanes (`lanes`):
    /// to the scalar code for those positions, not to the error.
    bounds_failure: Option<Block>,
    elementwise: Elementwise,
    /// A contraction's epilogue (`ir::contraction`): its sum (by address
    /// in the expression), read from the totals the product left in the
    /// output (`out`, of the node's `rank`).
    epilogue: Option<(*const Scalar, ClValue, u32)>,
}

/// What the element loop of a node computes and where it stores it.
struct Store<'s> {
    scalar: &'s Scalar,
    dtype: Dtype,
    flat: Variable,
    out: ClValue,
    invariants: &'s [Invariant<'s>],
}

impl Lowerer<'_, '_> {
    fn f(&mut self, reg: Reg) -> ClValue {
        match reg {
            Reg::F(v) => v,
            Reg::I(v) => self.builder.ins().fcvt_from_sint(types::F64, v),
            Reg::B(v) => {
                let wide = self.builder.ins().uextend(types::I64, v);
                self.builder.ins().fcvt_from_sint(types::F64, wide)
            }
        }
    }

    fn i(&mut self, reg: Reg) -> ClValue {
        match reg {
            Reg::I(v) => v,
            Reg::F(v) => self.builder.ins().fcvt_to_sint_sat(types::I64, v),
            Reg::B(v) => self.builder.ins().uextend(types::I64, v),
        }
    }

    fn b(&mut self, reg: Reg) -> ClValue {
        match reg {
            Reg::B(v) => v,
            Reg::I(v) => self.builder.ins().icmp_imm_s(IntCC::NotEqual, v, 0),
            Reg::F(v) => {
                let zero = self.builder.ins().f64const(0.0);
                self.builder.ins().fcmp(FloatCC::NotEqual, v, zero)
            }
        }
    }

    /// A dim's value: a constant, or read from the dims table.
    fn dim(&mut self, dim: &Dim) -> ClValue {
        match dim.as_constant() {
            Some(value) => self.builder.ins().iconst(types::I64, value),
            None => self.dims[dim],
        }
    }

    fn call(&mut self, helper: Helper, args: &[ClValue]) -> ClValue {
        let offset = (helper.slot() * 8) as i32;
        let pointer = self.builder.ins().load(types::I64, pointer_table(), self.helpers, offset);
        let call = self.builder.ins().call_indirect(self.signatures[&helper.shape()], pointer, args);
        self.builder.inst_results(call)[0]
    }

    /// A float rounded to `dtype`, as the interpreter's `round`.
    fn round(&mut self, value: ClValue, dtype: Dtype) -> ClValue {
        match dtype {
            Dtype::F32 => {
                let narrow = self.builder.ins().fdemote(types::F32, value);
                self.builder.ins().fpromote(types::F64, narrow)
            }
            Dtype::Bf16 => self.round_bf16(value),
            Dtype::F16 => self.call(Helper::RoundF16, &[value]),
            _ => value,
        }
    }

    /// A float rounded to bf16 as `numerics::round` does (nearest-even on
    /// the f64's bits: the kept bits, the round bit and every bit below
    /// it), inline where the result is a normal bf16 or overflows; other
    /// values (NaN, infinities, bf16 subnormals) through the helper.
    fn round_bf16(&mut self, value: ClValue) -> ClValue {
        let bits = self.builder.ins().bitcast(types::I64, MemFlagsData::new(), value);
        let exponent_bits = self.builder.ins().ushr_imm_u(bits, 52);
        let exponent = self.builder.ins().band_imm_u(exponent_bits, 0x7FF);
        // Normal in bf16: biased exponents 897..=1150 of the f64.
        let from_lowest = self.builder.ins().iadd_imm_s(exponent, -897);
        let normal = self.builder.ins().icmp_imm_u(IntCC::UnsignedLessThanOrEqual, from_lowest, 253);
        let (fast, slow, merge) =
            (self.builder.create_block(), self.builder.create_block(), self.builder.create_block());
        let result = self.builder.append_block_param(merge, types::F64);
        self.builder.ins().brif(normal, fast, &[], slow, &[]);
        self.builder.switch_to_block(fast);
        self.builder.seal_block(fast);
        let mantissa = self.builder.ins().band_imm_u(bits, 0xF_FFFF_FFFF_FFFF);
        let sign_bits = self.builder.ins().ushr_imm_u(bits, 48);
        let sign = self.builder.ins().band_imm_u(sign_bits, 0x8000);
        let rebiased = self.builder.ins().iadd_imm_s(exponent, -896);
        let exponent = self.builder.ins().ishl_imm_u(rebiased, 7);
        // bf16 keeps the mantissa's top 7 bits (from bit 45 on).
        let top = self.builder.ins().ushr_imm_u(mantissa, 45);
        let signed = self.builder.ins().bor(sign, exponent);
        let truncated = self.builder.ins().bor(signed, top);
        let round_bit = self.builder.ins().band_imm_u(mantissa, 1 << 44);
        let halfway_or_odd = self.builder.ins().band_imm_u(mantissa, (1 << 45) | ((1 << 44) - 1));
        let at_half = self.builder.ins().icmp_imm_u(IntCC::NotEqual, round_bit, 0);
        let not_tie_to_even = self.builder.ins().icmp_imm_u(IntCC::NotEqual, halfway_or_odd, 0);
        let up = self.builder.ins().band(at_half, not_tie_to_even);
        let up = self.builder.ins().uextend(types::I64, up);
        let rounded = self.builder.ins().iadd(truncated, up);
        let widened = self.builder.ins().ishl_imm_u(rounded, 16);
        let narrow_bits = self.builder.ins().ireduce(types::I32, widened);
        let narrow = self.builder.ins().bitcast(types::F32, MemFlagsData::new(), narrow_bits);
        let fast_value = self.builder.ins().fpromote(types::F64, narrow);
        self.builder.ins().jump(merge, &[fast_value.into()]);
        self.builder.switch_to_block(slow);
        self.builder.seal_block(slow);
        let slow_value = self.call(Helper::RoundBf16, &[value]);
        self.builder.ins().jump(merge, &[slow_value.into()]);
        self.builder.switch_to_block(merge);
        self.builder.seal_block(merge);
        result
    }

    /// Euclidean `x / c` or `x % c` for a constant `c > 0`, inline: the
    /// truncating quotient and remainder, moved down by one where the
    /// remainder is negative.
    fn euclid_by_constant(&mut self, op: BinaryOp, x: ClValue, divisor: i64, dtype: Dtype) -> ClValue {
        let c = self.builder.ins().iconst(types::I64, divisor);
        let remainder = self.builder.ins().srem(x, c);
        let negative = self.builder.ins().icmp_imm_s(IntCC::SignedLessThan, remainder, 0);
        let value = if op == BinaryOp::Rem {
            let lifted = self.builder.ins().iadd(remainder, c);
            self.builder.ins().select(negative, lifted, remainder)
        } else {
            let quotient = self.builder.ins().sdiv(x, c);
            let lowered = self.builder.ins().iadd_imm_s(quotient, -1);
            self.builder.ins().select(negative, lowered, quotient)
        };
        self.wrap(value, dtype)
    }

    /// An integer wrapped to `dtype`.
    fn wrap(&mut self, value: ClValue, dtype: Dtype) -> ClValue {
        if dtype == Dtype::I32 {
            let narrow = self.builder.ins().ireduce(types::I32, value);
            self.builder.ins().sextend(types::I64, narrow)
        } else {
            value
        }
    }

    /// A result of `dtype` from a float, as the interpreter's `float_result`.
    fn float_result(&mut self, value: ClValue, dtype: Dtype) -> Reg {
        match dtype {
            Dtype::Bool => {
                let zero = self.builder.ins().f64const(0.0);
                Reg::B(self.builder.ins().fcmp(FloatCC::NotEqual, value, zero))
            }
            Dtype::I32 | Dtype::I64 => {
                let int = self.builder.ins().fcvt_to_sint_sat(types::I64, value);
                Reg::I(self.wrap(int, dtype))
            }
            _ => Reg::F(self.round(value, dtype)),
        }
    }

    fn scalar(&mut self, scalar: &Scalar) -> Reg {
        if let Some(address) = self.total_at(scalar) {
            let total = self.builder.ins().load(types::F32, self.flags, address, 0);
            return Reg::F(self.builder.ins().fpromote(types::F64, total));
        }
        if let Some(variable) = self.hoisted.get(&(scalar as *const Scalar)) {
            let value = self.builder.use_var(*variable);
            return match scalar.dtype() {
                d if d.is_float() => Reg::F(value),
                Dtype::Bool => Reg::B(value),
                _ => Reg::I(value),
            };
        }
        match scalar {
            Scalar::Index(id, _) => Reg::I(self.builder.use_var(self.indices[id])),
            Scalar::Dim(dim) => Reg::I(self.dim(dim)),
            Scalar::Float(value, dtype) => {
                Reg::F(self.builder.ins().f64const(linnet_ir::numerics::round(*value, *dtype)))
            }
            Scalar::Int(value, dtype) => {
                Reg::I(self.builder.ins().iconst(types::I64, linnet_ir::numerics::wrap(*value, *dtype)))
            }
            Scalar::Bool(value) => Reg::B(self.builder.ins().iconst(types::I8, i64::from(*value))),
            Scalar::Load(value, positions, _) => self.load(*value, positions),
            Scalar::Unary(op, a, dtype) => {
                let a = self.scalar(a);
                match op {
                    UnaryOp::Not => {
                        let b = self.b(a);
                        Reg::B(self.builder.ins().bxor_imm_s(b, 1))
                    }
                    UnaryOp::Neg if dtype.is_int() => {
                        let i = self.i(a);
                        let negated = self.builder.ins().ineg(i);
                        Reg::I(self.wrap(negated, *dtype))
                    }
                    UnaryOp::Abs if dtype.is_int() => {
                        let i = self.i(a);
                        Reg::I(self.builder.ins().iabs(i))
                    }
                    op => {
                        let x = self.f(a);
                        let y = match op {
                            UnaryOp::Neg => self.builder.ins().fneg(x),
                            UnaryOp::Exp => self.call(Helper::Exp, &[x]),
                            UnaryOp::Log => self.call(Helper::Ln, &[x]),
                            UnaryOp::Rsqrt => {
                                let root = self.builder.ins().sqrt(x);
                                let one = self.builder.ins().f64const(1.0);
                                self.builder.ins().fdiv(one, root)
                            }
                            UnaryOp::Sqrt => self.builder.ins().sqrt(x),
                            UnaryOp::Cos => self.call(Helper::Cos, &[x]),
                            UnaryOp::Sin => self.call(Helper::Sin, &[x]),
                            UnaryOp::Tanh => self.call(Helper::Tanh, &[x]),
                            UnaryOp::Abs => self.builder.ins().fabs(x),
                            UnaryOp::Not => unreachable!("handled above"),
                        };
                        self.float_result(y, *dtype)
                    }
                }
            }
            Scalar::Binary(op @ (BinaryOp::Div | BinaryOp::Rem), a, b, dtype)
                if dtype.is_int() && positive_constant(b).is_some() =>
            {
                let divisor = positive_constant(b).expect("checked above");
                let a = self.scalar(a);
                let x = self.i(a);
                Reg::I(self.euclid_by_constant(*op, x, divisor, *dtype))
            }
            Scalar::Binary(op, a, b, dtype) => {
                let (a, b) = (self.scalar(a), self.scalar(b));
                self.binary(*op, a, b, *dtype)
            }
            Scalar::Select(c, a, b, dtype) => {
                let cond = self.scalar(c);
                let cond = self.b(cond);
                let (then, otherwise, merge) =
                    (self.builder.create_block(), self.builder.create_block(), self.builder.create_block());
                let kind = if dtype.is_float() {
                    types::F64
                } else if *dtype == Dtype::Bool {
                    types::I8
                } else {
                    types::I64
                };
                let result = self.builder.append_block_param(merge, kind);
                self.builder.ins().brif(cond, then, &[], otherwise, &[]);
                for (block, side) in [(then, a), (otherwise, b)] {
                    self.builder.switch_to_block(block);
                    self.builder.seal_block(block);
                    let reg = self.scalar(side);
                    let value = if dtype.is_float() {
                        self.f(reg)
                    } else if *dtype == Dtype::Bool {
                        self.b(reg)
                    } else {
                        self.i(reg)
                    };
                    self.builder.ins().jump(merge, &[value.into()]);
                }
                self.builder.switch_to_block(merge);
                self.builder.seal_block(merge);
                if dtype.is_float() {
                    Reg::F(result)
                } else if *dtype == Dtype::Bool {
                    Reg::B(result)
                } else {
                    Reg::I(result)
                }
            }
            Scalar::Cast(a, dtype) => {
                let a = self.scalar(a);
                match dtype {
                    Dtype::Bool => Reg::B(self.b(a)),
                    Dtype::I32 | Dtype::I64 => {
                        let i = self.i(a);
                        Reg::I(self.wrap(i, *dtype))
                    }
                    _ => {
                        let f = self.f(a);
                        Reg::F(self.round(f, *dtype))
                    }
                }
            }
            Scalar::Reduce { op, index, extent, body, dtype } => {
                self.extents.insert(*index, extent.clone());
                let extent = self.dim(extent);
                self.reduce(*op, *index, extent, body, *dtype)
            }
        }
    }

    fn binary(&mut self, op: BinaryOp, a: Reg, b: Reg, dtype: Dtype) -> Reg {
        if let BinaryOp::Cmp(cmp) = op {
            let float = matches!(a, Reg::F(_)) || matches!(b, Reg::F(_));
            return Reg::B(if float {
                let (x, y) = (self.f(a), self.f(b));
                let cc = float_condition(cmp);
                self.builder.ins().fcmp(cc, x, y)
            } else {
                let (x, y) = (self.i(a), self.i(b));
                let cc = match cmp {
                    CmpOp::Eq => IntCC::Equal,
                    CmpOp::Ne => IntCC::NotEqual,
                    CmpOp::Lt => IntCC::SignedLessThan,
                    CmpOp::Le => IntCC::SignedLessThanOrEqual,
                    CmpOp::Gt => IntCC::SignedGreaterThan,
                    CmpOp::Ge => IntCC::SignedGreaterThanOrEqual,
                };
                self.builder.ins().icmp(cc, x, y)
            });
        }
        if matches!(op, BinaryOp::And | BinaryOp::Or) {
            let (x, y) = (self.b(a), self.b(b));
            return Reg::B(if op == BinaryOp::And {
                self.builder.ins().band(x, y)
            } else {
                self.builder.ins().bor(x, y)
            });
        }
        if dtype.is_int() {
            let (x, y) = (self.i(a), self.i(b));
            let value = match op {
                BinaryOp::Add => self.builder.ins().iadd(x, y),
                BinaryOp::Sub => self.builder.ins().isub(x, y),
                BinaryOp::Mul => self.builder.ins().imul(x, y),
                BinaryOp::Div => self.call(Helper::DivEuclid, &[x, y]),
                BinaryOp::Rem => self.call(Helper::RemEuclid, &[x, y]),
                BinaryOp::Max => self.builder.ins().smax(x, y),
                BinaryOp::Min => self.builder.ins().smin(x, y),
                _ => unreachable!("handled above"),
            };
            return Reg::I(self.wrap(value, dtype));
        }
        let (x, y) = (self.f(a), self.f(b));
        let value = match op {
            BinaryOp::Add => self.builder.ins().fadd(x, y),
            BinaryOp::Sub => self.builder.ins().fsub(x, y),
            BinaryOp::Mul => self.builder.ins().fmul(x, y),
            BinaryOp::Div => self.builder.ins().fdiv(x, y),
            BinaryOp::Rem => self.call(Helper::Rem, &[x, y]),
            BinaryOp::Max => self.call(Helper::Max, &[x, y]),
            BinaryOp::Min => self.call(Helper::Min, &[x, y]),
            _ => unreachable!("handled above"),
        };
        self.float_result(value, dtype)
    }

    /// The address of the element of `value` at `positions` (a prefix of
    /// its axes: then of the first element of that row), after checking
    /// every position.
    fn address(&mut self, value: Value, positions: &[Scalar]) -> ClValue {
        let (base, offset, stored) = self.element(value, positions);
        let bytes = match stored {
            // A row's first element starts a block: its bytes are the
            // blocks before it.
            Stored::Blocks(format, _) => {
                let blocks = self.builder.ins().udiv_imm_u(offset, format.block_values() as i64);
                self.builder.ins().imul_imm_s(blocks, format.block_bytes() as i64)
            }
            _ => self.builder.ins().imul_imm_s(offset, stored.bytes()),
        };
        self.builder.ins().iadd(base, bytes)
    }

    /// The base address of `value`, the flat index of its element at
    /// `positions` (as [`Self::address`]), and how it is held.
    fn element(&mut self, value: Value, positions: &[Scalar]) -> (ClValue, ClValue, Stored) {
        let argument = self.loads.iter().position(|(v, ..)| *v == value).expect("loads are listed first");
        let (shape, stored) = (self.loads[argument].1.clone(), self.loads[argument].2);
        let load_number = self.sites.len() as i64;
        self.sites.push(LoadSite { value, sources: positions.iter().map(Scalar::direct_load).collect() });
        let mut offset = self.builder.ins().iconst(types::I64, 0);
        for (axis, (position, size)) in positions.iter().zip(&shape).enumerate() {
            let reg = self.scalar(position);
            let at = self.i(reg);
            if self.inside(position, size) {
                let size = self.dim(size);
                let scaled = self.builder.ins().imul(offset, size);
                offset = self.builder.ins().iadd(scaled, at);
                continue;
            }
            let size = self.dim(size);
            let inside = self.builder.ins().icmp(IntCC::UnsignedLessThan, at, size);
            let ok = self.builder.create_block();
            let fail = self.builder.create_block();
            self.builder.ins().brif(inside, ok, &[], fail, &[]);
            self.builder.switch_to_block(fail);
            self.builder.seal_block(fail);
            match self.bounds_failure {
                // Computing in lanes: the scalar code takes these positions.
                Some(fallback) => {
                    self.builder.ins().jump(fallback, &[]);
                }
                None => {
                    let number = self.builder.ins().iconst(types::I64, load_number);
                    self.builder.ins().store(self.flags, number, self.error, 0);
                    self.builder.ins().store(self.flags, at, self.error, 8);
                    self.builder.ins().store(self.flags, size, self.error, 16);
                    let axis = self.builder.ins().iconst(types::I64, axis as i64);
                    self.builder.ins().store(self.flags, axis, self.error, 24);
                    self.builder.ins().jump(self.error_block, &[]);
                }
            }
            self.builder.switch_to_block(ok);
            self.builder.seal_block(ok);
            let scaled = self.builder.ins().imul(offset, size);
            offset = self.builder.ins().iadd(scaled, at);
        }
        for size in &shape[positions.len()..] {
            let size = self.dim(size);
            offset = self.builder.ins().imul(offset, size);
        }
        let base = self.builder.ins().load(types::I64, pointer_table(), self.inputs, (argument * 8) as i32);
        (base, offset, stored)
    }

    /// Whether `position` lies in `0..size` whatever the indices are
    /// (`ir::bounds::inside`): such a position needs no check.
    fn inside(&self, position: &Scalar, size: &Dim) -> bool {
        linnet_ir::bounds::inside(position, size, &self.extents)
    }

    fn load(&mut self, value: Value, positions: &[Scalar]) -> Reg {
        if let Stored::Blocks(format, _) = self.stored(value) {
            // One value of a block (a gather's rows): decoded by the helper.
            let (base, offset, _) = self.element(value, positions);
            let format = self.builder.ins().iconst(types::I64, helpers::format_code(format));
            return Reg::F(self.call(Helper::BlockValue, &[format, base, offset]));
        }
        let address = self.address(value, positions);
        match self.stored(value) {
            Stored::Bool => Reg::B(self.builder.ins().load(types::I8, self.flags, address, 0)),
            Stored::Int => Reg::I(self.builder.ins().load(types::I64, self.flags, address, 0)),
            Stored::F32 => {
                let narrow = self.builder.ins().load(types::F32, self.flags, address, 0);
                Reg::F(self.builder.ins().fpromote(types::F64, narrow))
            }
            Stored::Bf16Bits => {
                let bits = self.builder.ins().uload16(types::I32, self.flags, address, 0);
                let high = self.builder.ins().ishl_imm_u(bits, 16);
                let narrow = self.builder.ins().bitcast(types::F32, MemFlagsData::new(), high);
                Reg::F(self.builder.ins().fpromote(types::F64, narrow))
            }
            Stored::Blocks(..) => unreachable!("decoded above"),
        }
    }

    fn stored(&self, value: Value) -> Stored {
        self.loaded(value).1
    }

    /// A loaded value's shape and how its elements are held.
    fn loaded(&self, value: Value) -> (&[Dim], Stored) {
        let (_, shape, stored) = self.loads.iter().find(|(v, ..)| *v == value).expect("loads are listed first");
        (shape, *stored)
    }

    /// The loops over the axes from `level` on, then one element. Before
    /// the loop of each level, the invariant parts of that level are
    /// computed once (when every loop inside runs at least once, so that
    /// nothing is evaluated that the element loop would not evaluate).
    fn nest(&mut self, store: &Store, axes: &[Variable], shape: &[ClValue], level: u32) {
        let continuation = self.invariants_at(store, shape, level);
        let rows = if level == 0 { self.rows.take() } else { None };
        if let (Some((first, end)), [outer, next, _, ..]) = (rows, axes) {
            // One loop over the flat index of the first two axes, from
            // `first` to `end`: what a thread is given. The parts invariant
            // per position of the first axis are computed per flat row.
            let combined = self.builder.declare_var(types::I64);
            self.counted_from(combined, Some(first), end, &mut |this| {
                let at = this.builder.use_var(combined);
                let (quotient, remainder) =
                    (this.builder.ins().udiv(at, shape[1]), this.builder.ins().urem(at, shape[1]));
                this.builder.def_var(*outer, quotient);
                this.builder.def_var(*next, remainder);
                let inner = this.invariants_at(store, &shape[1..], level + 1);
                this.nest(store, &axes[2..], &shape[2..], level + 2);
                this.close(inner);
            });
            self.close(continuation);
            return;
        }
        let in_lanes = self.elementwise == Elementwise::Lanes && axes.len() == 1 && lanes::in_lanes_float(store.dtype);
        if let Some((first, end)) = rows {
            // A node of one or two axes: rows `first..end` of the first.
            if in_lanes {
                self.lanes_loop(store, axes[0], level, first, end, &mut |this| this.nest(store, &[], &[], level + 1));
            } else {
                self.counted_from(axes[0], Some(first), end, &mut |this| {
                    this.nest(store, &axes[1..], &shape[1..], level + 1)
                });
            }
            self.close(continuation);
            return;
        }
        match axes.split_first() {
            Some((axis, [])) if in_lanes => {
                let zero = self.builder.ins().iconst(types::I64, 0);
                self.lanes_loop(store, *axis, level, zero, shape[0], &mut |this| this.nest(store, &[], &[], level + 1));
            }
            Some((axis, rest)) => {
                self.counted(*axis, shape[0], &mut |this| this.nest(store, rest, &shape[1..], level + 1))
            }
            None => {
                let reg = self.scalar(store.scalar);
                let at = self.builder.use_var(store.flat);
                let (value, width) = match store.dtype {
                    Dtype::Bool => (self.b(reg), 1),
                    Dtype::I32 | Dtype::I64 => {
                        let i = self.i(reg);
                        (self.wrap(i, store.dtype), 8)
                    }
                    _ => {
                        let f = self.f(reg);
                        let rounded = self.round(f, store.dtype);
                        (self.builder.ins().fdemote(types::F32, rounded), 4)
                    }
                };
                let bytes = self.builder.ins().imul_imm_s(at, width);
                let address = self.builder.ins().iadd(store.out, bytes);
                self.builder.ins().store(self.flags, value, address, 0);
                let next = self.builder.ins().iadd_imm_s(at, 1);
                self.builder.def_var(store.flat, next);
            }
        }
        self.close(continuation);
    }

    /// The invariant parts of `level`, computed once here when every loop
    /// inside runs at least once (so that nothing is evaluated that the
    /// element loop would not evaluate); the block after them, to `close`.
    fn invariants_at(&mut self, store: &Store, shape: &[ClValue], level: u32) -> Option<Block> {
        let here: Vec<&Invariant> = store.invariants.iter().filter(|inv| inv.level == level).collect();
        if here.is_empty() {
            None
        } else {
            let zero = self.builder.ins().iconst(types::I64, 0);
            let mut runs = self.builder.ins().iconst(types::I8, 1);
            for extent in shape {
                let positive = self.builder.ins().icmp(IntCC::SignedGreaterThan, *extent, zero);
                runs = self.builder.ins().band(runs, positive);
            }
            let (compute, continuation) = (self.builder.create_block(), self.builder.create_block());
            self.builder.ins().brif(runs, compute, &[], continuation, &[]);
            self.builder.switch_to_block(compute);
            self.builder.seal_block(compute);
            let mut computed = Vec::new();
            for invariant in here {
                let reg = self.scalar(invariant.scalar);
                let (kind, value) = match invariant.scalar.dtype() {
                    d if d.is_float() => (types::F64, self.f(reg)),
                    Dtype::Bool => (types::I8, self.b(reg)),
                    _ => (types::I64, self.i(reg)),
                };
                computed.push((invariant.scalar, kind, value));
            }
            // Each value is passed on as a block parameter: Cranelift's
            // optimizer places pure instructions where they are used and
            // hoists them out of a loop only to the loop depth of their
            // operands, so the arithmetic after a reduction (the `rsqrt` of
            // a norm's sum) would otherwise be recomputed in the element
            // loop. A block parameter is computed here, once.
            let pinned = self.builder.create_block();
            let arguments: Vec<_> = computed.iter().map(|&(_, _, value)| value.into()).collect();
            self.builder.ins().jump(pinned, &arguments);
            self.builder.switch_to_block(pinned);
            self.builder.seal_block(pinned);
            for (scalar, kind, _) in computed {
                let value = self.builder.append_block_param(pinned, kind);
                let variable = self.builder.declare_var(kind);
                self.builder.def_var(variable, value);
                self.hoisted.insert(scalar as *const Scalar, variable);
            }
            Some(continuation)
        }
    }

    /// Joins the block after a level's invariant parts.
    fn close(&mut self, continuation: Option<Block>) {
        if let Some(continuation) = continuation {
            self.builder.ins().jump(continuation, &[]);
            self.builder.switch_to_block(continuation);
            self.builder.seal_block(continuation);
        }
    }

    /// A contraction (`ir::contraction`): the loop nest over the output's
    /// rows addresses each row's operands and calls the matrix–vector
    /// kernel for the row.
    /// A dense one (one weight matrix, input rows in output order) is one
    /// call for all rows.
    fn contraction(
        &mut self,
        contraction: &Contraction,
        output: &[Dim],
        axes: &[Variable],
        shape: &[ClValue],
        out: ClValue,
    ) {
        let columns = shape[shape.len() - 1];
        let depth = self.dim(contraction.depth);
        let code = helpers::weight_code(self.stored(contraction.weight.value).storage());
        let code = self.builder.ins().iconst(types::I64, code);
        let outer = &output[..output.len() - 1];
        let in_order = contraction
            .input
            .rows
            .iter()
            .enumerate()
            .all(|(k, p)| matches!(p, Scalar::Index(i, _) if *i as usize == k));
        let input_shape =
            &self.loads.iter().find(|(v, ..)| *v == contraction.input.value).expect("loads are listed first").1;
        if contraction.weight.rows.is_empty()
            && in_order
            && contraction.input.rows.len() == outer.len()
            && input_shape[..outer.len()] == *outer
        {
            let input = self.address(contraction.input.value, &[]);
            let weight = self.address(contraction.weight.value, &[]);
            let mut rows = self.builder.ins().iconst(types::I64, 1);
            for extent in &shape[..shape.len() - 1] {
                rows = self.builder.ins().imul(rows, *extent);
            }
            self.call(Helper::MatMul, &[input, weight, out, columns, depth, rows, code]);
            return;
        }
        // Rows that pick their weights are recorded, then run by weight
        // matrix (`helpers::batch_run`).
        let zero = self.builder.ins().iconst(types::I64, 0);
        self.call(Helper::BatchStart, &[zero, zero, zero]);
        let row = self.builder.declare_var(types::I64);
        self.builder.def_var(row, zero);
        let call = RowCall { contraction, row, out, columns };
        self.rows(&call, &axes[..axes.len() - 1], &shape[..shape.len() - 1]);
        self.call(Helper::BatchRun, &[columns, depth, code]);
    }

    /// Where the total a contraction's product left for the output at
    /// the current position of the node's axes is (an f32: an epilogue's
    /// node is a float, stored as f32), if `scalar` is the epilogue's sum.
    fn total_at(&mut self, scalar: &Scalar) -> Option<ClValue> {
        let (_, out, rank) = self.epilogue.filter(|(sum, ..)| std::ptr::eq(*sum, scalar))?;
        let mut flat = self.builder.ins().iconst(types::I64, 0);
        for axis in 0..rank {
            let size = self.extents[&axis].clone();
            let size = self.dim(&size);
            let at = self.builder.use_var(self.indices[&axis]);
            let scaled = self.builder.ins().imul(flat, size);
            flat = self.builder.ins().iadd(scaled, at);
        }
        let bytes = self.builder.ins().imul_imm_s(flat, 4);
        Some(self.builder.ins().iadd(out, bytes))
    }

    /// The loops over the output's rows (`axes`), then one kernel call.
    fn rows(&mut self, call: &RowCall, axes: &[Variable], shape: &[ClValue]) {
        match axes.split_first() {
            Some((axis, rest)) => self.counted(*axis, shape[0], &mut |this| this.rows(call, rest, &shape[1..])),
            None => {
                let input = self.address(call.contraction.input.value, call.contraction.input.rows);
                let weight = self.address(call.contraction.weight.value, call.contraction.weight.rows);
                let at = self.builder.use_var(call.row);
                let first = self.builder.ins().imul(at, call.columns);
                let bytes = self.builder.ins().imul_imm_s(first, 4);
                let target = self.builder.ins().iadd(call.out, bytes);
                self.call(Helper::BatchRow, &[input, weight, target]);
                let next = self.builder.ins().iadd_imm_s(at, 1);
                self.builder.def_var(call.row, next);
            }
        }
    }

    /// A counted loop over `0..extent` of `index`, with `body` inside.
    fn counted(&mut self, index: Variable, extent: ClValue, body: &mut dyn FnMut(&mut Self)) {
        self.counted_from(index, None, extent, body)
    }

    /// A counted loop over `start..extent` (from 0 when `start` is none).
    fn counted_from(
        &mut self,
        index: Variable,
        start: Option<ClValue>,
        extent: ClValue,
        body: &mut dyn FnMut(&mut Self),
    ) {
        let start = start.unwrap_or_else(|| self.builder.ins().iconst(types::I64, 0));
        self.builder.def_var(index, start);
        let (header, inner, exit) =
            (self.builder.create_block(), self.builder.create_block(), self.builder.create_block());
        self.builder.ins().jump(header, &[]);
        self.builder.switch_to_block(header);
        let at = self.builder.use_var(index);
        let more = self.builder.ins().icmp(IntCC::SignedLessThan, at, extent);
        self.builder.ins().brif(more, inner, &[], exit, &[]);
        self.builder.switch_to_block(inner);
        self.builder.seal_block(inner);
        body(self);
        let at = self.builder.use_var(index);
        let next = self.builder.ins().iadd_imm_s(at, 1);
        self.builder.def_var(index, next);
        self.builder.ins().jump(header, &[]);
        self.builder.seal_block(header);
        self.builder.switch_to_block(exit);
        self.builder.seal_block(exit);
    }

    fn reduce(&mut self, op: ReduceOp, index: u32, extent: ClValue, body: &Scalar, dtype: Dtype) -> Reg {
        if op == ReduceOp::Sum && self.elementwise == Elementwise::Lanes {
            if let Some(total) = self.sum_in_lanes(index, extent, body, dtype) {
                return self.float_result(total, dtype);
            }
        }
        let variable = self.builder.declare_var(types::I64);
        self.indices.insert(index, variable);
        let float = dtype.is_float();
        let total = self.builder.declare_var(if float { types::F64 } else { types::I64 });
        let start = if float {
            let value = match op {
                ReduceOp::Sum => 0.0,
                ReduceOp::Max => f64::NEG_INFINITY,
                ReduceOp::Min => f64::INFINITY,
            };
            self.builder.ins().f64const(value)
        } else {
            let value = match op {
                ReduceOp::Sum => 0,
                ReduceOp::Max => i64::MIN,
                ReduceOp::Min => i64::MAX,
            };
            self.builder.ins().iconst(types::I64, value)
        };
        self.builder.def_var(total, start);
        // As the interpreter: the first element starts the reduction (so a
        // NaN or a -0.0 there is kept); an empty one is the identity.
        let first = self.builder.declare_var(types::I8);
        let yes = self.builder.ins().iconst(types::I8, 1);
        self.builder.def_var(first, yes);
        self.counted(variable, extent, &mut |this| {
            let reg = this.scalar(body);
            let sum = this.builder.use_var(total);
            let is_first = this.builder.use_var(first);
            let next = if float {
                let v = this.f(reg);
                match op {
                    ReduceOp::Sum => this.builder.ins().fadd(sum, v),
                    ReduceOp::Max => this.call(Helper::Max, &[sum, v]),
                    ReduceOp::Min => this.call(Helper::Min, &[sum, v]),
                }
            } else {
                let v = this.i(reg);
                match op {
                    ReduceOp::Sum => this.builder.ins().iadd(sum, v),
                    ReduceOp::Max => this.builder.ins().smax(sum, v),
                    ReduceOp::Min => this.builder.ins().smin(sum, v),
                }
            };
            let v = if float { this.f(reg) } else { this.i(reg) };
            let next = this.builder.ins().select(is_first, v, next);
            this.builder.def_var(total, next);
            let no = this.builder.ins().iconst(types::I8, 0);
            this.builder.def_var(first, no);
        });
        let total = self.builder.use_var(total);
        if float {
            self.float_result(total, dtype)
        } else {
            Reg::I(self.wrap(total, dtype))
        }
    }
}

/// How a loaded value's elements are held (`exec::tensor`): floats as
/// f32 but bf16 parameters as their bits and quantized parameters as
/// their blocks, integers as i64, bools as bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stored {
    F32,
    Bf16Bits,
    /// Blocks of a format, of a parameter declared of a type.
    Blocks(BlockFormat, Dtype),
    Int,
    Bool,
}

impl Stored {
    /// How a contraction's weight matrix held so is named to the kernels.
    fn storage(self) -> Storage {
        match self {
            Stored::Bf16Bits => Storage::Bf16,
            Stored::Blocks(format, Dtype::Bf16) => Storage::Bf16Blocks(format),
            Stored::Blocks(format, _) => Storage::Blocks(format),
            Stored::F32 | Stored::Int | Stored::Bool => Storage::F32,
        }
    }

    fn of(node: &linnet_ir::Node, params: &[Param]) -> Stored {
        if let NodeKind::Param(at) = node.kind {
            if let Some(format) = params[at].storage {
                return Stored::Blocks(format, node.dtype);
            }
        }
        match (&node.kind, node.dtype) {
            (NodeKind::Param(_), Dtype::Bf16) => Stored::Bf16Bits,
            (_, Dtype::Bool) => Stored::Bool,
            (_, Dtype::I32 | Dtype::I64) => Stored::Int,
            _ => Stored::F32,
        }
    }

    /// Bytes per element (blocks are addressed by row: `address`).
    fn bytes(self) -> i64 {
        match self {
            Stored::Bool => 1,
            Stored::Bf16Bits => 2,
            Stored::F32 => 4,
            Stored::Int => 8,
            Stored::Blocks(..) => unreachable!("blocks are addressed by row"),
        }
    }
}

/// Loads from a kernel's tables of input and helper pointers: they do not
/// change during a call, so the optimizer may load each once, outside
/// every loop, instead of in every iteration that reads through it.
fn pointer_table() -> MemFlagsData {
    MemFlagsData::trusted().with_readonly().with_can_move()
}

/// The ordered float comparison a source comparison is.
fn float_condition(cmp: CmpOp) -> FloatCC {
    match cmp {
        CmpOp::Eq => FloatCC::Equal,
        CmpOp::Ne => FloatCC::NotEqual,
        CmpOp::Lt => FloatCC::LessThan,
        CmpOp::Le => FloatCC::LessThanOrEqual,
        CmpOp::Gt => FloatCC::GreaterThan,
        CmpOp::Ge => FloatCC::GreaterThanOrEqual,
    }
}

/// The value of a constant integer operand, when it is positive.
fn positive_constant(scalar: &Scalar) -> Option<i64> {
    let value = match scalar {
        Scalar::Int(value, dtype) => linnet_ir::numerics::wrap(*value, *dtype),
        Scalar::Dim(dim) => dim.as_constant()?,
        _ => return None,
    };
    (value > 0).then_some(value)
}

/// Every dim, not a constant, that a node's function reads: its shape, its
/// loads' shapes, reduction extents and dims used as values.
fn dims_read(entry: &Entry, shape: &[Dim], scalar: &Scalar) -> Vec<Dim> {
    fn walk(entry: &Entry, scalar: &Scalar, out: &mut Vec<Dim>) {
        match scalar {
            Scalar::Dim(dim) => out.push(dim.clone()),
            Scalar::Load(value, ..) => out.extend(entry.nodes[value.index()].shape.iter().cloned()),
            Scalar::Reduce { extent, .. } => out.push(extent.clone()),
            _ => {}
        }
        scalar.for_each_child(&mut |child| walk(entry, child, out));
    }
    let mut out = shape.to_vec();
    walk(entry, scalar, &mut out);
    let mut seen = std::collections::HashSet::new();
    out.retain(|dim| dim.as_constant().is_none() && seen.insert(dim.clone()));
    out
}

/// The kernel signature: `fn(out, inputs, dims, helpers, error,
/// first_row, end_row) -> status` (`linnet_cpu::abi::KernelFn`).
fn kernel_signature(call_conv: CallConv) -> Signature {
    let mut signature = Signature::new(call_conv);
    signature.params.extend([AbiParam::new(types::I64); 7]);
    signature.returns.push(AbiParam::new(types::I32));
    signature
}

fn helper_signature(call_conv: CallConv, shape: Shape) -> Signature {
    let mut signature = Signature::new(call_conv);
    let (kind, arity) = match shape {
        Shape::Float1 => (types::F64, 1),
        Shape::Float2 => (types::F64, 2),
        Shape::Int2 => (types::I64, 2),
        Shape::MatMul => (types::I64, 7),
        Shape::Int3 => (types::I64, 3),
        Shape::BlockValue => (types::I64, 3),
    };
    signature.params.extend(std::iter::repeat_n(AbiParam::new(kind), arity));
    signature.returns.push(AbiParam::new(if shape == Shape::BlockValue { types::F64 } else { kind }));
    signature
}

/// Defines one function per `Compute` node of `entry`, named
/// `{prefix}v{node}`, in `module` (a JIT or an object file). Entry dims are
/// read at run time from the dims table; the model's dims are constants.
/// A node that cannot be compiled is an error naming it. The functions'
/// IR is built in node order, then compiled on rayon's threads (the
/// module takes the machine code in node order): compiling is nearly all
/// of a build's time.
pub fn define_kernels<M: Module>(
    module: &mut M,
    params: &[Param],
    entry: &Entry,
    analysis: &Analysis,
    prefix: &str,
    elementwise: Elementwise,
) -> Result<Vec<KernelDef>, (usize, String)> {
    assert_eq!(module.target_config().pointer_type(), types::I64, "the CPU backend targets 64-bit hosts");
    let call_conv = module.target_config().default_call_conv;
    let mut function_context = FunctionBuilderContext::new();
    let (mut functions, mut defs) = (Vec::new(), Vec::new());
    for (at, node) in entry.nodes.iter().enumerate() {
        let NodeKind::Compute(scalar) = &node.kind else { continue };
        let mut loaded = Vec::new();
        scalar.loads(&mut loaded);
        loaded.sort_unstable();
        loaded.dedup();
        let loads: Vec<(Value, Vec<Dim>, Stored)> = loaded
            .iter()
            .map(|v| (*v, entry.nodes[v.index()].shape.clone(), Stored::of(&entry.nodes[v.index()], params)))
            .collect();
        let table = dims_read(entry, &node.shape, scalar);
        // Each function keeps its own context until it is compiled.
        let mut context = module.make_context();
        context.func.signature = kernel_signature(call_conv);
        let symbol = format!("{prefix}v{at}");
        let sites;
        let mut splits_rows = false;
        let id = module
            .declare_function(&symbol, Linkage::Export, &context.func.signature)
            .map_err(|e| (at, e.to_string()))?;
        {
            let mut builder = FunctionBuilder::new(&mut context.func, &mut function_context);
            let entry_block = builder.create_block();
            builder.append_block_params_for_function_params(entry_block);
            builder.switch_to_block(entry_block);
            builder.seal_block(entry_block);
            let params = builder.block_params(entry_block).to_vec();
            let (out, inputs, dims_table, helpers, error) = (params[0], params[1], params[2], params[3], params[4]);
            // The rows to compute (elementwise nodes; see `rows`).
            let (first_row, end_row) = (params[5], params[6]);
            let flags = MemFlagsData::trusted();
            let dims: HashMap<Dim, ClValue> = table
                .iter()
                .enumerate()
                .map(|(k, dim)| (dim.clone(), builder.ins().load(types::I64, flags, dims_table, (k * 8) as i32)))
                .collect();
            let signatures = [Shape::Float1, Shape::Float2, Shape::Int2, Shape::MatMul, Shape::Int3, Shape::BlockValue]
                .into_iter()
                .map(|shape| (shape, builder.import_signature(helper_signature(call_conv, shape))))
                .collect();
            let error_block = builder.create_block();
            let mut lowerer = Lowerer {
                builder: &mut builder,
                helpers,
                signatures,
                indices: HashMap::new(),
                inputs,
                error,
                loads,
                error_block,
                dims,
                sites: Vec::new(),
                flags,
                hoisted: HashMap::new(),
                rows: None,
                extents: HashMap::new(),
                bounds_failure: None,
                elementwise,
                epilogue: None,
            };
            let shape: Vec<ClValue> = node.shape.iter().map(|d| lowerer.dim(d)).collect();
            // The loop nest, the flat output position in a variable.
            let flat = lowerer.builder.declare_var(types::I64);
            let zero = lowerer.builder.ins().iconst(types::I64, 0);
            lowerer.builder.def_var(flat, zero);
            let axes: Vec<Variable> = (0..shape.len()).map(|_| lowerer.builder.declare_var(types::I64)).collect();
            for (k, axis) in axes.iter().enumerate() {
                lowerer.indices.insert(k as u32, *axis);
                lowerer.extents.insert(k as u32, node.shape[k].clone());
            }
            // The kernel takes f32 inputs; a bf16 parameter as the input
            // row (never so in the models) runs as generated loops.
            let contraction = if analysis.contraction[at] { contraction::of(entry, at) } else { None };
            match contraction.filter(|c| lowerer.stored(c.input.value) == Stored::F32) {
                Some(contraction) => {
                    lowerer.contraction(&contraction, &node.shape, &axes, &shape, out);
                    if let Some(epilogue) = contraction.epilogue {
                        // Each output from the total the product left in
                        // its place, in place.
                        let invariants = invariant::invariants(epilogue, shape.len() as u32);
                        lowerer.epilogue = Some((contraction.sum as *const Scalar, out, shape.len() as u32));
                        let store = Store { scalar: epilogue, dtype: node.dtype, flat, out, invariants: &invariants };
                        lowerer.builder.def_var(flat, zero);
                        lowerer.nest(&store, &axes, &shape, 0);
                    }
                }
                None => {
                    let invariants = invariant::invariants(scalar, shape.len() as u32);
                    let store = Store { scalar, dtype: node.dtype, flat, out, invariants: &invariants };
                    if !shape.is_empty() {
                        // Rows `first_row..end_row` (of the first two axes
                        // flattened when there are three or more): the
                        // flat position starts at the first.
                        let mut start = first_row;
                        let merged = if shape.len() >= 3 { 2 } else { 1 };
                        for extent in &shape[merged..] {
                            start = lowerer.builder.ins().imul(start, *extent);
                        }
                        lowerer.builder.def_var(flat, start);
                        lowerer.rows = Some((first_row, end_row));
                        splits_rows = true;
                    }
                    lowerer.nest(&store, &axes, &shape, 0);
                }
            }
            let done = lowerer.builder.ins().iconst(types::I32, 0);
            lowerer.builder.ins().return_(&[done]);
            lowerer.builder.switch_to_block(error_block);
            lowerer.builder.seal_block(error_block);
            let failed = lowerer.builder.ins().iconst(types::I32, 1);
            lowerer.builder.ins().return_(&[failed]);
            sites = std::mem::take(&mut lowerer.sites);
            builder.finalize(module.target_config());
        }
        functions.push(context);
        defs.push(KernelDef {
            func: id,
            record: KernelRecord { node: at, symbol, loads: loaded, dims: table, sites, splits_rows },
        });
    }
    compile_all(module, functions, defs)
}

/// Compiles `functions` on rayon's threads and defines each in `module`
/// as its `defs` entry says, in order; the first function (in node order)
/// that does not compile is an error naming its node.
fn compile_all<M: Module>(
    module: &mut M,
    mut functions: Vec<Context>,
    defs: Vec<KernelDef>,
) -> Result<Vec<KernelDef>, (usize, String)> {
    use rayon::prelude::*;
    // The nodes apart: a `KernelDef` is not shared among threads.
    let nodes: Vec<usize> = defs.iter().map(|def| def.record.node).collect();
    let isa = module.isa();
    let compiled: Vec<Result<(), (usize, String)>> = functions
        .par_iter_mut()
        .zip(&nodes)
        .map(|(function, &node)| {
            function
                .compile(isa, &mut ControlPlane::default())
                .map(|_| ())
                .map_err(|error| (node, format!("Cranelift: {:?}", error.inner)))
        })
        .collect();
    // The first failure in node order, whichever thread met it first.
    compiled.into_iter().collect::<Result<(), _>>()?;
    functions
        .into_iter()
        .zip(defs)
        .map(|(function, def)| {
            let code = function.compiled_code().expect("compiled above");
            let relocs: Vec<ModuleReloc> = code
                .buffer
                .relocs()
                .iter()
                .map(|reloc| ModuleReloc::from_mach_reloc(reloc, &function.func, def.func))
                .collect();
            module
                .define_function_bytes(def.func, u64::from(code.buffer.alignment), code.code_buffer(), &relocs)
                .map_err(|e| (def.record.node, format!("Cranelift: {e:?}")))?;
            Ok(def)
        })
        .collect()
}
