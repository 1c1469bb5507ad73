//! The kernel contractions run on: `out[m, n] = Σₖ input[m, k] ·
//! weight[n, k]`, with the numerics a compiled backend may use (`docs/
//! language.md`): products and sums in f32 with fused multiply-adds, the
//! sum split across vector lanes. The instruction set is chosen at run
//! time ([`Isa`]): AVX-512 (sixteen lanes), AVX2 with FMA (eight), and on
//! CPUs with AVX-512 BF16, bf16 dot products when the weights are bf16, the
//! inputs exactly bf16 values (each product is then exact, as it is in
//! f32) and at least four rows share the weights; on CPUs with AMX, those
//! products in tiles of sixteen rows by sixteen (`amx`). Weights are f32 or
//! bf16 bits ([`Weight`]), widened in registers as they are read, never
//! copied.
//!
//! Work is tiled for the caches: input rows in blocks that stay in L2,
//! four weight rows at a time against six input rows (twenty-four sums in
//! flight), so that a prefill reads each weight row once per block of
//! rows; large products split the weight rows among the kernels' threads
//! (`codegen::threads`).

use std::sync::atomic::{AtomicU64, Ordering};

use super::choice::{batch_order, choose, BatchOrder, Product, Storage};
use super::isa::Isa;
use super::matrix::{Matrix, Rows, Weight};
use super::simd::{Lanes, OneLane};
use super::{amx, byte_tiles, dequant, int8, panels, threads};
use linnet_ir::quant::BlockFormat;

/// Weight bytes the kernel was given, over the process's life.
static WEIGHT_BYTES: AtomicU64 = AtomicU64::new(0);

/// The bytes of weights the kernel has read since the process started:
/// every weight matrix (or expert) once per call, which is what a decode
/// step streams from memory.
pub fn weight_bytes_read() -> u64 {
    WEIGHT_BYTES.load(Ordering::Relaxed)
}

/// Products at or above which the weight rows are shared among threads.
const PARALLEL_PRODUCTS: usize = 1 << 18;

/// Input rows per block: a block's rows stay in L2 while every weight row
/// of a thread's share passes over them.
const ROW_BLOCK: usize = 64;

/// `out[m, n] = Σₖ input[m, k] · weight[n, k]` for `rows` input rows
/// (`out` is `rows × columns`, `weight` `columns × depth`), in the
/// process's batch order.
pub fn matmul<'a>(input: &[f32], weight: impl Into<Matrix<'a>>, out: &mut [f32], rows: usize) {
    matmul_on(Isa::host(), batch_order(), input, weight, out, rows)
}

/// [`matmul`] on a given instruction set, which the CPU must have, in a
/// given batch order.
pub fn matmul_on<'a>(
    isa: Isa,
    order: BatchOrder,
    input: &[f32],
    weight: impl Into<Matrix<'a>>,
    out: &mut [f32],
    rows: usize,
) {
    if rows == 0 {
        return;
    }
    let weight = weight.into();
    let (depth, columns) = (input.len() / rows, out.len() / rows);
    assert!(
        input.len() == rows * depth && out.len() == rows * columns && weight.holds(columns, depth),
        "operands of matching sizes"
    );
    assert!(Isa::available().contains(&isa), "this CPU cannot run {}", isa.name());
    let (input_base, out_base) = (input.as_ptr(), out.as_mut_ptr());
    let rows = Rows {
        // SAFETY: row `m` of each is inside its slice.
        inputs: (0..rows).map(|m| unsafe { input_base.add(m * depth) }).collect(),
        outs: (0..rows).map(|m| unsafe { out_base.add(m * columns) }).collect(),
    };
    count_weight_bytes(&[(&rows, weight)]);
    // SAFETY: the rows point into `input` and `out`, which outlive this
    // call, with `depth` and `columns` elements each.
    unsafe { run(isa, order, &[(&rows, weight)], columns, depth) }
}

/// `out[m][n] = Σₖ input[m][k] · weight[n, k]` for every row `m` of each
/// group's `Rows`, with the group's weight matrix; the matrices are of one
/// size (the experts a batch of tokens chose). The threads share out the
/// columns of every matrix in one pass, so none waits at the end of each.
/// In the process's batch order.
///
/// # Safety
/// Each input row has `depth` readable values and each output row room
/// for `columns`; no output row overlaps another or an input.
pub unsafe fn matmul_groups(groups: &[(&Rows, Matrix)], columns: usize, depth: usize) {
    count_weight_bytes(groups);
    // SAFETY: as the caller promises.
    unsafe { run(Isa::host(), batch_order(), groups, columns, depth) }
}

/// `out[m][n] = Σₖ input[m][k] · other[n, k]` for activations against
/// activations (attention's queries against its keys): [`matmul_groups`]
/// for one matrix, not counted as weights read.
///
/// # Safety
/// As [`matmul_groups`].
pub unsafe fn products(rows: &Rows, other: &[f32], columns: usize, depth: usize) {
    // SAFETY: as the caller promises.
    unsafe { run(Isa::host(), batch_order(), &[(rows, Matrix::F32(other))], columns, depth) }
}

/// Every matrix of `groups` read once: what a decode step streams.
fn count_weight_bytes(groups: &[(&Rows, Matrix)]) {
    let bytes: usize = groups.iter().map(|(_, weight)| weight.bytes()).sum();
    WEIGHT_BYTES.fetch_add(bytes as u64, Ordering::Relaxed);
}

/// A group's inputs as bf16 bits, for bf16 dot products, when every value
/// is exactly a bf16 (then each product is exact, as it is in f32).
enum Bf16Inputs {
    /// In rows [`bf16_stride`] apart, for `vdpbf16ps` (`Avx512Bf16`).
    Vectors(Vec<u16>),
    /// In AMX tiles (`Amx`).
    Tiles(amx::Inputs),
}

