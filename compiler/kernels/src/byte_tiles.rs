//! Products of Q4_K weight rows against input rows quantized to 8 bits
//! (`int8::QuantizedRows`) in AMX's byte tiles (`tdpbusd`): the freedom
//! `docs/language.md` gives a parameter declared bf16 ("Quantized
//! inputs"), taken on CPUs with AMX-INT8 for products over more rows than
//! a decode step's and few enough that decoding every weight into bf16
//! would cost more than the products (a prefill's experts: `matmul`'s
//! choice of kernel).
//!
//! Sixteen weight rows are unpacked into bytes a span at a time, a Q4_K
//! group's 32 values a tile row (the A operand), and serve every sixteen
//! input rows in turn; the input rows are laid out once per call as B
//! tiles hold them, sixteen to a block ([`Inputs`]). Each group's
//! tile of sums (sixteen weight rows by sixteen input rows) is an exact
//! integer; it takes the group's 6-bit scale in f32, which is exact too,
//! so the f32 order is the panels' (`panels::reference`), bit for bit:
//! per block, the scaled sums of groups 0–3, then of groups 4–7, each
//! times `d · step` by one fused multiply-add, then the mins against the
//! levels' sums times `−dmin · step`.

use super::int8::{assert_operands, QuantizedRows, SPAN};
use linnet_ir::quant::BlockFormat;

/// Rows of a tile: sixteen weight rows (A), sixteen input rows (B's
/// columns), and the 16 × 16 sums they make (C).
const EDGE: usize = 16;

/// Values of a Q4_K group, whose sums take one scale: a tile's depth.
const GROUP: usize = 32;

/// Groups in a span (a Q4_K block).
const GROUPS: usize = SPAN / GROUP;

/// The most input rows a product takes the tiles for. Each group's sums
/// of each sixteen input rows take their scale in vector lanes, while the
/// weights decoded once into bf16 (`amx`) serve every sixteen for the
/// tiles alone: past three blocks of rows, the bf16 tiles were the faster
/// (Q4_K experts of 1024 × 2048 and 2048 × 512 streamed from memory).
pub const MOST_ROWS: usize = 3 * EDGE;

/// Quantized input rows laid out for the tiles, in blocks of sixteen (the
/// last filled out to sixteen with zero levels and steps).
pub struct Inputs {
    /// Per block of rows, per group of the depth: a B tile of eight rows
    /// of sixteen words, word `n` of row `i` the levels `4i..4i + 4` of
    /// the group in the block's input row `n`.
    tiles: Vec<u32>,
    /// Per block, per span: the sixteen rows' steps.
    steps: Vec<f32>,
    /// Per block, per span, per pair of groups: the sixteen rows' sums of
    /// the pair's levels (as `QuantizedRows` holds them).
    pair_sums: Vec<u32>,
    /// Spans of the depth.
    spans: usize,
    /// Input rows.
    rows: usize,
}

impl Inputs {
    /// `quantized` laid out for the tiles: at most [`MOST_ROWS`] rows.
    pub fn new(quantized: &QuantizedRows) -> Inputs {
        let (rows, spans) = (quantized.len(), quantized.depth() / SPAN);
        assert!(rows <= MOST_ROWS, "at most {MOST_ROWS} input rows, not {rows}");
        let blocks = rows.div_ceil(EDGE);
        let mut inputs = Inputs {
            tiles: vec![0; blocks * spans * SPAN / 4 * EDGE],
            steps: vec![0.0; blocks * spans * EDGE],
            pair_sums: vec![0; blocks * spans * (GROUPS / 2) * EDGE],
            spans,
            rows,
        };
        for row in 0..rows {
            let (block, n) = (row / EDGE, row % EDGE);
            for span in 0..spans {
                let (levels, pair_sums, step) = quantized.span(row, span);
                let span_of_all = block * spans + span;
                inputs.steps[span_of_all * EDGE + n] = step;
                for (pair, sum) in pair_sums.iter().enumerate() {
                    inputs.pair_sums[(span_of_all * (GROUPS / 2) + pair) * EDGE + n] = *sum;
                }
                for (word, four) in levels.chunks_exact(4).enumerate() {
                    let bytes = [four[0] as u8, four[1] as u8, four[2] as u8, four[3] as u8];
                    inputs.tiles[(span_of_all * SPAN / 4 + word) * EDGE + n] = u32::from_le_bytes(bytes);
                }
            }
        }
        inputs
    }

