//! Products of weight rows in blocks (every format: levels of 8 bits or
//! fewer) against input rows quantized to 8 bits, in integer dot
//! products: the freedom `docs/language.md` gives a parameter declared
//! bf16 ("Quantized inputs"), taken in a decode step's products, where
//! decoding each weight into an f32 lane costs more than reading it, and
//! in every K-quant product on AVX2 (`choice::choose`).
//!
//! An input row is quantized per [`SPAN`] values (a K-quant block's,
//! eight blocks of 32; a row's last span the values left where the span
//! does not divide it): `step = max|x| / 127`, each level `round(x /
//! step)` (ties to even) in `-127..=127`, with the levels' sums over each
//! 16 values. A block's products are then integers, summed exactly in i32
//! with its small integer scales (Q2_K's, Q4_K's and Q5_K's mins against
//! the levels' sums, Q6_K's offset of 32 and Q3_K's of 4 likewise,
//! IQ4_XS's scale of each 32) in eight lanes ([`lane_of`]), as AVX2's
//! byte products leave them; each lane is multiplied by the block's
//! scale and the span's step and added into an f32 lane of the row (Q4_1's
//! and Q5_1's offsets against the levels' sums likewise; the blocks of 32
//! of a span by turns into two sets of lanes, [`Runs`]), and
//! the eight f32 lanes are added once, at the row's end ([`Sums`]).
//! Integer sums are the same in any order and the f32 sums take one order
//! everywhere, so every instruction set computes the same bits: AVX2's
//! `vpmaddubsw`/`vpmaddwd` (the signed levels of the formats of blocks
//! of 32 by their magnitudes against the inputs' levels with their
//! signs, `vpsignb`; IQ4_NL's, IQ4_XS's and MXFP4's looked up by
//! `vpshufb`), AVX-512 BW's
//! at 64 values a register (its two halves added into eight lanes; with
//! VNNI, `vpdpwssd` adds the scaled pairs; two blocks of 32 a register,
//! their lanes in its halves, with VNNI by `vpdpbusd`), and the portable loops, which
//! the tests hold the vector code to. Each format's loops on each
//! instruction set are a function of their own ([`Columns`]).

use super::dequant::{prefetch_ahead, two_streams, DOT_ROWS};
use super::isa::Isa;
use linnet_ir::quant::{self, layouts, BlockFormat};

/// Input values quantized with one step: a K-quant block's span.
pub const SPAN: usize = 256;

/// Values a level sum covers: Q6_K's scale groups; Q4_K's groups of 32
/// add two.
const SUM_VALUES: usize = 16;

/// Whether this CPU has AVX-512 VNNI's byte and word dot products.
pub fn has_vnni() -> bool {
    #[cfg(target_arch = "x86_64")]
    return std::arch::is_x86_feature_detected!("avx512vnni");
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Input rows quantized to 8-bit levels per [`SPAN`] values, a row's last
/// span the values left where [`SPAN`] does not divide its depth (a whole
/// number of [`RUN`]s).
#[derive(Clone, Debug, PartialEq)]
pub struct QuantizedRows {
    depth: usize,
    levels: Vec<i8>,
    /// A step per span of each row.
    steps: Vec<f32>,
    /// The levels' sum over each [`SUM_VALUES`] of each row.
    sums: Vec<i16>,
    /// The levels' sums over each 32 values of each row, two to a word
    /// (the first 32's in the low 16 bits): a Q4_K group's, in pairs;
    /// for rows of whole spans.
    pair_sums: Vec<u32>,
}

/// The values a row's depth is a whole number of: the least block of
/// any format (Q4_0's, …, IQ4_NL's, MXFP4's).
pub const RUN: usize = 32;

impl QuantizedRows {
    /// `rows` (each of `depth` values, a whole number of [`RUN`]s)
    /// quantized. A span holding an infinity or NaN gets a NaN step, so
    /// that the products over it are NaN as the exact ones would be.
    pub fn new<'a>(rows: impl ExactSizeIterator<Item = &'a [f32]>, depth: usize) -> QuantizedRows {
        assert!(depth.is_multiple_of(RUN), "rows of whole runs");
        let (count, spans) = (rows.len(), depth.div_ceil(SPAN));
        let mut quantized = QuantizedRows {
            depth,
            levels: vec![0; count * depth],
            steps: vec![0.0; count * spans],
            sums: vec![0; count * depth / SUM_VALUES],
            pair_sums: Vec::new(),
        };
        let rows_levels = quantized.levels.chunks_exact_mut(depth.max(1));
        let rows_sums = quantized.sums.chunks_exact_mut((depth / SUM_VALUES).max(1));
        let rows_steps = quantized.steps.chunks_exact_mut(spans.max(1));
        #[cfg(target_arch = "x86_64")]
        let vectors = Isa::host().lanes() == Isa::Avx512;
        for (((row, levels), sums), steps) in rows.zip(rows_levels).zip(rows_sums).zip(rows_steps) {
            assert_eq!(row.len(), depth, "rows of the depth");
            let spans =
                row.chunks(SPAN).zip(levels.chunks_mut(SPAN)).zip(sums.chunks_mut(SPAN / SUM_VALUES)).zip(steps);
            for (((values, levels), sums), step) in spans {
                #[cfg(target_arch = "x86_64")]
                if vectors && values.len() == SPAN {
                    // SAFETY: the CPU has AVX-512 F and BW; a span's values, levels and sums.
                    *step = unsafe { x86::quantize_span_avx512(values, levels, sums) };
                    continue;
                }
                *step = quantize_span(values, levels, sums);
            }
        }
        if depth.is_multiple_of(SPAN) {
            quantized.pair_sums = quantized
                .sums
                .chunks_exact(4)
                .map(|sums| ((sums[0] + sums[1]) as u16) as u32 | u32::from((sums[2] + sums[3]) as u16) << 16)
                .collect();
        }
        quantized
    }

    /// Values in each row.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// Span `span` of row `row`, in rows of whole spans: its [`SPAN`]
    /// levels, their sums over each 32 in pairs (as `pair_sums`), and its
    /// step.
    pub fn span(&self, row: usize, span: usize) -> (&[i8], &[u32], f32) {
        assert!(self.depth.is_multiple_of(SPAN), "rows of whole spans");
        let at = row * self.depth / SPAN + span;
        (&self.levels[at * SPAN..(at + 1) * SPAN], &self.pair_sums[at * 4..(at + 1) * 4], self.steps[at])
    }

    /// How many rows.
    pub fn len(&self) -> usize {
        self.steps.len() / self.depth.div_ceil(SPAN).max(1)
    }
}

/// `values`' levels into `levels` and their sums over each
/// [`SUM_VALUES`] into `sums`; their step.
fn quantize_span(values: &[f32], levels: &mut [i8], sums: &mut [i16]) -> f32 {
    let step = quantize_levels(values, levels);
    for (sum, levels) in sums.iter_mut().zip(levels.chunks_exact(SUM_VALUES)) {
        *sum = levels.iter().map(|level| i16::from(*level)).sum();
    }
    step
}

/// `values`' levels into `levels`, and their step.
fn quantize_levels(values: &[f32], levels: &mut [i8]) -> f32 {
    if !values.iter().all(|value| value.is_finite()) {
        levels.fill(0);
        return f32::NAN;
    }
    let largest = values.iter().fold(0f32, |largest, value| largest.max(value.abs()));
    if largest == 0.0 {
        levels.fill(0);
        return 0.0;
    }
    let inverse = 127.0 / largest;
    for (level, value) in levels.iter_mut().zip(values) {
        *level = nearest_even(value * inverse).clamp(-127.0, 127.0) as i8;
    }
    largest / 127.0
}

/// `x` rounded to the nearest integer, ties to even, for `|x| < 2²²` (and
/// infinities and NaN kept; -0.4 gives +0, a level of 0 all the same):
/// adding and taking away 1.5 · 2²³ leaves no fraction bits, in the
/// default rounding mode. `f32::round_ties_even`
/// computes the same, but is a call to `rintf` on CPUs the build does not
/// assume SSE4.1 of, inside a loop that this keeps in vector lanes.
#[inline(always)]
fn nearest_even(x: f32) -> f32 {
    (x + SHIFTER) - SHIFTER
}

/// 1.5 · 2²³: [`nearest_even`]'s shifter.
const SHIFTER: f32 = 12_582_912.0;

/// The lane of a block's eight that value `v` of the block is summed in:
/// each 32 values' `4l..4l + 4` go to lane `l` (as AVX2's byte products
/// of 32 values and their pairwise sums leave them, and AVX-512's halves
/// added).
const fn lane_of(v: usize) -> usize {
    (v % 32) / 4
}

/// How an instruction set reads a block's f16 scales and carries a
/// product's sums: eight i32 lanes of a block's integer sums, each
/// multiplied by the block's scale and the span's step and added into
/// eight f32 lanes (one fused multiply-add), which are added together once
/// at the end of the row ([`Sums::total`]), in the same order everywhere.
///
/// # Safety
/// Every method: the CPU has the implementing set's instructions; `half`
/// reads two bytes at byte `at` of `block`.
trait Sums {
    /// Eight i32 lanes.
    type Ints: Copy;
    /// Eight f32 lanes.
    type Floats: Copy;
    /// The f16 at byte `at` of `block`: exactly `quant::f16_at`'s value.
    unsafe fn half(block: *const u8, at: usize) -> f32;
    unsafe fn zero() -> Self::Floats;
    /// `into + sums · scale` lane by lane, rounded once; each of `sums`
    /// is under 2²⁴ in magnitude, so exact in f32.
    unsafe fn add_scaled(into: Self::Floats, sums: Self::Ints, scale: f32) -> Self::Floats;
    /// `a + b` lane by lane.
    unsafe fn add(a: Self::Floats, b: Self::Floats) -> Self::Floats;
    /// Lanes `l` and `l + 4` added, then those four's `l` and `l + 2`,
    /// then the two.
    unsafe fn total(lanes: Self::Floats) -> f32;
}

/// A block's integer sums against `R` rows of levels and their sums over
/// each 16 (each from the block's first value), in eight lanes
/// ([`lane_of`]), on one instruction set.
///
/// # Safety
/// Every method: the CPU has the implementing set's instructions; `block`
/// (or `quants`) is a whole block of the method's format; each of
/// `levels` has the block's values' levels readable, and each of `sums`
/// their sums over each 16.
trait BlockDots: Sums + Sized {
    /// Q4_K: lane `l` of `Σ_g scale[g] · Σ_{k∈g} q[k] · level[k]` over its
    /// eight groups of 32 (`q` the nibbles), and `min[l] · Σ_{k∈l}
    /// level[k]` (group `l`'s mins in lane `l`); the groups' 6-bit scales
    /// and mins unpacked as `quant::q4_k_scales_mins` does. With `FIFTH`,
    /// Q5_K, whose block has the same scales and mins: each `q` has a
    /// fifth bit (16), bit `g` of the block's high-bit byte `k % 32`
    /// (bytes 16–47), and its nibbles follow them (from byte 48).
    unsafe fn q4_k<const FIFTH: bool, const R: usize>(
        block: *const u8,
        levels: [*const i8; R],
        sums: [*const i16; R],
    ) -> [(Self::Ints, Self::Ints); R];

