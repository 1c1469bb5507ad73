//! One `Compute` node as an MLIR function: an `scf.parallel` over the
//! node's elements (flattened), its scalar expression in `arith`, `math`,
//! `scf` and `memref` operations. Every value is a flat `memref<?xT>` in
//! its own element type (bool as `i8`); entry dims come in a `memref<?xi64>`
//! table, in the order [`Kernel::dims`] lists them; a position outside its
//! axis reads element 0 and sets `error[0]` to 1. In registers floats are
//! f32 (the contract allows f32 accumulation), rounded to bf16 or f16
//! where a value of that type is produced; integers are i64, wrapped to
//! 32 bits where the type is `i32`, with the language's Euclidean division.
//! The same body runs on the host (MLIR's CPU lowering) or, mapped to GPU
//! threads, as PTX.

use crate::ir::{BinaryOp, Entry, NodeKind, ReduceOp, Scalar, UnaryOp, Value};
use crate::sema::dim::Dim;
use std::collections::HashMap;
use crate::sema::ty::Dtype;
use crate::syntax::ast::CmpOp;
use std::fmt::Write;

/// A node's kernel: its MLIR function and what it is called with.
pub struct Kernel {
    pub name: String,
    pub text: String,
    /// The values it reads, in argument order after the output.
    pub loads: Vec<Value>,
    /// The non-constant dims, in the order of the dims table.
    pub dims: Vec<Dim>,
}

/// Why a node has no kernel for this target yet.
#[derive(Debug)]
pub struct Unsupported(pub String);

/// The storage type of a dtype in memory.
fn stored(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::Bf16 => "bf16",
        Dtype::F16 => "f16",
        Dtype::F32 => "f32",
        Dtype::I32 => "i32",
        Dtype::I64 => "i64",
        Dtype::Bool => "i8",
    }
}

/// The register type of a dtype.
fn register(dtype: Dtype) -> &'static str {
    match dtype {
        Dtype::Bf16 | Dtype::F16 | Dtype::F32 => "f32",
        Dtype::I32 | Dtype::I64 => "i64",
        Dtype::Bool => "i1",
    }
}

/// Emits the body of one kernel, one SSA value at a time.
struct Emitter<'e> {
    entry: &'e Entry,
    body: String,
    next: usize,
    loads: Vec<Value>,
    dims: Vec<Dim>,
    /// The SSA names (of type `index`) of the node's axes and of the
    /// reduction indices in scope, by index number.
    indices: HashMap<u32, String>,
}

