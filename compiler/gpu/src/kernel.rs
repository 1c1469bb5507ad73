//! One `Compute` node as an MLIR kernel (in `emit`'s calling convention):
//! one work item per element of the node, its scalar expression in
//! `arith`, `math`, `scf` and `memref` operations; or, where the
//! expression reduces along other axes than its last (`ir::invariant`: a
//! norm's sum of squares), a warp per row that shares those reductions
//! among its lanes and then writes the row. A position outside its
//! axis reads element 0 and raises [`super::emit::Fault::PositionOutsideAxis`]
//! with the axis' [`Check`], the position and the axis' size; a
//! position that is an index over the axis's own dim is inside it and is
//! not checked. Floats are computed in f32 (the contract allows f32
//! accumulation), rounded to bf16 or f16 where a value of that type is
//! produced; integers in i64, wrapped to 32 bits where the type is `i32`,
//! with the language's Euclidean division. The same body runs on the host
//! (MLIR's CPU lowering) or as PTX.

use super::emit::{register, Check, Combine, Emitter, Form, Kernel, ModelEntry, Unsupported, WARP_LANES};
use linnet_ir::invariant::{invariants, Invariant};
use linnet_ir::CmpOp;
use linnet_ir::Dtype;
use linnet_ir::{BinaryOp, NodeKind, ReduceOp, Scalar, UnaryOp, Value};
use std::cell::Cell;