    /// Q6_K: lane `l` of `Σ_g scale[g] · Σ_{k∈g} u[k] · level[k]` over its
    /// sixteen groups of 16 (`u` the unsigned 6-bit levels), less 32 ·
    /// `Σ_{g∈{2l, 2l+1}} scale[g] · Σ_{k∈g} level[k]`: the offset of 32
    /// taken against the groups' sums of levels.
    unsafe fn q6_k<const R: usize>(block: *const u8, levels: [*const i8; R], sums: [*const i16; R]) -> [Self::Ints; R];

    /// Q3_K: as Q6_K, over its sixteen groups of 16 with the unsigned
    /// 3-bit levels (two low bits from bytes 32–95, as `quant::layouts`
    /// lays them out, the third from the high-bit bytes 0–31, bit `v /
    /// 32` of byte `v % 32`), less 4 · the groups' scaled sums of levels;
    /// the scales 6-bit less 32 (`quant::layouts::q3_k_scale`).
    unsafe fn q3_k<const R: usize>(block: *const u8, levels: [*const i8; R], sums: [*const i16; R]) -> [Self::Ints; R];

    /// Q2_K: lane `l` of `Σ_g scale[g] · Σ_{k∈g} q[k] · level[k]` over its
    /// sixteen groups of 16 (`q` the 2-bit levels from byte 16, laid out
    /// as Q3_K's two low bits), and `min[2l] · Σ_{k∈2l} level[k] +
    /// min[2l + 1] · …`; each group's 4-bit scale and min in the low and
    /// high nibble of byte `g`.
    unsafe fn q2_k<const R: usize>(
        block: *const u8,
        levels: [*const i8; R],
        sums: [*const i16; R],
    ) -> [(Self::Ints, Self::Ints); R];

    /// A block of a format of runs of 32 values ([`RunFormat`]): lane `l`
    /// of `Σ_run scale[run] · Σ_{k∈run} q[k] · level[k]` over its runs,
    /// `q` the levels `layouts::level` reads (Q4_0's less 8, Q5_0's less
    /// 16, IQ4_NL's, IQ4_XS's and MXFP4's from their tables, Q4_1's and
    /// Q5_1's unsigned) and `scale` IQ4_XS's 6-bit scales less 32, else 1.
    unsafe fn runs<F: RunFormat, const R: usize>(block: *const u8, levels: [*const i8; R]) -> [Self::Ints; R];

    /// Lane `l` of `Σ_k level[k]` over 32 levels: the share of Q4_1's and
    /// Q5_1's offset.
    unsafe fn level_sums<const R: usize>(levels: [*const i8; R]) -> [Self::Ints; R];

    /// A span of a [`RunFormat`]'s blocks added into the rows' lanes, as
    /// [`run_span`] adds them (an instruction set may take two blocks at a
    /// time, with the same bits).
    #[inline(always)]
    unsafe fn runs_span<F: RunFormat, const R: usize>(span: *const u8, rows: Rows<R>, into: &mut [Self::Floats; R]) {
        // SAFETY: as the caller promises.
        unsafe { run_span::<Self, F, R>(span, rows, into) }
    }
}

/// Plain loops over `quant`'s definitions of the levels: any CPU.
struct Portable;

impl Sums for Portable {
    type Ints = [i32; 8];
    type Floats = [f32; 8];

    #[inline(always)]
    unsafe fn half(block: *const u8, at: usize) -> f32 {
        // SAFETY: as the caller promises, the block has the half.
        quant::f16_at(unsafe { std::slice::from_raw_parts(block, at + 2) }, at)
    }

    #[inline(always)]
    unsafe fn zero() -> [f32; 8] {
        [0.0; 8]
    }

    #[inline(always)]
    unsafe fn add_scaled(into: [f32; 8], sums: [i32; 8], scale: f32) -> [f32; 8] {
        std::array::from_fn(|l| (sums[l] as f32).mul_add(scale, into[l]))
    }

    #[inline(always)]
    unsafe fn add(a: [f32; 8], b: [f32; 8]) -> [f32; 8] {
        std::array::from_fn(|l| a[l] + b[l])
    }

    #[inline(always)]
    unsafe fn total(lanes: [f32; 8]) -> f32 {
        let fours: [f32; 4] = std::array::from_fn(|l| lanes[l] + lanes[l + 4]);
        (fours[0] + fours[2]) + (fours[1] + fours[3])
    }
}

impl BlockDots for Portable {
    #[inline(always)]
    unsafe fn q4_k<const FIFTH: bool, const R: usize>(
        block: *const u8,
        levels: [*const i8; R],
        sums: [*const i16; R],
    ) -> [([i32; 8], [i32; 8]); R] {
        // SAFETY: as the caller promises, the block and the rows' span are whole.
        let (fifths, quants) = unsafe {
            let quants_at = if FIFTH { 48 } else { 16 };
            (std::slice::from_raw_parts(block.add(16), 32), std::slice::from_raw_parts(block.add(quants_at), 128))
        };
        let scales_mins = quant::q4_k_scales_mins(unsafe { std::slice::from_raw_parts(block.add(4), 12) });
        let nibble = |v: usize| {
            let (chunk, within) = (v / 64, v % 64);
            let low = i32::from((quants[chunk * 32 + within % 32] >> (4 * (within / 32))) & 0xf);
            let fifth = if FIFTH { i32::from((fifths[v % 32] >> (v / 32)) & 1) } else { 0 };
            low | fifth << 4
        };
        std::array::from_fn(|r| {
            let (levels, sums) =
                // SAFETY: as the caller promises (the function's `# Safety`).
                unsafe { (std::slice::from_raw_parts(levels[r], SPAN), std::slice::from_raw_parts(sums[r], 16)) };
            let mut products = [0; 8];
            for (v, level) in levels.iter().enumerate() {
                products[lane_of(v)] += i32::from(scales_mins[v / 32]) * nibble(v) * i32::from(*level);
            }
            let mins = std::array::from_fn(|l| {
                i32::from(scales_mins[8 + l]) * (i32::from(sums[2 * l]) + i32::from(sums[2 * l + 1]))
            });
            (products, mins)
        })
    }

    #[inline(always)]
    unsafe fn q6_k<const R: usize>(block: *const u8, levels: [*const i8; R], sums: [*const i16; R]) -> [[i32; 8]; R] {
        // SAFETY: as above.
        let block = unsafe { std::slice::from_raw_parts(block, 210) };
        let unsigned = quant::q6_k_levels(block).map(|level| i32::from(level) + 32);
        // SAFETY: as the caller promises, the rows' spans and sums.
        unsafe { offset_products(&unsigned, |group| i32::from(block[192 + group] as i8), 32, levels, sums) }
    }

    #[inline(always)]
    unsafe fn q3_k<const R: usize>(block: *const u8, levels: [*const i8; R], sums: [*const i16; R]) -> [[i32; 8]; R] {
        // SAFETY: as the caller promises, the block is whole.
        let block = unsafe { std::slice::from_raw_parts(block, 110) };
        let unsigned: [i32; SPAN] = std::array::from_fn(|v| i32::from(layouts::level(BlockFormat::Q3K, block, v)) + 4);
        let scale = |group: usize| i32::from(layouts::q3_k_scale(&block[96..108], group)) - 32;
        // SAFETY: as the caller promises, the rows' spans and sums.
        unsafe { offset_products(&unsigned, scale, 4, levels, sums) }
    }

    #[inline(always)]
    unsafe fn q2_k<const R: usize>(
        block: *const u8,
        levels: [*const i8; R],
        sums: [*const i16; R],
    ) -> [([i32; 8], [i32; 8]); R] {
        // SAFETY: as the caller promises, the block is whole.
        let block = unsafe { std::slice::from_raw_parts(block, 84) };
        let (scale, min) = (|g: usize| i32::from(block[g] & 0xf), |g: usize| i32::from(block[g] >> 4));
        std::array::from_fn(|r| {
            let (levels, sums) =
                unsafe { (std::slice::from_raw_parts(levels[r], SPAN), std::slice::from_raw_parts(sums[r], 16)) };
            let mut products = [0; 8];
            for (v, level) in levels.iter().enumerate() {
                let q = i32::from(layouts::level(BlockFormat::Q2K, block, v));
                products[lane_of(v)] += scale(v / SUM_VALUES) * q * i32::from(*level);
            }
            let mins = std::array::from_fn(|l| {
                min(2 * l) * i32::from(sums[2 * l]) + min(2 * l + 1) * i32::from(sums[2 * l + 1])
            });
            (products, mins)
        })
    }

    #[inline(always)]
    unsafe fn runs<F: RunFormat, const R: usize>(block: *const u8, levels: [*const i8; R]) -> [[i32; 8]; R] {
        // SAFETY: as the caller promises, the block is whole.
        let block = unsafe { std::slice::from_raw_parts(block, F::BYTES) };
        let mut products = [[0; 8]; R];
        for run in 0..F::RUNS {
            let scale = run_scale(F::FORMAT, block, run);
            let quants: [i32; RUN] =
                std::array::from_fn(|v| scale * i32::from(layouts::level(F::FORMAT, block, RUN * run + v)));
            for (products, levels) in products.iter_mut().zip(levels) {
                // SAFETY: as the caller promises, the rows' levels of the block's values.
                let levels = unsafe { std::slice::from_raw_parts(levels.add(RUN * run), RUN) };
                for (v, (q, level)) in quants.iter().zip(levels).enumerate() {
                    products[lane_of(v)] += q * i32::from(*level);
                }
            }
        }
        products
    }

    #[inline(always)]
    unsafe fn level_sums<const R: usize>(levels: [*const i8; R]) -> [[i32; 8]; R] {
        std::array::from_fn(|r| {
            // SAFETY: as the caller promises, the rows' 32 levels.
            let levels = unsafe { std::slice::from_raw_parts(levels[r], RUN) };
            let mut sums = [0; 8];
            for (v, level) in levels.iter().enumerate() {
                sums[lane_of(v)] += i32::from(*level);
            }
            sums
        })
    }
}

/// The integer scale of run `run` of `block`: IQ4_XS's 6-bit scale less
/// 32; 1 in the formats whose runs share the block's scale.
#[inline(always)]
fn run_scale(format: BlockFormat, block: &[u8], run: usize) -> i32 {
    match format {
        BlockFormat::Iq4Xs => i32::from(layouts::iq4_xs_scale(block, run)) - 32,
        _ => 1,
    }
}

/// Sixteen groups of 16 unsigned levels (`unsigned`) against `R` rows, in
/// plain loops: lane `l` of `Σ_g scale(g) · Σ_{k∈g} unsigned[k] ·
/// level[k]`, less `offset` times `Σ_{g∈{2l, 2l+1}} scale(g) · Σ_{k∈g}
/// level[k]` (Q6_K's and Q3_K's).
///
/// # Safety
/// Each of `levels` has a span of levels readable, each of `sums` their
/// sixteen sums.
#[inline(always)]
unsafe fn offset_products<const R: usize>(
    unsigned: &[i32; SPAN],
    scale: impl Fn(usize) -> i32,
    offset: i32,
    levels: [*const i8; R],
    sums: [*const i16; R],
) -> [[i32; 8]; R] {
    std::array::from_fn(|r| {
        let (levels, sums) =
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe { (std::slice::from_raw_parts(levels[r], SPAN), std::slice::from_raw_parts(sums[r], 16)) };
        let mut products = [0; 8];
        for (v, level) in levels.iter().enumerate() {
            products[lane_of(v)] += scale(v / SUM_VALUES) * unsigned[v] * i32::from(*level);
        }
        std::array::from_fn(|l| {
            let offsets = scale(2 * l) * i32::from(sums[2 * l]) + scale(2 * l + 1) * i32::from(sums[2 * l + 1]);
            products[l] - offset * offsets
        })
    })
}