impl Bf16Inputs {
    /// Weight rows of `stride` elements decoded and rounded to bf16 at a
    /// time for these inputs' products ([`rounded_columns`]): for AMX
    /// tiles, as many as fill [`TILE_ROUNDED_BYTES`], a whole number of
    /// tile pairs (32 rows), 32 to 256 of them, so that each block of
    /// input rows' tiles is read from L2 for as many as fit beside it; for
    /// the vector products, [`VECTOR_ROUNDED_ROWS`].
    fn rounded_rows(&self, stride: usize) -> usize {
        match self {
            Bf16Inputs::Vectors(_) => VECTOR_ROUNDED_ROWS,
            Bf16Inputs::Tiles(_) => (TILE_ROUNDED_BYTES / (2 * stride)).clamp(32, 256) / 32 * 32,
        }
    }

    /// `rows` converted for `isa`'s bf16 products; `None` where a value is
    /// not a bf16 value. AMX tiles span 32 values of the depth: other
    /// depths take the vector products.
    fn new(isa: Isa, rows: &Rows, depth: usize) -> Option<Bf16Inputs> {
        if isa == Isa::Amx && depth.is_multiple_of(amx::DEPTH) {
            // SAFETY: each input row has `depth` readable values.
            return unsafe { amx::Inputs::new(rows, depth) }.map(Bf16Inputs::Tiles);
        }
        // SAFETY: the CPU has AVX-512 (`isa` has bf16 dot products), and
        // each input row has `depth` readable values.
        #[cfg(target_arch = "x86_64")]
        return unsafe { x86::as_bf16(rows, depth) }.map(Bf16Inputs::Vectors);
        #[cfg(not(target_arch = "x86_64"))]
        unreachable!("bf16 dot products are x86's ({} rows of {depth})", rows.inputs.len())
    }
}