impl Emitter<'_> {
    pub(super) fn scalar(&mut self, scalar: &Scalar) -> Result<String, Unsupported> {
        if let Some(value) = self.hoisted.get(&(scalar as *const Scalar)) {
            return Ok(value.clone());
        }
        Ok(match scalar {
            Scalar::Index(k, _) => {
                let index =
                    self.indices.get(k).cloned().ok_or_else(|| Unsupported(format!("index i{k} is not bound")))?;
                self.op(format!("arith.index_cast {index} : index to i64"))
            }
            Scalar::Dim(dim) => self.dim(dim),
            Scalar::Float(value, dtype) => {
                let bits = (linnet_ir::numerics::round(*value, *dtype) as f32).to_bits();
                self.op(format!("arith.constant 0x{bits:08X} : f32"))
            }
            Scalar::Int(value, dtype) => {
                self.op(format!("arith.constant {} : i64", linnet_ir::numerics::wrap(*value, *dtype)))
            }
            Scalar::Bool(value) => self.op(format!("arith.constant {value}")),
            Scalar::Load(value, positions, _) => self.load(*value, positions)?,
            Scalar::Unary(op, a, dtype) => {
                let a = self.scalar(a)?;
                self.unary(*op, a, *dtype)
            }
            Scalar::Binary(op, a, b, dtype) => {
                let operands = a.dtype();
                let (a, b) = (self.scalar(a)?, self.scalar(b)?);
                self.binary(*op, a, b, operands, *dtype)
            }
            Scalar::Select(condition, a, b, dtype) => {
                let (then, otherwise) = linnet_ir::bounds::branch_ranges(condition, &self.extents, &self.ranges);
                let condition = self.scalar(condition)?;
                let name = self.fresh();
                let ty = register(*dtype);
                self.line(format!("{name} = scf.if {condition} -> ({ty}) {{"));
                let outside = std::mem::replace(&mut self.ranges, then);
                let a = self.scalar(a);
                self.ranges = otherwise;
                self.line(format!("  scf.yield {} : {ty}", a?));
                self.line("} else {".into());
                let b = self.scalar(b);
                self.ranges = outside;
                self.line(format!("  scf.yield {} : {ty}", b?));
                self.line("}".into());
                name
            }
            Scalar::Cast(a, dtype) => {
                let from = a.dtype();
                let a = self.scalar(a)?;
                self.cast(a, from, *dtype)
            }
            Scalar::Reduce { dtype, .. } => {
                let (zero, one) = (self.index_constant(0), self.index_constant(1));
                let result = self.reduction(scalar, &zero, &one)?;
                if register(*dtype) == "f32" {
                    self.rounded(result, *dtype)
                } else {
                    self.wrapped(result, *dtype)
                }
            }
        })
    }

    fn unary(&mut self, op: UnaryOp, a: String, dtype: Dtype) -> String {
        let float = dtype.is_float();
        let result = match (op, float) {
            (UnaryOp::Neg, true) => self.op(format!("arith.negf {a} : f32")),
            (UnaryOp::Neg, false) => {
                let zero = self.op("arith.constant 0 : i64".into());
                self.op(format!("arith.subi {zero}, {a} : i64"))
            }
            (UnaryOp::Not, _) => return self.not(&a),
            (UnaryOp::Abs, false) => self.magnitude(a),
            (op, _) => {
                let name = match op {
                    UnaryOp::Exp => "math.exp",
                    UnaryOp::Log => "math.log",
                    UnaryOp::Rsqrt => "math.rsqrt",
                    UnaryOp::Sqrt => "math.sqrt",
                    UnaryOp::Cos => "math.cos",
                    UnaryOp::Sin => "math.sin",
                    UnaryOp::Tanh => "math.tanh",
                    _ => "math.absf",
                };
                self.op(format!("{name} {a} : f32"))
            }
        };
        if float {
            self.rounded(result, dtype)
        } else {
            self.wrapped(result, dtype)
        }
    }

    fn binary(&mut self, op: BinaryOp, a: String, b: String, operands: Dtype, dtype: Dtype) -> String {
        let float = operands.is_float();
        match op {
            BinaryOp::And => return self.op(format!("arith.andi {a}, {b} : i1")),
            BinaryOp::Or => return self.op(format!("arith.ori {a}, {b} : i1")),
            BinaryOp::Cmp(cmp) if operands == Dtype::Bool => {
                let (a, b) =
                    (self.op(format!("arith.extui {a} : i1 to i64")), self.op(format!("arith.extui {b} : i1 to i64")));
                return self.op(format!("arith.cmpi {}, {a}, {b} : i64", integer_predicate(cmp)));
            }
            BinaryOp::Cmp(cmp) if float => {
                return self.op(format!("arith.cmpf {}, {a}, {b} : f32", float_predicate(cmp)))
            }
            BinaryOp::Cmp(cmp) => return self.op(format!("arith.cmpi {}, {a}, {b} : i64", integer_predicate(cmp))),
            _ => {}
        }
        if float {
            let name = match op {
                BinaryOp::Add => "arith.addf",
                BinaryOp::Sub => "arith.subf",
                BinaryOp::Mul => "arith.mulf",
                BinaryOp::Div => "arith.divf",
                BinaryOp::Rem => "arith.remf",
                BinaryOp::Max => "arith.maxnumf",
                _ => "arith.minnumf",
            };
            let result = self.op(format!("{name} {a}, {b} : f32"));
            return self.rounded(result, dtype);
        }
        let result = match op {
            BinaryOp::Add => self.op(format!("arith.addi {a}, {b} : i64")),
            BinaryOp::Sub => self.op(format!("arith.subi {a}, {b} : i64")),
            BinaryOp::Mul => self.op(format!("arith.muli {a}, {b} : i64")),
            BinaryOp::Max => self.op(format!("arith.maxsi {a}, {b} : i64")),
            BinaryOp::Min => self.op(format!("arith.minsi {a}, {b} : i64")),
            BinaryOp::Div | BinaryOp::Rem => self.euclidean(op, a, b),
            _ => unreachable!("handled above"),
        };
        self.wrapped(result, dtype)
    }

    /// Euclidean division or remainder; by zero, 0 (as `numerics`).
    fn euclidean(&mut self, op: BinaryOp, a: String, b: String) -> String {
        let (zero, one) = (self.op("arith.constant 0 : i64".into()), self.op("arith.constant 1 : i64".into()));
        let by_zero = self.op(format!("arith.cmpi eq, {b}, {zero} : i64"));
        let divisor = self.op(format!("arith.select {by_zero}, {one}, {b} : i64"));
        let quotient = self.op(format!("arith.divsi {a}, {divisor} : i64"));
        let remainder = self.op(format!("arith.remsi {a}, {divisor} : i64"));
        let negative = self.op(format!("arith.cmpi slt, {remainder}, {zero} : i64"));
        let positive_divisor = self.op(format!("arith.cmpi sgt, {divisor}, {zero} : i64"));
        let result = if op == BinaryOp::Div {
            let lower = self.op(format!("arith.subi {quotient}, {one} : i64"));
            let higher = self.op(format!("arith.addi {quotient}, {one} : i64"));
            let adjusted = self.op(format!("arith.select {positive_divisor}, {lower}, {higher} : i64"));
            self.op(format!("arith.select {negative}, {adjusted}, {quotient} : i64"))
        } else {
            let magnitude = self.magnitude(divisor);
            let adjusted = self.op(format!("arith.addi {remainder}, {magnitude} : i64"));
            self.op(format!("arith.select {negative}, {adjusted}, {remainder} : i64"))
        };
        self.op(format!("arith.select {by_zero}, {zero}, {result} : i64"))
    }

    fn cast(&mut self, a: String, from: Dtype, to: Dtype) -> String {
        match (register(from), to) {
            ("f32", Dtype::Bool) => {
                let zero = self.op("arith.constant 0.0 : f32".into());
                self.op(format!("arith.cmpf une, {a}, {zero} : f32"))
            }
            ("i64", Dtype::Bool) => {
                let zero = self.op("arith.constant 0 : i64".into());
                self.op(format!("arith.cmpi ne, {a}, {zero} : i64"))
            }
            ("i1", Dtype::Bool) => a,
            ("f32", Dtype::I32 | Dtype::I64) => {
                // Truncation toward zero, saturating, NaN to 0 (as Rust's `as`).
                let (low, high) = (
                    self.op("arith.constant -9.22337203685477580800e+18 : f32".into()),
                    self.op("arith.constant 9.22337149e+18 : f32".into()),
                );
                let clamped = self.op(format!("arith.maxnumf {a}, {low} : f32"));
                let clamped = self.op(format!("arith.minnumf {clamped}, {high} : f32"));
                let nan = self.op(format!("arith.cmpf uno, {a}, {a} : f32"));
                let zero = self.op("arith.constant 0.0 : f32".into());
                let finite = self.op(format!("arith.select {nan}, {zero}, {clamped} : f32"));
                let integer = self.op(format!("arith.fptosi {finite} : f32 to i64"));
                self.wrapped(integer, to)
            }
            ("i64", Dtype::I32 | Dtype::I64) => self.wrapped(a, to),
            ("i1", Dtype::I32 | Dtype::I64) => self.op(format!("arith.extui {a} : i1 to i64")),
            ("f32", _) => self.rounded(a, to),
            ("i64", _) => {
                let float = self.op(format!("arith.sitofp {a} : i64 to f32"));
                self.rounded(float, to)
            }
            (_, _) => self.op(format!("arith.uitofp {a} : i1 to f32")),
        }
    }

    /// The element of `value` at `positions`, each checked against its
    /// axis (outside: element 0, and the error flag set).
    fn load(&mut self, value: Value, positions: &[Scalar]) -> Result<String, Unsupported> {
        let dtype = self.entry.nodes[value.index()].dtype;
        let argument = self.argument(value);
        let at = self.position(value, positions)?;
        Ok(self.load_element(&argument, &at, dtype))
    }

    /// The row-major number (an index) of `positions` among the positions
    /// of `value`'s leading axes (all of them, or as many as are given),
    /// each checked against its axis unless `ir::bounds` proves it inside:
    /// outside one, 0, and the error flag set.
    pub(super) fn position(&mut self, value: Value, positions: &[Scalar]) -> Result<String, Unsupported> {
        let shape = self.entry.nodes[value.index()].shape.clone();
        let mut flat = self.op("arith.constant 0 : i64".into());
        let mut inside = None;
        for (axis, (scalar, size)) in positions.iter().zip(&shape).enumerate() {
            // A position inside the axis whatever the indices are needs no
            // check.
            let proven = linnet_ir::bounds::inside_within(scalar, size, &self.extents, &self.ranges);
            let position = self.scalar(scalar)?;
            let size = self.dim(size);
            if !proven {
                let here = self.inside(&position, &size);
                let outside = self.not(&here);
                let check = Check { value, axis, source: scalar.direct_load() };
                self.when(&outside, |emitter| emitter.fault_outside_axis(check, &position, &size));
                inside = Some(match inside {
                    Some(so_far) => self.op(format!("arith.andi {so_far}, {here} : i1")),
                    None => here,
                });
            }
            let scaled = self.op(format!("arith.muli {flat}, {size} : i64"));
            flat = self.op(format!("arith.addi {scaled}, {position} : i64"));
        }
        let safe = match inside {
            None => flat,
            Some(inside) => {
                let zero = self.op("arith.constant 0 : i64".into());
                self.op(format!("arith.select {inside}, {flat}, {zero} : i64"))
            }
        };
        Ok(self.op(format!("arith.index_cast {safe} : i64 to index")))
    }

    /// `Reduce` node `reduction` over the positions of its index from
    /// `from`, every `step`th (indices), in registers: not yet rounded or
    /// wrapped to its type.
    fn reduction(&mut self, reduction: &Scalar, from: &str, step: &str) -> Result<String, Unsupported> {
        let Scalar::Reduce { op, index, extent, body, dtype } = reduction else {
            return Err(Unsupported("not a reduction".into()));
        };
        let (op, index, dtype) = (*op, *index, *dtype);
        let ty = register(dtype);
        let initial = match (op, ty) {
            (ReduceOp::Sum, "f32") => "arith.constant 0.0 : f32".to_string(),
            (ReduceOp::Max, "f32") => "arith.constant 0xFF800000 : f32".to_string(),
            (ReduceOp::Min, "f32") => "arith.constant 0x7F800000 : f32".to_string(),
            (ReduceOp::Sum, _) => "arith.constant 0 : i64".to_string(),
            (ReduceOp::Max, _) => format!("arith.constant {} : i64", i64::MIN),
            (ReduceOp::Min, _) => format!("arith.constant {} : i64", i64::MAX),
        };
        if ty == "i1" {
            return Err(Unsupported("a reduction over booleans".into()));
        }
        let initial = self.op(initial);
        let upper = self.dim_index(extent);
        let (result, counter, accumulator) = (self.fresh(), self.fresh(), self.fresh());
        self.line(format!("{result} = scf.for {counter} = {from} to {upper} step {step} iter_args({accumulator} = {initial}) -> ({ty}) {{"));
        self.indices.insert(index, counter);
        self.extents.insert(index, extent.clone());
        let value = self.scalar(body)?;
        let combined = match (op, ty) {
            (ReduceOp::Sum, "f32") => self.op(format!("arith.addf {accumulator}, {value} : f32")),
            (ReduceOp::Max, "f32") => self.op(format!("arith.maxnumf {accumulator}, {value} : f32")),
            (ReduceOp::Min, "f32") => self.op(format!("arith.minnumf {accumulator}, {value} : f32")),
            (ReduceOp::Sum, _) => self.op(format!("arith.addi {accumulator}, {value} : i64")),
            (ReduceOp::Max, _) => self.op(format!("arith.maxsi {accumulator}, {value} : i64")),
            (ReduceOp::Min, _) => self.op(format!("arith.minsi {accumulator}, {value} : i64")),
        };
        self.line(format!("  scf.yield {combined} : {ty}"));
        self.line("}".into());
        self.indices.remove(&index);
        self.extents.remove(&index);
        Ok(result)
    }
}

