//! Evaluating a `Compute` node: its scalar expression is first prepared
//! (dims evaluated, index numbers given slots, loads given strides), then
//! run at every point of the output shape.

use crate::tensor::{Data, Tensor};
use crate::{Dims, NodeError, Values};
use linnet_ir::numerics::{self, bf16_value, math, round, wrap};
use linnet_ir::Dtype;
use linnet_ir::{BinaryOp, ReduceOp, Scalar, UnaryOp, Value};
use std::collections::HashMap;

fn dim(dim: &linnet_ir::dim::Dim, dims: &Dims) -> i64 {
    dim.value_under(dims).expect("an entry's dims are bound when it is called")
}

#[derive(Clone, Copy, Debug)]
enum V {
    F(f64),
    I(i64),
    B(bool),
}

impl V {
    fn f(self) -> f64 {
        match self {
            V::F(v) => v,
            V::I(v) => v as f64,
            V::B(v) => f64::from(u8::from(v)),
        }
    }

    fn i(self) -> i64 {
        match self {
            V::I(v) => v,
            V::F(v) => v as i64,
            V::B(v) => i64::from(v),
        }
    }

    fn b(self) -> bool {
        match self {
            V::B(v) => v,
            V::I(v) => v != 0,
            V::F(v) => v != 0.0,
        }
    }
}

/// A scalar expression ready to run.
enum P {
    Slot(usize),
    Const(V),
    /// `sources`: the value each position reads directly, for errors.
    Load {
        tensor: usize,
        value: Value,
        positions: Vec<P>,
        shape: Vec<usize>,
        sources: Vec<Option<Value>>,
    },
    Unary(UnaryOp, Box<P>, Dtype),
    Binary(BinaryOp, Box<P>, Box<P>, Dtype),
    Select(Box<P>, Box<P>, Box<P>),
    Cast(Box<P>, Dtype),
    Reduce {
        op: ReduceOp,
        slot: usize,
        extent: i64,
        body: Box<P>,
        dtype: Dtype,
    },
    /// An invariant part (`ir::invariant`): computed once per position of
    /// the axes before `level`, kept in memo `id`.
    Memo {
        id: usize,
        level: usize,
        body: Box<P>,
    },
}

struct Preparer<'v> {
    values: &'v Values<Tensor>,
    dims: &'v Dims,
    slots: HashMap<u32, usize>,
    tensors: Vec<usize>,
    /// The invariant parts not yet prepared, by place, with their levels.
    invariants: HashMap<*const Scalar, u32>,
    memos: usize,
}

impl Preparer<'_> {
    fn prepare(&mut self, scalar: &Scalar) -> P {
        if let Some(&level) = self.invariants.get(&(scalar as *const Scalar)) {
            self.invariants.remove(&(scalar as *const Scalar));
            let body = Box::new(self.prepare(scalar));
            self.memos += 1;
            return P::Memo { id: self.memos - 1, level: level as usize, body };
        }
        match scalar {
            Scalar::Index(id, _) => P::Slot(self.slots[id]),
            Scalar::Dim(d) => P::Const(V::I(dim(d, self.dims))),
            Scalar::Float(v, dtype) => P::Const(V::F(round(*v, *dtype))),
            Scalar::Int(v, dtype) => P::Const(V::I(wrap(*v, *dtype))),
            Scalar::Bool(v) => P::Const(V::B(*v)),
            Scalar::Load(value, positions, _) => {
                let tensor = self.tensors.len();
                self.tensors.push(value.index());
                let shape = self.values[value.index()].as_ref().expect("a loaded value is live").shape.clone();
                let sources = positions.iter().map(Scalar::direct_load).collect();
                P::Load {
                    tensor,
                    value: *value,
                    positions: positions.iter().map(|p| self.prepare(p)).collect(),
                    shape,
                    sources,
                }
            }
            Scalar::Unary(op, a, dtype) => P::Unary(*op, Box::new(self.prepare(a)), *dtype),
            Scalar::Binary(op, a, b, dtype) => {
                P::Binary(*op, Box::new(self.prepare(a)), Box::new(self.prepare(b)), *dtype)
            }
            Scalar::Select(c, a, b, _) => {
                P::Select(Box::new(self.prepare(c)), Box::new(self.prepare(a)), Box::new(self.prepare(b)))
            }
            Scalar::Cast(a, dtype) => P::Cast(Box::new(self.prepare(a)), *dtype),
            Scalar::Reduce { op, index, extent, body, dtype } => {
                let slot = self.slots.len();
                self.slots.insert(*index, slot);
                let extent = dim(extent, self.dims);
                P::Reduce { op: *op, slot, extent, body: Box::new(self.prepare(body)), dtype: *dtype }
            }
        }
    }
}