    /// Blocks of sixteen input rows.
    fn blocks(&self) -> usize {
        self.rows.div_ceil(EDGE)
    }

    /// The B tile of group `group` of span `span` of block `block`.
    #[cfg(target_arch = "x86_64")]
    fn tile(&self, block: usize, span: usize, group: usize) -> *const u8 {
        self.tiles[((block * self.spans + span) * GROUPS + group) * (GROUP / 4) * EDGE..].as_ptr().cast()
    }

    /// Block `block`'s sixteen steps of span `span`.
    #[cfg(target_arch = "x86_64")]
    fn steps(&self, block: usize, span: usize) -> &[f32] {
        &self.steps[(block * self.spans + span) * EDGE..][..EDGE]
    }

    /// Block `block`'s sixteen sums of pair `pair` of span `span`'s groups.
    #[cfg(target_arch = "x86_64")]
    fn pair_sums(&self, block: usize, span: usize, pair: usize) -> &[u32] {
        &self.pair_sums[((block * self.spans + span) * (GROUPS / 2) + pair) * EDGE..][..EDGE]
    }
}

/// `outs[r][n] = Σₖ x̂[r][k] · value[n, k]` for the columns `n` in `range`,
/// where weight row `n` is `blocks[n · row_bytes..]` (whole Q4_K blocks)
/// and `x̂` the quantized input rows laid out in `inputs`, on a CPU whose
/// tiles have byte products ([`available`]).
///
/// # Safety
/// Each output row has room for the columns of `range`, which no other
/// thread writes; the CPU has AMX-INT8 and the process the tiles.
pub unsafe fn dot_columns(
    blocks: &[u8],
    row_bytes: usize,
    inputs: &Inputs,
    outs: &[*mut f32],
    range: std::ops::Range<usize>,
) {
    assert!(super::amx::has_byte_products(), "byte tiles run on AMX-INT8");
    assert!(inputs.rows <= MOST_ROWS, "at most {MOST_ROWS} input rows");
    let depth = inputs.spans * SPAN;
    assert_operands(BlockFormat::Q4K, blocks, row_bytes, depth, (inputs.rows, outs.len()), &range);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as the caller promises; the CPU has the tiles.
    unsafe {
        x86::dot_columns(blocks, row_bytes, inputs, outs, range)
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("byte tiles are x86's AMX ({} rows)", inputs.rows)
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Inputs, EDGE, GROUP, GROUPS, SPAN};
    use crate::amx::x86::{store_transposed, Config, Configured};
    use crate::panels::x86::header;
    use linnet_ir::quant::BlockFormat;
    use std::arch::asm;
    use std::arch::x86_64::*;

    /// Sums: tmm0–3, sixteen rows of sixteen i32; weights: tmm4–5, sixteen
    /// rows of a group's 32 bytes; inputs: tmm6–7, eight rows of sixteen
    /// input rows' four bytes.
    const CONFIG: Config = Config::new([
        (EDGE as u8, 64),
        (EDGE as u8, 64),
        (EDGE as u8, 64),
        (EDGE as u8, 64),
        (EDGE as u8, GROUP as u8),
        (EDGE as u8, GROUP as u8),
        ((GROUP / 4) as u8, 64),
        ((GROUP / 4) as u8, 64),
    ]);

    /// Where group `g`'s 32 bytes lie in a row's 256 unpacked bytes of a
    /// span: the low nibbles of a 64-byte load of the quants hold groups
    /// `4p` and `4p + 2`, its high nibbles `4p + 1` and `4p + 3`.
    const fn unpacked_at(group: usize) -> usize {
        128 * (group / 4) + 64 * (group % 2) + 32 * (group % 4 / 2)
    }

    /// A span of sixteen weight rows unpacked, a byte a value: row `i` at
    /// `256 · i`, its groups where [`unpacked_at`] puts them (4 KiB).
    #[repr(C, align(64))]
    #[derive(Clone, Copy)]
    struct Unpacked([u8; EDGE * SPAN]);

    /// A span's headers of sixteen weight rows, lane `i` row `i`'s.
    #[repr(C, align(64))]
    #[derive(Clone, Copy, Default)]
    struct Scales {
        /// Group `g`'s 6-bit scale, in f32.
        scales: [[f32; EDGE]; GROUPS],
        /// Groups `2i` and `2i + 1`'s mins, in the low and high 16 bits.
        mins: [[u32; EDGE]; GROUPS / 2],
        d: [f32; EDGE],
        dmin: [f32; EDGE],
    }

    /// Four tiles of sums, as `tilestored` leaves them: tile `q` is group
    /// `4h + q`'s of a half `h` of a span.
    #[repr(C, align(64))]
    struct Stored([[i32; EDGE * EDGE]; 4]);

    /// Sixteen weight rows (fewer at the matrix's end) and their headers.
    struct Weights<'a> {
        /// The first row's blocks; the others follow `row_bytes` apart.
        first: *const u8,
        row_bytes: usize,
        rows: usize,
        /// Per span.
        scales: &'a [Scales],
    }

    /// The next sixteen weight rows' bytes, asked into L2 a part at each
    /// step of the first block of input rows. Each row is a stream of its
    /// own, which the hardware's prefetchers do not follow sixteen at a
    /// time; asked all at once, they would fill the line buffers and hold
    /// up the products.
    struct Ahead {
        at: *const u8,
        bytes: usize,
    }

    thread_local! {
        /// A thread's headers of sixteen weight rows, a span each.
        static SCALES: std::cell::RefCell<Vec<Scales>> = const { std::cell::RefCell::new(Vec::new()) };
        /// A thread's sixteen weight rows unpacked, a span each: unpacked
        /// as the first block of input rows passes over them, read as
        /// they lie by the other blocks.
        static UNPACKED: std::cell::RefCell<Vec<Unpacked>> = const { std::cell::RefCell::new(Vec::new()) };
    }

    /// `super::dot_columns`: sixteen weight rows at a time against each
    /// block of input rows.
    ///
    /// # Safety
    /// As `super::dot_columns`: each output row has room for the columns of
    /// `range`, which no other thread writes; the CPU has AMX-INT8 with the
    /// tiles granted, and AVX-512 VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
    pub unsafe fn dot_columns(
        blocks: &[u8],
        row_bytes: usize,
        inputs: &Inputs,
        outs: &[*mut f32],
        range: std::ops::Range<usize>,
    ) {
        let block_bytes = BlockFormat::Q4K.block_bytes();
        // The thread's buffers, taken for the call and put back after it.
        let (mut scales, mut unpacked) = (SCALES.take(), UNPACKED.take());
        scales.resize(inputs.spans, Scales::default());
        unpacked.resize(inputs.spans, Unpacked([0; EDGE * SPAN]));
        // SAFETY: the caller's promise: the CPU has the tiles.
        let tiles = unsafe { Configured::as_in(&CONFIG) };
        for first_column in range.clone().step_by(EDGE) {
            let rows = (range.end - first_column).min(EDGE);
            let next = (first_column + EDGE).min(range.end)..(first_column + 2 * EDGE).min(range.end);
            let ahead =
                Ahead { at: blocks.as_ptr().wrapping_add(next.start * row_bytes), bytes: next.len() * row_bytes };
            let first = blocks[first_column * row_bytes..].as_ptr();
            for (span, scales) in scales.iter_mut().enumerate() {
                // SAFETY: rows `first_column..` have their blocks (the caller's promise).
                unsafe { gather_scales(first.add(span * block_bytes), row_bytes, rows, scales) };
            }
            let weights = Weights { first, row_bytes, rows, scales: &scales };
            for block in 0..inputs.blocks() {
                let outs = &outs[block * EDGE..outs.len().min((block + 1) * EDGE)];
                let unpacking = (block == 0).then_some(&ahead);
                // SAFETY: the tiles are configured; the blocks exist and
                // the outputs have room for these columns (the caller's
                // promise); the first block unpacks every span.
                unsafe { panel_sums(&weights, &mut unpacked, unpacking, inputs, block, outs, first_column) };
            }
        }
        drop(tiles);
        SCALES.set(scales);
        UNPACKED.set(unpacked);
    }

    /// The headers of `rows` blocks from `first`, `row_bytes` apart, into
    /// `scales` (zeros past them).
    ///
    /// # Safety
    /// `rows` (at most sixteen) whole Q4_K blocks lie at `first`, `row_bytes`
    /// apart; the CPU has AVX-512 BW.
    #[inline(always)]
    unsafe fn gather_scales(first: *const u8, row_bytes: usize, rows: usize, scales: &mut Scales) {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            let header = header(first, row_bytes, rows);
            _mm512_store_ps(scales.d.as_mut_ptr(), header.d);
            _mm512_store_ps(scales.dmin.as_mut_ptr(), header.dmin);
            for (lanes, scale) in scales.scales.iter_mut().zip(header.scales) {
                _mm512_store_ps(lanes.as_mut_ptr(), _mm512_cvtepi32_ps(scale));
            }
            for (lanes, mins) in scales.mins.iter_mut().zip(header.mins) {
                _mm512_store_si512(lanes.as_mut_ptr().cast(), mins);
            }
        }
    }

    /// Span `span` of `rows` weight rows from `first`, `row_bytes` apart,
    /// into `into` (their quants a byte each; zeros for the rows past them).
    ///
    /// # Safety
    /// `rows` (at most sixteen) weight rows lie at `first`, `row_bytes` apart,
    /// each with block `span`; the CPU has AVX-512 BW.
    #[inline(always)]
    unsafe fn unpack(first: *const u8, row_bytes: usize, rows: usize, span: usize, into: &mut Unpacked) {
        let at = span * BlockFormat::Q4K.block_bytes() + 16;
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            let nibble = _mm512_set1_epi8(0x0f);
            for row in 0..EDGE {
                for half in 0..2 {
                    let quants = if row < rows {
                        _mm512_loadu_si512(first.add(row * row_bytes + at + 64 * half).cast())
                    } else {
                        _mm512_setzero_si512()
                    };
                    let low = _mm512_and_si512(quants, nibble);
                    let high = _mm512_and_si512(_mm512_srli_epi16::<4>(quants), nibble);
                    let to = into.0[row * SPAN + 128 * half..].as_mut_ptr();
                    _mm512_store_si512(to.cast(), low);
                    _mm512_store_si512(to.add(64).cast(), high);
                }
            }
        }
    }

    /// Half `step % 2` of span `step / 2`'s groups of input block `block`
    /// against the span's unpacked weight rows: their four tiles of sums,
    /// into `into`.
    ///
    /// # Safety
    /// The tiles are configured as [`CONFIG`].
    #[inline(always)]
    unsafe fn half_sums(unpacked: &Unpacked, inputs: &Inputs, block: usize, step: usize, into: &mut Stored) {
        let (span, half) = (step / 2, step % 2);
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            for quarter in 0..4 {
                let group = 4 * half + quarter;
                let a = unpacked.0[unpacked_at(group)..].as_ptr();
                let b = inputs.tile(block, span, group);
                asm!("tileloadd tmm4, [{p} + {s}*1]", p = in(reg) a, s = in(reg) SPAN, options(nostack, readonly));
                asm!("tileloadd tmm6, [{p} + {s}*1]", p = in(reg) b, s = in(reg) 64usize, options(nostack, readonly));
                match quarter {
                    0 => asm!("tilezero tmm0", "tdpbusd tmm0, tmm4, tmm6", options(nostack, nomem)),
                    1 => asm!("tilezero tmm1", "tdpbusd tmm1, tmm4, tmm6", options(nostack, nomem)),
                    2 => asm!("tilezero tmm2", "tdpbusd tmm2, tmm4, tmm6", options(nostack, nomem)),
                    _ => asm!("tilezero tmm3", "tdpbusd tmm3, tmm4, tmm6", options(nostack, nomem)),
                }
            }
            let base = into.0.as_mut_ptr().cast::<u8>();
            let tile = |t: usize| base.add(t * EDGE * EDGE * 4);
            asm!("tilestored [{p} + {s}*1], tmm0", p = in(reg) tile(0), s = in(reg) 64usize, options(nostack));
            asm!("tilestored [{p} + {s}*1], tmm1", p = in(reg) tile(1), s = in(reg) 64usize, options(nostack));
            asm!("tilestored [{p} + {s}*1], tmm2", p = in(reg) tile(2), s = in(reg) 64usize, options(nostack));
            asm!("tilestored [{p} + {s}*1], tmm3", p = in(reg) tile(3), s = in(reg) 64usize, options(nostack));
        }
    }

    /// Input block `block` (`outs`, its output rows) against `weights`:
    /// columns `first_column..first_column + weights.rows`. With
    /// `unpacking` (the first block), each span is unpacked into
    /// `unpacked` just before its tiles run and the next rows are asked
    /// for a part each step; the other blocks read the spans as the first
    /// left them. The tiles of each half span run one half ahead of the
    /// vectors that scale them, so that the vectors read sums stored a
    /// while before (a load of what `tilestored` has just written waits
    /// for it).
    ///
    /// # Safety
    /// The tiles are configured as [`CONFIG`]; the blocks exist; each of
    /// `outs` has room for those columns; without `unpacking`, `unpacked`
    /// holds these weight rows' spans.
    #[inline(always)]
    unsafe fn panel_sums(
        weights: &Weights,
        unpacked: &mut [Unpacked],
        unpacking: Option<&Ahead>,
        inputs: &Inputs,
        block: usize,
        outs: &[*mut f32],
        first_column: usize,
    ) {
        #[repr(C, align(64))]
        struct Sums([f32; EDGE * EDGE]);
        let steps_in_all = 2 * inputs.spans;
        let lines = unpacking.map_or(0, |ahead| ahead.bytes.div_ceil(64));
        let lines_a_step = lines.div_ceil(steps_in_all);
        let mut stored = [Stored([[0; EDGE * EDGE]; 4]), Stored([[0; EDGE * EDGE]; 4])];
        let mut sums = [_mm512_setzero_ps(); EDGE];
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            let (first, row_bytes, rows) = (weights.first, weights.row_bytes, weights.rows);
            if unpacking.is_some() {
                unpack(first, row_bytes, rows, 0, &mut unpacked[0]);
            }
            half_sums(&unpacked[0], inputs, block, 0, &mut stored[0]);
            for step in 0..steps_in_all {
                if let Some(ahead) = unpacking {
                    for line in (step * lines_a_step..(step + 1) * lines_a_step).take_while(|line| *line < lines) {
                        _mm_prefetch::<_MM_HINT_T1>(ahead.at.wrapping_add(64 * line).cast());
                    }
                }
                let ahead = step + 1;
                if ahead < steps_in_all {
                    if ahead % 2 == 0 && unpacking.is_some() {
                        unpack(first, row_bytes, rows, ahead / 2, &mut unpacked[ahead / 2]);
                    }
                    half_sums(&unpacked[ahead / 2], inputs, block, ahead, &mut stored[ahead % 2]);
                }
                let (span, half, tiles) = (step / 2, step % 2, &stored[step % 2]);
                let scales = &weights.scales[span];
                let steps = _mm512_loadu_ps(inputs.steps(block, span).as_ptr());
                for (m, sum) in sums.iter_mut().enumerate() {
                    // The half's scaled sums: exact integers in f32.
                    let mut part = _mm512_setzero_ps();
                    for (quarter, tile) in tiles.0.iter().enumerate() {
                        let products = _mm512_cvtepi32_ps(_mm512_load_si512(tile[m * EDGE..].as_ptr().cast()));
                        let scale = _mm512_set1_ps(scales.scales[4 * half + quarter][m]);
                        part = _mm512_fmadd_ps(products, scale, part);
                    }
                    let scale = _mm512_mul_ps(_mm512_set1_ps(scales.d[m]), steps);
                    *sum = _mm512_fmadd_ps(part, scale, *sum);
                }
                if half == 0 {
                    continue;
                }
                let pair_sums: [__m512i; GROUPS / 2] =
                    std::array::from_fn(|pair| _mm512_loadu_si512(inputs.pair_sums(block, span, pair).as_ptr().cast()));
                let negative_steps = _mm512_mul_ps(steps, _mm512_set1_ps(-1.0));
                for (m, sum) in sums.iter_mut().enumerate() {
                    let mut mins = _mm512_setzero_si512();
                    for (pair, pair_sum) in pair_sums.iter().enumerate() {
                        let pair_mins = _mm512_set1_epi32(scales.mins[pair][m] as i32);
                        mins = _mm512_dpwssd_epi32(mins, pair_mins, *pair_sum);
                    }
                    let scale = _mm512_mul_ps(_mm512_set1_ps(scales.dmin[m]), negative_steps);
                    *sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mins), scale, *sum);
                }
            }
            let mut out = Sums([0.0; EDGE * EDGE]);
            for (m, sum) in sums.into_iter().enumerate() {
                _mm512_store_ps(out.0[m * EDGE..].as_mut_ptr(), sum);
            }
            store_transposed(&out.0, outs, first_column, rows);
        }
    }

    const _: () = assert!(SPAN == 256 && EDGE == 16 && GROUPS == 8);
}

