//! The CPU backend: one Cranelift function per `Compute` node, JIT-compiled
//! for an entry's concrete dims and cached by them. A function runs the
//! node's loop nest, evaluates its scalar expression (loads with bounds
//! checks, lazy selects, reductions as inner loops) and stores each element;
//! it returns 0, or 1 with the failing load's number, position and size.

use crate::ir::{BinaryOp, Entry, NodeKind, ReduceOp, Scalar, UnaryOp, Value};
use crate::sema::dim::{Atom, Dim, Symbol};
use crate::sema::ty::Dtype;
use crate::syntax::ast::CmpOp;
use cranelift_codegen::ir::condcodes::{FloatCC, IntCC};
use cranelift_codegen::ir::{types, AbiParam, Block, FuncRef, InstBuilder, MemFlagsData, Type};
use cranelift_frontend::{FunctionBuilder, FunctionBuilderContext, Variable};
use cranelift_jit::{JITBuilder, JITModule};
use cranelift_module::{default_libcall_names, FuncId, Linkage, Module};
use std::collections::HashMap;

/// `fn(out, inputs, error) -> status`: `inputs` points at each loaded
/// value's elements; `error` receives (load, position, size).
pub type Kernel = unsafe extern "C" fn(*mut u8, *const *const u8, *mut i64) -> i32;

extern "C" fn call_exp(x: f64) -> f64 {
    x.exp()
}
extern "C" fn call_ln(x: f64) -> f64 {
    x.ln()
}
extern "C" fn call_cos(x: f64) -> f64 {
    x.cos()
}
extern "C" fn call_sin(x: f64) -> f64 {
    x.sin()
}
extern "C" fn call_tanh(x: f64) -> f64 {
    x.tanh()
}
extern "C" fn call_max(x: f64, y: f64) -> f64 {
    x.max(y)
}
extern "C" fn call_min(x: f64, y: f64) -> f64 {
    x.min(y)
}
extern "C" fn call_rem(x: f64, y: f64) -> f64 {
    x % y
}
extern "C" fn call_round_bf16(x: f64) -> f64 {
    crate::interp::tensor::round(x, Dtype::Bf16)
}
extern "C" fn call_round_f16(x: f64) -> f64 {
    crate::interp::tensor::round(x, Dtype::F16)
}
extern "C" fn call_div_euclid(x: i64, y: i64) -> i64 {
    crate::interp::tensor::div_euclid(x, y)
}
extern "C" fn call_rem_euclid(x: i64, y: i64) -> i64 {
    crate::interp::tensor::rem_euclid(x, y)
}

const HELPERS_F1: [(&str, extern "C" fn(f64) -> f64); 7] = [
    ("linnet_exp", call_exp),
    ("linnet_ln", call_ln),
    ("linnet_cos", call_cos),
    ("linnet_sin", call_sin),
    ("linnet_tanh", call_tanh),
    ("linnet_round_bf16", call_round_bf16),
    ("linnet_round_f16", call_round_f16),
];
const HELPERS_F2: [(&str, extern "C" fn(f64, f64) -> f64); 3] = [("linnet_max", call_max), ("linnet_min", call_min), ("linnet_rem", call_rem)];
const HELPERS_I2: [(&str, extern "C" fn(i64, i64) -> i64); 2] = [("linnet_div_euclid", call_div_euclid), ("linnet_rem_euclid", call_rem_euclid)];

/// The compiled nodes of one entry at one binding of its dims.
pub struct Compiled {
    /// Kept alive: the kernels point into it.
    _module: JITModule,
    /// Per node: its kernel and the values it loads, in argument order.
    pub kernels: Vec<Option<(Kernel, Vec<Value>)>>,
}

/// A scalar in a register: floats as f64, integers as i64, bools as i8.
#[derive(Clone, Copy)]
enum Reg {
    F(cranelift_codegen::ir::Value),
    I(cranelift_codegen::ir::Value),
    B(cranelift_codegen::ir::Value),
}