/// An invariant part's value and the outer position it was computed at.
type Memo = (Vec<i64>, V);

struct Runner<'v> {
    tensors: Vec<&'v Tensor>,
    memos: std::cell::RefCell<Vec<Option<Memo>>>,
}

fn float_result(value: f64, dtype: Dtype) -> V {
    match dtype {
        Dtype::Bool => V::B(value != 0.0),
        Dtype::I32 | Dtype::I64 => V::I(wrap(value as i64, dtype)),
        _ => V::F(round(value, dtype)),
    }
}

impl Runner<'_> {
    fn run(&self, p: &P, slots: &mut [i64]) -> Result<V, NodeError> {
        Ok(match p {
            P::Slot(slot) => V::I(slots[*slot]),
            P::Memo { id, level, body } => {
                if let Some((at, value)) = &self.memos.borrow()[*id] {
                    if at[..] == slots[..*level] {
                        return Ok(*value);
                    }
                }
                let value = self.run(body, slots)?;
                self.memos.borrow_mut()[*id] = Some((slots[..*level].to_vec(), value));
                value
            }
            P::Const(v) => *v,
            P::Load { tensor, value, positions, shape, sources } => {
                let mut offset = 0usize;
                for (axis, ((position, &size), source)) in positions.iter().zip(shape).zip(sources).enumerate() {
                    let at = self.run(position, slots)?.i();
                    if at < 0 || at as usize >= size {
                        return Err(NodeError::OutOfRange {
                            value: *value,
                            axis,
                            position: at,
                            size: size as i64,
                            source: *source,
                        });
                    }
                    offset = offset * size + at as usize;
                }
                match &self.tensors[*tensor].data {
                    Data::F32(values) => V::F(values[offset] as f64),
                    Data::Bf16(bits) => V::F(bf16_value(bits[offset]) as f64),
                    Data::Blocks(..) => unreachable!("the interpreter dequantizes blocks when they are uploaded"),
                    Data::I64(values) => V::I(values[offset]),
                    Data::Bool(values) => V::B(values[offset]),
                }
            }
            P::Unary(op, a, dtype) => {
                let a = self.run(a, slots)?;
                match op {
                    UnaryOp::Not => V::B(!a.b()),
                    UnaryOp::Neg if dtype.is_int() => V::I(wrap(a.i().wrapping_neg(), *dtype)),
                    UnaryOp::Abs if dtype.is_int() => V::I(a.i().wrapping_abs()),
                    op => {
                        let x = a.f();
                        let y = match op {
                            UnaryOp::Neg => -x,
                            UnaryOp::Exp => math::exp(x),
                            UnaryOp::Log => math::ln(x),
                            UnaryOp::Rsqrt => 1.0 / math::sqrt(x),
                            UnaryOp::Sqrt => math::sqrt(x),
                            UnaryOp::Cos => math::cos(x),
                            UnaryOp::Sin => math::sin(x),
                            UnaryOp::Tanh => math::tanh(x),
                            UnaryOp::Abs => x.abs(),
                            UnaryOp::Not => unreachable!("handled above"),
                        };
                        float_result(y, *dtype)
                    }
                }
            }
            P::Binary(op, a, b, dtype) => {
                let (a, b) = (self.run(a, slots)?, self.run(b, slots)?);
                binary(*op, a, b, *dtype)
            }
            P::Select(c, a, b) => {
                if self.run(c, slots)?.b() {
                    self.run(a, slots)?
                } else {
                    self.run(b, slots)?
                }
            }
            P::Cast(a, dtype) => {
                let a = self.run(a, slots)?;
                match dtype {
                    Dtype::Bool => V::B(a.b()),
                    Dtype::I32 | Dtype::I64 => {
                        V::I(wrap(if let V::F(f) = a { f.trunc() as i64 } else { a.i() }, *dtype))
                    }
                    _ => V::F(round(a.f(), *dtype)),
                }
            }
            P::Reduce { op, slot, extent, body, dtype } => {
                let mut total: Option<V> = None;
                for at in 0..*extent {
                    slots[*slot] = at;
                    let v = self.run(body, slots)?;
                    total = Some(match (total, op) {
                        (None, _) => match v {
                            V::F(f) => V::F(f),
                            other => other,
                        },
                        (Some(V::F(t)), ReduceOp::Sum) => V::F(t + v.f()),
                        (Some(V::F(t)), ReduceOp::Max) => V::F(t.max(v.f())),
                        (Some(V::F(t)), ReduceOp::Min) => V::F(t.min(v.f())),
                        (Some(t), ReduceOp::Sum) => V::I(t.i().wrapping_add(v.i())),
                        (Some(t), ReduceOp::Max) => V::I(t.i().max(v.i())),
                        (Some(t), ReduceOp::Min) => V::I(t.i().min(v.i())),
                    });
                }
                let total = total.unwrap_or(match op {
                    ReduceOp::Sum => V::F(0.0),
                    ReduceOp::Max => V::F(f64::NEG_INFINITY),
                    ReduceOp::Min => V::F(f64::INFINITY),
                });
                if dtype.is_float() {
                    float_result(total.f(), *dtype)
                } else {
                    V::I(wrap(total.i(), *dtype))
                }
            }
        })
    }
}