#[cfg(test)]
mod tests {
    use super::{dot_columns, Inputs, EDGE, MOST_ROWS};
    use crate::int8::tests::activations;
    use crate::int8::{QuantizedRows, SPAN};
    use crate::panels::reference_products;
    use linnet_ir::quant::{self, BlockFormat};

    /// The byte tiles compute the panels' reference bits on a CPU with
    /// AMX-INT8, over arbitrary blocks, for whole tiles and parts of them
    /// (of the weight rows) and the input rows up to their most.
    #[test]
    fn byte_tiles_compute_the_panels_bits() {
        if !crate::amx::has_byte_products() {
            return;
        }
        let depth = 3 * SPAN;
        let row_bytes = BlockFormat::Q4K.row_bytes(depth).unwrap();
        for columns in [EDGE, 2 * EDGE + 5, 7] {
            let blocks = quant::arbitrary_blocks(BlockFormat::Q4K, columns * depth / SPAN, columns as u64);
            for rows in [5, 9, 13, EDGE, EDGE + 1, 2 * EDGE + 7, MOST_ROWS] {
                let values = activations(rows, depth, rows as u64 + 200);
                let quantized = QuantizedRows::new(values.chunks_exact(depth), depth);
                let mut outs = vec![vec![f32::NAN; columns]; rows];
                let pointers: Vec<*mut f32> = outs.iter_mut().map(|out| out.as_mut_ptr()).collect();
                // SAFETY: each output row has `columns` values; the CPU has the tiles.
                unsafe { dot_columns(&blocks, row_bytes, &Inputs::new(&quantized), &pointers, 0..columns) };
                let expected = reference_products(&blocks, &quantized, columns);
                for (r, (ours, theirs)) in outs.iter().zip(&expected).enumerate() {
                    for (n, (ours, theirs)) in ours.iter().zip(theirs).enumerate() {
                        assert_eq!(ours.to_bits(), theirs.to_bits(), "{rows} rows, row {r} column {n} of {columns}");
                    }
                }
            }
        }
    }
}