fn float_predicate(cmp: CmpOp) -> &'static str {
    match cmp {
        CmpOp::Eq => "oeq",
        CmpOp::Ne => "une",
        CmpOp::Lt => "olt",
        CmpOp::Le => "ole",
        CmpOp::Gt => "ogt",
        CmpOp::Ge => "oge",
    }
}

fn integer_predicate(cmp: CmpOp) -> &'static str {
    match cmp {
        CmpOp::Eq => "eq",
        CmpOp::Ne => "ne",
        CmpOp::Lt => "slt",
        CmpOp::Le => "sle",
        CmpOp::Gt => "sgt",
        CmpOp::Ge => "sge",
    }
}

/// The kernel of `Compute` node `at` of `entry`: one work item per
/// element, or, where its expression reduces along other axes than its
/// last (a norm's sum of squares, a softmax's sum), a warp per row
/// ([`row_kernel`]).
pub fn kernel(entry: ModelEntry<'_>, at: usize, form: Form) -> Result<Kernel, Unsupported> {
    let node = &entry.nodes[at];
    let NodeKind::Compute(scalar) = &node.kind else { return Err(Unsupported("not a compute node".into())) };
    let rank = node.shape.len() as u32;
    let parts: Vec<Invariant<'_>> = invariants(scalar, rank).into_iter().filter(|part| part.level < rank).collect();
    let mut shared = Vec::new();
    for part in &parts {
        lane_reductions(part.scalar, &mut shared);
    }
    if shared.is_empty() {
        element_kernel(entry, at, form, scalar)
    } else {
        row_kernel(entry, at, form, scalar, &parts, &shared)
    }
}