/// In the invariant order, each group whose product takes bf16 inputs
/// made two groups where some of its rows are bf16 values and some not:
/// those rows then take the bf16 products and the others the f32 lanes,
/// each by its own values, whatever rows share its call. `None` where no
/// group mixes them.
///
/// # Safety
/// Each input row has `depth` readable values.
unsafe fn split_by_bf16_values<'m>(
    isa: Isa,
    order: BatchOrder,
    groups: &[(&Rows, Matrix<'m>)],
    depth: usize,
) -> Option<Vec<(Rows, Matrix<'m>)>> {
    let takes_bf16 = |rows: &Rows, weight: &Matrix| {
        order.invariant_for(Storage::of(weight))
            && choose(isa, Storage::of(weight), rows.inputs.len(), depth, order).converts_to_bf16()
    };
    // SAFETY: as the caller promises.
    let is_bf16 =
        |row: *const f32| unsafe { std::slice::from_raw_parts(row, depth) }.iter().all(|v| v.to_bits() & 0xffff == 0);
    let exact: Vec<Vec<bool>> = groups
        .iter()
        .map(|(rows, weight)| match takes_bf16(rows, weight) {
            true => rows.inputs.iter().map(|&row| is_bf16(row)).collect(),
            false => Vec::new(),
        })
        .collect();
    let mixed = |exact: &Vec<bool>| exact.contains(&true) && exact.contains(&false);
    if !exact.iter().any(mixed) {
        return None;
    }
    let mut split = Vec::new();
    for ((rows, weight), exact) in groups.iter().zip(&exact) {
        if !mixed(exact) {
            split.push((Rows { inputs: rows.inputs.clone(), outs: rows.outs.clone() }, *weight));
            continue;
        }
        for bf16 in [true, false] {
            let (inputs, outs) = rows
                .inputs
                .iter()
                .zip(&rows.outs)
                .zip(exact)
                .filter(|(_, &is)| is == bf16)
                .map(|((&input, &out), _)| (input, out))
                .unzip();
            split.push((Rows { inputs, outs }, *weight));
        }
    }
    Some(split)
}

/// A group's inputs as a product over its weights takes them, made once
/// per call before the threads share out its columns.
enum Prepared {
    /// The f32 rows as they are.
    AsGiven,
    /// The f32 rows as they are, for blocks summed from registers
    /// (`dequant::dot_columns`).
    Dots,
    /// The rows as bf16 bits, for bf16 dot products.
    Bf16(Bf16Inputs),
    /// The rows quantized to 8 bits, for integer dot products (`int8`).
    Int8(int8::QuantizedRows),
    /// The rows quantized to 8 bits, for the VNNI panels (`panels`).
    Panels(int8::QuantizedRows),
    /// The rows quantized to 8 bits and laid out for AMX's byte tiles
    /// (`byte_tiles`).
    ByteTiles(byte_tiles::Inputs),
}

/// `rows` against `weight` as [`choose`] multiplies them on `isa` in
/// `order`: quantized for the integer products, converted to bf16 for bf16
/// dot products (as given where a value is not a bf16 value).
fn prepare(isa: Isa, order: BatchOrder, rows: &Rows, weight: &Matrix, depth: usize) -> Prepared {
    let quantized = || {
        // SAFETY: each input row has `depth` readable values.
        let inputs = rows.inputs.iter().map(|input| unsafe { std::slice::from_raw_parts(*input, depth) });
        int8::QuantizedRows::new(inputs, depth)
    };
    match choose(isa, Storage::of(weight), rows.inputs.len(), depth, order) {
        Product::Int8 => Prepared::Int8(quantized()),
        Product::Panels => Prepared::Panels(quantized()),
        Product::ByteTiles => Prepared::ByteTiles(byte_tiles::Inputs::new(&quantized())),
        Product::Bf16Dots | Product::RoundedBf16Dots => {
            Bf16Inputs::new(isa, rows, depth).map_or(Prepared::AsGiven, Prepared::Bf16)
        }
        Product::Dots => Prepared::Dots,
        Product::Lanes | Product::Decoded => Prepared::AsGiven,
    }
}

/// # Safety
/// As [`matmul_groups`]; the CPU has `isa`.
unsafe fn run(isa: Isa, order: BatchOrder, groups: &[(&Rows, Matrix)], columns: usize, depth: usize) {
    if let Some(split) = split_by_bf16_values(isa, order, groups, depth) {
        let groups: Vec<(&Rows, Matrix)> = split.iter().map(|(rows, weight)| (rows, *weight)).collect();
        // SAFETY: the same rows and weights, regrouped.
        return unsafe { run(isa, order, &groups, columns, depth) };
    }
    let plan = |group: usize| {
        let (rows, weight) = &groups[group];
        assert!(weight.holds(columns, depth), "a weight row per column");
        prepare(isa, order, rows, weight, depth)
    };
    // Conversions past a decode step's rows on every thread (a prefill's
    // experts have thousands of rows between them); a decode step's here.
    let converts = groups.iter().any(|(rows, weight)| {
        let count = rows.inputs.len();
        let product = choose(isa, Storage::of(weight), count, depth, order);
        product.converts_to_bf16() || (product.quantizes() && count > dequant::DOT_ROWS)
    });
    let plans: Vec<Prepared> =
        if converts { threads::map(groups.len(), &plan) } else { (0..groups.len()).map(plan).collect() };
    // What is not multiplied in bf16 runs in f32 lanes.
    let lanes = isa.lanes();
    let share = |group: usize, range: std::ops::Range<usize>| {
        let ((rows, weight), prepared) = (&groups[group], &plans[group]);
        // SAFETY: the caller's promises, on `isa`, which the CPU has; the
        // prepared inputs are `rows` converted.
        unsafe {
            match (weight, prepared) {
                (Matrix::Bf16(weight), Prepared::Bf16(inputs)) => {
                    bf16_columns(rows, inputs, weight, depth, depth, 0, range)
                }
                (Matrix::F32(weight), _) => columns_on(lanes, rows, weight, depth, 0, range),
                (Matrix::Bf16(weight), _) => columns_on(lanes, rows, weight, depth, 0, range),
                (Matrix::Bf16Blocks(format, blocks), Prepared::Int8(inputs)) => {
                    let row_bytes = format.row_bytes(depth).expect("rows of whole blocks");
                    int8::dot_columns(lanes, *format, blocks, row_bytes, inputs, &rows.outs, range)
                }
                (Matrix::Bf16Blocks(format, blocks), Prepared::Panels(inputs)) => {
                    let row_bytes = format.row_bytes(depth).expect("rows of whole blocks");
                    panels::dot_columns(blocks, row_bytes, inputs, &rows.outs, range)
                }
                (Matrix::Bf16Blocks(format, blocks), Prepared::ByteTiles(inputs)) => {
                    let row_bytes = format.row_bytes(depth).expect("rows of whole blocks");
                    byte_tiles::dot_columns(blocks, row_bytes, inputs, &rows.outs, range)
                }
                (Matrix::Bf16Blocks(format, blocks), Prepared::Bf16(inputs)) => {
                    rounded_columns(rows, inputs, *format, blocks, depth, range)
                }
                (Matrix::Blocks(format, blocks) | Matrix::Bf16Blocks(format, blocks), Prepared::Dots) => {
                    let row_bytes = format.row_bytes(depth).expect("rows of whole blocks");
                    dequant::dot_columns(isa, *format, blocks, row_bytes, &rows.inputs, &rows.outs, range)
                }
                (Matrix::Blocks(format, blocks) | Matrix::Bf16Blocks(format, blocks), _) => {
                    decoded_columns(lanes, rows, *format, blocks, depth, range)
                }
            }
        }
    };
    let threads = threads::threads();
    let products: usize = groups.iter().map(|(rows, _)| rows.inputs.len() * columns * depth).sum();
    if threads == 1 || products < PARALLEL_PRODUCTS {
        return (0..groups.len()).for_each(|group| share(group, 0..columns));
    }
    // About four shares a thread over all groups, none under a tile's
    // worth (an AMX tile's sixteen weight rows).
    let chunk =
        (columns * groups.len()).div_ceil(threads * 4).next_multiple_of(16).clamp(16, columns.next_multiple_of(16));
    let parts = columns.div_ceil(chunk);
    threads::for_each(groups.len() * parts, &|job| {
        let (group, part) = (job / parts, job % parts);
        share(group, part * chunk..((part + 1) * chunk).min(columns));
    });
}

/// Elements from one row to the next in the bf16 rows the vector dot
/// products read from buffers of their own (input rows converted, weight
/// rows rounded): a cache line past the depth, so that rows of a power of
/// two's bytes do not all fall in the same sets of L1 (a tile reads ten
/// rows at once, an AMX tile sixteen, and L1 holds eight to twelve lines
/// a set).
fn bf16_stride(depth: usize) -> usize {
    depth + 32
}

/// Weight rows decoded from blocks at a time: their values (f32) stay in
/// L2 while every input row of the share passes over them.
const DECODED_ROWS: usize = 16;

/// The bytes of weight rows rounded for AMX tiles a thread keeps (half of
/// a core's L2 on the CPUs with AMX; the input rows' tiles take much of
/// the rest).
const TILE_ROUNDED_BYTES: usize = 1 << 20;

/// Weight rows rounded at a time for the vector bf16 products: half as
/// many bytes a row as decoded ones, and each block of input rows read
/// from L2 for more of them.
const VECTOR_ROUNDED_ROWS: usize = 64;

thread_local! {
    /// A thread's decoded weight rows ([`decoded_columns`]).
    static DECODED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    /// A thread's rows decoded and rounded to bf16 bits ([`rounded_columns`]).
    static ROUNDED: std::cell::RefCell<Vec<u16>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Columns `range` of every output row from weight rows in blocks: the
/// rows are decoded [`DECODED_ROWS`] at a time into a thread's buffer (the
/// matrix is never dequantized whole), then multiplied as f32 weights.
///
/// # Safety
/// As [`columns_on`].
unsafe fn decoded_columns(
    isa: Isa,
    rows: &Rows,
    format: BlockFormat,
    blocks: &[u8],
    depth: usize,
    range: std::ops::Range<usize>,
) {
    let row_bytes = format.row_bytes(depth).expect("rows of whole blocks");
    DECODED.with_borrow_mut(|decoded| {
        decoded.resize(DECODED_ROWS * depth, 0.0);
        let mut first = range.start;
        while first < range.end {
            let end = (first + DECODED_ROWS).min(range.end);
            for (n, out) in (first..end).zip(decoded.chunks_exact_mut(depth.max(1))) {
                dequant::row(isa, format, &blocks[n * row_bytes..(n + 1) * row_bytes], out);
            }
            // SAFETY: as the caller promises; weight row `n` of the
            // decoded rows is column `first + n`.
            unsafe { columns_on(isa, rows, &decoded[..(end - first) * depth], depth, first, first..end) };
            first = end;
        }
    });
}

/// [`decoded_columns`] for a parameter declared bf16 against bf16 inputs
/// (`inputs`, the rows of `rows` converted): the decoded rows are rounded
/// to bf16 ([`Matrix::Bf16Blocks`]), then multiplied in bf16 dot products
/// as bf16 weights are.
///
/// # Safety
/// As [`columns_on`]; the CPU has AVX-512 BF16 (and AMX, for tiles).
unsafe fn rounded_columns(
    rows: &Rows,
    inputs: &Bf16Inputs,
    format: BlockFormat,
    blocks: &[u8],
    depth: usize,
    range: std::ops::Range<usize>,
) {
    let row_bytes = format.row_bytes(depth).expect("rows of whole blocks");
    let stride = bf16_stride(depth);
    ROUNDED.with_borrow_mut(|rounded| {
        // Zeros past each row's depth, read by no product.
        let at_a_time = inputs.rounded_rows(stride);
        rounded.resize(at_a_time * stride, 0);
        let mut first = range.start;
        while first < range.end {
            let end = (first + at_a_time).min(range.end);
            for (n, out) in (first..end).zip(rounded.chunks_exact_mut(stride.max(1))) {
                let row = &blocks[n * row_bytes..(n + 1) * row_bytes];
                dequant::row_bf16(Isa::Avx512Bf16, format, row, &mut out[..depth]);
            }
            let weight = &rounded[..(end - first) * stride];
            // SAFETY: as the caller promises; weight row `n` of the
            // rounded rows is column `first + n`.
            unsafe { bf16_columns(rows, inputs, weight, stride, depth, first, first..end) };
            first = end;
        }
    });
}

/// Columns `range` of every output row from bf16 weights against bf16
/// inputs (the rows of `rows`, converted), in the products `inputs` was
/// made for; weight row `n - first` of `weight`, `stride` elements after
/// the one before, makes column `n`.
///
/// # Safety
/// As [`columns_on`]; the CPU has the instruction set `inputs` was made for.
unsafe fn bf16_columns(
    rows: &Rows,
    inputs: &Bf16Inputs,
    weight: &[u16],
    stride: usize,
    depth: usize,
    first: usize,
    range: std::ops::Range<usize>,
) {
    // SAFETY: as the caller promises.
    unsafe {
        match inputs {
            #[cfg(target_arch = "x86_64")]
            Bf16Inputs::Vectors(bits) => x86::columns_bf16(rows, bits, weight, stride, depth, first, range),
            Bf16Inputs::Tiles(tiles) => amx::columns(rows, tiles, weight, stride, first, range),
            #[cfg(not(target_arch = "x86_64"))]
            Bf16Inputs::Vectors(_) => unreachable!("bf16 dot products are x86's"),
        }
    }
}

/// Columns `range` of every output row, in `isa`'s f32 lanes; weight row
/// `n - first` of `weight` makes column `n`.
///
/// # Safety
/// As [`matmul_groups`], the CPU has `isa`, and no other thread writes
/// these columns.
unsafe fn columns_on<W: Weight>(
    isa: Isa,
    rows: &Rows,
    weight: &[W],
    depth: usize,
    first: usize,
    range: std::ops::Range<usize>,
) {
    // SAFETY: the caller's promises.
    unsafe {
        match isa.lanes() {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => x86::columns_avx512(rows, weight, depth, first, range),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::columns_avx2(rows, weight, depth, first, range),
            _ => widened_columns::<OneLane, W>(rows, weight, depth, first, range),
        }
    }
}

/// `R` input rows against `N` weight rows over the whole depth: `R · N`
/// sums, one accumulator each, the tail past the last full vector added
/// in order.
///
/// # Safety
/// Each of the tile's `R` input rows has `depth` readable values from its
/// first, each of its `N` weight rows `depth` weights at `weight`, and the
/// output rows room for the tile's columns, which no other thread writes; the
/// CPU has `L`'s instruction set.
#[inline(always)]
unsafe fn tile<L: Lanes, W: Weight, const R: usize, const N: usize>(
    inputs: [*const f32; R],
    weights: [*const W; N],
    depth: usize,
) -> [[f32; N]; R] {
    // SAFETY: as the caller promises (the function's `# Safety`).
    unsafe {
        let mut sums = [[L::zero(); N]; R];
        let mut w = [L::zero(); N];
        let mut k = 0;
        while k + L::WIDTH <= depth {
            for j in 0..N {
                // The next tile's weight rows (which follow these) asked
                // for one tile ahead, so that their reading from memory
                // overlaps this tile's arithmetic: the hardware's
                // prefetcher alone left an expert's products waiting on
                // memory (205 → 305 GFLOP/s with it).
                L::prefetch(weights[j].wrapping_add(k + N * depth));
                w[j] = L::load_weight(weights[j].add(k));
            }
            for (r, row) in sums.iter_mut().enumerate() {
                let a = L::load(inputs[r].add(k));
                for (sum, w) in row.iter_mut().zip(&w) {
                    *sum = L::fma(a, *w, *sum);
                }
            }
            k += L::WIDTH;
        }
        let mut out = [[0f32; N]; R];
        for r in 0..R {
            out[r] = L::sums(&sums[r]);
            for (j, total) in out[r].iter_mut().enumerate() {
                for t in k..depth {
                    *total += *inputs[r].add(t) * (*weights[j].add(t)).value();
                }
            }
        }
        out
    }
}

/// The tiles of one kind of operands: `R` input rows from `m` against `N`
/// weight rows from `n`, over the whole depth.
trait Tiles {
    /// # Safety
    /// Rows `m..m + R` and weight rows `n..n + N` exist.
    unsafe fn tile<const R: usize, const N: usize>(&self, m: usize, n: usize) -> [[f32; N]; R];
}

/// f32 inputs against weights of type `W`, in lanes `L`.
struct Widened<'a, L, W> {
    rows: &'a Rows,
    weight: *const W,
    depth: usize,
    /// The column of the first weight row.
    first: usize,
    lanes: std::marker::PhantomData<L>,
}

impl<L: Lanes, W: Weight> Tiles for Widened<'_, L, W> {
    #[inline(always)]
    unsafe fn tile<const R: usize, const N: usize>(&self, m: usize, n: usize) -> [[f32; N]; R] {
        let mut inputs = [std::ptr::null(); R];
        let mut weights = [std::ptr::null(); N];
        // SAFETY: as the caller promises.
        unsafe {
            for (r, input) in inputs.iter_mut().enumerate() {
                *input = self.rows.inputs[m + r];
            }
            for (j, weight) in weights.iter_mut().enumerate() {
                *weight = self.weight.add((n - self.first + j) * self.depth);
            }
            tile::<L, W, R, N>(inputs, weights, self.depth)
        }
    }
}