fn binary(op: BinaryOp, a: V, b: V, dtype: Dtype) -> V {
    if let BinaryOp::Cmp(cmp) = op {
        let ordering = match (a, b) {
            (V::F(_), _) | (_, V::F(_)) => a.f().partial_cmp(&b.f()),
            _ => Some(a.i().cmp(&b.i())),
        };
        return V::B(cmp.holds(ordering));
    }
    match op {
        BinaryOp::And => return V::B(a.b() && b.b()),
        BinaryOp::Or => return V::B(a.b() || b.b()),
        _ => {}
    }
    if dtype.is_int() {
        return V::I(wrap(numerics::integer(op, a.i(), b.i()), dtype));
    }
    float_result(numerics::float(op, a.f(), b.f()), dtype)
}

/// Every element of a `Compute` node.
pub fn compute(
    scalar: &Scalar,
    shape: Vec<usize>,
    dtype: Dtype,
    values: &Values<Tensor>,
    dims: &Dims,
) -> Result<Tensor, NodeError> {
    let rank = shape.len();
    let invariants = linnet_ir::invariant::invariants(scalar, rank as u32)
        .into_iter()
        .map(|i| (i.scalar as *const Scalar, i.level))
        .collect();
    let slots = (0..rank as u32).map(|k| (k, k as usize)).collect();
    let mut preparer = Preparer { values, dims, slots, tensors: Vec::new(), invariants, memos: 0 };
    let prepared = preparer.prepare(scalar);
    let runner = Runner {
        tensors: preparer.tensors.iter().map(|&at| values[at].as_deref().expect("a loaded value is live")).collect(),
        memos: std::cell::RefCell::new(vec![None; preparer.memos]),
    };
    let mut slots = vec![0i64; preparer.slots.len().max(rank)];
    let count: usize = shape.iter().product();
    let mut out = Tensor::zeros(dtype, shape.clone());
    for flat in 0..count {
        let mut rest = flat;
        for axis in (0..rank).rev() {
            slots[axis] = (rest % shape[axis]) as i64;
            rest /= shape[axis];
        }
        let v = runner.run(&prepared, &mut slots)?;
        match &mut out.data {
            Data::F32(values) => values[flat] = round(v.f(), dtype) as f32,
            Data::I64(values) => values[flat] = wrap(v.i(), dtype),
            Data::Bool(values) => values[flat] = v.b(),
            Data::Bf16(_) | Data::Blocks(..) => unreachable!("computed values are held as f32"),
        }
    }
    Ok(out)
}
