//! Random programs, the same results: scalar expressions drawn at random
//! (arithmetic in every dtype, casts and bf16/f16 rounding, comparisons,
//! lazy selects, gathers through computed positions, reductions) run on
//! the interpreter and as Cranelift code. The generated scalar code keeps
//! the reference's order and f64 arithmetic, so they agree bit for bit,
//! errors included (the same load reported out of range). The code that
//! computes in f32 lanes meets the numerics contract (`tolerance`) and
//! reports the same errors; its bf16 rounding and `exp` are held to the
//! reference element by element.

use linnet_cranelift::Elementwise;
use linnet_exec::tensor::{Data, Tensor};
use linnet_exec::tolerance;
use linnet_exec::Machine;
use linnet_ir::dim::Dim;
use linnet_ir::CmpOp;
use linnet_ir::Dtype;
use linnet_ir::{BinaryOp, Entry, Input, Model, Node, NodeKind, ReduceOp, Scalar, UnaryOp, Value};
use linnet_runtime::sampling::Rng;

const SIDE: i64 = 6;

struct Generator {
    rng: Rng,
    next_index: u32,
}

impl Generator {
    fn pick(&mut self, n: u64) -> u64 {
        self.rng.next_u64() % n
    }

    fn dtype(&mut self) -> Dtype {
        [Dtype::F32, Dtype::Bf16, Dtype::F16, Dtype::I32, Dtype::I64, Dtype::Bool][self.pick(6) as usize]
    }

    /// A position in 0..SIDE built from the indices in scope.
    fn position(&mut self, indices: &[u32]) -> Scalar {
        let index = Scalar::Index(indices[self.pick(indices.len() as u64) as usize], Dtype::I64);
        match self.pick(3) {
            0 => index,
            1 => Scalar::Binary(
                BinaryOp::Rem,
                Box::new(Scalar::Binary(
                    BinaryOp::Add,
                    Box::new(index),
                    Box::new(Scalar::Int(self.pick(9) as i64, Dtype::I64)),
                    Dtype::I64,
                )),
                Box::new(Scalar::Int(SIDE, Dtype::I64)),
                Dtype::I64,
            ),
            _ => Scalar::Int(self.pick(SIDE as u64) as i64, Dtype::I64),
        }
    }

