//! The CPU backend's kernels against their rooflines, one figure per
//! kernel family and instruction set, so that a regression shows as a
//! number: matrix–vector products in GB/s of weights (decode streams them
//! from memory), matrix products in GFLOP/s (prefill), attention and the
//! gated delta rule in GFLOP/s, generated elementwise code in GB/s (an
//! expert's SwiGLU activation and an RMS norm, in f32 lanes and as the
//! scalar f64 code).
//! Shapes are the bench model's (H 2048, experts of width 512, 16 query
//! heads of 256, 32 delta-rule heads of 128). Run with `cargo bench -p
//! linnet-cranelift --bench kernels [-- FAMILY…]` (vector (with
//! `VECTOR_ROWS=N`, a matrix of N rows instead of 24832), matrix, experts
//! (with `EXPERT_ROWS=8,16,…`, also every expert that many rows),
//! intrinsics, elementwise).

use linnet_cranelift::Elementwise;
use linnet_exec::tensor::{Data, Tensor};
use linnet_ir::dim::Dim;
use linnet_ir::numerics::bf16_bits;
use linnet_ir::quant::{quantize, BlockFormat};
use linnet_ir::Dtype;
use linnet_ir::{BinaryOp, Entry, Input, Intrinsic, Model, Node, NodeKind, ReduceOp, Scalar, UnaryOp, Value};
use linnet_kernels::choice::{choose, BatchOrder, Storage};
use linnet_kernels::intrinsics;
use linnet_kernels::isa::Isa;
use linnet_kernels::matmul::{matmul_groups, matmul_on};
use linnet_kernels::matrix::{Matrix, Rows};
use std::time::Instant;