/// The formats, each a span's share of a product.
trait KQuant {
    const FORMAT: BlockFormat;
    /// The span's sums against each row's span (`rows`), times the
    /// blocks' scales and the span's steps, added into the row's lanes
    /// `into`: Q2_K's,
    /// Q4_K's and Q5_K's products times `d · step`, then their mins times
    /// `−dmin · step` ([`with_mins`]); Q3_K's and Q6_K's times `d · step`
    /// ([`scaled`]); each block of a [`RunFormat`] in turn times its
    /// scale and the step, Q4_1's and Q5_1's offsets against the levels'
    /// sums.
    unsafe fn add_block<B: BlockDots, const R: usize>(block: *const u8, rows: Rows<R>, into: &mut [B::Floats; R]);
}

/// A span of `R` input rows as a block's product reads it: each row's
/// levels, their sums over each 16, and the span's step; its values
/// ([`SPAN`], or fewer in a row's last span: a [`RunFormat`]'s blocks).
#[derive(Clone, Copy)]
struct Rows<const R: usize> {
    levels: [*const i8; R],
    sums: [*const i16; R],
    steps: [f32; R],
    values: usize,
}

/// Each row's `lanes` times `d · step` added into its sums.
///
/// # Safety
/// The CPU has `B`'s instruction set.
#[inline(always)]
unsafe fn scaled<B: BlockDots, const R: usize>(
    lanes: [B::Ints; R],
    d: f32,
    steps: [f32; R],
    into: &mut [B::Floats; R],
) {
    for (r, products) in lanes.into_iter().enumerate() {
        // SAFETY: as the caller promises.
        into[r] = unsafe { B::add_scaled(into[r], products, d * steps[r]) };
    }
}

/// Each row's products times `d · step`, then its mins times `−dmin ·
/// step`, added into its sums.
///
/// # Safety
/// The CPU has `B`'s instruction set.
#[inline(always)]
unsafe fn with_mins<B: BlockDots, const R: usize>(
    lanes: [(B::Ints, B::Ints); R],
    (d, dmin): (f32, f32),
    steps: [f32; R],
    into: &mut [B::Floats; R],
) {
    for (r, (products, mins)) in lanes.into_iter().enumerate() {
        // SAFETY: as the caller promises.
        unsafe {
            into[r] = B::add_scaled(into[r], products, d * steps[r]);
            into[r] = B::add_scaled(into[r], mins, -(dmin * steps[r]));
        }
    }
}

/// Q4_K, and Q5_K where `FIFTH`.
struct NibblesK<const FIFTH: bool>;
struct Q2K;
struct Q3K;
struct Q6K;

impl KQuant for Q2K {
    const FORMAT: BlockFormat = BlockFormat::Q2K;
    #[inline(always)]
    unsafe fn add_block<B: BlockDots, const R: usize>(block: *const u8, rows: Rows<R>, into: &mut [B::Floats; R]) {
        // SAFETY: as the caller promises, the block is whole.
        unsafe {
            with_mins::<B, R>(
                B::q2_k(block, rows.levels, rows.sums),
                (B::half(block, 80), B::half(block, 82)),
                rows.steps,
                into,
            )
        }
    }
}

impl KQuant for Q3K {
    const FORMAT: BlockFormat = BlockFormat::Q3K;
    #[inline(always)]
    unsafe fn add_block<B: BlockDots, const R: usize>(block: *const u8, rows: Rows<R>, into: &mut [B::Floats; R]) {
        // SAFETY: as the caller promises, the block is whole.
        unsafe { scaled::<B, R>(B::q3_k(block, rows.levels, rows.sums), B::half(block, 108), rows.steps, into) }
    }
}

impl<const FIFTH: bool> KQuant for NibblesK<FIFTH> {
    const FORMAT: BlockFormat = if FIFTH { BlockFormat::Q5K } else { BlockFormat::Q4K };
    #[inline(always)]
    unsafe fn add_block<B: BlockDots, const R: usize>(block: *const u8, rows: Rows<R>, into: &mut [B::Floats; R]) {
        // SAFETY: as the caller promises, the block is whole.
        unsafe {
            let lanes = B::q4_k::<FIFTH, R>(block, rows.levels, rows.sums);
            with_mins::<B, R>(lanes, (B::half(block, 0), B::half(block, 2)), rows.steps, into)
        }
    }
}

impl KQuant for Q6K {
    const FORMAT: BlockFormat = BlockFormat::Q6K;
    #[inline(always)]
    unsafe fn add_block<B: BlockDots, const R: usize>(block: *const u8, rows: Rows<R>, into: &mut [B::Floats; R]) {
        // SAFETY: as the caller promises, the block is whole.
        unsafe { scaled::<B, R>(B::q6_k(block, rows.levels, rows.sums), B::half(block, 208), rows.steps, into) }
    }
}

/// The formats whose blocks are runs of 32 values, each block with one
/// scale (at byte 0: an f16, MXFP4's E8M0 exponent) and, in Q4_1 and
/// Q5_1, an offset added (the f16 at byte 2): Q4_0, Q4_1, Q5_0, Q5_1,
/// Q8_0, IQ4_NL, MXFP4, and IQ4_XS, whose block is eight runs, each
/// with its integer scale ([`BlockDots::runs`]).
trait RunFormat {
    const FORMAT: BlockFormat;
    /// Runs in a block (IQ4_XS's eight, else one).
    const RUNS: usize = Self::FORMAT.block_values() / RUN;
    /// Bytes in a block.
    const BYTES: usize = Self::FORMAT.block_bytes();
}

/// A [`RunFormat`]'s span of blocks.
struct Runs<F>(std::marker::PhantomData<F>);

macro_rules! run_formats {
    ($($name:ident),*) => {
        $(
            #[doc = concat!("[`BlockFormat::", stringify!($name), "`], as a [`RunFormat`].")]
            struct $name;
            impl RunFormat for $name {
                const FORMAT: BlockFormat = BlockFormat::$name;
            }
        )*
    };
}

run_formats!(Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Iq4Nl, Iq4Xs, Mxfp4);

impl<F: RunFormat> KQuant for Runs<F> {
    const FORMAT: BlockFormat = F::FORMAT;
    #[inline(always)]
    unsafe fn add_block<B: BlockDots, const R: usize>(span: *const u8, rows: Rows<R>, into: &mut [B::Floats; R]) {
        // SAFETY: as the caller promises.
        unsafe { B::runs_span::<F, R>(span, rows, into) }
    }
}

/// A span of a [`RunFormat`]'s blocks against the rows, added into their
/// lanes: the even blocks' sums into `into`, the odd ones' into a second
/// set of lanes added to `into` at the span's end (two chains of
/// dependent additions, each half as long).
///
/// # Safety
/// The span's blocks are whole; the rows have their values' levels; the
/// CPU has `B`'s instruction set.
#[inline(always)]
unsafe fn run_span<B: BlockDots, F: RunFormat, const R: usize>(
    span: *const u8,
    rows: Rows<R>,
    into: &mut [B::Floats; R],
) {
    let blocks = rows.values / (RUN * F::RUNS);
    // SAFETY: as the caller promises (the function's `# Safety`).
    unsafe {
        let mut odd = [B::zero(); R];
        for block in 0..blocks {
            let into = if block % 2 == 0 { &mut *into } else { &mut odd };
            add_run_block::<B, F, R>(span, block, rows, into);
        }
        if blocks > 1 {
            for (into, odd) in into.iter_mut().zip(odd) {
                *into = B::add(*into, odd);
            }
        }
    }
}

/// The scale of a [`RunFormat`]'s block: its f16, or MXFP4's E8M0
/// exponent as `e8m0_half` reads it.
///
/// # Safety
/// `block` is a whole block of `F`; the CPU has `B`'s instruction set.
#[inline(always)]
unsafe fn block_scale<B: Sums, F: RunFormat>(block: *const u8) -> f32 {
    // SAFETY: as the caller promises (the function's `# Safety`).
    unsafe {
        match F::FORMAT {
            BlockFormat::Mxfp4 => layouts::e8m0_half(*block),
            _ => B::half(block, 0),
        }
    }
}

/// Block `block` of a span of a [`RunFormat`]'s blocks against the rows'
/// levels, times its scale and the span's steps, added into `into`: Q4_1's
/// and Q5_1's offsets against the levels' sums (a min of `−m`).
///
/// # Safety
/// The span has the block, whole; the rows have its values' levels; the
/// CPU has `B`'s instruction set.
#[inline(always)]
unsafe fn add_run_block<B: BlockDots, F: RunFormat, const R: usize>(
    span: *const u8,
    block: usize,
    rows: Rows<R>,
    into: &mut [B::Floats; R],
) {
    // SAFETY: as the caller promises (the function's `# Safety`).
    unsafe {
        let at = span.add(F::BYTES * block);
        let levels = rows.levels.map(|levels| levels.add(RUN * F::RUNS * block));
        let products = B::runs::<F, R>(at, levels);
        let scale = block_scale::<B, F>(at);
        match F::FORMAT {
            BlockFormat::Q4_1 | BlockFormat::Q5_1 => {
                let sums = B::level_sums::<R>(levels);
                let mut lanes = [(products[0], sums[0]); R];
                for r in 1..R {
                    lanes[r] = (products[r], sums[r]);
                }
                with_mins::<B, R>(lanes, (scale, -B::half(at, 2)), rows.steps, into)
            }
            _ => scaled::<B, R>(products, scale, rows.steps, into),
        }
    }
}

/// Column `n` of output rows `first..first + R`: weight row `row`
/// against those input rows, each block's sums added into eight f32
/// lanes a row ([`KQuant::add_block`]), the lanes added at the end.
///
/// # Safety
/// As [`dot_columns`]' caller promises, for column `n`; the input rows
/// exist.
#[inline(always)]
unsafe fn dot_row<B: BlockDots, F: KQuant, const R: usize>(
    row: &[u8],
    inputs: &QuantizedRows,
    first: usize,
    outs: &[*mut f32],
    n: usize,
) {
    let (depth, spans) = (inputs.depth, inputs.depth.div_ceil(SPAN));
    let levels: [*const i8; R] = std::array::from_fn(|r| inputs.levels[(first + r) * depth..].as_ptr());
    let sums: [*const i16; R] = std::array::from_fn(|r| inputs.sums[(first + r) * depth / SUM_VALUES..].as_ptr());
    let steps: [&[f32]; R] = std::array::from_fn(|r| &inputs.steps[(first + r) * spans..(first + r + 1) * spans]);
    // SAFETY: as the caller promises.
    unsafe {
        let mut lanes = [B::zero(); R];
        // A span's bytes: a K-quant block, eight of Q8_0's (the last
        // span's fewer where the span does not divide the row).
        let span_bytes = F::FORMAT.row_bytes(SPAN).expect("blocks that divide a span");
        // The whole spans with their count of values a constant (their
        // blocks' loops unrolled), then the last span's values left.
        let whole = row.chunks_exact(span_bytes);
        let last = whole.remainder();
        for (number, block) in whole.enumerate() {
            if first == 0 {
                prefetch_ahead(block);
            }
            F::add_block::<B, R>(block.as_ptr(), span_rows(levels, sums, steps, number, SPAN), &mut lanes);
        }
        if !last.is_empty() {
            let values = last.len() / F::FORMAT.block_bytes() * F::FORMAT.block_values();
            F::add_block::<B, R>(last.as_ptr(), span_rows(levels, sums, steps, spans - 1, values), &mut lanes);
        }
        outs[first..first + R].iter().zip(lanes).for_each(|(out, lanes)| *out.add(n) = B::total(lanes));
    }
}