    fn expr(&mut self, dtype: Dtype, depth: u32, indices: &mut Vec<u32>) -> Scalar {
        let leaf = depth == 0 || self.pick(4) == 0;
        if leaf {
            return match self.pick(3) {
                0 if dtype.is_float() => Scalar::Float((self.rng.next_f64() - 0.5) * 20.0, dtype),
                0 if dtype.is_int() => Scalar::Int(self.pick(40) as i64 - 20, dtype),
                0 => Scalar::Bool(self.pick(2) == 0),
                _ => {
                    let input = match dtype {
                        d if d.is_float() => 0,
                        d if d.is_int() => 1,
                        _ => 2,
                    };
                    let source_dtype = [Dtype::F32, Dtype::I64, Dtype::Bool][input];
                    let load = Scalar::Load(
                        Value(input as u32),
                        vec![self.position(indices), self.position(indices)],
                        source_dtype,
                    );
                    if source_dtype == dtype {
                        load
                    } else {
                        Scalar::Cast(Box::new(load), dtype)
                    }
                }
            };
        }
        match self.pick(6) {
            0 => {
                let from = self.dtype();
                Scalar::Cast(Box::new(self.expr(from, depth - 1, indices)), dtype)
            }
            1 if dtype == Dtype::Bool => {
                let operands = self.dtype();
                let op = [CmpOp::Eq, CmpOp::Ne, CmpOp::Lt, CmpOp::Le, CmpOp::Gt, CmpOp::Ge][self.pick(6) as usize];
                let a = self.expr(operands, depth - 1, indices);
                let b = self.expr(operands, depth - 1, indices);
                Scalar::Binary(BinaryOp::Cmp(op), Box::new(a), Box::new(b), Dtype::Bool)
            }
            1 | 2 if dtype != Dtype::Bool => {
                let ops = [
                    BinaryOp::Add,
                    BinaryOp::Sub,
                    BinaryOp::Mul,
                    BinaryOp::Div,
                    BinaryOp::Rem,
                    BinaryOp::Max,
                    BinaryOp::Min,
                ];
                let op = ops[self.pick(ops.len() as u64) as usize];
                let a = self.expr(dtype, depth - 1, indices);
                let b = self.expr(dtype, depth - 1, indices);
                Scalar::Binary(op, Box::new(a), Box::new(b), dtype)
            }
            3 => {
                let cond = self.expr(Dtype::Bool, depth - 1, indices);
                let a = self.expr(dtype, depth - 1, indices);
                let b = self.expr(dtype, depth - 1, indices);
                Scalar::Select(Box::new(cond), Box::new(a), Box::new(b), dtype)
            }
            4 if dtype.is_float() => {
                let ops = [
                    UnaryOp::Neg,
                    UnaryOp::Exp,
                    UnaryOp::Log,
                    UnaryOp::Rsqrt,
                    UnaryOp::Sqrt,
                    UnaryOp::Cos,
                    UnaryOp::Sin,
                    UnaryOp::Tanh,
                    UnaryOp::Abs,
                ];
                let op = ops[self.pick(ops.len() as u64) as usize];
                Scalar::Unary(op, Box::new(self.expr(dtype, depth - 1, indices)), dtype)
            }
            5 if dtype != Dtype::Bool => {
                self.next_index += 1;
                let index = 100 + self.next_index;
                indices.push(index);
                let body = self.expr(dtype, depth - 1, indices);
                indices.pop();
                let op = [ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min][self.pick(3) as usize];
                Scalar::Reduce {
                    op,
                    index,
                    extent: Dim::constant(self.pick(SIDE as u64 + 1) as i64),
                    body: Box::new(body),
                    dtype,
                }
            }
            _ => {
                let inner = if dtype == Dtype::Bool { Dtype::Bool } else { dtype };
                Scalar::Unary(
                    if inner == Dtype::Bool { UnaryOp::Not } else { UnaryOp::Neg },
                    Box::new(self.expr(inner, depth - 1, indices)),
                    inner,
                )
            }
        }
    }
}

fn model(scalar: Scalar, dtype: Dtype) -> Model {
    let square = || vec![Dim::constant(SIDE), Dim::constant(SIDE)];
    let inputs = [("floats", Dtype::F32), ("ints", Dtype::I64), ("flags", Dtype::Bool)];
    let mut nodes: Vec<Node> = inputs
        .iter()
        .enumerate()
        .map(|(at, (_, d))| Node { kind: NodeKind::Input(at), shape: square(), dtype: *d, source: None })
        .collect();
    nodes.push(Node { kind: NodeKind::Compute(scalar), shape: square(), dtype, source: None });
    let entry = Entry {
        name: "program".into(),
        dims: Vec::new(),
        requires: Vec::new(),
        inputs: inputs.iter().map(|(name, d)| Input { name: name.to_string(), shape: square(), dtype: *d }).collect(),
        nodes,
        outputs: vec![Value(3)],
    };
    Model { name: "random".into(), params: Vec::new(), states: Vec::new(), entries: vec![entry] }
}

fn reference(program: &Model) -> Machine {
    linnet_exec::interp::machine(program.clone(), Vec::new())
}

fn native(program: &Model, elementwise: Elementwise) -> Machine {
    linnet_cranelift::jit_machine(program.clone(), Vec::new(), elementwise).unwrap_or_else(|e| panic!("{e}"))
}

