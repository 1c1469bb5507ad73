//! The functions generated code calls: for what hardware would not do as
//! `numerics` does (bf16/f16 rounding, `exp`, NaN-aware `max`,
//! Euclidean division), and the hand-tuned kernel contractions run on
//! (`matmul`). They reach a kernel as a table of pointers, its
//! fourth argument, so compiled code has no symbols to resolve: the same
//! bytes run from the JIT and from an artifact's object file.

use linnet_ir::numerics::{self, math};
use linnet_ir::Dtype;

/// A helper's slot in the table; the order is part of the kernel ABI
/// (`native::ABI_VERSION`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Helper {
    Exp,
    Ln,
    Cos,
    Sin,
    Tanh,
    RoundBf16,
    RoundF16,
    Max,
    Min,
    Rem,
    DivEuclid,
    RemEuclid,
    MatMul,
    MatMulBf16,
    BatchStart,
    BatchRow,
    BatchRun,
}

/// The argument and result kinds of a helper.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shape {
    /// `fn(f64) -> f64`
    Float1,
    /// `fn(f64, f64) -> f64`
    Float2,
    /// `fn(i64, i64) -> i64`
    Int2,
    /// `fn(input, weight, out, columns, depth, rows) -> i64`: pointers and
    /// counts.
    MatMul,
    /// `fn(i64, i64, i64) -> i64`
    Int3,
}

impl Helper {
    pub fn slot(self) -> usize {
        self as usize
    }

    pub fn shape(self) -> Shape {
        match self {
            Helper::Exp
            | Helper::Ln
            | Helper::Cos
            | Helper::Sin
            | Helper::Tanh
            | Helper::RoundBf16
            | Helper::RoundF16 => Shape::Float1,
            Helper::Max | Helper::Min | Helper::Rem => Shape::Float2,
            Helper::DivEuclid | Helper::RemEuclid => Shape::Int2,
            Helper::MatMul | Helper::MatMulBf16 => Shape::MatMul,
            Helper::BatchStart | Helper::BatchRow | Helper::BatchRun => Shape::Int3,
        }
    }
}

extern "C" fn exp(x: f64) -> f64 {
    math::exp(x)
}
extern "C" fn ln(x: f64) -> f64 {
    math::ln(x)
}
extern "C" fn cos(x: f64) -> f64 {
    math::cos(x)
}
extern "C" fn sin(x: f64) -> f64 {
    math::sin(x)
}
extern "C" fn tanh(x: f64) -> f64 {
    math::tanh(x)
}
extern "C" fn round_bf16(x: f64) -> f64 {
    numerics::round(x, Dtype::Bf16)
}
extern "C" fn round_f16(x: f64) -> f64 {
    numerics::round(x, Dtype::F16)
}
extern "C" fn max(x: f64, y: f64) -> f64 {
    x.max(y)
}
extern "C" fn min(x: f64, y: f64) -> f64 {
    x.min(y)
}
extern "C" fn rem(x: f64, y: f64) -> f64 {
    x % y
}
extern "C" fn div_euclid(x: i64, y: i64) -> i64 {
    numerics::div_euclid(x, y)
}
extern "C" fn rem_euclid(x: i64, y: i64) -> i64 {
    numerics::rem_euclid(x, y)
}

/// `matmul` over raw parts, for weights of element type `W`.
///
/// # Safety
/// `input` points at `rows × depth` values, `weight` at `columns × depth`,
/// `out` at room for `rows × columns`: generated code passes checked rows.
unsafe fn matmul_parts<W: super::matmul::Weight + Sync>(
    input: *const f32,
    weight: *const W,
    out: *mut f32,
    columns: i64,
    depth: i64,
    rows: i64,
) -> i64 {
    let (columns, depth, rows) = (columns as usize, depth as usize, rows as usize);
    // SAFETY: as the caller promises.
    unsafe {
        let input = std::slice::from_raw_parts(input, rows * depth);
        let weight = std::slice::from_raw_parts(weight, columns * depth);
        let out = std::slice::from_raw_parts_mut(out, rows * columns);
        super::matmul::matmul(input, weight, out, rows);
    }
    0
}

extern "C" fn matmul(input: *const f32, weight: *const f32, out: *mut f32, columns: i64, depth: i64, rows: i64) -> i64 {
    // SAFETY: generated code passes checked rows (see `matmul_parts`).
    unsafe { matmul_parts(input, weight, out, columns, depth, rows) }
}

extern "C" fn matmul_bf16(
    input: *const f32,
    weight: *const u16,
    out: *mut f32,
    columns: i64,
    depth: i64,
    rows: i64,
) -> i64 {
    // SAFETY: generated code passes checked rows (see `matmul_parts`).
    unsafe { matmul_parts(input, weight, out, columns, depth, rows) }
}

thread_local! {
    /// The rows of a contraction whose rows pick their weights (an expert
    /// per token), as its kernel walks them: (input, weight, output).
    static BATCH: std::cell::RefCell<Vec<(usize, usize, usize)>> = const { std::cell::RefCell::new(Vec::new()) };
}

extern "C" fn batch_start(_: i64, _: i64, _: i64) -> i64 {
    BATCH.with_borrow_mut(Vec::clear);
    0
}

extern "C" fn batch_row(input: i64, weight: i64, out: i64) -> i64 {
    BATCH.with_borrow_mut(|rows| rows.push((input as usize, weight as usize, out as usize)));
    0
}

/// Runs the recorded rows, the rows of each weight matrix together (so
/// that a prefill reads each expert's weights once), every matrix in one
/// parallel pass.
extern "C" fn batch_run(columns: i64, depth: i64, bf16: i64) -> i64 {
    let mut rows = BATCH.with_borrow_mut(std::mem::take);
    rows.sort_by_key(|(_, weight, _)| *weight);
    let (columns, depth) = (columns as usize, depth as usize);
    let batches: Vec<(super::matmul::Rows, usize)> = rows
        .chunk_by(|a, b| a.1 == b.1)
        .map(|group| {
            let batch = super::matmul::Rows {
                inputs: group.iter().map(|(input, ..)| *input as *const f32).collect(),
                outs: group.iter().map(|(.., out)| *out as *mut f32).collect(),
            };
            (batch, group[0].1)
        })
        .collect();
    // SAFETY: generated code recorded checked rows: `depth` inputs, room
    // for `columns` outputs, each a `columns × depth` weight matrix of
    // bf16 bits or f32 as `bf16` says; rows of distinct outputs.
    unsafe {
        if bf16 != 0 {
            let groups: Vec<_> = batches
                .iter()
                .map(|(batch, weight)| (batch, std::slice::from_raw_parts(*weight as *const u16, columns * depth)))
                .collect();
            super::matmul::matmul_groups(&groups, columns, depth);
        } else {
            let groups: Vec<_> = batches
                .iter()
                .map(|(batch, weight)| (batch, std::slice::from_raw_parts(*weight as *const f32, columns * depth)))
                .collect();
            super::matmul::matmul_groups(&groups, columns, depth);
        }
    }
    0
}

/// The table every kernel is called with, in [`Helper`] order.
pub fn table() -> [*const u8; 17] {
    [
        exp as *const u8,
        ln as *const u8,
        cos as *const u8,
        sin as *const u8,
        tanh as *const u8,
        round_bf16 as *const u8,
        round_f16 as *const u8,
        max as *const u8,
        min as *const u8,
        rem as *const u8,
        div_euclid as *const u8,
        rem_euclid as *const u8,
        matmul as *const u8,
        matmul_bf16 as *const u8,
        batch_start as *const u8,
        batch_row as *const u8,
        batch_run as *const u8,
    ]
}