/// Columns `range` of every output row: input rows in blocks, weight rows
/// four at a time against six input rows at a time (twenty-four sums in
/// registers, ten loads for each twenty-four products).
///
/// # Safety
/// As [`columns_on`], with `tiles` over `rows`' inputs.
#[inline(always)]
unsafe fn columns<T: Tiles>(tiles: &T, rows: &Rows, range: std::ops::Range<usize>) {
    let count = rows.inputs.len();
    for block in (0..count).step_by(ROW_BLOCK) {
        let block_end = (block + ROW_BLOCK).min(count);
        let mut n = range.start;
        while n < range.end {
            // A lone row streams eight weight rows at once.
            let wide = if block_end - block == 1 { 8 } else { 4 };
            let width = if n + wide <= range.end {
                wide
            } else if n + 4 <= range.end {
                4
            } else {
                1
            };
            let mut m = block;
            while m < block_end {
                // Up to six rows share each weight load, the last rows of a
                // block too (an expert's tokens rarely come in sixes).
                let height = if width == 4 {
                    (block_end - m).min(6)
                } else if m + 4 <= block_end {
                    4
                } else {
                    1
                };
                // SAFETY: rows `m..m + height` and columns `n..n + width`
                // are inside the block and the range.
                unsafe {
                    match (height, width) {
                        (1, 8) => store(rows, m, n, tiles.tile::<1, 8>(m, n)),
                        (6, 4) => store(rows, m, n, tiles.tile::<6, 4>(m, n)),
                        (5, 4) => store(rows, m, n, tiles.tile::<5, 4>(m, n)),
                        (4, 4) => store(rows, m, n, tiles.tile::<4, 4>(m, n)),
                        (3, 4) => store(rows, m, n, tiles.tile::<3, 4>(m, n)),
                        (2, 4) => store(rows, m, n, tiles.tile::<2, 4>(m, n)),
                        (1, 4) => store(rows, m, n, tiles.tile::<1, 4>(m, n)),
                        (4, _) => store(rows, m, n, tiles.tile::<4, 1>(m, n)),
                        _ => store(rows, m, n, tiles.tile::<1, 1>(m, n)),
                    }
                }
                m += height;
            }
            n += width;
        }
    }
}