/// The scalar code agrees with the interpreter bit for bit, the lanes
/// within the contract; both report the errors it reports.
fn agree(program: &Model, given: Vec<Tensor>, context: &str) {
    let interpreted = reference(program).call("program", given.clone());
    for elementwise in [Elementwise::Scalar, Elementwise::Lanes] {
        let compiled = native(program, elementwise).call("program", given.clone());
        let verdict = |a: &[Tensor], b: &[Tensor]| match elementwise {
            Elementwise::Scalar => same(&a[0], &b[0]).then_some(()).ok_or_else(|| "not the same bits".to_string()),
            Elementwise::Lanes => tolerance::compare(&a[0], &b[0]).map(|_| ()).map_err(|e| e.to_string()),
        };
        match (&interpreted, compiled) {
            (Ok(a), Ok(b)) => {
                if let Err(why) = verdict(a, &b) {
                    panic!(
                        "{context} ({elementwise:?}) differs: {why}\n{program}\ninterp {:?}\ncpu    {:?}",
                        a[0].data, b[0].data
                    )
                }
            }
            (Err(a), Err(b)) => assert_eq!(*a, b, "{context} ({elementwise:?})"),
            (a, b) => panic!("{context} ({elementwise:?}): interp {a:?}, cpu {:?}\n{program}", b.map(|_| ())),
        }
    }
}

fn floats(shape: Vec<usize>, values: Vec<f32>) -> Vec<Tensor> {
    let count = values.len();
    vec![
        Tensor::from_f32(Dtype::F32, shape.clone(), values),
        Tensor::from_i64(Dtype::I64, shape.clone(), vec![0; count]),
        Tensor { dtype: Dtype::Bool, shape, data: Data::Bool(vec![false; count]) },
    ]
}

fn same(a: &Tensor, b: &Tensor) -> bool {
    match (&a.data, &b.data) {
        (Data::F32(x), Data::F32(y)) => {
            x.iter().zip(y.iter()).all(|(p, q)| p.to_bits() == q.to_bits() || (p.is_nan() && q.is_nan()))
        }
        _ => a == b,
    }
}

#[test]
fn random_programs_agree_on_both_backends() {
    let mut generator = Generator { rng: Rng::new(2026), next_index: 0 };
    let count = (SIDE * SIDE) as usize;
    let inputs = |rng: &mut Rng| {
        vec![
            Tensor::from_f32(
                Dtype::F32,
                vec![6, 6],
                (0..count).map(|_| ((rng.next_f64() - 0.5) * 8.0) as f32).collect(),
            ),
            Tensor::from_i64(Dtype::I64, vec![6, 6], (0..count).map(|_| (rng.next_u64() % 17) as i64 - 8).collect()),
            Tensor {
                dtype: Dtype::Bool,
                shape: vec![6, 6],
                data: Data::Bool((0..count).map(|_| rng.next_u64().is_multiple_of(2)).collect()),
            },
        ]
    };
    let mut data_rng = Rng::new(7);
    for case in 0..2000 {
        let dtype = generator.dtype();
        let scalar = generator.expr(dtype, 4, &mut vec![0, 1]);
        let program = model(scalar, dtype);
        linnet_ir::verify(&program).unwrap_or_else(|e| panic!("case {case}: {e}"));
        let given = inputs(&mut data_rng);
        agree(&program, given, &format!("case {case}"));
    }
}

/// bf16 rounding of f64 sums at every exponent (normal, subnormal and
/// overflowing bf16 results, infinities and NaN): generated scalar code
/// rounds inline where it can and must agree with the interpreter
/// everywhere. (Lanes sum in f32, which overflows where f64 does not.)
#[test]
fn bf16_rounding_agrees_at_every_exponent() {
    let mut rng = Rng::new(16);
    let count = (SIDE * SIDE) as usize;
    let load =
        |k: u32| Scalar::Load(Value(0), vec![Scalar::Index(0, Dtype::I64), Scalar::Index(k, Dtype::I64)], Dtype::F32);
    // A sum of a row's six values, rounded once from f64 to bf16.
    let sum = Scalar::Reduce {
        op: ReduceOp::Sum,
        index: 2,
        extent: Dim::constant(SIDE),
        body: Box::new(load(2)),
        dtype: Dtype::Bf16,
    };
    let program = model(
        Scalar::Binary(
            BinaryOp::Add,
            Box::new(sum),
            Box::new(Scalar::Cast(Box::new(load(1)), Dtype::Bf16)),
            Dtype::Bf16,
        ),
        Dtype::Bf16,
    );
    for round in 0..200 {
        let values: Vec<f32> = (0..count)
            .map(|_| match rng.next_u64() % 16 {
                0 => f32::INFINITY,
                1 => f32::NAN,
                2 => f32::MAX,
                _ => f32::from_bits(rng.next_u64() as u32),
            })
            .collect();
        let given = floats(vec![6, 6], values);
        let interpreted = reference(&program).call("program", given.clone()).unwrap();
        let compiled = native(&program, Elementwise::Scalar).call("program", given).unwrap();
        assert!(
            same(&interpreted[0], &compiled[0]),
            "round {round}:\ninterp {:?}\ncpu    {:?}",
            interpreted[0].data,
            compiled[0].data
        );
    }
}