/// The reductions in a part invariant along the last axis that a row's
/// lanes can share: f32 sums, maxima and minima, outside lazy branches
/// and other reductions.
fn lane_reductions<'s>(scalar: &'s Scalar, out: &mut Vec<&'s Scalar>) {
    match scalar {
        Scalar::Reduce { dtype, .. } if register(*dtype) == "f32" => out.push(scalar),
        Scalar::Reduce { .. } => {}
        Scalar::Select(condition, _, _, _) => lane_reductions(condition, out),
        _ => scalar.for_each_child(&mut |child| lane_reductions(child, out)),
    }
}

/// One work item per element of the node.
fn element_kernel(entry: ModelEntry<'_>, at: usize, form: Form, scalar: &Scalar) -> Result<Kernel, Unsupported> {
    let node = &entry.nodes[at];
    let mut emitter = Emitter::new(entry, at, 0, form);
    let sizes: Vec<String> = node.shape.iter().map(|dim| emitter.dim_index(dim)).collect();
    let sizes: Vec<&str> = sizes.iter().map(String::as_str).collect();
    let mut failed = None;
    emitter.parallel(&node.shape, |emitter, element| {
        emitter.bind_axes(element, &sizes, &node.shape);
        match emitter.scalar(scalar) {
            Ok(value) => emitter.store_element(value, "%out", element, node.dtype),
            Err(why) => failed = Some(why),
        }
    });
    match failed {
        Some(why) => Err(why),
        None => Ok(emitter.finish(node.dtype)),
    }
}