/// Span `number` of rows whose levels, sums and steps start at `levels`,
/// `sums` and `steps`, of `values` values.
///
/// # Safety
/// The rows have the span.
#[inline(always)]
unsafe fn span_rows<const R: usize>(
    levels: [*const i8; R],
    sums: [*const i16; R],
    steps: [&[f32]; R],
    number: usize,
    values: usize,
) -> Rows<R> {
    // SAFETY: as the caller promises.
    unsafe {
        Rows {
            levels: levels.map(|levels| levels.add(number * SPAN)),
            sums: sums.map(|sums| sums.add(number * SPAN / SUM_VALUES)),
            steps: steps.map(|steps| steps[number]),
            values,
        }
    }
}

/// What a product of quantized input rows against weight rows reads and
/// writes ([`dot_columns`]' arguments but the instruction set and the
/// format): the weight rows `blocks[n · row_bytes..]` of the columns `n`
/// in `range`, the input rows, and an output row each.
#[derive(Clone)]
struct Operands<'a> {
    blocks: &'a [u8],
    row_bytes: usize,
    inputs: &'a QuantizedRows,
    outs: &'a [*mut f32],
    range: std::ops::Range<usize>,
}

/// Columns `range` of every output row: each weight row, while it is in
/// L1, against the input rows [`DOT_ROWS`] at a time ([`dot_row`]).
///
/// # Safety
/// As [`dot_columns`]: each output row has room for the columns of `range`,
/// which no other thread writes; the rows of `blocks` are whole blocks of `F`;
/// the CPU has `B`'s instruction set.
#[inline(always)]
unsafe fn dot_columns_of<B: BlockDots, F: KQuant>(operands: Operands) {
    let Operands { blocks, row_bytes, inputs, outs, range } = operands;
    for n in two_streams(range) {
        let row = &blocks[n * row_bytes..(n + 1) * row_bytes];
        for first in (0..inputs.len()).step_by(DOT_ROWS) {
            let count = (inputs.len() - first).min(DOT_ROWS);
            // SAFETY: as `dot_columns`' caller promises.
            unsafe { for_rows!(count, dot_row::<B, F>(row, inputs, first, outs, n)) }
        }
    }
}

/// An instruction set's products of one format's rows ([`dot_columns_of`]),
/// each format's compiled as a function of its own, with the set's
/// features: one format's loops do not share a function, and the
/// compiler's choices of registers and inlining, with the others'.
trait Columns {
    /// # Safety
    /// As [`dot_columns_of`]'s, on a CPU with the set.
    unsafe fn of<F: KQuant>(operands: Operands);
}

impl Columns for Portable {
    unsafe fn of<F: KQuant>(operands: Operands) {
        // SAFETY: as the caller promises.
        unsafe { dot_columns_of::<Portable, F>(operands) }
    }
}

/// [`dot_columns_of`] for `format`, on `C`'s instruction set.
///
/// # Safety
/// As [`dot_columns_of`].
unsafe fn dot_columns_in<C: Columns>(format: BlockFormat, operands: Operands) {
    // SAFETY: as `dot_columns`' caller promises.
    unsafe {
        match format {
            BlockFormat::Q4K => C::of::<NibblesK<false>>(operands),
            BlockFormat::Q5K => C::of::<NibblesK<true>>(operands),
            BlockFormat::Q2K => C::of::<Q2K>(operands),
            BlockFormat::Q3K => C::of::<Q3K>(operands),
            BlockFormat::Q6K => C::of::<Q6K>(operands),
            BlockFormat::Q4_0 => C::of::<Runs<Q4_0>>(operands),
            BlockFormat::Q4_1 => C::of::<Runs<Q4_1>>(operands),
            BlockFormat::Q5_0 => C::of::<Runs<Q5_0>>(operands),
            BlockFormat::Q5_1 => C::of::<Runs<Q5_1>>(operands),
            BlockFormat::Q8_0 => C::of::<Runs<Q8_0>>(operands),
            BlockFormat::Iq4Nl => C::of::<Runs<Iq4Nl>>(operands),
            BlockFormat::Iq4Xs => C::of::<Runs<Iq4Xs>>(operands),
            BlockFormat::Mxfp4 => C::of::<Runs<Mxfp4>>(operands),
        }
    }
}

/// Asserts what every product of quantized input rows against rows of
/// `format`'s blocks takes (`int8`'s, the panels', the byte tiles'): some
/// input rows (`rows.0`), an output row each (`rows.1`), and the weight
/// rows of `range` whole in `blocks`, `row_bytes` apart, as deep as the
/// inputs (`depth`).
pub(crate) fn assert_operands(
    format: BlockFormat,
    blocks: &[u8],
    row_bytes: usize,
    depth: usize,
    rows: (usize, usize),
    range: &std::ops::Range<usize>,
) {
    assert!(rows.0 > 0 && rows.0 == rows.1, "input rows, an output row each");
    assert!(
        range.end * row_bytes <= blocks.len() && format.row_bytes(depth) == Some(row_bytes),
        "whole rows of blocks, as deep as the inputs"
    );
}