/// [`columns`] of f32 inputs in lanes `L`.
///
/// # Safety
/// As [`columns_on`]; the CPU runs `L`.
#[inline(always)]
unsafe fn widened_columns<L: Lanes, W: Weight>(
    rows: &Rows,
    weight: &[W],
    depth: usize,
    first: usize,
    range: std::ops::Range<usize>,
) {
    let tiles = Widened::<L, W> { rows, weight: weight.as_ptr(), depth, first, lanes: std::marker::PhantomData };
    // SAFETY: as the caller promises (the function's `# Safety`).
    unsafe { columns(&tiles, rows, range) }
}

/// A tile's sums into output rows `m..m + R`, columns `n..n + N`.
///
/// # Safety
/// Those rows exist and have room for those columns.
#[inline(always)]
unsafe fn store<const R: usize, const N: usize>(rows: &Rows, m: usize, n: usize, sums: [[f32; N]; R]) {
    for (r, row) in sums.iter().enumerate() {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { std::ptr::copy_nonoverlapping(row.as_ptr(), rows.outs[m + r].add(n), N) };
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{columns, widened_columns, Rows, Tiles, Weight};
    use crate::simd::{Avx2, Avx512, Lanes};
    use std::arch::x86_64::*;

    /// # Safety
    /// As `super::columns_on`; the CPU has AVX-512 F.
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma")]
    pub unsafe fn columns_avx512<W: Weight>(
        rows: &Rows,
        weight: &[W],
        depth: usize,
        first: usize,
        range: std::ops::Range<usize>,
    ) {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { widened_columns::<Avx512, W>(rows, weight, depth, first, range) }
    }

    /// # Safety
    /// As `super::columns_on`; the CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn columns_avx2<W: Weight>(
        rows: &Rows,
        weight: &[W],
        depth: usize,
        first: usize,
        range: std::ops::Range<usize>,
    ) {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { widened_columns::<Avx2, W>(rows, weight, depth, first, range) }
    }

    /// bf16 input rows (converted) against bf16 weight rows: thirty-two
    /// products per instruction per sum (`vdpbf16ps`); `depth` is even.
    struct Bf16<'a> {
        /// Rows `bf16_stride` apart.
        inputs: *const u16,
        /// Rows `weight_stride` apart.
        weight: *const u16,
        weight_stride: usize,
        depth: usize,
        first: usize,
        rows: std::marker::PhantomData<&'a [u16]>,
    }

    impl Tiles for Bf16<'_> {
        #[inline(always)]
        unsafe fn tile<const R: usize, const N: usize>(&self, m: usize, n: usize) -> [[f32; N]; R] {
            let depth = self.depth;
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe {
                let mut inputs = [std::ptr::null::<u16>(); R];
                let mut weights = [std::ptr::null::<u16>(); N];
                for (r, input) in inputs.iter_mut().enumerate() {
                    *input = self.inputs.add((m + r) * super::bf16_stride(depth));
                }
                for (j, weight) in weights.iter_mut().enumerate() {
                    *weight = self.weight.add((n - self.first + j) * self.weight_stride);
                }
                let load =
                    |at: *const u16| std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(at as *const __m512i));
                let mut sums = [[_mm512_setzero_ps(); N]; R];
                let mut w = [load(weights[0]); N];
                let mut k = 0;
                while k + 32 <= depth {
                    for j in 0..N {
                        // The next tile's rows, one tile ahead (as `tile`).
                        Avx512::prefetch(weights[j].wrapping_add(k + N * self.weight_stride));
                        w[j] = load(weights[j].add(k));
                    }
                    for (r, row) in sums.iter_mut().enumerate() {
                        let a = load(inputs[r].add(k));
                        for (sum, w) in row.iter_mut().zip(&w) {
                            *sum = _mm512_dpbf16_ps(*sum, a, *w);
                        }
                    }
                    k += 32;
                }
                let value = linnet_ir::numerics::bf16_value;
                let mut out = [[0f32; N]; R];
                for r in 0..R {
                    out[r] = Avx512::sums(&sums[r]);
                    for (j, total) in out[r].iter_mut().enumerate() {
                        for t in k..depth {
                            *total += value(*inputs[r].add(t)) * value(*weights[j].add(t));
                        }
                    }
                }
                out
            }
        }
    }

    /// The rows of `rows` as bf16 bits, `bf16_stride` apart (`None` where a
    /// value is not a bf16 value): a row's values are converted whole, with
    /// the bits that bf16 drops or-ed together on the way, instead of one
    /// branch per value.
    ///
    /// # Safety
    /// The CPU has AVX-512 BW; each input row has `depth` readable values.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn as_bf16(rows: &Rows, depth: usize) -> Option<Vec<u16>> {
        let stride = super::bf16_stride(depth);
        let total = rows.inputs.len() * stride;
        // Written before it is read: no pass to zero it first.
        let mut bits = Vec::with_capacity(total);
        let spare = &mut bits.spare_capacity_mut()[..total];
        for (&row, out) in rows.inputs.iter().zip(spare.chunks_exact_mut(stride.max(1))) {
            // SAFETY: as the caller promises.
            let values = unsafe { std::slice::from_raw_parts(row, depth) };
            let mut dropped = 0u32;
            for (bits, value) in out.iter_mut().zip(values) {
                dropped |= value.to_bits() & 0xffff;
                bits.write((value.to_bits() >> 16) as u16);
            }
            // The padding: read by no product, written so that every
            // element is initialized before the length is set.
            out[depth..].iter_mut().for_each(|pad| {
                pad.write(0);
            });
            if dropped != 0 {
                return None;
            }
        }
        // SAFETY: every row's `depth` elements were written above.
        unsafe { bits.set_len(total) };
        Some(bits)
    }

    /// Columns `range` of every output row from bf16 inputs (`inputs`:
    /// the rows of `rows`, converted, `bf16_stride` apart) and bf16
    /// weights, rows `weight_stride` apart.
    ///
    /// # Safety
    /// As `super::columns_on`; the CPU has AVX-512 BF16; `W` is bf16 bits.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16")]
    pub unsafe fn columns_bf16<W: Weight>(
        rows: &Rows,
        inputs: &[u16],
        weight: &[W],
        weight_stride: usize,
        depth: usize,
        first: usize,
        range: std::ops::Range<usize>,
    ) {
        debug_assert!(W::BF16);
        let tiles = Bf16 {
            inputs: inputs.as_ptr(),
            weight: weight.as_ptr() as *const u16,
            weight_stride,
            depth,
            first,
            rows: std::marker::PhantomData,
        };
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { columns(&tiles, rows, range) }
    }
}

