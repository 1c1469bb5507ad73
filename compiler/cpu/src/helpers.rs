//! The functions generated code calls: for what hardware would not do as
//! `numerics` does (bf16/f16 rounding, `exp`, NaN-aware `max`,
//! Euclidean division), and the hand-tuned kernel contractions run on
//! (`matmul`). They reach a kernel as a table of pointers, its
//! fourth argument, so compiled code has no symbols to resolve: the same
//! bytes run from the JIT and from an artifact's object file.

use linnet_ir::numerics::{self, math};
use linnet_ir::quant::{self, BlockFormat};
use linnet_ir::Dtype;
use linnet_kernels::choice::Storage;
use linnet_kernels::matmul;
use linnet_kernels::matrix::{Matrix, Rows};

/// A helper's slot in the table; the order is part of the kernel ABI
/// ([`crate::abi::ABI_VERSION`]).
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
    /// The matrix product, for weights held as its last argument says
    /// ([`weight_code`]).
    MatMul,
    BatchStart,
    BatchRow,
    BatchRun,
    BlockValue,
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
    /// `fn(input, weight, out, columns, depth, rows, code) -> i64`:
    /// pointers, counts and how the weights are held ([`weight_code`]).
    MatMul,
    /// `fn(i64, i64, i64) -> i64`
    Int3,
    /// `fn(format, blocks, index) -> f64`: one value of a quantized
    /// parameter.
    BlockValue,
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
            Helper::MatMul => Shape::MatMul,
            Helper::BatchStart | Helper::BatchRow | Helper::BatchRun => Shape::Int3,
            Helper::BlockValue => Shape::BlockValue,
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

/// The weights a kernel was given, by their code (`weight_code`): f32,
/// bf16 bits, or blocks of a format (of a parameter declared bf16 or not).
fn matrix<'a>(code: i64, weight: *const u8, columns: usize, depth: usize) -> Matrix<'a> {
    // SAFETY (of each slice): generated code passes a weight matrix of
    // `columns × depth` values held as `code` says.
    unsafe {
        match code {
            WEIGHT_F32 => Matrix::F32(std::slice::from_raw_parts(weight as *const f32, columns * depth)),
            WEIGHT_BF16 => Matrix::Bf16(std::slice::from_raw_parts(weight as *const u16, columns * depth)),
            _ => {
                let formats = BlockFormat::ALL.len() as i64;
                let format = BlockFormat::ALL[((code - WEIGHT_BLOCKS) % formats) as usize];
                let bytes = columns * format.row_bytes(depth).expect("rows of whole blocks");
                let blocks = std::slice::from_raw_parts(weight, bytes);
                match code >= WEIGHT_BF16_BLOCKS {
                    true => Matrix::Bf16Blocks(format, blocks),
                    false => Matrix::Blocks(format, blocks),
                }
            }
        }
    }
}

const WEIGHT_F32: i64 = 0;
const WEIGHT_BF16: i64 = 1;
/// Blocks of `BlockFormat::ALL[code - WEIGHT_BLOCKS]`.
const WEIGHT_BLOCKS: i64 = 2;
/// Blocks of `BlockFormat::ALL[code - WEIGHT_BF16_BLOCKS]`, of a
/// parameter declared bf16.
const WEIGHT_BF16_BLOCKS: i64 = WEIGHT_BLOCKS + BlockFormat::ALL.len() as i64;

/// How generated code names a weight matrix's elements to the kernels.
pub fn weight_code(storage: Storage) -> i64 {
    match storage {
        Storage::F32 => WEIGHT_F32,
        Storage::Bf16 => WEIGHT_BF16,
        Storage::Bf16Blocks(format) => WEIGHT_BF16_BLOCKS + format_code(format),
        Storage::Blocks(format) => WEIGHT_BLOCKS + format_code(format),
    }
}

/// A block format's number in the helpers' arguments.
pub fn format_code(format: BlockFormat) -> i64 {
    BlockFormat::ALL.iter().position(|f| *f == format).expect("a known format") as i64
}

/// The kernel entry: `matmul` over raw parts, for weights held as `code`
/// says ([`weight_code`]).
extern "C" fn matmul(
    input: *const f32,
    weight: *const u8,
    out: *mut f32,
    columns: i64,
    depth: i64,
    rows: i64,
    code: i64,
) -> i64 {
    let (columns, depth, rows) = (columns as usize, depth as usize, rows as usize);
    // SAFETY: generated code passes checked rows: `input` points at
    // `rows × depth` values, `weight` at `columns × depth` held as `code`
    // says, `out` at room for `rows × columns`.
    unsafe {
        let input = std::slice::from_raw_parts(input, rows * depth);
        let out = std::slice::from_raw_parts_mut(out, rows * columns);
        matmul::matmul(input, matrix(code, weight, columns, depth), out, rows);
    }
    0
}

/// Value `index` of the blocks at `blocks` (format number `format`):
/// generated code passes an index inside the parameter.
extern "C" fn block_value(format: i64, blocks: i64, index: i64) -> f64 {
    let (format, index) = (BlockFormat::ALL[format as usize], index as usize);
    // The blocks up to the one holding the value, which lie inside the
    // parameter.
    let len = (index / format.block_values() + 1) * format.block_bytes();
    // SAFETY: as above.
    let bytes = unsafe { std::slice::from_raw_parts(blocks as *const u8, len) };
    f64::from(quant::value_at(format, bytes, index))
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
/// parallel pass; the weights are held as `code` says (`weight_code`).
extern "C" fn batch_run(columns: i64, depth: i64, code: i64) -> i64 {
    let mut rows = BATCH.with_borrow_mut(std::mem::take);
    rows.sort_by_key(|(_, weight, _)| *weight);
    let (columns, depth) = (columns as usize, depth as usize);
    let batches: Vec<(Rows, usize)> = rows
        .chunk_by(|a, b| a.1 == b.1)
        .map(|group| {
            let batch = Rows {
                inputs: group.iter().map(|(input, ..)| *input as *const f32).collect(),
                outs: group.iter().map(|(.., out)| *out as *mut f32).collect(),
            };
            (batch, group[0].1)
        })
        .collect();
    let groups: Vec<_> =
        batches.iter().map(|(batch, weight)| (batch, matrix(code, *weight as *const u8, columns, depth))).collect();
    // SAFETY: generated code recorded checked rows: `depth` inputs, room
    // for `columns` outputs, each a `columns × depth` weight matrix held as
    // `code` says; rows of distinct outputs.
    unsafe { matmul::matmul_groups(&groups, columns, depth) };
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
        batch_start as *const u8,
        batch_row as *const u8,
        batch_run as *const u8,
        block_value as *const u8,
    ]
}