/// A warp per row (a position of every axis but the last). Its lanes
/// share the `shared` reductions (each lane every 32nd position, the
/// shares combined in the lanes' tree); then each lane computes the
/// invariant `parts` once, with those totals, and the row's elements at
/// every 32nd position of the last axis from its own. A row's reduction
/// is computed once instead of once per element, by 32 threads.
fn row_kernel(
    entry: ModelEntry<'_>,
    at: usize,
    form: Form,
    scalar: &Scalar,
    parts: &[Invariant<'_>],
    shared: &[&Scalar],
) -> Result<Kernel, Unsupported> {
    let node = &entry.nodes[at];
    let (leading, last) = node.shape.split_at(node.shape.len() - 1);
    let last_axis = leading.len() as u32;
    let mut e = Emitter::new(entry, at, 0, form);
    let leading_sizes: Vec<String> = leading.iter().map(|dim| e.dim_index(dim)).collect();
    let columns = e.dim_index(&last[0]);
    let lanes = e.index_constant(i64::from(WARP_LANES));
    let combines: Vec<Combine> = shared
        .iter()
        .map(|reduction| match reduction {
            Scalar::Reduce { op: ReduceOp::Sum, .. } => Combine::Add,
            Scalar::Reduce { op: ReduceOp::Max, .. } => Combine::Max,
            _ => Combine::Min,
        })
        .collect();
    let failed = Cell::new(None);
    let bind_row = |e: &mut Emitter<'_>, item: &str| {
        let sizes: Vec<&str> = leading_sizes.iter().map(String::as_str).collect();
        e.bind_axes(item, &sizes, &node.shape);
    };
    e.parallel_in_lanes(
        leading,
        &combines,
        |e, item, lane| {
            bind_row(e, item);
            shared
                .iter()
                .map(|reduction| {
                    e.reduction(reduction, lane, &lanes).unwrap_or_else(|why| {
                        failed.set(Some(why));
                        e.op("arith.constant 0.0 : f32".into())
                    })
                })
                .collect()
        },
        |e, item, lane, totals| {
            bind_row(e, item);
            for (reduction, total) in shared.iter().zip(totals) {
                let value = e.rounded(total.clone(), reduction.dtype());
                e.hoisted.insert(*reduction as *const Scalar, value);
            }
            for part in parts {
                match e.scalar(part.scalar) {
                    Ok(value) => _ = e.hoisted.insert(part.scalar as *const Scalar, value),
                    Err(why) => failed.set(Some(why)),
                }
            }
            let first = e.mul(item, &columns);
            e.for_steps(lane, &columns, &lanes, &[], |e, column, _| {
                e.indices.insert(last_axis, column.to_string());
                match e.scalar(scalar) {
                    Ok(value) => {
                        let at = e.add(&first, column);
                        e.store_element(value, "%out", &at, node.dtype);
                    }
                    Err(why) => failed.set(Some(why)),
                }
                Vec::new()
            });
        },
    );
    match failed.into_inner() {
        Some(why) => Err(why),
        None => Ok(e.finish(node.dtype)),
    }
}