/// The fastest of `runs` timings of `work`, in seconds.
fn fastest(runs: usize, mut work: impl FnMut()) -> f64 {
    work();
    (0..runs)
        .map(|_| {
            let start = Instant::now();
            work();
            start.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// The fastest of `runs` timings of `work` in each batch order that takes
/// another kernel for these rows (the invariant order first, then the
/// variant one where it differs), with the order's name for a figure's
/// label.
fn in_each_order(
    isa: Isa,
    matrix: Matrix,
    rows: usize,
    depth: usize,
    runs: usize,
    mut work: impl FnMut(BatchOrder),
) -> Vec<(&'static str, f64)> {
    let storage = Storage::of(&matrix);
    let kernel = |order| choose(isa, storage, rows, depth, order);
    let mut timed = vec![("", fastest(runs, || work(BatchOrder::Invariant)))];
    if kernel(BatchOrder::Variant) != kernel(BatchOrder::Invariant) {
        timed.push((" (batch-variant)", fastest(runs, || work(BatchOrder::Variant))));
    }
    timed
}

/// Deterministic values in [-1, 1), exactly bf16.
fn values(count: usize, seed: u64) -> Vec<f32> {
    let mut state = seed;
    (0..count)
        .map(|_| {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let value = (state >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
            linnet_ir::numerics::bf16_value(bf16_bits(value))
        })
        .collect()
}

/// A decode step's products: GB/s of weights.
fn vector_kernels() {
    // The output head's shape for decode: 248320 × 2048 is 1 GB; a tenth
    // of it is read from memory the same way, though in blocks (some tens
    // of MB) part of it may stay in a large L3 between calls, above what
    // the whole head streams at. `VECTOR_ROWS` sets the rows: enough that
    // every format's blocks outgrow the L3 (600000 rows are 691 MB in
    // Q4_K) gives what each streams from memory.
    let columns = match std::env::var("VECTOR_ROWS") {
        Ok(rows) => rows.trim().parse().expect("VECTOR_ROWS: a count of rows"),
        Err(_) => 24832,
    };
    // The rows the in-L2 figures below take from the same matrix.
    let cached_columns = 1024;
    assert!(columns >= cached_columns, "VECTOR_ROWS: at least {cached_columns} rows (the in-L2 figures take them)");
    let depth = 2048;
    let weight: Vec<u16> = values(columns * depth, 1).into_iter().map(bf16_bits).collect();
    for isa in Isa::available() {
        let input = values(depth, 2);
        let mut out = vec![0f32; columns];
        let seconds = fastest(5, || matmul_on(isa, BatchOrder::Invariant, &input, weight.as_slice(), &mut out, 1));
        let gbs = (columns * depth * 2) as f64 / seconds / 1e9;
        println!("matrix-vector bf16 {columns}×{depth} on {:<10}: {gbs:6.1} GB/s of weights", isa.name());
    }
    // The same head in each block format (quantized from the same values),
    // read where it lies: GB/s of the blocks' bytes, and values per second;
    // exact, and as a parameter declared bf16 (the K-quants' products then
    // over inputs quantized to 8 bits, `docs/language.md`).
    let head: Vec<f32> = weight.iter().map(|b| linnet_ir::numerics::bf16_value(*b)).collect();
    for format in BlockFormat::ALL {
        let blocks = quantize(format, &head).expect("rows of whole blocks");
        let kinds = [("", Matrix::Blocks(format, &blocks)), (" declared bf16", Matrix::Bf16Blocks(format, &blocks))];
        for ((kind, matrix), isa) in
            kinds.into_iter().flat_map(|kind| Isa::available().into_iter().map(move |isa| (kind, isa)))
        {
            let input = values(depth, 2);
            let mut out = vec![0f32; columns];
            let timed =
                in_each_order(isa, matrix, 1, depth, 5, |order| matmul_on(isa, order, &input, matrix, &mut out, 1));
            for (order, seconds) in timed {
                let gbs = blocks.len() as f64 / seconds / 1e9;
                let values_per_second = (columns * depth) as f64 / seconds / 1e9;
                println!("matrix-vector {format}{kind}{order} {columns}×{depth} on {:<10}: {gbs:6.1} GB/s of blocks, {values_per_second:5.1} G weights/s", isa.name());
            }
        }
    }
    // The same kernels on rows that stay in L2 between calls (1024 of
    // them, shared by the threads): what they compute a second when
    // memory is not the limit. A decode step's products are memory-bound
    // only where these figures are well above the streamed ones.
    for format in BlockFormat::ALL {
        let blocks = quantize(format, &head[..cached_columns * depth]).expect("rows of whole blocks");
        let isa = Isa::host();
        let input = values(depth, 2);
        let mut out = vec![0f32; cached_columns];
        for (kind, matrix) in
            [("", Matrix::Blocks(format, &blocks)), (" declared bf16", Matrix::Bf16Blocks(format, &blocks))]
        {
            let timed =
                in_each_order(isa, matrix, 1, depth, 200, |order| matmul_on(isa, order, &input, matrix, &mut out, 1));
            for (order, seconds) in timed {
                let gbs = blocks.len() as f64 / seconds / 1e9;
                println!(
                    "matrix-vector {format}{kind}{order} {cached_columns}×{depth} in L2 on {:<10}: {gbs:6.1} GB/s of blocks",
                    isa.name()
                );
            }
        }
    }
}

/// A prefill's products: GFLOP/s.
fn matrix_kernels() {
    // A prefill's projection: 512 rows through 2048 × 2048.
    let (rows, columns, depth) = (512, 2048, 2048);
    let weight: Vec<u16> = values(columns * depth, 3).into_iter().map(bf16_bits).collect();
    let input = values(rows * depth, 4);
    for isa in Isa::available() {
        let mut out = vec![0f32; rows * columns];
        let matrix = Matrix::Bf16(&weight);
        let timed =
            in_each_order(isa, matrix, rows, depth, 3, |order| matmul_on(isa, order, &input, matrix, &mut out, rows));
        for (order, seconds) in timed {
            let gflops = 2.0 * (rows * columns * depth) as f64 / seconds / 1e9;
            println!("matrix bf16{order} {rows}×{columns}×{depth} on {:<10}: {gflops:6.1} GFLOP/s", isa.name());
        }
    }
    // The same values in blocks, and those blocks as a parameter declared
    // bf16 against bf16 inputs (a bf16 model's prefill): rounded to bf16
    // where the CPU has bf16 dot products (`docs/language.md`).
    let projection: Vec<f32> = weight.iter().map(|b| linnet_ir::numerics::bf16_value(*b)).collect();
    let bf16_input: Vec<f32> = input.iter().map(|x| linnet_ir::numerics::bf16_value(bf16_bits(*x))).collect();
    for format in BlockFormat::ALL {
        let blocks = quantize(format, &projection).expect("rows of whole blocks");
        for isa in Isa::available() {
            let kinds = [
                ("", &input, Matrix::Blocks(format, &blocks)),
                (" declared bf16", &bf16_input, Matrix::Bf16Blocks(format, &blocks)),
            ];
            for (kind, input, matrix) in kinds {
                let mut out = vec![0f32; rows * columns];
                let timed = in_each_order(isa, matrix, rows, depth, 3, |order| {
                    matmul_on(isa, order, input, matrix, &mut out, rows)
                });
                for (order, seconds) in timed {
                    let gflops = 2.0 * (rows * columns * depth) as f64 / seconds / 1e9;
                    println!(
                        "matrix {format}{kind}{order} {rows}×{columns}×{depth} on {:<10}: {gflops:6.1} GFLOP/s",
                        isa.name()
                    );
                }
            }
        }
    }
}

/// The expert products as generated code makes them (one grouped call),
/// each expert's weights of 256 its own (so that they stream from memory
/// as in the model): a 512-token prefill's gate and up products and its
/// down products (8 experts a token, 1024 × 2048 and 2048 × 512, each
/// expert's rows as a router's choices at random fall: 16 on average,
/// from a handful to thirty), and a decode step's (8 experts of one row,
/// other experts each call); each also in Q4_K and Q6_K declared bf16.
fn expert_kernels() {
    let experts = 256;
    let mut state = 7u64;
    let mut routed = vec![0usize; experts];
    for _token in 0..512 {
        let mut chosen = Vec::new();
        while chosen.len() < 8 {
            state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let expert = (state >> 33) as usize % experts;
            if !chosen.contains(&expert) {
                chosen.push(expert);
            }
        }
        chosen.into_iter().for_each(|e| routed[e] += 1);
    }
    // With `EXPERT_ROWS=8,16,…`, also every expert that many rows (where
    // one kernel gives way to another).
    let fixed: Vec<Vec<usize>> = std::env::var("EXPERT_ROWS")
        .map(|rows| {
            rows.split(',').map(|count| vec![count.trim().parse().expect("EXPERT_ROWS: counts"); experts]).collect()
        })
        .unwrap_or_default();
    let decode_step = vec![1; 8];
    let shapes = [(1024, 2048), (2048, 512)];
    // Each shape's experts made once, for every count of rows.
    for (columns, depth) in shapes {
        let expert_values = |e: usize| values(columns * depth, 20 + e as u64);
        let weights: Vec<Vec<u16>> =
            (0..experts).map(|e| expert_values(e).into_iter().map(bf16_bits).collect()).collect();
        // The same experts in Q4_K and Q6_K declared bf16 (a q4_k_m model's
        // formats).
        let blocks: Vec<(BlockFormat, Vec<Vec<u8>>)> = [BlockFormat::Q4K, BlockFormat::Q6K]
            .into_iter()
            .map(|format| {
                let quantized =
                    (0..experts).map(|e| quantize(format, &expert_values(e)).expect("rows of whole blocks")).collect();
                (format, quantized)
            })
            .collect();
        for counts in std::iter::once(&routed).chain(&fixed).chain([&decode_step]) {
            let (chosen, total) = (counts.len(), counts.iter().sum::<usize>());
            let input = values(total * depth, 13);
            let mut out = vec![0f32; total * columns];
            let out_base = out.as_mut_ptr();
            let firsts: Vec<usize> =
                counts.iter().scan(0, |next, &count| Some(std::mem::replace(next, *next + count))).collect();
            let batches: Vec<Rows> = firsts
                .iter()
                .zip(counts)
                .map(|(&first, &count)| Rows {
                    inputs: (first..first + count).map(|r| input[(r * depth)..].as_ptr()).collect(),
                    // SAFETY: row `r` of `out` has room for `columns`.
                    outs: (first..first + count).map(|r| unsafe { out_base.add(r * columns) }).collect(),
                })
                .collect();
            let kinds = std::iter::once(None).chain(blocks.iter().map(Some));
            for kind in kinds {
                let matrix = |e: usize| match kind {
                    None => Matrix::Bf16(&weights[e]),
                    Some((format, blocks)) => Matrix::Bf16Blocks(*format, &blocks[e]),
                };
                // The bytes an expert's weights take as stored.
                let expert_bytes = kind.map_or(columns * depth * 2, |(_, blocks)| blocks[0].len());
                let kind = kind.map_or("bf16".to_string(), |(format, _)| format!("{format} declared bf16"));
                let mut call = 0;
                let seconds = fastest(if chosen == experts { 3 } else { 30 }, || {
                    call += 1;
                    let groups: Vec<(&Rows, Matrix)> = batches
                        .iter()
                        .enumerate()
                        .map(|(e, rows)| (rows, matrix((call * chosen + e) % experts)))
                        .collect();
                    // SAFETY: every row points into a live vector of the right
                    // length, and the output rows are distinct.
                    unsafe { matmul_groups(&groups, columns, depth) }
                });
                let gflops = 2.0 * (total * columns * depth) as f64 / seconds / 1e9;
                let gbs = (chosen * expert_bytes) as f64 / seconds / 1e9;
                let (least, most) = (counts.iter().min().unwrap_or(&0), counts.iter().max().unwrap_or(&0));
                println!("experts {kind} {chosen} × {least}–{most} rows × {columns}×{depth} on {:<10}: {gflops:6.1} GFLOP/s, {gbs:5.1} GB/s of weights", Isa::host().name());
            }
        }
    }
}

fn tensor(shape: Vec<usize>, seed: u64) -> Tensor {
    let count = shape.iter().product();
    Tensor::from_f32(Dtype::F32, shape, values(count, seed))
}

fn intrinsic_kernels() {
    // Causal attention over a 512-token prefill, 16 query heads and 2
    // key/value heads of 256.
    let (heads, kv_heads, tokens, width) = (16, 2, 512, 256);
    let (q, k, v) = (
        tensor(vec![1, heads, tokens, width], 5),
        tensor(vec![1, kv_heads, tokens, width], 6),
        tensor(vec![1, kv_heads, tokens, width], 7),
    );
    let scale = Tensor::from_f32(Dtype::F32, Vec::new(), vec![0.0625]);
    let mask = Tensor {
        dtype: Dtype::Bool,
        shape: vec![tokens, tokens],
        data: Data::Bool((0..tokens * tokens).map(|at| at % tokens <= at / tokens).collect()),
    };
    let seconds = fastest(3, || {
        drop(intrinsics::run(
            Intrinsic::GroupedAttention,
            &[&q, &k, &v, &scale, &mask],
            q.shape.clone(),
            vec![0.0; q.shape.iter().product()],
        ))
    });
    let flops = 4.0 * (heads * width) as f64 * (tokens * (tokens + 1) / 2) as f64;
    println!("attention 512 tokens, 16 heads of 256 (causal): {:6.1} GFLOP/s", flops / seconds / 1e9);
    // The gated delta rule over a 512-token prefill: 32 value heads and 16
    // key heads of 128.
    let (key_heads, value_heads, dim) = (16, 32, 128);
    let q = tensor(vec![1, tokens, key_heads, dim], 8);
    let k = tensor(vec![1, tokens, key_heads, dim], 9);
    let v = tensor(vec![1, tokens, value_heads, dim], 10);
    let decay = Tensor::from_f32(Dtype::F32, vec![1, tokens, value_heads], vec![-0.1; tokens * value_heads]);
    let beta = Tensor::from_f32(Dtype::F32, vec![1, tokens, value_heads], vec![0.5; tokens * value_heads]);
    let state = tensor(vec![1, value_heads, dim, dim], 11);
    let shape = vec![1, tokens + dim, value_heads, dim];
    let seconds = fastest(3, || {
        drop(intrinsics::run(
            Intrinsic::GatedDeltaRule,
            &[&q, &k, &v, &decay, &beta, &state, &scale],
            shape.clone(),
            vec![0.0; shape.iter().product()],
        ))
    });
    // Per token and head: decay, recall, update and read the state, 2 FLOPs each.
    let flops = 8.0 * (tokens * value_heads * dim * dim) as f64;
    println!("gated delta rule 512 tokens, 32 heads of 128: {:6.1} GFLOP/s", flops / seconds / 1e9);
    // One decode step of it: the state (2 MB of f32) read and written once.
    let (q, k, v) = (
        tensor(vec![1, key_heads, dim], 14),
        tensor(vec![1, key_heads, dim], 15),
        tensor(vec![1, value_heads, dim], 16),
    );
    let (decay, beta) = (
        Tensor::from_f32(Dtype::F32, vec![1, value_heads], vec![-0.1; value_heads]),
        Tensor::from_f32(Dtype::F32, vec![1, value_heads], vec![0.5; value_heads]),
    );
    let shape = vec![1, 1 + dim, value_heads, dim];
    let seconds = fastest(20, || {
        drop(intrinsics::run(
            Intrinsic::GatedDeltaStep,
            &[&q, &k, &v, &decay, &beta, &state, &scale],
            shape.clone(),
            vec![0.0; shape.iter().product()],
        ))
    });
    let bytes = 2.0 * (value_heads * dim * dim * 4) as f64;
    println!(
        "gated delta step, 32 heads of 128: {:6.1} GB/s of state read and written ({:.3} ms)",
        bytes / seconds / 1e9,
        seconds * 1e3
    );
}

/// A 512-token prefill's expert activations (8 experts a token, width
/// 512): `bf16(silu(x[r, c]) * x[r, 512 + c])` from the gate and up
/// products side by side, as generated code computes it; and its RMS norm
/// at H 2048: each row's sum of squares (a reduction computed once per
/// row), then the row scaled by its reciprocal root,
/// `bf16(x[r, c] * rsqrt(sum[k] x[r, k]² / H + 1e-6))`.
fn elementwise_kernels() {
    let (rows, width) = (512 * 8, 512);
    let load = |offset: i64| {
        let column = Scalar::Binary(
            BinaryOp::Add,
            Box::new(Scalar::Index(1, Dtype::I64)),
            Box::new(Scalar::Int(offset, Dtype::I64)),
            Dtype::I64,
        );
        Scalar::Load(Value(0), vec![Scalar::Index(0, Dtype::I64), column], Dtype::F32)
    };
    let negated = Scalar::Unary(UnaryOp::Neg, Box::new(load(0)), Dtype::F32);
    let denominator = Scalar::Binary(
        BinaryOp::Add,
        Box::new(Scalar::Float(1.0, Dtype::F32)),
        Box::new(Scalar::Unary(UnaryOp::Exp, Box::new(negated), Dtype::F32)),
        Dtype::F32,
    );
    let silu = Scalar::Binary(BinaryOp::Div, Box::new(load(0)), Box::new(denominator), Dtype::F32);
    let product = Scalar::Binary(BinaryOp::Mul, Box::new(silu), Box::new(load(width)), Dtype::Bf16);
    generated("SwiGLU activation", product, [rows, 2 * width], [rows, width], (rows * 3 * width * 4) as f64);

    let (rows, width) = (512, 2048);
    let at = |index: u32| {
        Scalar::Load(Value(0), vec![Scalar::Index(0, Dtype::I64), Scalar::Index(index, Dtype::I64)], Dtype::F32)
    };
    let square = Scalar::Binary(BinaryOp::Mul, Box::new(at(2)), Box::new(at(2)), Dtype::F32);
    let body =
        Scalar::Binary(BinaryOp::Div, Box::new(square), Box::new(Scalar::Float(width as f64, Dtype::F32)), Dtype::F32);
    let mean_square = Scalar::Reduce {
        op: ReduceOp::Sum,
        index: 2,
        extent: Dim::constant(width),
        body: Box::new(body),
        dtype: Dtype::F32,
    };
    let shifted =
        Scalar::Binary(BinaryOp::Add, Box::new(mean_square), Box::new(Scalar::Float(1e-6, Dtype::F32)), Dtype::F32);
    let scale = Scalar::Unary(UnaryOp::Rsqrt, Box::new(shifted), Dtype::F32);
    let normalized = Scalar::Binary(BinaryOp::Mul, Box::new(at(1)), Box::new(scale), Dtype::Bf16);
    generated("RMS norm", normalized, [rows, width], [rows, width], (rows * 2 * width * 4) as f64);
}

/// Times one generated elementwise node, `scalar` over an output of
/// `output` from one f32 input of `input`, in f32 lanes and as the scalar
/// f64 code; `bytes` is what one call reads and writes.
fn generated(name: &str, scalar: Scalar, input: [i64; 2], output: [i64; 2], bytes: f64) {
    let dtype = scalar.dtype();
    let (input_shape, output_shape) = (input.map(Dim::constant).to_vec(), output.map(Dim::constant).to_vec());
    let entry = Entry {
        name: "node".into(),
        dims: Vec::new(),
        requires: Vec::new(),
        inputs: vec![Input { name: "x".into(), shape: input_shape.clone(), dtype: Dtype::F32 }],
        nodes: vec![
            Node { kind: NodeKind::Input(0), shape: input_shape, dtype: Dtype::F32, source: None },
            Node { kind: NodeKind::Compute(scalar), shape: output_shape, dtype, source: None },
            // One element out: the node's output stays inside the call,
            // where its buffer is reused from one call to the next, so the
            // figure is the kernel's, not page faults' or a download's.
            Node {
                kind: NodeKind::Compute(Scalar::Load(Value(1), vec![Scalar::Int(0, Dtype::I64); 2], dtype)),
                shape: Vec::new(),
                dtype,
                source: None,
            },
        ],
        outputs: vec![Value(2)],
    };
    let model = Model { name: "elementwise".into(), params: Vec::new(), states: Vec::new(), entries: vec![entry] };
    let values = tensor(input.iter().map(|&d| d as usize).collect(), 12);
    for elementwise in [Elementwise::Lanes, Elementwise::Scalar] {
        let mut machine =
            linnet_cranelift::jit_machine(model.clone(), Vec::new(), elementwise).expect("the node compiles");
        // The copies of the input each call consumes, made outside the timing.
        let mut inputs: Vec<Tensor> = (0..6).map(|_| values.clone()).collect();
        let seconds = fastest(5, || {
            drop(machine.call("node", vec![inputs.pop().expect("one input a run")]).expect("the node runs"))
        });
        println!(
            "generated {name} {}×{} ({elementwise:?}): {:6.1} GB/s read and written",
            output[0],
            output[1],
            bytes / seconds / 1e9
        );
    }
}

fn main() {
    println!(
        "{} threads; instruction sets: {}",
        linnet_kernels::threads::threads(),
        Isa::available().iter().map(|isa| isa.name()).collect::<Vec<_>>().join(", ")
    );
    // `cargo bench -p linnet-cpu --bench kernels -- experts` runs the
    // families whose names are given; no name runs them all.
    let wanted: Vec<String> = std::env::args().skip(1).filter(|arg| !arg.starts_with("--")).collect();
    let families: [(&str, fn()); 5] = [
        ("vector", vector_kernels),
        ("matrix", matrix_kernels),
        ("experts", expert_kernels),
        ("intrinsics", intrinsic_kernels),
        ("elementwise", elementwise_kernels),
    ];
    for (name, family) in families {
        if wanted.is_empty() || wanted.iter().any(|w| w == name) {
            family();
        }
    }
}