struct Helpers {
    f1: HashMap<&'static str, FuncRef>,
    f2: HashMap<&'static str, FuncRef>,
    i2: HashMap<&'static str, FuncRef>,
}

struct Lowerer<'b, 'f> {
    builder: &'b mut FunctionBuilder<'f>,
    helpers: Helpers,
    /// Index variables by number.
    indices: HashMap<u32, Variable>,
    inputs: cranelift_codegen::ir::Value,
    error: cranelift_codegen::ir::Value,
    /// Each loaded value's argument number, shape and element kind.
    loads: Vec<(Value, Vec<i64>, Dtype)>,
    error_block: Block,
    dims: &'b HashMap<Symbol, i64>,
    load_count: i64,
    /// Aligned, non-trapping accesses (every address is checked first).
    flags: MemFlagsData,
}

fn dim_value(dim: &Dim, dims: &HashMap<Symbol, i64>) -> i64 {
    dim.evaluate(&|atom| match atom {
        Atom::Generic(name) => dims.get(name).copied(),
        _ => None,
    })
    .expect("dims are bound when an entry is compiled")
}

impl Lowerer<'_, '_> {
    fn f(&mut self, reg: Reg) -> cranelift_codegen::ir::Value {
        match reg {
            Reg::F(v) => v,
            Reg::I(v) => self.builder.ins().fcvt_from_sint(types::F64, v),
            Reg::B(v) => {
                let wide = self.builder.ins().uextend(types::I64, v);
                self.builder.ins().fcvt_from_sint(types::F64, wide)
            }
        }
    }

    fn i(&mut self, reg: Reg) -> cranelift_codegen::ir::Value {
        match reg {
            Reg::I(v) => v,
            Reg::F(v) => self.builder.ins().fcvt_to_sint_sat(types::I64, v),
            Reg::B(v) => self.builder.ins().uextend(types::I64, v),
        }
    }

    fn b(&mut self, reg: Reg) -> cranelift_codegen::ir::Value {
        match reg {
            Reg::B(v) => v,
            Reg::I(v) => self.builder.ins().icmp_imm_s(IntCC::NotEqual, v, 0),
            Reg::F(v) => {
                let zero = self.builder.ins().f64const(0.0);
                self.builder.ins().fcmp(FloatCC::NotEqual, v, zero)
            }
        }
    }

    fn call1(&mut self, name: &str, x: cranelift_codegen::ir::Value) -> cranelift_codegen::ir::Value {
        let call = self.builder.ins().call(self.helpers.f1[name], &[x]);
        self.builder.inst_results(call)[0]
    }

    fn call2(&mut self, name: &str, x: cranelift_codegen::ir::Value, y: cranelift_codegen::ir::Value) -> cranelift_codegen::ir::Value {
        let call = self.builder.ins().call(self.helpers.f2[name], &[x, y]);
        self.builder.inst_results(call)[0]
    }

    fn calli(&mut self, name: &str, x: cranelift_codegen::ir::Value, y: cranelift_codegen::ir::Value) -> cranelift_codegen::ir::Value {
        let call = self.builder.ins().call(self.helpers.i2[name], &[x, y]);
        self.builder.inst_results(call)[0]
    }

    /// A float rounded to `dtype`, as the interpreter's `round`.
    fn round(&mut self, value: cranelift_codegen::ir::Value, dtype: Dtype) -> cranelift_codegen::ir::Value {
        match dtype {
            Dtype::F32 => {
                let narrow = self.builder.ins().fdemote(types::F32, value);
                self.builder.ins().fpromote(types::F64, narrow)
            }
            Dtype::Bf16 => self.call1("linnet_round_bf16", value),
            Dtype::F16 => self.call1("linnet_round_f16", value),
            _ => value,
        }
    }