/// Elementwise nodes large enough that the CPU backend shares their rows
/// among threads (the first two axes flattened for three axes, the first
/// axis for two), with parts invariant per first-axis position and per
/// row: the same bits as the interpreter, and a gather out of range in a
/// late row is the error a single pass reports.
#[test]
fn rows_shared_among_threads_agree_with_the_interpreter() {
    for shape in [vec![3i64, 150, 200], vec![400, 200]] {
        let rank = shape.len() as u32;
        let (first, last) = (shape[0], shape[shape.len() - 1]);
        let index = |k: u32| Scalar::Index(k, Dtype::I64);
        let x = |positions: Vec<Scalar>| Scalar::Load(Value(0), positions, Dtype::F32);
        let at = |leading: Scalar, last: Scalar| -> Vec<Scalar> {
            let mut positions = vec![leading];
            positions.extend((1..rank - 1).map(index));
            positions.push(last);
            positions
        };
        let gather = Scalar::Load(Value(1), vec![index(0)], Dtype::I64);
        // Σ_k x[a, …, k] with the middle axis at 0 (invariant per `a`), and
        // the row's own sum (invariant per row).
        let mut plane_positions = at(index(0), index(10));
        if rank == 3 {
            plane_positions[1] = Scalar::Int(0, Dtype::I64);
        }
        let plane = Scalar::Reduce {
            op: ReduceOp::Sum,
            index: 10,
            extent: Dim::constant(last),
            body: Box::new(x(plane_positions)),
            dtype: Dtype::F32,
        };
        let row = Scalar::Reduce {
            op: ReduceOp::Sum,
            index: 11,
            extent: Dim::constant(last),
            body: Box::new(x(at(index(0), index(11)))),
            dtype: Dtype::F32,
        };
        let scaled =
            Scalar::Binary(BinaryOp::Mul, Box::new(x(at(index(0), index(rank - 1)))), Box::new(plane), Dtype::F32);
        let summed = Scalar::Binary(BinaryOp::Add, Box::new(scaled), Box::new(row), Dtype::F32);
        let scalar =
            Scalar::Binary(BinaryOp::Add, Box::new(summed), Box::new(x(at(gather, index(rank - 1)))), Dtype::F32);
        let dims = || shape.iter().map(|d| Dim::constant(*d)).collect::<Vec<_>>();
        let nodes = vec![
            Node { kind: NodeKind::Input(0), shape: dims(), dtype: Dtype::F32, source: None },
            Node { kind: NodeKind::Input(1), shape: vec![Dim::constant(first)], dtype: Dtype::I64, source: None },
            Node { kind: NodeKind::Compute(scalar), shape: dims(), dtype: Dtype::F32, source: None },
        ];
        let entry = Entry {
            name: "program".into(),
            dims: Vec::new(),
            requires: Vec::new(),
            inputs: vec![
                Input { name: "x".into(), shape: dims(), dtype: Dtype::F32 },
                Input { name: "idx".into(), shape: vec![Dim::constant(first)], dtype: Dtype::I64 },
            ],
            nodes,
            outputs: vec![Value(2)],
        };
        let program = Model { name: "rows".into(), params: Vec::new(), states: Vec::new(), entries: vec![entry] };
        linnet_ir::verify(&program).unwrap();
        let mut rng = Rng::new(5);
        let count = shape.iter().product::<i64>() as usize;
        let floats = Tensor::from_f32(
            Dtype::F32,
            shape.iter().map(|d| *d as usize).collect(),
            (0..count).map(|_| (rng.next_f64() - 0.5) as f32).collect(),
        );
        let indices = |bad: bool| {
            (0..first).map(|i| if bad && i == first - 1 { first + 4 } else { (i * 7) % first }).collect::<Vec<i64>>()
        };
        for bad in [false, true] {
            let given = vec![floats.clone(), Tensor::from_i64(Dtype::I64, vec![first as usize], indices(bad))];
            let interpreted = reference(&program).call("program", given.clone());
            assert_eq!(interpreted.is_err(), bad, "{shape:?}: the gather out of range is an error, and only it");
            agree(&program, given, &format!("{shape:?}"));
        }
    }
}