/// `outs[r][n] = Σₖ x̂[r][k] · value[n, k]` for the columns `n` in `range`,
/// where weight row `n` is `blocks[n · row_bytes..]` (whole blocks of
/// `format`) and `x̂` the quantized input rows, on `isa`.
///
/// # Safety
/// Each output row has room for the columns of `range`, which no other
/// thread writes.
pub unsafe fn dot_columns(
    isa: Isa,
    format: BlockFormat,
    blocks: &[u8],
    row_bytes: usize,
    inputs: &QuantizedRows,
    outs: &[*mut f32],
    range: std::ops::Range<usize>,
) {
    assert_operands(format, blocks, row_bytes, inputs.depth, (inputs.len(), outs.len()), &range);
    let operands = Operands { blocks, row_bytes, inputs, outs, range };
    // SAFETY: as the caller promises, on a CPU with `isa`.
    unsafe {
        match isa.lanes() {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 if has_vnni() => dot_columns_in::<x86::Avx512<true>>(format, operands),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => dot_columns_in::<x86::Avx512<false>>(format, operands),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => dot_columns_in::<x86::Avx2>(format, operands),
            _ => dot_columns_in::<Portable>(format, operands),
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{
        dot_columns_of, layouts, BlockDots, BlockFormat, Columns, KQuant, Operands, Rows, RunFormat, Sums, RUN, SPAN,
        SUM_VALUES,
    };
    use std::arch::x86_64::*;

    /// AVX2's byte products: `vpmaddubsw` multiplies the unsigned weight
    /// levels by the signed input levels and adds pairs into i16 (at most
    /// 2 · 63 · 127, no saturation), `vpmaddwd` multiplies those by the
    /// groups' scales and adds pairs into i32.
    pub(super) struct Avx2;

    /// `Σ scale · (weights · inputs)` of 32 bytes, in eight i32 lanes.
    ///
    /// # Safety
    /// `inputs` has 32 readable bytes; the CPU has AVX2.
    #[inline(always)]
    unsafe fn scaled_products(weights: __m256i, inputs: *const i8, scales: __m256i) -> __m256i {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { _mm256_madd_epi16(_mm256_maddubs_epi16(weights, _mm256_loadu_si256(inputs.cast())), scales) }
    }

    /// The vector kernels, whose CPUs have F16C.
    trait Vectors {}
    impl Vectors for Avx2 {}
    impl<const VNNI: bool> Vectors for Avx512<VNNI> {}

    /// Eight lanes in a 256-bit register, summed with FMA.
    impl<V: Vectors> Sums for V {
        type Ints = __m256i;
        type Floats = __m256;

        /// Widened by F16C (`dequant::half_at`).
        #[inline(always)]
        unsafe fn half(block: *const u8, at: usize) -> f32 {
            // SAFETY: as the caller promises, on a CPU with F16C.
            unsafe { crate::dequant::half_at(block, at) }
        }

        #[inline(always)]
        unsafe fn zero() -> __m256 {
            unsafe { _mm256_setzero_ps() }
        }

        #[inline(always)]
        unsafe fn add_scaled(into: __m256, sums: __m256i, scale: f32) -> __m256 {
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe { _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums), _mm256_set1_ps(scale), into) }
        }

        #[inline(always)]
        unsafe fn add(a: __m256, b: __m256) -> __m256 {
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe { _mm256_add_ps(a, b) }
        }

        #[inline(always)]
        unsafe fn total(lanes: __m256) -> f32 {
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe {
                let fours = _mm_add_ps(_mm256_castps256_ps128(lanes), _mm256_extractf128_ps::<1>(lanes));
                let twos = _mm_add_ps(fours, _mm_movehl_ps(fours, fours));
                _mm_cvtss_f32(_mm_add_ss(twos, _mm_movehdup_ps(twos)))
            }
        }
    }

    /// `quant::q4_k_scales_mins` in a vector, from the 12 packed bytes at
    /// byte 4 of `block`: the eight scales, then the eight mins.
    ///
    /// # Safety
    /// `block` is a whole Q4_K block; the CPU has AVX2.
    #[inline(always)]
    unsafe fn q4_k_scales_mins(block: *const u8) -> __m128i {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            // The three words, and four bytes of quants the block goes on with.
            let words = _mm_loadu_si128(block.add(4).cast());
            let low_six = _mm_and_si128(words, _mm_set1_epi32(0x3f3f_3f3f));
            let third = _mm_shuffle_epi32::<0b10_10_10_10>(words);
            let nibbles = _mm_and_si128(_mm_srlv_epi32(third, _mm_set_epi32(0, 0, 4, 0)), _mm_set1_epi32(0x0f0f_0f0f));
            let top_two = _mm_slli_epi32::<4>(_mm_and_si128(_mm_srli_epi32::<6>(words), _mm_set1_epi32(0x0303_0303)));
            // Scales then mins of groups 0–3 (low), and of groups 4–7 (high).
            let high = _mm_or_si128(nibbles, top_two);
            _mm_unpacklo_epi32(low_six, high)
        }
    }

    /// Sixteen i16 lanes: the first eight byte `low` of `bytes` widened,
    /// the last eight byte `high`.
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[inline(always)]
    unsafe fn spread(bytes: __m128i, low: i8, high: i8) -> __m256i {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            let pick = _mm_set_epi64x(i64::from_le_bytes([high as u8; 8]), i64::from_le_bytes([low as u8; 8]));
            _mm256_cvtepi8_epi16(_mm_shuffle_epi8(bytes, pick))
        }
    }

    /// Q4_K's `Σ_g min[g] · Σ_{k∈g} level[k]` in eight i32 lanes, `packed`
    /// its scales then its mins, `sums` the levels' sums of each 16: each
    /// min twice, beside the two sums of its group, by `vpmaddwd`.
    ///
    /// # Safety
    /// `sums` has sixteen readable i16; the CPU has AVX2.
    #[inline(always)]
    unsafe fn q4_k_mins(packed: __m128i, sums: *const i16) -> __m256i {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            let mins = _mm256_cvtepu8_epi16(_mm_unpackhi_epi8(packed, packed));
            _mm256_madd_epi16(_mm256_loadu_si256(sums.cast()), mins)
        }
    }

    /// An offset of `2^SHIFT` (Q6_K's 32, Q3_K's 4) times `Σ_g scale[g] ·
    /// Σ_{k∈g} level[k]`, `scales` its sixteen, in eight i32 lanes (groups
    /// `2l` and `2l + 1` in lane `l`): taken from the products' lanes,
    /// lane by lane.
    ///
    /// # Safety
    /// `sums` has sixteen readable i16; the CPU has AVX2.
    #[inline(always)]
    unsafe fn offsets<const SHIFT: i32>(scales: __m128i, sums: *const i16) -> __m256i {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            let scaled_sums = _mm256_madd_epi16(_mm256_loadu_si256(sums.cast()), _mm256_cvtepi8_epi16(scales));
            _mm256_slli_epi32::<SHIFT>(scaled_sums)
        }
    }

    /// Q3_K's sixteen scales less 32, as i8, from the block's twelve packed
    /// bytes (96–107): the low nibbles of bytes 0–7, then their high ones,
    /// each with its two top bits from byte `8 + g % 4`, bits `2 · (g /
    /// 4)` (a word shifted by 0, 2, 4 and 6 in its four lanes).
    ///
    /// # Safety
    /// `block` is a whole Q3_K block; the CPU has AVX2.
    #[inline(always)]
    unsafe fn q3_k_scales(block: *const u8) -> __m128i {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            let nibble = _mm_set1_epi8(0x0f);
            let low = _mm_loadl_epi64(block.add(96).cast());
            let nibbles =
                _mm_unpacklo_epi64(_mm_and_si128(low, nibble), _mm_and_si128(_mm_srli_epi16::<4>(low), nibble));
            let word = _mm_set1_epi32(block.add(104).cast::<i32>().read_unaligned());
            let top_two = _mm_and_si128(_mm_srlv_epi32(word, _mm_set_epi32(6, 4, 2, 0)), _mm_set1_epi8(3));
            _mm_sub_epi8(_mm_or_si128(nibbles, _mm_slli_epi16::<4>(top_two)), _mm_set1_epi8(32))
        }
    }

    /// Q2_K's and Q3_K's products in eight i32 lanes, on AVX2 (which
    /// AVX-512 CPUs have too), `scales` their sixteen groups' as i8: per
    /// half block, the 32 bytes of two-bit levels from byte `quants_at`
    /// give four quarters of 32 values (shifted by 0, 2, 4, 6); with
    /// `THIRD` (Q3_K), each with a third bit from the high-bit bytes 0–31
    /// (shifted by the quarter's number); the unsigned levels (0–3, 0–7)
    /// against the inputs' by `vpmaddubsw`.
    ///
    /// # Safety
    /// `block` is a whole block of Q3_K where `THIRD`, else Q2_K; each of
    /// `levels` has a span readable; the CPU has AVX2.
    #[inline(always)]
    unsafe fn two_bit_products<const THIRD: bool, const R: usize>(
        block: *const u8,
        quants_at: usize,
        scales: __m128i,
        levels: [*const i8; R],
    ) -> [__m256i; R] {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            let (two_bits, one) = (_mm256_set1_epi8(3), _mm256_set1_epi8(1));
            let mut thirds = if THIRD { _mm256_loadu_si256(block.cast()) } else { _mm256_setzero_si256() };
            let mut products = [_mm256_setzero_si256(); R];
            for half in 0..2 {
                let mut low = _mm256_loadu_si256(block.add(quants_at + 32 * half).cast());
                for part in 0..4 {
                    let mut unsigned = _mm256_and_si256(low, two_bits);
                    if THIRD {
                        let third = _mm256_slli_epi16::<2>(_mm256_and_si256(thirds, one));
                        unsigned = _mm256_or_si256(unsigned, third);
                        thirds = _mm256_srli_epi16::<1>(thirds);
                    }
                    let group = (8 * half + 2 * part) as i8;
                    let group_scales = spread(scales, group, group + 1);
                    for (sum, levels) in products.iter_mut().zip(levels) {
                        let quarter = scaled_products(unsigned, levels.add(128 * half + 32 * part), group_scales);
                        *sum = _mm256_add_epi32(*sum, quarter);
                    }
                    low = _mm256_srli_epi16::<2>(low);
                }
            }
            products
        }
    }

    /// Q3_K's products, less its offset of 4 (see [`two_bit_products`]).
    ///
    /// # Safety
    /// As [`BlockDots::q3_k`]'s, on a CPU with AVX2.
    #[inline(always)]
    unsafe fn q3_k_products<const R: usize>(
        block: *const u8,
        levels: [*const i8; R],
        sums: [*const i16; R],
    ) -> [__m256i; R] {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            let scales = q3_k_scales(block);
            let products = two_bit_products::<true, R>(block, 32, scales, levels);
            let mut lanes = products;
            for (lanes, sums) in lanes.iter_mut().zip(sums) {
                *lanes = _mm256_sub_epi32(*lanes, offsets::<2>(scales, sums));
            }
            lanes
        }
    }

    /// Q2_K's products and its mins against the levels' sums (see
    /// [`two_bit_products`]).
    ///
    /// # Safety
    /// As [`BlockDots::q2_k`]'s, on a CPU with AVX2.
    #[inline(always)]
    unsafe fn q2_k_products<const R: usize>(
        block: *const u8,
        levels: [*const i8; R],
        sums: [*const i16; R],
    ) -> [(__m256i, __m256i); R] {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            let (packed, nibble) = (_mm_loadu_si128(block.cast()), _mm_set1_epi8(0x0f));
            let (scales, mins) = (_mm_and_si128(packed, nibble), _mm_and_si128(_mm_srli_epi16::<4>(packed), nibble));
            let products = two_bit_products::<false, R>(block, 16, scales, levels);
            let mut lanes = [(_mm256_setzero_si256(), _mm256_setzero_si256()); R];
            for r in 0..R {
                lanes[r] = (products[r], offsets::<0>(mins, sums[r]));
            }
            lanes
        }
    }

    /// The nibbles of sixteen bytes at `bytes` as 32 bytes: values 0–15
    /// the low halves, 16–31 the high (`layouts`' runs of 32).
    ///
    /// # Safety
    /// `bytes` has 16 readable bytes; the CPU has AVX2.
    #[inline(always)]
    unsafe fn nibbles(bytes: *const u8) -> __m256i {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            let low = _mm_loadu_si128(bytes.cast());
            _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16::<4>(low), low), _mm256_set1_epi8(0x0f))
        }
    }

    /// Q5_0's and Q5_1's fifth bits as all ones in the bytes of the values
    /// that have one, from the u32 at `bits` (bit `i` for value `i`): byte
    /// `i` takes byte `i / 8` of the word, and its bit `i % 8` is tested.
    ///
    /// # Safety
    /// `bits` has 4 readable bytes; the CPU has AVX2.
    #[inline(always)]
    unsafe fn fifth_bits(bits: *const u8) -> __m256i {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            let word = _mm256_set1_epi32(bits.cast::<i32>().read_unaligned());
            let bytes = _mm256_shuffle_epi8(
                word,
                _mm256_set_epi64x(0x0303_0303_0303_0303, 0x0202_0202_0202_0202, 0x0101_0101_0101_0101, 0),
            );
            let bit = _mm256_set1_epi64x(0x8040_2010_0804_0201_u64 as i64);
            _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit)
        }
    }

    /// `nibbles` looked up in `table` (sixteen levels).
    ///
    /// # Safety
    /// The CPU has AVX2.
    #[inline(always)]
    unsafe fn looked_up(table: &[i8; 16], nibbles: __m256i) -> __m256i {
        // SAFETY: as the caller promises; the table has sixteen bytes.
        unsafe { _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(_mm_loadu_si128(table.as_ptr().cast())), nibbles) }
    }

    /// The 32 signed levels of run `run` of `block`, as `layouts::level`
    /// reads them.
    ///
    /// # Safety
    /// `block` is a whole block of `format`, a [`super::RunFormat`]'s; the
    /// CPU has AVX2.
    #[inline(always)]
    unsafe fn run_levels(format: BlockFormat, block: *const u8, run: usize) -> __m256i {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            match format {
                BlockFormat::Q8_0 => _mm256_loadu_si256(block.add(2).cast()),
                BlockFormat::Q4_0 => _mm256_sub_epi8(nibbles(block.add(2)), _mm256_set1_epi8(8)),
                BlockFormat::Q4_1 => nibbles(block.add(4)),
                // Less 16 where the fifth bit is clear.
                BlockFormat::Q5_0 => _mm256_sub_epi8(
                    nibbles(block.add(6)),
                    _mm256_andnot_si256(fifth_bits(block.add(2)), _mm256_set1_epi8(16)),
                ),
                BlockFormat::Q5_1 => _mm256_or_si256(
                    nibbles(block.add(8)),
                    _mm256_and_si256(fifth_bits(block.add(4)), _mm256_set1_epi8(16)),
                ),
                BlockFormat::Iq4Nl => looked_up(&layouts::IQ4_LEVELS, nibbles(block.add(2))),
                BlockFormat::Mxfp4 => looked_up(&layouts::MXFP4_LEVELS, nibbles(block.add(1))),
                BlockFormat::Iq4Xs => looked_up(&layouts::IQ4_LEVELS, nibbles(block.add(8 + 16 * run))),
                other => unreachable!("{other} is not a format of runs of 32"),
            }
        }
    }

    /// A [`super::RunFormat`]'s block against `R` rows in eight i32
    /// lanes, on AVX2 (which AVX-512 CPUs have too), run by run:
    /// `vpmaddubsw` of the levels' magnitudes by the inputs' levels with
    /// the levels' signs (`vpsignb`: at most 2 · 128 · 127, no
    /// saturation; Q4_1's and Q5_1's levels, unsigned, as they are),
    /// pairs added into i32 by `vpmaddwd` by the run's integer scale.
    ///
    /// # Safety
    /// As [`BlockDots::runs`]', on a CPU with AVX2.
    #[inline(always)]
    unsafe fn run_products<F: RunFormat, const R: usize>(block: *const u8, levels: [*const i8; R]) -> [__m256i; R] {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            let mut products = [_mm256_setzero_si256(); R];
            let whole = std::slice::from_raw_parts(block, F::BYTES);
            for run in 0..F::RUNS {
                let quants = run_levels(F::FORMAT, block, run);
                let unsigned = matches!(F::FORMAT, BlockFormat::Q4_1 | BlockFormat::Q5_1);
                let magnitudes = if unsigned { quants } else { _mm256_abs_epi8(quants) };
                let scale = _mm256_set1_epi16(super::run_scale(F::FORMAT, whole, run) as i16);
                for (sum, levels) in products.iter_mut().zip(levels) {
                    let levels = _mm256_loadu_si256(levels.add(RUN * run).cast());
                    let signed = if unsigned { levels } else { _mm256_sign_epi8(levels, quants) };
                    *sum = _mm256_add_epi32(*sum, _mm256_madd_epi16(_mm256_maddubs_epi16(magnitudes, signed), scale));
                }
            }
            products
        }
    }

    /// [`BlockDots::level_sums`] on AVX2: the levels by ones, pairs of
    /// pairs added.
    ///
    /// # Safety
    /// Each of `levels` has 32 readable levels; the CPU has AVX2.
    #[inline(always)]
    unsafe fn level_sums<const R: usize>(levels: [*const i8; R]) -> [__m256i; R] {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            let mut sums = [_mm256_setzero_si256(); R];
            for (sum, levels) in sums.iter_mut().zip(levels) {
                let pairs = _mm256_maddubs_epi16(_mm256_set1_epi8(1), _mm256_loadu_si256(levels.cast()));
                *sum = _mm256_madd_epi16(pairs, _mm256_set1_epi16(1));
            }
            sums
        }
    }

    /// The [`BlockDots`] methods whose AVX2 code AVX-512 CPUs run as it is,
    /// in 256-bit lanes (a run of a [`super::RunFormat`] is 32 values, and
    /// so is each quarter of Q2_K's and Q3_K's half blocks): the same in both impls.
    macro_rules! in_256_bit_lanes {
        () => {
            /// # Safety
            /// As the trait's.
            #[inline(always)]
            unsafe fn runs<F: RunFormat, const R: usize>(block: *const u8, levels: [*const i8; R]) -> [__m256i; R] {
                // SAFETY: as the caller promises (the function's `# Safety`).
                unsafe { run_products::<F, R>(block, levels) }
            }

            /// # Safety
            /// As the trait's.
            #[inline(always)]
            unsafe fn level_sums<const R: usize>(levels: [*const i8; R]) -> [__m256i; R] {
                // SAFETY: as the caller promises (the function's `# Safety`).
                unsafe { level_sums(levels) }
            }

            /// # Safety
            /// As the trait's.
            #[inline(always)]
            unsafe fn q3_k<const R: usize>(
                block: *const u8,
                levels: [*const i8; R],
                sums: [*const i16; R],
            ) -> [__m256i; R] {
                // SAFETY: as the caller promises (the function's `# Safety`).
                unsafe { q3_k_products(block, levels, sums) }
            }

            /// # Safety
            /// As the trait's.
            #[inline(always)]
            unsafe fn q2_k<const R: usize>(
                block: *const u8,
                levels: [*const i8; R],
                sums: [*const i16; R],
            ) -> [(__m256i, __m256i); R] {
                // SAFETY: as the caller promises (the function's `# Safety`).
                unsafe { q2_k_products(block, levels, sums) }
            }
        };
    }

    impl BlockDots for Avx2 {
        in_256_bit_lanes!();

        /// The mins against each 32 levels' sum (each 16's, in pairs)
        /// by `vpmaddwd`. Q5_K's fifth bits: chunk `c`'s are bits `2c`
        /// and `2c + 1` of the high-bit bytes, brought to bits 0 and 1 by
        /// a shift of the 16-bit words per chunk (bits 0–7 of a byte never
        /// take its neighbour's), then to bit 4 of each level.
        #[inline(always)]
        unsafe fn q4_k<const FIFTH: bool, const R: usize>(
            block: *const u8,
            levels: [*const i8; R],
            sums: [*const i16; R],
        ) -> [(__m256i, __m256i); R] {
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe {
                let nibble = _mm256_set1_epi8(0x0f);
                let packed = q4_k_scales_mins(block);
                let quants_at = if FIFTH { 48 } else { 16 };
                let mut fifths = if FIFTH { _mm256_loadu_si256(block.add(16).cast()) } else { _mm256_setzero_si256() };
                let mut products = [_mm256_setzero_si256(); R];
                for chunk in 0..4 {
                    let q = _mm256_loadu_si256(block.add(quants_at + 32 * chunk).cast());
                    let (mut low, mut high) =
                        (_mm256_and_si256(q, nibble), _mm256_and_si256(_mm256_srli_epi16::<4>(q), nibble));
                    if FIFTH {
                        let low_fifths = _mm256_slli_epi16::<4>(_mm256_and_si256(fifths, _mm256_set1_epi8(1)));
                        let high_fifths = _mm256_slli_epi16::<3>(_mm256_and_si256(fifths, _mm256_set1_epi8(2)));
                        (low, high) = (_mm256_or_si256(low, low_fifths), _mm256_or_si256(high, high_fifths));
                        fifths = _mm256_srli_epi16::<2>(fifths);
                    }
                    let (low_group, high_group) = (2 * chunk as i8, 2 * chunk as i8 + 1);
                    let low_scale = spread(packed, low_group, low_group);
                    let high_scale = spread(packed, high_group, high_group);
                    for (sum, levels) in products.iter_mut().zip(levels) {
                        let low = scaled_products(low, levels.add(64 * chunk), low_scale);
                        let high = scaled_products(high, levels.add(64 * chunk + 32), high_scale);
                        *sum = _mm256_add_epi32(*sum, _mm256_add_epi32(low, high));
                    }
                }
                let mut lanes = [(_mm256_setzero_si256(), _mm256_setzero_si256()); R];
                for r in 0..R {
                    lanes[r] = (products[r], q4_k_mins(packed, sums[r]));
                }
                lanes
            }
        }

        /// A half block's 128 levels from its 64 bytes of low bits and 32
        /// of high bits, as `quant::q6_k_levels` lays them out: quarter `p`
        /// takes the nibbles of low bytes `32 (p % 2)..` (the upper ones
        /// for `p ≥ 2`) and bits `2p..2p + 2` of the high bytes.
        #[inline(always)]
        unsafe fn q6_k<const R: usize>(
            block: *const u8,
            levels: [*const i8; R],
            sums: [*const i16; R],
        ) -> [__m256i; R] {
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe {
                let (nibble, two_bits) = (_mm256_set1_epi8(0x0f), _mm256_set1_epi8(3));
                let scales = _mm_loadu_si128(block.add(192).cast());
                let mut products = [_mm256_setzero_si256(); R];
                for half in 0..2 {
                    let low = [
                        _mm256_loadu_si256(block.add(64 * half).cast()),
                        _mm256_loadu_si256(block.add(64 * half + 32).cast()),
                    ];
                    let high = _mm256_loadu_si256(block.add(128 + 32 * half).cast());
                    let quarters = [
                        (_mm256_and_si256(low[0], nibble), high),
                        (_mm256_and_si256(low[1], nibble), _mm256_srli_epi16::<2>(high)),
                        (_mm256_and_si256(_mm256_srli_epi16::<4>(low[0]), nibble), _mm256_srli_epi16::<4>(high)),
                        (_mm256_and_si256(_mm256_srli_epi16::<4>(low[1]), nibble), _mm256_srli_epi16::<6>(high)),
                    ];
                    for (part, (low, high)) in quarters.into_iter().enumerate() {
                        let unsigned = _mm256_or_si256(low, _mm256_slli_epi16::<4>(_mm256_and_si256(high, two_bits)));
                        // Values 0–15 of the quarter are group `g`, 16–31 group `g + 1`.
                        let group = (8 * half + 2 * part) as i8;
                        let group_scales = spread(scales, group, group + 1);
                        for (sum, levels) in products.iter_mut().zip(levels) {
                            let quarter = scaled_products(unsigned, levels.add(128 * half + 32 * part), group_scales);
                            *sum = _mm256_add_epi32(*sum, quarter);
                        }
                    }
                }
                let mut lanes = products;
                for (lanes, sums) in lanes.iter_mut().zip(sums) {
                    *lanes = _mm256_sub_epi32(*lanes, offsets::<5>(scales, sums));
                }
                lanes
            }
        }
    }

    /// AVX-512 BW's byte products, sixty-four bytes an instruction: a
    /// register holds 64 consecutive values of either format (Q4_K's 32
    /// nibble bytes in both halves, the upper half shifted by a nibble;
    /// Q6_K's high bits likewise by two bits), each group's scale spread
    /// over its lanes by an in-lane byte shuffle (`vpshufb`) of the
    /// scales widened to i16 in every 128-bit lane. With `VNNI`, the
    /// scaled pairs are added into the sums by the same instruction that
    /// multiplies them (`vpdpwssd`).
    pub(super) struct Avx512<const VNNI: bool>;

    /// The two 256-bit halves of `v` added, lane by lane.
    ///
    /// # Safety
    /// The CPU has AVX-512 F.
    #[inline(always)]
    unsafe fn halves_added(v: __m512i) -> __m256i {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { _mm256_add_epi32(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64::<1>(v)) }
    }

    /// `sums + Σ scale · (weights · inputs)` of 64 bytes, in sixteen i32
    /// lanes: with `VNNI` in one `vpdpwssd`, else a `vpmaddwd` and an add.
    ///
    /// # Safety
    /// `inputs` has 64 readable bytes; the CPU has AVX-512 BW, and AVX-512 VNNI
    /// when `VNNI`.
    #[inline(always)]
    unsafe fn add_scaled_products<const VNNI: bool>(
        sums: __m512i,
        weights: __m512i,
        inputs: *const i8,
        scales: __m512i,
    ) -> __m512i {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            let pairs = _mm512_maddubs_epi16(weights, _mm512_loadu_si512(inputs.cast()));
            if VNNI {
                _mm512_dpwssd_epi32(sums, pairs, scales)
            } else {
                _mm512_add_epi32(sums, _mm512_madd_epi16(pairs, scales))
            }
        }
    }

    /// Sixteen i32 lanes, each the sum of its four bytes' products,
    /// `unsigned` by `signed`: with `VNNI` one `vpdpbusd`, else
    /// `vpmaddubsw` (no saturation at these levels: at most 2 · 128 · 127)
    /// and `vpmaddwd` by ones.
    ///
    /// # Safety
    /// The CPU has AVX-512 BW, and AVX-512 VNNI when `VNNI`.
    #[inline(always)]
    unsafe fn byte_dots<const VNNI: bool>(unsigned: __m512i, signed: __m512i) -> __m512i {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            if VNNI {
                _mm512_dpbusd_epi32(_mm512_setzero_si512(), unsigned, signed)
            } else {
                _mm512_madd_epi16(_mm512_maddubs_epi16(unsigned, signed), _mm512_set1_epi16(1))
            }
        }
    }

    /// Eight lanes of `low`, then eight of `high`.
    ///
    /// # Safety
    /// The CPU has AVX-512 F.
    #[inline(always)]
    unsafe fn pair_of(low: f32, high: f32) -> __m512 {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { _mm512_mask_blend_ps(0xff00, _mm512_set1_ps(low), _mm512_set1_ps(high)) }
    }

    /// `−x` lane by lane (the sign bit flipped, as f32 negation does).
    ///
    /// # Safety
    /// The CPU has AVX-512 F.
    #[inline(always)]
    unsafe fn negated(x: __m512) -> __m512 {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32(i32::MIN))) }
    }

    /// `vpshufb` controls that fill each 128-bit lane `l` with its i16
    /// word `picks[l]`: a group's scale over the lanes of its products.
    const fn word_picks(picks: [u8; 4]) -> [u8; 64] {
        let mut control = [0u8; 64];
        let mut at = 0;
        while at < 64 {
            control[at] = 2 * picks[at / 16] + (at % 2) as u8;
            at += 1;
        }
        control
    }

    /// Q4_K's chunk `c` (32 bytes, 64 values): groups `2c` (the low
    /// nibbles), then `2c + 1`, of 16 i16 lanes each.
    const Q4_K_PICKS: [[u8; 64]; 4] =
        [word_picks([0, 0, 1, 1]), word_picks([2, 2, 3, 3]), word_picks([4, 4, 5, 5]), word_picks([6, 6, 7, 7])];
    /// Q6_K's pair `p` of a half's quarters (64 values): four groups of 8
    /// i16 lanes from its half's `4p`.
    const Q6_K_PICKS: [[u8; 64]; 2] = [word_picks([0, 1, 2, 3]), word_picks([4, 5, 6, 7])];

    /// Eight i16 scales in every 128-bit lane, spread by `picks`.
    ///
    /// # Safety
    /// The CPU has AVX-512 BW.
    #[inline(always)]
    unsafe fn spread_wide(words: __m512i, picks: &[u8; 64]) -> __m512i {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { _mm512_shuffle_epi8(words, _mm512_loadu_si512(picks.as_ptr().cast())) }
    }

    impl<const VNNI: bool> BlockDots for Avx512<VNNI> {
        in_256_bit_lanes!();

        /// A whole span of blocks of 32 two blocks a register: an even
        /// block's levels in the low half, the next block's in the high
        /// half, their sums by `vpdpbusd` (VNNI) or `vpmaddubsw` and
        /// `vpmaddwd`, scaled and added into sixteen f32 lanes whose low
        /// half is the even blocks' lanes ([`super::run_span`]'s `into`)
        /// and whose high half the odd blocks', added at the span's end:
        /// the same operations, lane by lane, as the 256-bit code.
        #[inline(always)]
        unsafe fn runs_span<F: RunFormat, const R: usize>(span: *const u8, rows: Rows<R>, into: &mut [__m256; R]) {
            if rows.values != SPAN || F::RUNS != 1 {
                // SAFETY: as the caller promises.
                return unsafe { super::run_span::<Self, F, R>(span, rows, into) };
            }
            // SAFETY: as the caller promises (the trait's `# Safety`).
            unsafe {
                let offsets = matches!(F::FORMAT, BlockFormat::Q4_1 | BlockFormat::Q5_1);
                let mut lanes = [_mm512_setzero_ps(); R];
                for (lanes, into) in lanes.iter_mut().zip(into.iter()) {
                    *lanes = _mm512_zextps256_ps512(*into);
                }
                for pair in 0..SPAN / 64 {
                    let (even, odd) = (span.add(F::BYTES * 2 * pair), span.add(F::BYTES * (2 * pair + 1)));
                    let quants = _mm512_inserti64x4::<1>(
                        _mm512_castsi256_si512(run_levels(F::FORMAT, even, 0)),
                        run_levels(F::FORMAT, odd, 0),
                    );
                    let magnitudes = if offsets { quants } else { _mm512_abs_epi8(quants) };
                    let negative = _mm512_movepi8_mask(quants);
                    let scales = pair_of(super::block_scale::<Self, F>(even), super::block_scale::<Self, F>(odd));
                    // The offsets as mins of `−m`, each scaled as `−(min · step)`.
                    let mins =
                        if offsets { pair_of(-Self::half(even, 2), -Self::half(odd, 2)) } else { _mm512_setzero_ps() };
                    for ((lanes, levels), step) in lanes.iter_mut().zip(rows.levels).zip(rows.steps) {
                        let levels = _mm512_loadu_si512(levels.add(64 * pair).cast());
                        let signed = match offsets {
                            true => levels,
                            false => _mm512_mask_sub_epi8(levels, negative, _mm512_setzero_si512(), levels),
                        };
                        let step = _mm512_set1_ps(step);
                        let products = _mm512_cvtepi32_ps(byte_dots::<VNNI>(magnitudes, signed));
                        *lanes = _mm512_fmadd_ps(products, _mm512_mul_ps(scales, step), *lanes);
                        if offsets {
                            let sums = _mm512_cvtepi32_ps(byte_dots::<VNNI>(_mm512_set1_epi8(1), levels));
                            *lanes = _mm512_fmadd_ps(sums, negated(_mm512_mul_ps(mins, step)), *lanes);
                        }
                    }
                }
                for (into, lanes) in into.iter_mut().zip(lanes) {
                    let high = _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(lanes)));
                    *into = _mm256_add_ps(_mm512_castps512_ps256(lanes), high);
                }
            }
        }

        /// Q5_K's fifth bits: the high-bit bytes in both halves, the
        /// upper shifted one bit further, shifted two bits a chunk.
        #[inline(always)]
        unsafe fn q4_k<const FIFTH: bool, const R: usize>(
            block: *const u8,
            levels: [*const i8; R],
            sums: [*const i16; R],
        ) -> [(__m256i, __m256i); R] {
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe {
                let nibble = _mm512_set1_epi8(0x0f);
                let upper_by_a_nibble = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi64x(4));
                let packed = q4_k_scales_mins(block);
                let scales = _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(packed));
                let quants_at = if FIFTH { 48 } else { 16 };
                let mut fifths = if FIFTH {
                    let upper_by_a_bit = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi64x(1));
                    _mm512_srlv_epi64(_mm512_broadcast_i64x4(_mm256_loadu_si256(block.add(16).cast())), upper_by_a_bit)
                } else {
                    _mm512_setzero_si512()
                };
                let mut products = [_mm512_setzero_si512(); R];
                for (chunk, picks) in Q4_K_PICKS.iter().enumerate() {
                    let q = _mm512_broadcast_i64x4(_mm256_loadu_si256(block.add(quants_at + 32 * chunk).cast()));
                    let mut q = _mm512_and_si512(_mm512_srlv_epi64(q, upper_by_a_nibble), nibble);
                    if FIFTH {
                        q = _mm512_or_si512(q, _mm512_slli_epi16::<4>(_mm512_and_si512(fifths, _mm512_set1_epi8(1))));
                        fifths = _mm512_srli_epi64::<2>(fifths);
                    }
                    let group_scales = spread_wide(scales, picks);
                    for (sum, levels) in products.iter_mut().zip(levels) {
                        *sum = add_scaled_products::<VNNI>(*sum, q, levels.add(64 * chunk), group_scales);
                    }
                }
                let mut lanes = [(_mm256_setzero_si256(), _mm256_setzero_si256()); R];
                for r in 0..R {
                    lanes[r] = (halves_added(products[r]), q4_k_mins(packed, sums[r]));
                }
                lanes
            }
        }

        #[inline(always)]
        unsafe fn q6_k<const R: usize>(
            block: *const u8,
            levels: [*const i8; R],
            sums: [*const i16; R],
        ) -> [__m256i; R] {
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe {
                let (nibble, two_bits) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(3));
                // Quarters 0 and 1 (high bits 0–1 and 2–3), then 2 and 3.
                let first_quarters = _mm512_inserti64x4::<1>(_mm512_setzero_si512(), _mm256_set1_epi64x(2));
                let last_quarters = _mm512_inserti64x4::<1>(_mm512_set1_epi64(4), _mm256_set1_epi64x(6));
                let packed = _mm_loadu_si128(block.add(192).cast());
                let scales = [
                    _mm512_broadcast_i32x4(_mm_cvtepi8_epi16(packed)),
                    _mm512_broadcast_i32x4(_mm_cvtepi8_epi16(_mm_srli_si128::<8>(packed))),
                ];
                let mut products = [_mm512_setzero_si512(); R];
                for (half, half_scales) in scales.into_iter().enumerate() {
                    let low = _mm512_loadu_si512(block.add(64 * half).cast());
                    let high = _mm512_broadcast_i64x4(_mm256_loadu_si256(block.add(128 + 32 * half).cast()));
                    let pairs = [
                        (_mm512_and_si512(low, nibble), _mm512_srlv_epi64(high, first_quarters)),
                        (_mm512_and_si512(_mm512_srli_epi16::<4>(low), nibble), _mm512_srlv_epi64(high, last_quarters)),
                    ];
                    for (pair, (low, high)) in pairs.into_iter().enumerate() {
                        let unsigned = _mm512_or_si512(low, _mm512_slli_epi16::<4>(_mm512_and_si512(high, two_bits)));
                        let group_scales = spread_wide(half_scales, &Q6_K_PICKS[pair]);
                        for (sum, levels) in products.iter_mut().zip(levels) {
                            let at = levels.add(128 * half + 64 * pair);
                            *sum = add_scaled_products::<VNNI>(*sum, unsigned, at, group_scales);
                        }
                    }
                }
                let mut lanes = [_mm256_setzero_si256(); R];
                for r in 0..R {
                    lanes[r] = _mm256_sub_epi32(halves_added(products[r]), offsets::<5>(packed, sums[r]));
                }
                lanes
            }
        }
    }

    /// `super::quantize_span` on AVX-512 F and BW, with the same
    /// operations on sixteen values at a time: the same levels, sums and
    /// step.
    ///
    /// # Safety
    /// `values` holds a span ([`SPAN`] values) and `levels` and `sums` room for
    /// its levels and their sums; the CPU has AVX-512 F and BW.
    #[target_feature(enable = "avx512f,avx512bw")]
    pub unsafe fn quantize_span_avx512(values: &[f32], levels: &mut [i8], sums: &mut [i16]) -> f32 {
        assert!(values.len() == SPAN && levels.len() == SPAN && sums.len() == SPAN / SUM_VALUES, "a span");
        let vectors: [__m512; SPAN / 16] =
            // SAFETY: as the caller promises (the function's `# Safety`).
            std::array::from_fn(|at| unsafe { _mm512_loadu_ps(values.as_ptr().add(16 * at)) });
        let (mut finite, mut largest) = (u16::MAX, _mm512_setzero_ps());
        for vector in vectors {
            let magnitude = _mm512_abs_ps(vector);
            finite &= _mm512_cmp_ps_mask::<_CMP_LT_OQ>(magnitude, _mm512_set1_ps(f32::INFINITY));
            largest = _mm512_max_ps(largest, magnitude);
        }
        let largest = _mm512_reduce_max_ps(largest);
        if finite != u16::MAX || largest == 0.0 {
            levels.fill(0);
            sums.fill(0);
            return if finite != u16::MAX { f32::NAN } else { 0.0 };
        }
        let inverse = _mm512_set1_ps(127.0 / largest);
        let shifter = _mm512_set1_ps(super::SHIFTER);
        let (low, high) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
        for ((vector, sum), levels) in vectors.into_iter().zip(sums).zip(levels.chunks_exact_mut(16)) {
            let nearest = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(vector, inverse), shifter), shifter);
            let ints = _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(nearest, low), high));
            *sum = _mm512_reduce_add_epi32(ints) as i16;
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe { _mm_storeu_si128(levels.as_mut_ptr().cast(), _mm512_cvtepi32_epi8(ints)) };
        }
        largest / 127.0
    }

    /// [`Columns`] for an instruction set whose features are `$features`.
    macro_rules! columns_with {
        ($isa:ty, $features:literal) => {
            impl Columns for $isa {
                #[inline(always)]
                unsafe fn of<F: KQuant>(operands: Operands) {
                    /// # Safety
                    /// As [`Columns::of`]'s.
                    #[target_feature(enable = $features)]
                    unsafe fn compiled<F: KQuant>(operands: Operands) {
                        // SAFETY: as the caller promises, with the features.
                        unsafe { dot_columns_of::<$isa, F>(operands) }
                    }
                    // SAFETY: as the caller promises, on a CPU with the features.
                    unsafe { compiled::<F>(operands) }
                }
            }
        };
    }

    columns_with!(Avx2, "avx2,fma,f16c");
    columns_with!(Avx512<false>, "avx512f,avx512bw,avx2,fma,f16c");
    columns_with!(Avx512<true>, "avx512f,avx512bw,avx512vnni,avx2,fma,f16c");
}