    /// An integer wrapped to `dtype`.
    fn wrap(&mut self, value: cranelift_codegen::ir::Value, dtype: Dtype) -> cranelift_codegen::ir::Value {
        if dtype == Dtype::I32 {
            let narrow = self.builder.ins().ireduce(types::I32, value);
            self.builder.ins().sextend(types::I64, narrow)
        } else {
            value
        }
    }

    /// A result of `dtype` from a float, as the interpreter's `float_result`.
    fn float_result(&mut self, value: cranelift_codegen::ir::Value, dtype: Dtype) -> Reg {
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
        match scalar {
            Scalar::Index(id, _) => Reg::I(self.builder.use_var(self.indices[id])),
            Scalar::Dim(dim) => Reg::I(self.builder.ins().iconst(types::I64, dim_value(dim, self.dims))),
            Scalar::Float(value, dtype) => Reg::F(self.builder.ins().f64const(crate::interp::tensor::round(*value, *dtype))),
            Scalar::Int(value, dtype) => Reg::I(self.builder.ins().iconst(types::I64, crate::interp::tensor::wrap(*value, *dtype))),
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
                            UnaryOp::Exp => self.call1("linnet_exp", x),
                            UnaryOp::Log => self.call1("linnet_ln", x),
                            UnaryOp::Rsqrt => {
                                let root = self.builder.ins().sqrt(x);
                                let one = self.builder.ins().f64const(1.0);
                                self.builder.ins().fdiv(one, root)
                            }
                            UnaryOp::Sqrt => self.builder.ins().sqrt(x),
                            UnaryOp::Cos => self.call1("linnet_cos", x),
                            UnaryOp::Sin => self.call1("linnet_sin", x),
                            UnaryOp::Tanh => self.call1("linnet_tanh", x),
                            UnaryOp::Abs => self.builder.ins().fabs(x),
                            UnaryOp::Not => unreachable!("handled above"),
                        };
                        self.float_result(y, *dtype)
                    }
                }
            }
            Scalar::Binary(op, a, b, dtype) => {
                let (a, b) = (self.scalar(a), self.scalar(b));
                self.binary(*op, a, b, *dtype)
            }
            Scalar::Select(c, a, b, dtype) => {
                let cond = self.scalar(c);
                let cond = self.b(cond);
                let (then, otherwise, merge) = (self.builder.create_block(), self.builder.create_block(), self.builder.create_block());
                let kind = if dtype.is_float() { types::F64 } else if *dtype == Dtype::Bool { types::I8 } else { types::I64 };
                let result = self.builder.append_block_param(merge, kind);
                self.builder.ins().brif(cond, then, &[], otherwise, &[]);
                for (block, side) in [(then, a), (otherwise, b)] {
                    self.builder.switch_to_block(block);
                    self.builder.seal_block(block);
                    let reg = self.scalar(side);
                    let value = if dtype.is_float() { self.f(reg) } else if *dtype == Dtype::Bool { self.b(reg) } else { self.i(reg) };
                    self.builder.ins().jump(merge, &[value.into()]);
                }
                self.builder.switch_to_block(merge);
                self.builder.seal_block(merge);
                if dtype.is_float() { Reg::F(result) } else if *dtype == Dtype::Bool { Reg::B(result) } else { Reg::I(result) }
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
            Scalar::Reduce { op, index, extent, body, dtype } => self.reduce(*op, *index, dim_value(extent, self.dims), body, *dtype),
        }
    }

    fn binary(&mut self, op: BinaryOp, a: Reg, b: Reg, dtype: Dtype) -> Reg {
        if let BinaryOp::Cmp(cmp) = op {
            let float = matches!(a, Reg::F(_)) || matches!(b, Reg::F(_));
            return Reg::B(if float {
                let (x, y) = (self.f(a), self.f(b));
                let cc = match cmp {
                    CmpOp::Eq => FloatCC::Equal,
                    CmpOp::Ne => FloatCC::NotEqual,
                    CmpOp::Lt => FloatCC::LessThan,
                    CmpOp::Le => FloatCC::LessThanOrEqual,
                    CmpOp::Gt => FloatCC::GreaterThan,
                    CmpOp::Ge => FloatCC::GreaterThanOrEqual,
                };
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
            return Reg::B(if op == BinaryOp::And { self.builder.ins().band(x, y) } else { self.builder.ins().bor(x, y) });
        }
        if dtype.is_int() {
            let (x, y) = (self.i(a), self.i(b));
            let value = match op {
                BinaryOp::Add => self.builder.ins().iadd(x, y),
                BinaryOp::Sub => self.builder.ins().isub(x, y),
                BinaryOp::Mul => self.builder.ins().imul(x, y),
                BinaryOp::Div => self.calli("linnet_div_euclid", x, y),
                BinaryOp::Rem => self.calli("linnet_rem_euclid", x, y),
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
            BinaryOp::Rem => self.call2("linnet_rem", x, y),
            BinaryOp::Max => self.call2("linnet_max", x, y),
            BinaryOp::Min => self.call2("linnet_min", x, y),
            _ => unreachable!("handled above"),
        };
        self.float_result(value, dtype)
    }

    fn load(&mut self, value: Value, positions: &[Scalar]) -> Reg {
        let argument = self.loads.iter().position(|(v, ..)| *v == value).expect("loads are listed first");
        let (shape, dtype) = (self.loads[argument].1.clone(), self.loads[argument].2);
        let load_number = self.load_count;
        self.load_count += 1;
        let mut offset = self.builder.ins().iconst(types::I64, 0);
        for (position, size) in positions.iter().zip(&shape) {
            let reg = self.scalar(position);
            let at = self.i(reg);
            let inside = self.builder.ins().icmp_imm_s(IntCC::UnsignedLessThan, at, *size);
            let ok = self.builder.create_block();
            let fail = self.builder.create_block();
            self.builder.ins().brif(inside, ok, &[], fail, &[]);
            self.builder.switch_to_block(fail);
            self.builder.seal_block(fail);
            let number = self.builder.ins().iconst(types::I64, load_number);
            let bound = self.builder.ins().iconst(types::I64, *size);
            self.builder.ins().store(self.flags, number, self.error, 0);
            self.builder.ins().store(self.flags, at, self.error, 8);
            self.builder.ins().store(self.flags, bound, self.error, 16);
            self.builder.ins().jump(self.error_block, &[]);
            self.builder.switch_to_block(ok);
            self.builder.seal_block(ok);
            let scaled = self.builder.ins().imul_imm_s(offset, *size);
            offset = self.builder.ins().iadd(scaled, at);
        }
        let base = self.builder.ins().load(types::I64, self.flags, self.inputs, (argument * 8) as i32);
        let width = match dtype {
            Dtype::Bool => 1,
            Dtype::I32 | Dtype::I64 => 8,
            _ => 4,
        };
        let bytes = self.builder.ins().imul_imm_s(offset, width);
        let address = self.builder.ins().iadd(base, bytes);
        match dtype {
            Dtype::Bool => Reg::B(self.builder.ins().load(types::I8, self.flags, address, 0)),
            Dtype::I32 | Dtype::I64 => Reg::I(self.builder.ins().load(types::I64, self.flags, address, 0)),
            _ => {
                let narrow = self.builder.ins().load(types::F32, self.flags, address, 0);
                Reg::F(self.builder.ins().fpromote(types::F64, narrow))
            }
        }
    }

    /// A counted loop over `0..extent` of `index`, with `body` inside.
    fn counted(&mut self, index: Variable, extent: i64, body: &mut dyn FnMut(&mut Self)) {
        let zero = self.builder.ins().iconst(types::I64, 0);
        self.builder.def_var(index, zero);
        let (header, inner, exit) = (self.builder.create_block(), self.builder.create_block(), self.builder.create_block());
        self.builder.ins().jump(header, &[]);
        self.builder.switch_to_block(header);
        let at = self.builder.use_var(index);
        let more = self.builder.ins().icmp_imm_s(IntCC::SignedLessThan, at, extent);
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

    fn reduce(&mut self, op: ReduceOp, index: u32, extent: i64, body: &Scalar, dtype: Dtype) -> Reg {
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
                    ReduceOp::Max => this.call2("linnet_max", sum, v),
                    ReduceOp::Min => this.call2("linnet_min", sum, v),
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
        if float { self.float_result(total, dtype) } else { Reg::I(self.wrap(total, dtype)) }
    }
}

fn new_module() -> JITModule {
    let mut builder = JITBuilder::with_flags(&[("opt_level", "speed")], default_libcall_names()).expect("the host is supported by Cranelift");
    for (name, f) in HELPERS_F1 {
        builder.symbol(name, f as *const u8);
    }
    for (name, f) in HELPERS_F2 {
        builder.symbol(name, f as *const u8);
    }
    for (name, f) in HELPERS_I2 {
        builder.symbol(name, f as *const u8);
    }
    JITModule::new(builder)
}

/// Compiles every `Compute` node of `entry` for these dims.
pub fn compile(entry: &Entry, dims: &HashMap<Symbol, i64>, skip: &[bool]) -> Result<Compiled, String> {
    let mut module = new_module();
    let pointer = module.target_config().pointer_type();
    let mut helper_ids: Vec<(&'static str, FuncId, Type, usize)> = Vec::new();
    for (name, _) in HELPERS_F1 {
        let mut signature = module.make_signature();
        signature.params.push(AbiParam::new(types::F64));
        signature.returns.push(AbiParam::new(types::F64));
        helper_ids.push((name, module.declare_function(name, Linkage::Import, &signature).map_err(|e| e.to_string())?, types::F64, 1));
    }
    for (name, _) in HELPERS_F2 {
        let mut signature = module.make_signature();
        signature.params.extend([AbiParam::new(types::F64), AbiParam::new(types::F64)]);
        signature.returns.push(AbiParam::new(types::F64));
        helper_ids.push((name, module.declare_function(name, Linkage::Import, &signature).map_err(|e| e.to_string())?, types::F64, 2));
    }
    for (name, _) in HELPERS_I2 {
        let mut signature = module.make_signature();
        signature.params.extend([AbiParam::new(types::I64), AbiParam::new(types::I64)]);
        signature.returns.push(AbiParam::new(types::I64));
        helper_ids.push((name, module.declare_function(name, Linkage::Import, &signature).map_err(|e| e.to_string())?, types::I64, 2));
    }
    let mut context = module.make_context();
    let mut function_context = FunctionBuilderContext::new();
    let mut declared = Vec::new();
    for (at, node) in entry.nodes.iter().enumerate() {
        let NodeKind::Compute(scalar) = &node.kind else { continue };
        if skip[at] {
            continue;
        }
        let mut loaded = Vec::new();
        scalar.loads(&mut loaded);
        loaded.sort_unstable();
        loaded.dedup();
        let loads: Vec<(Value, Vec<i64>, Dtype)> = loaded
            .iter()
            .map(|v| {
                let source = &entry.nodes[v.index()];
                (*v, source.shape.iter().map(|d| dim_value(d, dims)).collect(), source.dtype)
            })
            .collect();
        context.func.signature.params.extend([AbiParam::new(pointer), AbiParam::new(pointer), AbiParam::new(pointer)]);
        context.func.signature.returns.push(AbiParam::new(types::I32));
        let id = module.declare_function(&format!("v{at}"), Linkage::Local, &context.func.signature).map_err(|e| e.to_string())?;
        {
            let mut builder = FunctionBuilder::new(&mut context.func, &mut function_context);
            let entry_block = builder.create_block();
            builder.append_block_params_for_function_params(entry_block);
            builder.switch_to_block(entry_block);
            builder.seal_block(entry_block);
            let params = builder.block_params(entry_block).to_vec();
            let (out, inputs, error) = (params[0], params[1], params[2]);
            let mut helpers = Helpers { f1: HashMap::new(), f2: HashMap::new(), i2: HashMap::new() };
            for (name, id, kind, arity) in &helper_ids {
                let reference = module.declare_func_in_func(*id, builder.func);
                match (kind, arity) {
                    (&types::F64, 1) => helpers.f1.insert(name, reference),
                    (&types::F64, _) => helpers.f2.insert(name, reference),
                    _ => helpers.i2.insert(name, reference),
                };
            }
            let error_block = builder.create_block();
            let shape: Vec<i64> = node.shape.iter().map(|d| dim_value(d, dims)).collect();
            let flags = MemFlagsData::trusted();
            let mut lowerer = Lowerer { builder: &mut builder, helpers, indices: HashMap::new(), inputs, error, loads, error_block, dims, load_count: 0, flags };
            // The loop nest, the flat output position in a variable.
            let flat = lowerer.builder.declare_var(types::I64);
            let zero = lowerer.builder.ins().iconst(types::I64, 0);
            lowerer.builder.def_var(flat, zero);
            let axes: Vec<Variable> = (0..shape.len()).map(|_| lowerer.builder.declare_var(types::I64)).collect();
            for (k, axis) in axes.iter().enumerate() {
                lowerer.indices.insert(k as u32, *axis);
            }
            fn nest(lowerer: &mut Lowerer, axes: &[Variable], shape: &[i64], flat: Variable, out: cranelift_codegen::ir::Value, scalar: &Scalar, dtype: Dtype) {
                match axes.split_first() {
                    Some((axis, rest)) => lowerer.counted(*axis, shape[0], &mut |this| nest(this, rest, &shape[1..], flat, out, scalar, dtype)),
                    None => {
                        let reg = lowerer.scalar(scalar);
                        let at = lowerer.builder.use_var(flat);
                        let (value, width) = match dtype {
                            Dtype::Bool => (lowerer.b(reg), 1),
                            Dtype::I32 | Dtype::I64 => {
                                let i = lowerer.i(reg);
                                (lowerer.wrap(i, dtype), 8)
                            }
                            _ => {
                                let f = lowerer.f(reg);
                                let rounded = lowerer.round(f, dtype);
                                (lowerer.builder.ins().fdemote(types::F32, rounded), 4)
                            }
                        };
                        let bytes = lowerer.builder.ins().imul_imm_s(at, width);
                        let address = lowerer.builder.ins().iadd(out, bytes);
                        lowerer.builder.ins().store(lowerer.flags, value, address, 0);
                        let next = lowerer.builder.ins().iadd_imm_s(at, 1);
                        lowerer.builder.def_var(flat, next);
                    }
                }
            }
            nest(&mut lowerer, &axes, &shape, flat, out, scalar, node.dtype);
            let done = lowerer.builder.ins().iconst(types::I32, 0);
            lowerer.builder.ins().return_(&[done]);
            lowerer.builder.switch_to_block(error_block);
            lowerer.builder.seal_block(error_block);
            let failed = lowerer.builder.ins().iconst(types::I32, 1);
            lowerer.builder.ins().return_(&[failed]);
            builder.finalize(module.target_config());
        }
        module.define_function(id, &mut context).map_err(|e| format!("v{at}: {e:?}"))?;
        module.clear_context(&mut context);
        declared.push((at, id, loaded));
    }
    module.finalize_definitions().map_err(|e| e.to_string())?;
    let mut kernels: Vec<Option<(Kernel, Vec<Value>)>> = (0..entry.nodes.len()).map(|_| None).collect();
    for (at, id, loaded) in declared {
        let pointer = module.get_finalized_function(id);
        // SAFETY: the function was compiled above with this signature.
        let kernel: Kernel = unsafe { std::mem::transmute::<*const u8, Kernel>(pointer) };
        kernels[at] = Some((kernel, loaded));
    }
    Ok(Compiled { _module: module, kernels })
}