impl Emitter<'_> {
    fn fresh(&mut self) -> String {
        self.next += 1;
        format!("%t{}", self.next)
    }

    fn line(&mut self, text: String) {
        self.body.push_str("    ");
        self.body.push_str(&text);
        self.body.push('\n');
    }

    /// `name = op`; returns the name.
    fn op(&mut self, text: String) -> String {
        let name = self.fresh();
        self.line(format!("{name} = {text}"));
        name
    }

    fn index_constant(&mut self, value: i64) -> String {
        self.op(format!("arith.constant {value} : index"))
    }

    /// A dim's value as `i64`: a constant, or its slot in the dims table.
    fn dim(&mut self, dim: &Dim) -> String {
        if let Some(value) = dim.as_constant() {
            return self.op(format!("arith.constant {value} : i64"));
        }
        let slot = match self.dims.iter().position(|known| known == dim) {
            Some(slot) => slot,
            None => {
                self.dims.push(dim.clone());
                self.dims.len() - 1
            }
        };
        let at = self.index_constant(slot as i64);
        self.op(format!("memref.load %dims[{at}] : memref<?xi64>"))
    }

    fn argument(&mut self, value: Value) -> String {
        let at = match self.loads.iter().position(|known| *known == value) {
            Some(at) => at,
            None => {
                self.loads.push(value);
                self.loads.len() - 1
            }
        };
        format!("%in{at}")
    }

    /// Rounds an f32 register to `dtype`'s precision where it has less.
    fn rounded(&mut self, value: String, dtype: Dtype) -> String {
        match dtype {
            Dtype::Bf16 | Dtype::F16 => {
                let narrow = self.op(format!("arith.truncf {value} : f32 to {}", stored(dtype)));
                self.op(format!("arith.extf {narrow} : {} to f32", stored(dtype)))
            }
            _ => value,
        }
    }

    /// An i64 register wrapped to `dtype`'s width.
    fn wrapped(&mut self, value: String, dtype: Dtype) -> String {
        if dtype == Dtype::I32 {
            let narrow = self.op(format!("arith.trunci {value} : i64 to i32"));
            self.op(format!("arith.extsi {narrow} : i32 to i64"))
        } else {
            value
        }
    }

    fn scalar(&mut self, scalar: &Scalar) -> Result<String, Unsupported> {
        Ok(match scalar {
            Scalar::Index(k, _) => {
                let index = self.indices.get(k).cloned().ok_or_else(|| Unsupported(format!("index i{k} is not bound")))?;
                self.op(format!("arith.index_cast {index} : index to i64"))
            }
            Scalar::Dim(dim) => self.dim(dim),
            Scalar::Float(value, dtype) => {
                let bits = (crate::numerics::round(*value, *dtype) as f32).to_bits();
                self.op(format!("arith.constant 0x{bits:08X} : f32"))
            }
            Scalar::Int(value, dtype) => self.op(format!("arith.constant {} : i64", crate::numerics::wrap(*value, *dtype))),
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
                let condition = self.scalar(condition)?;
                let name = self.fresh();
                let ty = register(*dtype);
                self.line(format!("{name} = scf.if {condition} -> ({ty}) {{"));
                let a = self.scalar(a)?;
                self.line(format!("  scf.yield {a} : {ty}"));
                self.line("} else {".into());
                let b = self.scalar(b)?;
                self.line(format!("  scf.yield {b} : {ty}"));
                self.line("}".into());
                name
            }
            Scalar::Cast(a, dtype) => {
                let from = a.dtype();
                let a = self.scalar(a)?;
                self.cast(a, from, *dtype)
            }
            Scalar::Reduce { op, index, extent, body, dtype } => self.reduce(*op, *index, extent, body, *dtype)?,
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
            (UnaryOp::Not, _) => {
                let one = self.op("arith.constant true".into());
                return self.op(format!("arith.xori {a}, {one} : i1"));
            }
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
        if float { self.rounded(result, dtype) } else { self.wrapped(result, dtype) }
    }

    fn binary(&mut self, op: BinaryOp, a: String, b: String, operands: Dtype, dtype: Dtype) -> String {
        let float = operands.is_float();
        match op {
            BinaryOp::And => return self.op(format!("arith.andi {a}, {b} : i1")),
            BinaryOp::Or => return self.op(format!("arith.ori {a}, {b} : i1")),
            BinaryOp::Cmp(cmp) if operands == Dtype::Bool => {
                let (a, b) = (self.op(format!("arith.extui {a} : i1 to i64")), self.op(format!("arith.extui {b} : i1 to i64")));
                return self.op(format!("arith.cmpi {}, {a}, {b} : i64", integer_predicate(cmp)));
            }
            BinaryOp::Cmp(cmp) if float => return self.op(format!("arith.cmpf {}, {a}, {b} : f32", float_predicate(cmp))),
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

    /// `|a|` of an i64 (wrapping at the most negative, as Rust's).
    fn magnitude(&mut self, a: String) -> String {
        let zero = self.op("arith.constant 0 : i64".into());
        let negative = self.op(format!("arith.cmpi slt, {a}, {zero} : i64"));
        let negated = self.op(format!("arith.subi {zero}, {a} : i64"));
        self.op(format!("arith.select {negative}, {negated}, {a} : i64"))
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
                let (low, high) = (self.op("arith.constant -9.22337203685477580800e+18 : f32".into()), self.op("arith.constant 9.22337149e+18 : f32".into()));
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

    /// The flat position of `positions` in `value`, each checked against
    /// its axis (outside: element 0, and the error flag set).
    fn load(&mut self, value: Value, positions: &[Scalar]) -> Result<String, Unsupported> {
        let node = &self.entry.nodes[value.index()];
        let shape = node.shape.clone();
        let dtype = node.dtype;
        let argument = self.argument(value);
        let mut flat = self.op("arith.constant 0 : i64".into());
        let mut inside = self.op("arith.constant true".into());
        for (position, size) in positions.iter().zip(&shape) {
            let position = self.scalar(position)?;
            let size = self.dim(size);
            let zero = self.op("arith.constant 0 : i64".into());
            let above = self.op(format!("arith.cmpi sge, {position}, {zero} : i64"));
            let below = self.op(format!("arith.cmpi slt, {position}, {size} : i64"));
            let here = self.op(format!("arith.andi {above}, {below} : i1"));
            inside = self.op(format!("arith.andi {inside}, {here} : i1"));
            let scaled = self.op(format!("arith.muli {flat}, {size} : i64"));
            flat = self.op(format!("arith.addi {scaled}, {position} : i64"));
        }
        let zero = self.op("arith.constant 0 : i64".into());
        let safe = self.op(format!("arith.select {inside}, {flat}, {zero} : i64"));
        let outside = self.op("arith.constant true".into());
        let outside = self.op(format!("arith.xori {inside}, {outside} : i1"));
        self.line(format!("scf.if {outside} {{"));
        let (flag, slot) = (self.op("arith.constant 1 : i64".into()), self.index_constant(0));
        self.line(format!("  memref.store {flag}, %error[{slot}] : memref<4xi64>"));
        self.line("}".into());
        let at = self.op(format!("arith.index_cast {safe} : i64 to index"));
        let element = self.op(format!("memref.load {argument}[{at}] : memref<?x{}>", stored(dtype)));
        Ok(self.widened(element, dtype))
    }

    /// A stored element as a register.
    fn widened(&mut self, element: String, dtype: Dtype) -> String {
        match dtype {
            Dtype::Bf16 | Dtype::F16 => self.op(format!("arith.extf {element} : {} to f32", stored(dtype))),
            Dtype::F32 => element,
            Dtype::I32 => self.op(format!("arith.extsi {element} : i32 to i64")),
            Dtype::I64 => element,
            Dtype::Bool => {
                let zero = self.op("arith.constant 0 : i8".into());
                self.op(format!("arith.cmpi ne, {element}, {zero} : i8"))
            }
        }
    }

    /// A register as stored.
    fn narrowed(&mut self, value: String, dtype: Dtype) -> String {
        match dtype {
            Dtype::Bf16 | Dtype::F16 => self.op(format!("arith.truncf {value} : f32 to {}", stored(dtype))),
            Dtype::F32 | Dtype::I64 => value,
            Dtype::I32 => self.op(format!("arith.trunci {value} : i64 to i32")),
            Dtype::Bool => self.op(format!("arith.extui {value} : i1 to i8")),
        }
    }

    fn reduce(&mut self, op: ReduceOp, index: u32, extent: &Dim, body: &Scalar, dtype: Dtype) -> Result<String, Unsupported> {
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
        let extent = self.dim(extent);
        let upper = self.op(format!("arith.index_cast {extent} : i64 to index"));
        let (zero, one) = (self.index_constant(0), self.index_constant(1));
        let (result, counter, accumulator) = (self.fresh(), self.fresh(), self.fresh());
        self.line(format!("{result} = scf.for {counter} = {zero} to {upper} step {one} iter_args({accumulator} = {initial}) -> ({ty}) {{"));
        self.indices.insert(index, counter);
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
        Ok(if ty == "f32" { self.rounded(result, dtype) } else { self.wrapped(result, dtype) })
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

/// The kernel of `Compute` node `at` of `entry`, named `name`.
pub fn kernel(entry: &Entry, at: usize, name: &str) -> Result<Kernel, Unsupported> {
    let node = &entry.nodes[at];
    let NodeKind::Compute(scalar) = &node.kind else { return Err(Unsupported("not a compute node".into())) };
    let mut emitter = Emitter { entry, body: String::new(), next: 0, loads: Vec::new(), dims: Vec::new(), indices: HashMap::new() };
    // The element count, then the flat element id split into the axes.
    let mut count = emitter.op("arith.constant 1 : i64".into());
    let sizes: Vec<String> = node.shape.iter().map(|dim| emitter.dim(dim)).collect();
    for size in &sizes {
        count = emitter.op(format!("arith.muli {count}, {size} : i64"));
    }
    let upper = emitter.op(format!("arith.index_cast {count} : i64 to index"));
    let (zero, one) = (emitter.index_constant(0), emitter.index_constant(1));
    emitter.line(format!("scf.parallel (%element) = ({zero}) to ({upper}) step ({one}) {{"));
    let mut rest = emitter.op("arith.index_cast %element : index to i64".into());
    let mut axes = vec![String::new(); sizes.len()];
    for (axis, size) in sizes.iter().enumerate().rev() {
        let position = emitter.op(format!("arith.remui {rest}, {size} : i64"));
        rest = emitter.op(format!("arith.divui {rest}, {size} : i64"));
        axes[axis] = emitter.op(format!("arith.index_cast {position} : i64 to index"));
    }
    emitter.indices = axes.into_iter().enumerate().map(|(axis, name)| (axis as u32, name)).collect();
    let value = emitter.scalar(scalar)?;
    let value = if node.dtype.is_float() { emitter.rounded(value, node.dtype) } else { value };
    let value = emitter.narrowed(value, node.dtype);
    emitter.line(format!("memref.store {value}, %out[%element] : memref<?x{}>", stored(node.dtype)));
    emitter.line("scf.reduce".into());
    emitter.line("}".into());
    let mut arguments = format!("%out: memref<?x{}>", stored(node.dtype));
    for (at, value) in emitter.loads.iter().enumerate() {
        write!(arguments, ", %in{at}: memref<?x{}>", stored(entry.nodes[value.index()].dtype)).expect("writing to a string");
    }
    arguments.push_str(", %dims: memref<?xi64>, %error: memref<4xi64>");
    // `llvm.emit_c_interface`: MLIR's execution engine calls only such
    // functions (the host path); the GPU path ignores it.
    let text = format!("func.func @{name}({arguments}) attributes {{ llvm.emit_c_interface }} {{\n{}    return\n}}\n", emitter.body);
    Ok(Kernel { name: name.to_string(), text, loads: emitter.loads, dims: emitter.dims })
}