/// [`dot_columns`] over all `columns` of `blocks`, into rows of their own:
/// what the tests compare.
#[cfg(test)]
pub(crate) fn products(
    isa: Isa,
    format: BlockFormat,
    blocks: &[u8],
    inputs: &QuantizedRows,
    columns: usize,
) -> Vec<Vec<f32>> {
    let mut outs = vec![vec![f32::NAN; columns]; inputs.len()];
    let pointers: Vec<*mut f32> = outs.iter_mut().map(|out| out.as_mut_ptr()).collect();
    let row_bytes = blocks.len() / columns;
    // SAFETY: each output row has `columns` values, written by this thread only.
    unsafe { dot_columns(isa, format, blocks, row_bytes, inputs, &pointers, 0..columns) };
    outs
}

#[cfg(test)]
pub(crate) mod tests {
    use super::{products, QuantizedRows, DOT_ROWS, SPAN};
    use crate::isa::Isa;
    use linnet_ir::quant::{self, BlockFormat};

    /// Rows of values like a model's activations: mostly small, a few
    /// large, of both signs, from `seed`.
    pub(crate) fn activations(count: usize, depth: usize, seed: u64) -> Vec<f32> {
        let mut state = seed | 1;
        (0..count * depth)
            .map(|at| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                let unit = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                if at % 97 == 5 {
                    unit * 40.0
                } else {
                    unit
                }
            })
            .collect()
    }

    /// Every format, at depths of whole spans and, for the formats whose
    /// blocks are runs of 32, with a last span of 96 values and of 32.
    fn formats_and_depths() -> impl Iterator<Item = (BlockFormat, usize)> {
        BlockFormat::ALL.into_iter().flat_map(|format| {
            let partial = format.block_values() == 32;
            [4 * SPAN, 4 * SPAN + 96, 2 * SPAN + 32]
                .into_iter()
                .filter(move |depth| partial || *depth == 4 * SPAN)
                .map(move |depth| (format, depth))
        })
    }

    /// The value level `k` of row `row` stands for.
    fn value(inputs: &QuantizedRows, row: usize, k: usize) -> f32 {
        step(inputs, row, k) * f32::from(inputs.levels[row * inputs.depth + k])
    }

    /// The step of value `k` of row `row`.
    fn step(inputs: &QuantizedRows, row: usize, k: usize) -> f32 {
        inputs.steps[row * inputs.depth.div_ceil(SPAN) + k / SPAN]
    }

    /// The shifter's rounding is `round_ties_even`'s: at every half
    /// integer of the levels' range and beyond, on either side of it, and
    /// over a spread of other values.
    #[test]
    fn levels_round_half_to_even() {
        let halves = (-600..=600).map(|twice| twice as f32 / 2.0);
        let near = halves.flat_map(|x| [x.next_down(), x, x.next_up()]);
        let spread = (0..100_000).map(|i| (i as f32 * 0.618_034).sin() * 300.0);
        for x in near.chain(spread).chain([4_194_303.5, -4_194_302.5, 1e-40, -0.0]) {
            // Equal as values: a negative fraction may round to +0.
            assert_eq!(super::nearest_even(x), x.round_ties_even(), "{x}");
        }
        assert_eq!(super::nearest_even(f32::INFINITY), f32::INFINITY);
        assert!(super::nearest_even(f32::NAN).is_nan());
    }

    /// The vector quantizing gives the plain loops' levels, sums and step
    /// (which are the levels' sums, and on ties round to even): over
    /// activations, spans with a NaN or an infinity, zeros and negative
    /// zeros, and values whose levels fall on ties.
    #[test]
    fn every_isa_quantizes_alike() {
        let mut spans: Vec<Vec<f32>> = (0..40).map(|seed| activations(1, SPAN, seed)).collect();
        // The largest is 127, so each level is its value, on a tie but the last.
        let ties: Vec<f32> = (0..SPAN - 1).map(|at| (at % 200) as f32 - 99.5).chain([127.0]).collect();
        spans.push(ties.clone());
        spans.push(vec![0.0; SPAN]);
        spans.push((0..SPAN).map(|at| if at % 2 == 0 { -0.0 } else { 0.0 }).collect());
        for poison in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut span = activations(1, SPAN, 5);
            span[200] = poison;
            spans.push(span);
        }
        for (number, span) in spans.iter().enumerate() {
            let (mut levels, mut sums) = ([0i8; SPAN], [0i16; SPAN / 16]);
            let step = super::quantize_span(span, &mut levels, &mut sums);
            for (sum, levels) in sums.iter().zip(levels.chunks_exact(16)) {
                assert_eq!(*sum, levels.iter().map(|level| i16::from(*level)).sum::<i16>(), "span {number}");
            }
            if *span == ties {
                let rounded: Vec<i8> = ties.iter().map(|value| value.round_ties_even() as i8).collect();
                assert_eq!((step, levels.to_vec()), (1.0, rounded), "ties");
            }
            #[cfg(target_arch = "x86_64")]
            if Isa::available().contains(&Isa::Avx512) {
                let (mut vector_levels, mut vector_sums) = ([0i8; SPAN], [0i16; SPAN / 16]);
                // SAFETY: the CPU has AVX-512.
                let vector_step =
                    unsafe { super::x86::quantize_span_avx512(span, &mut vector_levels, &mut vector_sums) };
                assert_eq!(vector_step.to_bits(), step.to_bits(), "span {number}");
                assert_eq!((vector_levels, vector_sums), (levels, sums), "span {number}");
            }
        }
    }

    /// Quantizing is as stated: each level within half a step of its
    /// value, the largest magnitude at ±127, sums of 16 levels; zeros
    /// stay zeros, and a NaN spoils its span's step only.
    #[test]
    fn inputs_are_quantized_per_span() {
        let depth = 2 * SPAN;
        let mut values = activations(1, depth, 7);
        values[3] = f32::NAN;
        values[SPAN..SPAN + 16].fill(0.0);
        let quantized = QuantizedRows::new([values.as_slice()].into_iter(), depth);
        assert!(quantized.steps[0].is_nan());
        let step = quantized.steps[1];
        let largest = values[SPAN..].iter().fold(0f32, |m, v| m.max(v.abs()));
        assert_eq!(step, largest / 127.0);
        assert!(quantized.levels[SPAN..].iter().any(|level| level.unsigned_abs() == 127));
        for (k, exact) in values.iter().enumerate().skip(SPAN) {
            assert!((value(&quantized, 0, k) - exact).abs() <= step / 2.0 * 1.000_01, "value {k}");
        }
        assert_eq!(quantized.sums[SPAN / 16], 0, "a span of zeros");
        let sum: i16 = quantized.levels[SPAN + 16..SPAN + 32].iter().map(|l| i16::from(*l)).sum();
        assert_eq!(quantized.sums[SPAN / 16 + 1], sum);
    }

    /// A row whose depth the span does not divide ends with a span of its
    /// own: the values left, with their own step, rows after it in place.
    #[test]
    fn a_rows_last_span_takes_the_values_left() {
        let depth = SPAN + 64;
        let mut values = activations(2, depth, 9);
        values[SPAN..depth].iter_mut().for_each(|value| *value *= 1e-3);
        let quantized = QuantizedRows::new(values.chunks_exact(depth), depth);
        assert_eq!((quantized.len(), quantized.steps.len()), (2, 4));
        for row in 0..2 {
            let last = &values[row * depth + SPAN..(row + 1) * depth];
            let largest = last.iter().fold(0f32, |m, v| m.max(v.abs()));
            assert_eq!(quantized.steps[2 * row + 1], largest / 127.0, "row {row}");
            for (k, exact) in values[row * depth..(row + 1) * depth].iter().enumerate() {
                let step = quantized.steps[2 * row + k / SPAN];
                let level = f32::from(quantized.levels[row * depth + k]);
                assert!((step * level - exact).abs() <= step / 2.0 * 1.000_01, "row {row} value {k}");
            }
        }
    }

    /// Every instruction set computes the portable loops' bits, for every
    /// count of rows a pass takes and counts past it (whole passes and a
    /// tail), over arbitrary blocks (any levels, any scales).
    #[test]
    fn every_isa_computes_the_same_bits() {
        let columns = 5;
        for (format, depth) in formats_and_depths() {
            let count = columns * depth / format.block_values();
            let blocks = quant::arbitrary_blocks(format, count, 0x5851_f42d_4c95_7f2d);
            for rows in (1..=DOT_ROWS).chain([2 * DOT_ROWS, 2 * DOT_ROWS + 3]) {
                let values = activations(rows, depth, rows as u64);
                let inputs = QuantizedRows::new(values.chunks_exact(depth), depth);
                let expected = products(Isa::Portable, format, &blocks, &inputs, columns);
                let mut runs: Vec<(String, Vec<Vec<f32>>)> = Isa::available()
                    .into_iter()
                    .map(|isa| (format!("{isa:?}"), products(isa, format, &blocks, &inputs, columns)))
                    .collect();
                #[cfg(target_arch = "x86_64")]
                if super::has_vnni() {
                    // The AVX-512 sums without VNNI's, which this CPU would not take.
                    let mut outs = vec![vec![f32::NAN; columns]; inputs.len()];
                    let pointers: Vec<*mut f32> = outs.iter_mut().map(|out| out.as_mut_ptr()).collect();
                    let row_bytes = blocks.len() / columns;
                    let operands = super::Operands {
                        blocks: &blocks,
                        row_bytes,
                        inputs: &inputs,
                        outs: &pointers,
                        range: 0..columns,
                    };
                    // SAFETY: each output row has `columns` values; the CPU has AVX-512.
                    unsafe { super::dot_columns_in::<super::x86::Avx512<false>>(format, operands) };
                    runs.push(("Avx512 without VNNI".into(), outs));
                }
                for (isa, ours) in runs {
                    for (r, (ours, expected)) in ours.iter().zip(&expected).enumerate() {
                        for (n, (a, b)) in ours.iter().zip(expected).enumerate() {
                            assert_eq!(a.to_bits(), b.to_bits(), "{format} on {isa}, {rows} rows: row {r} column {n}");
                        }
                    }
                }
            }
        }
    }

    /// The products are those of the quantized inputs (up to f32
    /// rounding of their scales), and so within the contract's bound of
    /// the exact ones: `Σₖ |wₖ| · step / 2` for each span.
    #[test]
    fn products_meet_the_contracts_bound() {
        let columns = 7;
        for (format, depth) in formats_and_depths() {
            let values: Vec<f32> = activations(1, columns * depth, 11);
            let blocks = quant::quantize(format, &values).unwrap();
            let mut weights = vec![0f32; columns * depth];
            quant::dequantize(format, &blocks, &mut weights).unwrap();
            let inputs = activations(DOT_ROWS + 2, depth, 3);
            let quantized = QuantizedRows::new(inputs.chunks_exact(depth), depth);
            let ours = products(Isa::host(), format, &blocks, &quantized, columns);
            for (r, ours) in ours.iter().enumerate() {
                for (n, ours) in ours.iter().enumerate() {
                    let weights = &weights[n * depth..(n + 1) * depth];
                    let input = &inputs[r * depth..(r + 1) * depth];
                    let (mut exact, mut of_quantized, mut bound, mut magnitude) = (0f64, 0f64, 0f64, 0f64);
                    for (k, (w, x)) in weights.iter().zip(input).enumerate() {
                        let step = f64::from(step(&quantized, r, k));
                        exact += f64::from(*w) * f64::from(*x);
                        of_quantized += f64::from(*w) * f64::from(value(&quantized, r, k));
                        bound += f64::from(w.abs()) * step / 2.0;
                        magnitude += f64::from(w.abs()) * f64::from(value(&quantized, r, k).abs());
                    }
                    let ours = f64::from(*ours);
                    assert!(
                        (ours - of_quantized).abs() <= magnitude * 1e-5,
                        "{format} row {r} column {n}: {ours} vs {of_quantized}"
                    );
                    assert!(
                        (ours - exact).abs() <= bound * 1.001,
                        "{format} row {r} column {n}: {ours} vs {exact}, bound {bound}"
                    );
                }
            }
        }
    }
}