/// Random f32 bits at every exponent (normal, subnormal, infinities, NaN).
fn every_exponent(rng: &mut Rng, count: usize) -> Vec<f32> {
    (0..count)
        .map(|_| match rng.next_u64() % 16 {
            0 => f32::INFINITY,
            1 => f32::NEG_INFINITY,
            2 => f32::NAN,
            3 => f32::MAX,
            _ => f32::from_bits(rng.next_u64() as u32),
        })
        .collect()
}

/// A row of `width` f32 inputs through `op` into a value of `dtype`.
fn elementwise(width: usize, op: impl Fn(Scalar) -> Scalar, dtype: Dtype) -> Model {
    let mut program = model(
        op(Scalar::Load(Value(0), vec![Scalar::Index(0, Dtype::I64), Scalar::Index(1, Dtype::I64)], Dtype::F32)),
        dtype,
    );
    let entry = &mut program.entries[0];
    let row = vec![Dim::constant(1), Dim::constant(width as i64)];
    for node in &mut entry.nodes {
        node.shape = row.clone();
    }
    for input in &mut entry.inputs {
        input.shape = row.clone();
    }
    program
}

/// Lanes round f32 values to bf16 as the interpreter does, bit for bit
/// (to nearest even; overflow to infinity; a NaN stays a NaN), at every
/// exponent and at the rounding boundaries: half of the values have the
/// dropped half of their bits at a tie, or one unit either side of it, or
/// at either end.
#[test]
fn lanes_round_to_bf16_as_the_reference() {
    let mut rng = Rng::new(17);
    let width = 4099;
    let program = elementwise(width, |x| Scalar::Cast(Box::new(x), Dtype::Bf16), Dtype::Bf16);
    let boundaries = [0x0000u32, 0x7FFF, 0x8000, 0x8001, 0xFFFF];
    for round in 0..20 {
        let mut values = every_exponent(&mut rng, width);
        for value in values.iter_mut().step_by(2) {
            let low = boundaries[(rng.next_u64() % boundaries.len() as u64) as usize];
            *value = f32::from_bits(value.to_bits() & 0xFFFF_0000 | low);
        }
        let given = floats(vec![1, width], values);
        let interpreted = reference(&program).call("program", given.clone()).unwrap();
        let lanes = native(&program, Elementwise::Lanes).call("program", given).unwrap();
        assert!(
            same(&interpreted[0], &lanes[0]),
            "round {round}:\ninterp {:?}\nlanes  {:?}",
            interpreted[0].data,
            lanes[0].data
        );
    }
}

/// `exp` in lanes: within two units in the last place of the reference's
/// (rounded from f64) over the whole f32 range, subnormal results within
/// one unit of the smallest subnormal, and the same infinities, zeros
/// and NaNs.
#[test]
fn lanes_exp_is_within_two_ulps() {
    let mut rng = Rng::new(18);
    let width = 4099;
    let program = elementwise(width, |x| Scalar::Unary(UnaryOp::Exp, Box::new(x), Dtype::F32), Dtype::F32);
    let mut differs_from_libm = false;
    for round in 0..20 {
        let mut values = every_exponent(&mut rng, width);
        // Most of the range that gives a finite, nonzero result.
        for value in values.iter_mut().step_by(2) {
            *value = ((rng.next_f64() - 0.5) * 2.0 * 105.0) as f32;
        }
        let given = floats(vec![1, width], values.clone());
        let interpreted = reference(&program)
            .call("program", given.clone())
            .unwrap()
            .remove(0)
            .as_f32()
            .expect("f32 results")
            .to_vec();
        let lanes = native(&program, Elementwise::Lanes)
            .call("program", given)
            .unwrap()
            .remove(0)
            .as_f32()
            .expect("f32 results")
            .to_vec();
        for ((x, want), got) in values.iter().zip(&interpreted).zip(&lanes) {
            let close = if want.is_nan() {
                got.is_nan()
            } else if *want == 0.0 || want.is_infinite() {
                want == got
            } else if *want < f32::MIN_POSITIVE {
                (want - got).abs() <= f32::from_bits(1)
            } else {
                (want - got).abs() <= 2.0 * f32::EPSILON * want.abs()
            };
            assert!(close, "round {round}: exp({x:e}) is {got:e} in lanes, {want:e} in the reference");
            differs_from_libm |= want.to_bits() != got.to_bits() && !want.is_nan();
        }
    }
    // The scalar code's exp is the reference's (libm, rounded once): the
    // lanes computed these only if some result differs from it.
    assert!(differs_from_libm, "every result is the reference's to the bit: the node did not run in lanes");
}