#[cfg(test)]
mod tests {
    use super::{choose, matmul, matmul_groups, matmul_on, BatchOrder, Isa, Matrix, Product, Rows, Storage};

    const ORDERS: [BatchOrder; 2] = [BatchOrder::Invariant, BatchOrder::Variant];

    /// Every output within the bound on f32 dot products of its length
    /// (`depth · 2⁻²³ · Σ|aₖ·wₖ|`) of the exact sum, on every instruction
    /// set this CPU has, f32 and bf16 weights, with shapes that exercise
    /// every tile and tail and the threads.
    #[test]
    fn every_output_is_the_dot_product_within_f32_rounding() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut draw = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            // Wide exponents, so that order and rounding matter.
            ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2f32.powi(((seed >> 8) % 24) as i32 - 12)
        };
        let shapes = [0, 1, 2, 3, 8, 9, 31, 32, 64, 130]
            .into_iter()
            .flat_map(|depth| [1, 3, 4, 5, 17, 33].map(|columns| (depth, columns, 1 + depth % 6)));
        // AMX tiles' tails: rows and weight rows past whole tiles of sixteen
        // (and pairs of them), spans of 32 values.
        let tiles = [(64, 47, 16), (96, 33, 17), (32, 16, 33), (64, 31, 32), (32, 50, 48)];
        for (depth, columns, rows) in shapes.chain([(1030, 1021, 1), (512, 70, 9), (256, 300, 70)]).chain(tiles) {
            let weight: Vec<f32> = (0..depth * columns).map(|_| draw()).collect();
            let bits: Vec<u16> = weight.iter().map(|w| linnet_ir::numerics::bf16_bits(*w)).collect();
            let widened: Vec<f32> = bits.iter().map(|b| linnet_ir::numerics::bf16_value(*b)).collect();
            let input: Vec<f32> = (0..rows * depth).map(|_| draw()).collect();
            // bf16-valued inputs take the bf16 dot product where the CPU has it.
            let bf16_input: Vec<f32> =
                input.iter().map(|x| linnet_ir::numerics::bf16_value(linnet_ir::numerics::bf16_bits(*x))).collect();
            for (isa, order) in Isa::available().into_iter().flat_map(|isa| ORDERS.map(|order| (isa, order))) {
                for (input, bf16) in [(&input, false), (&input, true), (&bf16_input, true)] {
                    let mut out = vec![f32::NAN; rows * columns];
                    let reference = if bf16 { &widened } else { &weight };
                    if bf16 {
                        matmul_on(isa, order, input, bits.as_slice(), &mut out, rows);
                    } else {
                        matmul_on(isa, order, input, weight.as_slice(), &mut out, rows);
                    }
                    for (at, value) in out.iter().enumerate() {
                        let (m, n) = (at / columns, at % columns);
                        let pairs =
                            input[m * depth..(m + 1) * depth].iter().zip(&reference[n * depth..(n + 1) * depth]);
                        let (exact, magnitude) = pairs.fold((0f64, 0f64), |(s, a), (x, w)| {
                            (s + f64::from(*x) * f64::from(*w), a + (f64::from(*x) * f64::from(*w)).abs())
                        });
                        let bound = depth as f64 * 2f64.powi(-23) * magnitude;
                        assert!((f64::from(*value) - exact).abs() <= bound, "{isa:?} bf16 {bf16}, depth {depth}, columns {columns}, output {m}, {n}: {value} vs {exact}");
                    }
                }
            }
        }
    }

    /// Weights in blocks give what their dequantized values give as f32
    /// weights, on every instruction set, for every format, in both batch
    /// orders: bit for bit where rows are decoded and multiplied (every
    /// row in the invariant order; many rows, the threads too), within the
    /// bound on f32 dot products where a few rows take the values from
    /// registers (`dequant::dot_columns`), its magnitudes counting Q4_K's
    /// steps and offsets apart (`docs/language.md`).
    #[test]
    fn blocks_give_what_their_values_give() {
        use linnet_ir::quant::{dequantize, quantize, BlockFormat};
        let value = |seed: usize| ((seed * 2654435761) % 2001) as f32 / 1000.0 - 1.0;
        for format in BlockFormat::ALL {
            for (rows, columns, depth) in [(1, 37, 512), (3, 20, 256), (70, 300, 1024)] {
                let weights: Vec<f32> = (0..columns * depth).map(|at| value(at * 7 + 3)).collect();
                let blocks = quantize(format, &weights).unwrap();
                let mut values = vec![0f32; columns * depth];
                dequantize(format, &blocks, &mut values).unwrap();
                // Q4_K's offsets `dmin · min`: the values of the blocks with
                // `d` zeroed are their negatives (other formats: none).
                let mut offsets = vec![0f32; columns * depth];
                if format == BlockFormat::Q4K {
                    let mut without_steps = blocks.clone();
                    for block in without_steps.chunks_exact_mut(format.block_bytes()) {
                        block[..2].fill(0);
                    }
                    dequantize(format, &without_steps, &mut offsets).unwrap();
                }
                let input: Vec<f32> = (0..rows * depth).map(|at| value(at * 13 + 1)).collect();
                for (isa, order) in Isa::available().into_iter().flat_map(|isa| ORDERS.map(|order| (isa, order))) {
                    let mut from_blocks = vec![f32::NAN; rows * columns];
                    matmul_on(isa, order, &input, Matrix::Blocks(format, &blocks), &mut from_blocks, rows);
                    let mut from_values = vec![f32::NAN; rows * columns];
                    let f32_isa = isa.lanes();
                    matmul_on(f32_isa, order, &input, values.as_slice(), &mut from_values, rows);
                    let dots = choose(isa, Storage::Blocks(format), rows, depth, order) == Product::Dots;
                    for (at, (ours, decoded)) in from_blocks.iter().zip(&from_values).enumerate() {
                        let what = format!("{format} on {isa:?}, {order:?}, {rows} rows of {depth}, output {at}");
                        if !dots {
                            assert_eq!(ours.to_bits(), decoded.to_bits(), "{what}");
                        } else {
                            let (m, n) = (at / columns, at % columns);
                            // |step · q| ≤ |value| + |offset|, and the offset's own term.
                            let weights = values[n * depth..].iter().zip(&offsets[n * depth..]);
                            let magnitude: f64 = input[m * depth..(m + 1) * depth]
                                .iter()
                                .zip(weights)
                                .map(|(x, (w, offset))| {
                                    f64::from(*x).abs() * (f64::from(*w).abs() + 2.0 * f64::from(*offset).abs())
                                })
                                .sum();
                            let bound = depth as f64 * 2f64.powi(-23) * magnitude;
                            assert!(
                                (f64::from(*ours) - f64::from(*decoded)).abs() <= 2.0 * bound,
                                "{what}: {ours} vs {decoded}"
                            );
                        }
                    }
                }
            }
        }
    }

    /// Blocks of a parameter declared bf16 (`Matrix::Bf16Blocks`) are
    /// rounded to bf16 only where the contract lets them be and the CPU
    /// gains by it: in the variant batch order, more rows than a decode
    /// step's, bf16 inputs, AVX-512 BF16; there they give bit for bit what
    /// their values rounded to bf16 give as bf16 weights. Q4_K, Q6_K and Q8_0 blocks against a decode
    /// step's rows, and K-quant blocks against any rows on AVX2, give what
    /// `int8` gives over the rows quantized (on every instruction set;
    /// Q4_K past those rows in the panels' order, where the CPU has VNNI
    /// or AMX-INT8), and elsewhere blocks give what they give exactly.
    #[test]
    fn bf16_declared_blocks_round_only_where_they_may() {
        use linnet_ir::numerics::{bf16_bits, bf16_value};
        use linnet_ir::quant::{dequantize, quantize, BlockFormat};
        let value = |seed: usize| ((seed * 2654435761) % 2001) as f32 / 1000.0 - 1.0;
        let (columns, depth) = (40, 512);
        let mut rounded_somewhere = false;
        for format in BlockFormat::ALL {
            let weights: Vec<f32> = (0..columns * depth).map(|at| value(at * 7 + 3)).collect();
            let blocks = quantize(format, &weights).unwrap();
            let mut values = vec![0f32; columns * depth];
            dequantize(format, &blocks, &mut values).unwrap();
            let rounded: Vec<u16> = values.iter().map(|v| bf16_bits(*v)).collect();
            for rows in [3, 12, 70] {
                let input: Vec<f32> = (0..rows * depth).map(|at| value(at * 13 + 1)).collect();
                let bf16_input: Vec<f32> = input.iter().map(|x| bf16_value(bf16_bits(*x))).collect();
                for isa in Isa::available() {
                    for (input, bf16) in [(&input, false), (&bf16_input, true)] {
                        let product = |weight: Matrix| {
                            let mut out = vec![f32::NAN; rows * columns];
                            matmul_on(isa, BatchOrder::Variant, input, weight, &mut out, rows);
                            out
                        };
                        let ours = product(Matrix::Bf16Blocks(format, &blocks));
                        let chosen = choose(isa, Storage::Bf16Blocks(format), rows, depth, BatchOrder::Variant);
                        let rounds = chosen == Product::RoundedBf16Dots && bf16;
                        let expected = if chosen.quantizes() {
                            let inputs = crate::int8::QuantizedRows::new(input.chunks_exact(depth), depth);
                            // The panels and the byte tiles compute the same bits.
                            if matches!(chosen, Product::Panels | Product::ByteTiles) {
                                crate::panels::reference_products(&blocks, &inputs, columns).concat()
                            } else {
                                crate::int8::products(Isa::Portable, format, &blocks, &inputs, columns).concat()
                            }
                        } else if rounds {
                            product(Matrix::Bf16(&rounded))
                        } else {
                            product(Matrix::Blocks(format, &blocks))
                        };
                        let what = format!("{format} on {isa:?}, {rows} rows, bf16 inputs {bf16}");
                        assert!(ours.iter().zip(&expected).all(|(a, b)| a.to_bits() == b.to_bits()), "{what}");
                        if rounds {
                            let exact = product(Matrix::Blocks(format, &blocks));
                            rounded_somewhere |= ours.iter().zip(&exact).any(|(a, b)| a != b);
                        }
                    }
                }
            }
        }
        let bf16_host = Isa::available().contains(&Isa::Avx512Bf16);
        assert_eq!(rounded_somewhere, bf16_host, "rounding is taken exactly where the CPU has bf16 dot products");
    }

    /// Several matrices at once, each with its own rows (one, four, none,
    /// many), give what each gives alone, large enough to share threads.
    #[test]
    fn groups_give_what_each_matrix_gives_alone() {
        let (columns, depth) = (1024, 256);
        let value = |seed: usize| ((seed * 2654435761) % 1000) as f32 / 1000.0 - 0.5;
        let rows_per_group = [1usize, 4, 0, 37];
        let weights: Vec<Vec<f32>> =
            (0..rows_per_group.len()).map(|g| (0..columns * depth).map(|at| value(at + g * 7)).collect()).collect();
        let inputs: Vec<Vec<f32>> = rows_per_group
            .iter()
            .enumerate()
            .map(|(g, rows)| (0..rows * depth).map(|at| value(at * 3 + g)).collect())
            .collect();
        let mut grouped: Vec<Vec<f32>> = rows_per_group.iter().map(|rows| vec![f32::NAN; rows * columns]).collect();
        let batches: Vec<Rows> = (0..rows_per_group.len())
            .map(|g| Rows {
                inputs: (0..rows_per_group[g]).map(|m| inputs[g][m * depth..].as_ptr()).collect(),
                outs: (0..rows_per_group[g]).map(|m| grouped[g][m * columns..].as_mut_ptr()).collect(),
            })
            .collect();
        let groups: Vec<(&Rows, Matrix)> =
            batches.iter().zip(&weights).map(|(rows, weight)| (rows, Matrix::F32(weight))).collect();
        // SAFETY: every row points into a live vector of the right length.
        unsafe { matmul_groups(&groups, columns, depth) };
        for g in 0..rows_per_group.len() {
            let mut alone = vec![f32::NAN; rows_per_group[g] * columns];
            matmul(&inputs[g], weights[g].as_slice(), &mut alone, rows_per_group[g]);
            assert_eq!(grouped[g], alone, "group {g}");
        }
    }

    /// In the invariant batch order each row's outputs are the same bits
    /// whatever rows share its call: a row multiplied alone and as one of
    /// 2 to 70 rows (decode steps, a prefill's, the threads' shares of
    /// the columns), for f32 and bf16 weights and every block format (as
    /// declared f32 and bf16), over inputs that are bf16 values, not, and
    /// both in one call, on every instruction set this CPU has.
    #[test]
    fn each_row_is_the_same_bits_alone_or_batched() {
        use linnet_ir::numerics::{bf16_bits, bf16_value};
        use linnet_ir::quant::{quantize, BlockFormat};
        let value = |seed: usize| ((seed * 2654435761) % 2001) as f32 / 1000.0 - 1.0;
        let (columns, depth, most) = (45, 512, 70);
        let weights: Vec<f32> = (0..columns * depth).map(|at| value(at * 7 + 3)).collect();
        let bits: Vec<u16> = weights.iter().map(|w| bf16_bits(*w)).collect();
        let blocks: Vec<(BlockFormat, Vec<u8>)> =
            BlockFormat::ALL.into_iter().map(|format| (format, quantize(format, &weights).unwrap())).collect();
        let mut matrices = vec![Matrix::F32(&weights), Matrix::Bf16(&bits)];
        for (format, blocks) in &blocks {
            matrices.extend([Matrix::Blocks(*format, blocks), Matrix::Bf16Blocks(*format, blocks)]);
        }
        let input: Vec<f32> = (0..most * depth).map(|at| value(at * 13 + 1)).collect();
        let bf16_input: Vec<f32> = input.iter().map(|x| bf16_value(bf16_bits(*x))).collect();
        // Every other row bf16 values: those take the bf16 products, the
        // others the f32 lanes, in one call.
        let mixed: Vec<f32> = (0..most * depth).map(|at| [bf16_input[at], input[at]][at / depth % 2]).collect();
        for isa in Isa::available() {
            for matrix in &matrices {
                for input in [&input, &bf16_input, &mixed] {
                    let product = |rows: usize| {
                        let mut out = vec![f32::NAN; rows * columns];
                        matmul_on(isa, BatchOrder::Invariant, &input[..rows * depth], *matrix, &mut out, rows);
                        out
                    };
                    let alone: Vec<Vec<f32>> = (0..most)
                        .map(|m| {
                            let mut out = vec![f32::NAN; columns];
                            let row = &input[m * depth..(m + 1) * depth];
                            matmul_on(isa, BatchOrder::Invariant, row, *matrix, &mut out, 1);
                            out
                        })
                        .collect();
                    for rows in [2, 3, 4, 5, 7, 8, 16, 17, 48, 49, most] {
                        let batched = product(rows);
                        for (m, (batched, alone)) in batched.chunks_exact(columns).zip(&alone).enumerate() {
                            let same = batched.iter().zip(alone).all(|(a, b)| a.to_bits() == b.to_bits());
                            assert!(
                                same,
                                "{:?} on {isa:?}: row {m} of {rows} differs from it alone",
                                Storage::of(matrix)
                            );
                        }
                    }
                }
            }
        }
    }
}