/// A row's sum computed once per row and in lanes along its own index (a
/// norm's sum of squares): within the contract where the width leaves a
/// tail after the fours, the same error where a load falls outside the
/// row, -0.0 for a row of -0.0s and 0.0 for an empty sum, as the
/// reference.
#[test]
fn row_sums_in_lanes_meet_the_contract() {
    let mut rng = Rng::new(18);
    let row_sum = |width: usize, extent: i64, offset: i64| {
        let at = Scalar::Binary(
            BinaryOp::Add,
            Box::new(Scalar::Index(2, Dtype::I64)),
            Box::new(Scalar::Int(offset, Dtype::I64)),
            Dtype::I64,
        );
        let load = Scalar::Load(Value(0), vec![Scalar::Index(0, Dtype::I64), at], Dtype::F32);
        let square = Scalar::Binary(BinaryOp::Mul, Box::new(load.clone()), Box::new(load), Dtype::F32);
        elementwise(
            width,
            |x| {
                let sum = Scalar::Reduce {
                    op: ReduceOp::Sum,
                    index: 2,
                    extent: Dim::constant(extent),
                    body: Box::new(square.clone()),
                    dtype: Dtype::F32,
                };
                Scalar::Binary(
                    BinaryOp::Add,
                    Box::new(sum),
                    Box::new(Scalar::Binary(
                        BinaryOp::Mul,
                        Box::new(x),
                        Box::new(Scalar::Float(0.0, Dtype::F32)),
                        Dtype::F32,
                    )),
                    Dtype::F32,
                )
            },
            Dtype::F32,
        )
    };
    for (width, extent, offset) in [(4099, 4099, 0), (4099, 4096, 3), (7, 7, 0), (3, 3, 0), (10, 10, 1), (9, 6, 4)] {
        let program = row_sum(width, extent, offset);
        let values = (0..width).map(|_| rng.next_f64() as f32 * 2.0 - 1.0).collect();
        agree(&program, floats(vec![1, width], values), &format!("width {width}, extent {extent}, offset {offset}"));
    }
    // Squares of -0.0 are +0.0: sum the row itself for the signs.
    let signed = |width: usize, extent: i64| {
        let load = Scalar::Load(Value(0), vec![Scalar::Index(0, Dtype::I64), Scalar::Index(2, Dtype::I64)], Dtype::F32);
        elementwise(
            width,
            |_| Scalar::Reduce {
                op: ReduceOp::Sum,
                index: 2,
                extent: Dim::constant(extent),
                body: Box::new(load.clone()),
                dtype: Dtype::F32,
            },
            Dtype::F32,
        )
    };
    for (width, extent, expected) in [(9, 9, -0.0f32), (9, 0, 0.0)] {
        let given = floats(vec![1, width], vec![-0.0; width]);
        let lanes = native(&signed(width, extent), Elementwise::Lanes).call("program", given).unwrap();
        let Data::F32(sums) = &lanes[0].data else { panic!("an f32 output") };
        assert!(sums.iter().all(|sum| sum.to_bits() == expected.to_bits()), "extent {extent}: {sums:?}");
    }
}
