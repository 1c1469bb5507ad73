//! Weight rows in block formats decoded into f32 for the matrix kernel
//! (`matmul`), a few rows at a time. The values are exactly the blocks'
//! dequantized values as `linnet_ir::quant::dequantize` defines them (the
//! same operations in the same order, no fused multiply-add), so a product
//! over decoded rows has the numerics of a product over f32 weights.
//!
//! A few input rows against many weight rows ([`dot_columns`], a decode
//! step's products) take the values straight from registers into their
//! sums, in f32 fused multiply-adds over the lanes. Q6_K multiplies its
//! decoded values; Q8_0 and Q4_K apply each block's (group's) scale once
//! to the block's sum of levels times inputs, and Q4_K its minimum to the
//! inputs' sum, as `docs/language.md` allows. They ask for the weights
//! ahead of the block in hand ([`prefetch_ahead`]).
//!
//! The formats are written once over [`ByteLanes`] (a [`Decoder`] each),
//! small integers widened to i32 lanes and converted, and instantiated for
//! AVX-512 (sixteen lanes) and AVX2 (eight) inside functions with those
//! target features (the blocks' f16 scales widened by F16C, exactly);
//! other CPUs decode with `quant::dequantize` itself. Everything the
//! decoders call is inlined into those functions (no closures over arrays:
//! a call out of them would lose the features).

use super::isa::Isa;
use super::simd::Lanes;
use linnet_ir::quant::{self, layouts, BlockFormat, Offset};

/// Row `blocks` (whole blocks of `format`) decoded into `out`, on `isa`.
pub fn row(isa: Isa, format: BlockFormat, blocks: &[u8], out: &mut [f32]) {
    assert_eq!(format.row_bytes(out.len()), Some(blocks.len()), "rows of whole blocks");
    // SAFETY: the CPU has `isa`'s features (`matmul` runs on the ones it
    // has), and the sizes were checked above.
    unsafe {
        match isa.lanes() {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => x86::row_avx512(format, blocks, out),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::row_avx2(format, blocks, out),
            _ => quant::dequantize(format, blocks, out).expect("rows of whole blocks"),
        }
    }
}

/// Row `blocks` (whole blocks of `format`) decoded, each value rounded to
/// the nearest bf16, ties to even (`numerics::bf16_bits` of [`row`]'s
/// values), into `out` as bits, on `isa`. On AVX-512 BF16 in one pass, the
/// values never stored as f32: its conversion rounds so (it would flush
/// subnormal values to zero, but no decoded value is one: each is a
/// multiple of 2⁻²⁴, the least step of an f16 scale); elsewhere the
/// decoded row is rounded value by value.
pub fn row_bf16(isa: Isa, format: BlockFormat, blocks: &[u8], out: &mut [u16]) {
    assert_eq!(format.row_bytes(out.len()), Some(blocks.len()), "rows of whole blocks");
    #[cfg(target_arch = "x86_64")]
    if isa.has_bf16_dots() {
        // SAFETY: the CPU has `isa`'s features, the sizes were checked.
        return unsafe { x86::row_bf16_avx512(format, blocks, out) };
    }
    let mut values = vec![0f32; out.len()];
    row(isa, format, blocks, &mut values);
    out.iter_mut().zip(values).for_each(|(bits, value)| *bits = linnet_ir::numerics::bf16_bits(value));
}

/// i32 lanes of small integers and their conversion to the f32 lanes of
/// `Lanes`.
///
/// # Safety
/// As [`Lanes`]: the CPU has the set's instructions; `load_u8`,
/// `load_i8` and `load_i8_from` read `WIDTH` bytes, `splat_half` two and
/// `splat_from` one f32 at their pointer, `minus_products8` eight f32 at
/// each of its two, and `q6_k_levels` a whole Q6_K block.
trait ByteLanes: Lanes {
    type I: Copy;
    /// `WIDTH` bytes at `at`, zero-extended.
    unsafe fn load_u8(at: *const u8) -> Self::I;
    /// `WIDTH` bytes at `at`, sign-extended.
    unsafe fn load_i8(at: *const u8) -> Self::I;
    unsafe fn shift_right(v: Self::I, bits: u32) -> Self::I;
    unsafe fn and(v: Self::I, mask: i32) -> Self::I;
    unsafe fn float(v: Self::I) -> Self::V;
    /// Every lane the f16 at `at`, widened exactly (see [`half_at`]).
    unsafe fn splat_half(at: *const u8) -> Self::V;
    unsafe fn add(a: Self::V, b: Self::V) -> Self::V;
    /// Every lane the f32 at `at`, broadcast by a load even where the
    /// compiler knows the value (a shuffle would take the port the
    /// widening and converting need).
    ///
    /// # Safety
    /// `at` points at a readable f32; the CPU has `$feature`.
    unsafe fn splat_from(at: *const f32) -> Self::V;
    /// [`ByteLanes::load_i8`] as a load even where the compiler knows the
    /// bytes (for the same reason).
    ///
    /// # Safety
    /// `at` points at `$width` readable bytes; the CPU has `$feature`.
    unsafe fn load_i8_from(at: *const i8) -> Self::I;
    /// `acc` less `a[i] · b[i]` in each of its first eight lanes (the
    /// others kept).
    unsafe fn minus_products8(acc: Self::V, a: *const f32, b: *const f32) -> Self::V;
    /// `table[i]` in each lane, `i` the lane's integer (below 16).
    unsafe fn lookup16(indices: Self::I, table: &[f32; 16]) -> Self::V;
    /// A Q6_K block's 256 levels `q − 32` (`quant::q6_k_levels`).
    #[inline(always)]
    unsafe fn q6_k_levels(block: *const u8) -> [i8; 256] {
        // SAFETY: as the caller promises, the block is whole.
        quant::q6_k_levels(unsafe { std::slice::from_raw_parts(block, 192) })
    }
}

/// The f16 at byte `at` of `block` (which has it), widened by F16C:
/// exactly `quant::f16_at`'s value, without its branches. The half is
/// broadcast into a whole register first: an insert into a register's low
/// lane (what a scalar load compiles to) would wait on the register's
/// last writer, often the sum the previous block added into.
///
/// # Safety
/// `block` has two readable bytes at `at`; the CPU has F16C.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "f16c")]
#[inline]
pub(crate) unsafe fn half_at(block: *const u8, at: usize) -> f32 {
    use std::arch::x86_64::{_mm_cvtph_ps, _mm_cvtss_f32, _mm_set1_epi16};
    // SAFETY: as the caller promises.
    let bits = unsafe { block.add(at).cast::<i16>().read_unaligned() };
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_set1_epi16(i16::from_le(bits))))
}

/// # Safety
/// `block` has two readable bytes at `at`.
#[cfg(not(target_arch = "x86_64"))]
unsafe fn half_at(block: *const u8, at: usize) -> f32 {
    // SAFETY: as the caller promises.
    quant::f16_at(unsafe { std::slice::from_raw_parts(block, at + 2) }, at)
}

/// A block format's decoder: a block's values in pairs of vectors (`2 ·
/// WIDTH` values from `at`), handed to `sink` in order.
///
/// # Safety
/// Every method: `block` is a whole block of the format (`BYTES`
/// readable bytes), and the CPU has `L`'s instructions; `dot`'s input
/// rows have the block's `VALUES` readable values from their first (and
/// their sums of each 32 when `INPUT_SUMS`).
trait Decoder {
    const VALUES: usize;
    const BYTES: usize;
    /// Whether [`Decoder::dot`] reads the sums of each 32 inputs.
    const INPUT_SUMS: bool = false;
    unsafe fn pairs<L: ByteLanes>(block: *const u8, sink: &mut impl FnMut(usize, L::V, L::V));

    /// Adds `Σₖ inputs[r][k] · value[k]` over the block to `sums[r]` (two
    /// vectors a row; what counts is their lanes' total) for `R` input
    /// rows from the block's first value, `input_sums[r]` their sums over
    /// each 32 values when `INPUT_SUMS`. By default the decoded values
    /// times the inputs, in fused multiply-adds, a chain for each vector
    /// of a pair.
    #[inline(always)]
    unsafe fn dot<L: ByteLanes, const R: usize>(
        block: *const u8,
        inputs: [*const f32; R],
        _input_sums: [*const f32; R],
        sums: &mut [[L::V; R]; 2],
    ) {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            Self::pairs::<L>(block, &mut |at, even, odd| {
                for r in 0..R {
                    sums[0][r] = L::fma(L::load(inputs[r].add(at)), even, sums[0][r]);
                    sums[1][r] = L::fma(L::load(inputs[r].add(at + L::WIDTH)), odd, sums[1][r]);
                }
            })
        }
    }
}

struct Q8_0;
struct Q4K;
struct Q6K;

impl Decoder for Q8_0 {
    const VALUES: usize = 32;
    const BYTES: usize = 34;

    /// `d · q` for each of the block's 32 values.
    #[inline(always)]
    unsafe fn pairs<L: ByteLanes>(block: *const u8, sink: &mut impl FnMut(usize, L::V, L::V)) {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            let d = L::splat_half(block);
            let value = |at: usize| L::mul(d, L::float(L::load_i8(block.add(2 + at))));
            for at in (0..32).step_by(2 * L::WIDTH) {
                sink(at, value(at), value(at + L::WIDTH));
            }
        }
    }

    /// `d · Σₖ qₖ · inputₖ`: the scale applied once to the block's sum.
    #[inline(always)]
    unsafe fn dot<L: ByteLanes, const R: usize>(
        block: *const u8,
        inputs: [*const f32; R],
        _input_sums: [*const f32; R],
        sums: &mut [[L::V; R]; 2],
    ) {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            let mut parts = [[L::zero(); R]; 2];
            for at in (0..32).step_by(2 * L::WIDTH) {
                let (even, odd) =
                    (L::float(L::load_i8(block.add(2 + at))), L::float(L::load_i8(block.add(2 + at + L::WIDTH))));
                for r in 0..R {
                    parts[0][r] = L::fma(even, L::load(inputs[r].add(at)), parts[0][r]);
                    parts[1][r] = L::fma(odd, L::load(inputs[r].add(at + L::WIDTH)), parts[1][r]);
                }
            }
            let d = L::splat_half(block);
            for r in 0..R {
                sums[0][r] = L::fma(d, L::add(parts[0][r], parts[1][r]), sums[0][r]);
            }
        }
    }
}

impl Decoder for Q4K {
    const VALUES: usize = 256;
    const BYTES: usize = 144;
    const INPUT_SUMS: bool = true;

    /// `(d · scale) · q − dmin · min` for each of the block's 256 values:
    /// four chunks of 32 bytes, the low nibbles one group, the high the
    /// next (each chunk's bytes loaded once for both). The product is
    /// exact (an f16 times a 6-bit scale times a 4-bit level: at most 21
    /// significant bits), so one fused multiply-subtract rounds where the
    /// definition's subtraction does.
    #[inline(always)]
    unsafe fn pairs<L: ByteLanes>(block: *const u8, sink: &mut impl FnMut(usize, L::V, L::V)) {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            let steps = q4_k_steps::<L>(block);
            for chunk in 0..4 {
                let (low_step, low_offset) = (L::splat(steps[chunk * 2]), L::splat(-steps[8 + chunk * 2]));
                let (high_step, high_offset) = (L::splat(steps[chunk * 2 + 1]), L::splat(-steps[9 + chunk * 2]));
                for l in (0..32).step_by(2 * L::WIDTH) {
                    let at = block.add(16 + chunk * 32 + l);
                    let (even, odd) = (L::load_u8(at), L::load_u8(at.add(L::WIDTH)));
                    let low = |b| L::fma(low_step, L::float(L::and(b, 0xf)), low_offset);
                    sink(chunk * 64 + l, low(even), low(odd));
                    // Bytes widened to 32 bits: the high nibble is the byte shifted.
                    let high = |b| L::fma(high_step, L::float(L::shift_right(b, 4)), high_offset);
                    sink(chunk * 64 + 32 + l, high(even), high(odd));
                }
            }
        }
    }

    /// `(d · scale) · Σₖ qₖ · inputₖ − (dmin · min) · Σₖ inputₖ` for each
    /// group of 32: each group's step applied once to its sum, its offset
    /// to the inputs' sum.
    #[inline(always)]
    unsafe fn dot<L: ByteLanes, const R: usize>(
        block: *const u8,
        inputs: [*const f32; R],
        input_sums: [*const f32; R],
        sums: &mut [[L::V; R]; 2],
    ) {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            let steps = q4_k_steps::<L>(block);
            for chunk in 0..4 {
                let (mut low, mut high) = ([L::zero(); R], [L::zero(); R]);
                for l in (0..32).step_by(L::WIDTH) {
                    let bytes = L::load_u8(block.add(16 + chunk * 32 + l));
                    // Bytes widened to 32 bits: the high nibble is the byte shifted.
                    let (low_q, high_q) = (L::float(L::and(bytes, 0xf)), L::float(L::shift_right(bytes, 4)));
                    for r in 0..R {
                        low[r] = L::fma(low_q, L::load(inputs[r].add(chunk * 64 + l)), low[r]);
                        high[r] = L::fma(high_q, L::load(inputs[r].add(chunk * 64 + 32 + l)), high[r]);
                    }
                }
                let (low_step, high_step) = (L::splat_from(&steps[chunk * 2]), L::splat_from(&steps[chunk * 2 + 1]));
                for r in 0..R {
                    sums[0][r] = L::fma(low_step, low[r], sums[0][r]);
                    sums[1][r] = L::fma(high_step, high[r], sums[1][r]);
                }
            }
            for r in 0..R {
                sums[1][r] = L::minus_products8(sums[1][r], steps.as_ptr().add(8), input_sums[r]);
            }
        }
    }
}

/// A Q4_K block's eight groups' `d · scale`, then their `dmin · min`
/// (exact: an f16 times a six-bit integer), to be splat as needed.
///
/// # Safety
/// `block` is a whole Q4_K block; the CPU has `L`'s instruction set.
#[inline(always)]
unsafe fn q4_k_steps<L: ByteLanes>(block: *const u8) -> [f32; 16] {
    // SAFETY: as the caller promises (the function's `# Safety`).
    unsafe {
        let levels = quant::q4_k_scales_mins(std::slice::from_raw_parts(block.add(4), 12));
        let (d, dmin) = (half_at(block, 0), half_at(block, 2));
        let factors: [f32; 16] = std::array::from_fn(|at| if at < 8 { d } else { dmin });
        let mut steps = [0f32; 16];
        for at in (0..16).step_by(L::WIDTH) {
            let level = L::float(L::load_u8(levels.as_ptr().add(at)));
            L::store(steps.as_mut_ptr().add(at), L::mul(L::load(factors.as_ptr().add(at)), level));
        }
        steps
    }
}

impl Decoder for Q6K {
    const VALUES: usize = 256;
    const BYTES: usize = 210;

    /// `(d · scale) · (q − 32)` for each of the block's 256 values: their
    /// levels `q − 32` assembled as bytes first ([`ByteLanes::q6_k_levels`]), then
    /// widened sixteen or eight at a time.
    #[inline(always)]
    unsafe fn pairs<L: ByteLanes>(block: *const u8, sink: &mut impl FnMut(usize, L::V, L::V)) {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            // The sixteen `d · scale` (exact: an f16 times an i8), one per
            // sixteen values, splat from here as needed.
            let d = L::splat_half(block.add(208));
            let mut steps = [0f32; 16];
            for at in (0..16).step_by(L::WIDTH) {
                L::store(steps.as_mut_ptr().add(at), L::mul(d, L::float(L::load_i8(block.add(192 + at)))));
            }
            let levels = L::q6_k_levels(block);
            let value =
                |at: usize| L::mul(L::splat_from(&steps[at / 16]), L::float(L::load_i8_from(levels.as_ptr().add(at))));
            for at in (0..256).step_by(2 * L::WIDTH) {
                sink(at, value(at), value(at + L::WIDTH));
            }
        }
    }
}

/// The formats without a decoder of their own (`BlockFormat::ALL[FORMAT]`):
/// a vector of levels at a time ([`level_lanes`]), each value its group's
/// `step · level` (the block's group scales read once, in scalar code,
/// as `quant::layouts::group_scale` reads them), with the offset added in
/// a fused multiply-add where the format has one. That rounds where the
/// definition's addition does: every such format's `step · level` is
/// exact (an f16 times a scale of at most six bits times a level of at
/// most seven: at most 24 significant bits). A decode step's products
/// apply each group's scale once instead (`Decoder::dot`).
struct Levelled<const FORMAT: usize>;

impl<const FORMAT: usize> Levelled<FORMAT> {
    const FORMAT: BlockFormat = BlockFormat::ALL[FORMAT];
    const GROUPS: usize = Self::FORMAT.block_values() / Self::FORMAT.group_values();

    /// The block's group steps and offsets (their f16s widened by F16C;
    /// an offset signed as it is added, zero where the format has none),
    /// and Q5_0's and Q5_1's fifth bits a byte each (zeros for the other
    /// formats).
    ///
    /// # Safety
    /// `block` is a whole block of the format; the CPU has F16C.
    #[inline(always)]
    unsafe fn scales_and_fifth_bits(block: *const u8) -> ([f32; 16], [f32; 16], [u8; 32]) {
        // SAFETY: as the caller promises.
        unsafe {
            let bytes = std::slice::from_raw_parts(block, Self::FORMAT.block_bytes());
            let (mut steps, mut offsets) = ([0f32; 16], [0f32; 16]);
            for group in 0..Self::GROUPS {
                let scale =
                    layouts::group_scale_reading(Self::FORMAT, bytes, group, |bytes, at| half_at(bytes.as_ptr(), at));
                steps[group] = scale.step;
                offsets[group] = match scale.offset {
                    Offset::None => 0.0,
                    Offset::Plus(offset) => offset,
                    Offset::Minus(offset) => -offset,
                };
            }
            let mut fifth = [0u8; 32];
            if let Some(start) = fifth_bits_at(Self::FORMAT) {
                fifth.iter_mut().enumerate().for_each(|(at, bit)| *bit = layouts::fifth_bit(bytes, start, at));
            }
            (steps, offsets, fifth)
        }
    }

    /// A group's values from their levels: `step · level`, the offset
    /// added in a fused multiply-add where the format has one (exact
    /// products: see [`Levelled`]).
    ///
    /// # Safety
    /// The CPU has `L`'s instructions.
    #[inline(always)]
    unsafe fn scaled<L: ByteLanes>(step: f32, offset: f32, level: L::V) -> L::V {
        // SAFETY: as the caller promises.
        unsafe {
            match Self::FORMAT.has_offset() {
                true => L::fma(L::splat(step), level, L::splat(offset)),
                false => L::mul(L::splat(step), level),
            }
        }
    }
}

impl<const FORMAT: usize> Decoder for Levelled<FORMAT> {
    const VALUES: usize = BlockFormat::ALL[FORMAT].block_values();
    const BYTES: usize = BlockFormat::ALL[FORMAT].block_bytes();

    #[inline(always)]
    unsafe fn pairs<L: ByteLanes>(block: *const u8, sink: &mut impl FnMut(usize, L::V, L::V)) {
        let (format, group_values) = (Self::FORMAT, Self::FORMAT.group_values());
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            let (steps, offsets, fifth) = Self::scales_and_fifth_bits(block);
            for at in (0..Self::VALUES).step_by(2 * L::WIDTH) {
                let (group, next) = (at / group_values, (at + L::WIDTH) / group_values);
                let even = Self::scaled::<L>(steps[group], offsets[group], level_lanes::<L>(format, block, at, &fifth));
                let odd_level = level_lanes::<L>(format, block, at + L::WIDTH, &fifth);
                let odd = Self::scaled::<L>(steps[next], offsets[next], odd_level);
                sink(at, even, odd);
            }
        }
    }

    /// `step · Σₖ levelₖ · inputₖ ± offset · Σₖ inputₖ` for each group:
    /// its step applied once to the group's sum of levels times inputs,
    /// its offset to the inputs' sum (as Q4_K's `dot` does), the groups'
    /// sums in two chains.
    #[inline(always)]
    unsafe fn dot<L: ByteLanes, const R: usize>(
        block: *const u8,
        inputs: [*const f32; R],
        _input_sums: [*const f32; R],
        sums: &mut [[L::V; R]; 2],
    ) {
        let (format, group_values) = (Self::FORMAT, Self::FORMAT.group_values());
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            let (steps, offsets, fifth) = Self::scales_and_fifth_bits(block);
            for group in 0..Self::GROUPS {
                let (mut parts, mut input_sums) = ([L::zero(); R], [L::zero(); R]);
                for at in (group * group_values..(group + 1) * group_values).step_by(L::WIDTH) {
                    let level = level_lanes::<L>(format, block, at, &fifth);
                    for r in 0..R {
                        let input = L::load(inputs[r].add(at));
                        parts[r] = L::fma(level, input, parts[r]);
                        if format.has_offset() {
                            input_sums[r] = L::add(input_sums[r], input);
                        }
                    }
                }
                let (chain, step, offset) = (group % 2, L::splat(steps[group]), L::splat(offsets[group]));
                for r in 0..R {
                    sums[chain][r] = L::fma(step, parts[r], sums[chain][r]);
                    if format.has_offset() {
                        sums[chain][r] = L::fma(offset, input_sums[r], sums[chain][r]);
                    }
                }
            }
        }
    }
}

/// Where Q5_0's and Q5_1's u32 of fifth bits starts in a block.
#[inline(always)]
fn fifth_bits_at(format: BlockFormat) -> Option<usize> {
    match format {
        BlockFormat::Q5_0 => Some(2),
        BlockFormat::Q5_1 => Some(4),
        _ => None,
    }
}

/// IQ4_NL's and IQ4_XS's levels, and MXFP4's, as f32s to look up.
const IQ4_LEVELS: [f32; 16] = levels_as_floats(layouts::IQ4_LEVELS);
const MXFP4_LEVELS: [f32; 16] = levels_as_floats(layouts::MXFP4_LEVELS);

const fn levels_as_floats(levels: [i8; 16]) -> [f32; 16] {
    let mut floats = [0f32; 16];
    let mut at = 0;
    while at < 16 {
        floats[at] = levels[at] as f32;
        at += 1;
    }
    floats
}

/// The levels of values `at..at + L::WIDTH` of a block of `format` (one
/// of [`Levelled`]'s), as f32 lanes, as `quant::layouts::level` reads
/// them: every format's bits for a vector of values lie in contiguous
/// bytes under one shift (a vector never crosses a half of a run of 32
/// nibbles, or a group), but Q5_0's and Q5_1's fifth bits, which `fifth`
/// holds a byte each.
///
/// # Safety
/// `block` is a whole block of `format`; the CPU has `L`'s instructions.
#[inline(always)]
unsafe fn level_lanes<L: ByteLanes>(format: BlockFormat, block: *const u8, at: usize, fifth: &[u8; 32]) -> L::V {
    // SAFETY: as the caller promises; every read lies in the block (or `fifth`).
    unsafe {
        let (group, l) = (at / 32, at % 32);
        match format {
            BlockFormat::Q4_0 => L::add(L::float(nibbles::<L>(block, 2, at)), L::splat(-8.0)),
            BlockFormat::Q4_1 => L::float(nibbles::<L>(block, 4, at)),
            BlockFormat::Q5_0 => {
                let low = L::add(L::float(nibbles::<L>(block, 6, at)), L::splat(-16.0));
                L::fma(L::float(L::load_u8(fifth.as_ptr().add(l))), L::splat(16.0), low)
            }
            BlockFormat::Q5_1 => {
                let low = L::float(nibbles::<L>(block, 8, at));
                L::fma(L::float(L::load_u8(fifth.as_ptr().add(l))), L::splat(16.0), low)
            }
            BlockFormat::Iq4Nl => L::lookup16(nibbles::<L>(block, 2, at), &IQ4_LEVELS),
            BlockFormat::Mxfp4 => L::lookup16(nibbles::<L>(block, 1, at), &MXFP4_LEVELS),
            BlockFormat::Q2K => L::float(two_bits::<L>(block, 16, at)),
            BlockFormat::Q3K => {
                // A clear high bit (bit `at / 32` of byte `at % 32`) takes 4 off.
                let high = L::float(bits::<L>(block, l, group, 1));
                L::fma(high, L::splat(4.0), L::add(L::float(two_bits::<L>(block, 32, at)), L::splat(-4.0)))
            }
            BlockFormat::Q5K => {
                let low = L::float(bits::<L>(block, 48 + group / 2 * 32 + l, 4 * (group % 2), 0xf));
                L::fma(L::float(bits::<L>(block, 16 + l, group, 1)), L::splat(16.0), low)
            }
            BlockFormat::Iq4Xs => L::lookup16(nibbles::<L>(block, 8 + group * 16, l), &IQ4_LEVELS),
            BlockFormat::Q8_0 | BlockFormat::Q4K | BlockFormat::Q6K => unreachable!("{format} has its own decoder"),
        }
    }
}

/// The bytes from `byte` of `block`, shifted right by `shift` and masked
/// by `mask`, in i32 lanes.
///
/// # Safety
/// `block` has `L::WIDTH` readable bytes from `byte`; the CPU has `L`'s
/// instructions.
#[inline(always)]
unsafe fn bits<L: ByteLanes>(block: *const u8, byte: usize, shift: usize, mask: i32) -> L::I {
    // SAFETY: as the caller promises.
    unsafe { L::and(L::shift_right(L::load_u8(block.add(byte)), shift as u32), mask) }
}

/// The nibbles of values `at % 32..` of a run of 32 nibbles from byte
/// `start` of `block`: values 0–15 low, 16–31 high.
///
/// # Safety
/// As [`bits`], for the run's sixteen bytes.
#[inline(always)]
unsafe fn nibbles<L: ByteLanes>(block: *const u8, start: usize, at: usize) -> L::I {
    // SAFETY: as the caller promises.
    unsafe { bits::<L>(block, start + at % 16, 4 * (at % 32 / 16), 0xf) }
}

/// Q2_K's and Q3_K's two bits of values `at..` from the 64 bytes at
/// `start` of `block`: value `128c + 32s + l` at byte `32c + l`, shifted `2s`.
///
/// # Safety
/// As [`bits`], for the 64 bytes.
#[inline(always)]
unsafe fn two_bits<L: ByteLanes>(block: *const u8, start: usize, at: usize) -> L::I {
    // SAFETY: as the caller promises.
    unsafe { bits::<L>(block, start + at / 128 * 32 + at % 32, 2 * (at % 128 / 32), 3) }
}

/// `$body` with `$decoder` the [`Levelled`] decoder of `$format` (one of
/// the formats without a decoder of their own).
macro_rules! levelled {
    ($format:expr, |$decoder:ident| $body:expr) => {
        levelled!(@arms $format, $decoder, $body, Q4_0 Q4_1 Q5_0 Q5_1 Q2K Q3K Q5K Iq4Nl Iq4Xs Mxfp4)
    };
    (@arms $format:expr, $decoder:ident, $body:expr, $($name:ident)*) => {
        match $format {
            $(BlockFormat::$name => {
                type $decoder = Levelled<{ BlockFormat::$name.index() }>;
                $body
            })*
            BlockFormat::Q8_0 | BlockFormat::Q4K | BlockFormat::Q6K => unreachable!("{} has its own decoder", $format),
        }
    };
}

/// A row of `D`'s blocks, each block's pairs of vectors handed to `sink`
/// with their position in the row, in order.
///
/// # Safety
/// `row` holds whole blocks of `D`; the CPU has `L`'s instruction set.
#[inline(always)]
unsafe fn each_pair<L: ByteLanes, D: Decoder>(row: &[u8], mut sink: impl FnMut(usize, L::V, L::V)) {
    for (number, block) in row.chunks_exact(D::BYTES).enumerate() {
        // SAFETY: the decoders read inside their block.
        unsafe { D::pairs::<L>(block.as_ptr(), &mut |at, even, odd| sink(number * D::VALUES + at, even, odd)) }
    }
}

/// A row of blocks decoded into `out`.
///
/// # Safety
/// `row` holds whole blocks of `format` and `out` room for their values; the
/// CPU has `L`'s instruction set.
#[inline(always)]
unsafe fn decode_row<L: ByteLanes>(format: BlockFormat, row: &[u8], out: &mut [f32]) {
    let out = out.as_mut_ptr();
    // SAFETY: as the caller promises (the function's `# Safety`).
    let store = |at: usize, even: L::V, odd: L::V| unsafe {
        L::store(out.add(at), even);
        L::store(out.add(at + L::WIDTH), odd);
    };
    // SAFETY: `out` has the row's values' room.
    unsafe { each_pair_of::<L>(format, row, store) }
}

/// Each pair of vectors of a row of `format`'s blocks, to `sink`.
///
/// # Safety
/// `row` holds whole blocks of `format`; the CPU has `L`'s instruction set.
#[inline(always)]
unsafe fn each_pair_of<L: ByteLanes>(format: BlockFormat, row: &[u8], sink: impl FnMut(usize, L::V, L::V)) {
    // SAFETY: as the caller promises.
    unsafe {
        match format {
            BlockFormat::Q8_0 => each_pair::<L, Q8_0>(row, sink),
            BlockFormat::Q4K => each_pair::<L, Q4K>(row, sink),
            BlockFormat::Q6K => each_pair::<L, Q6K>(row, sink),
            other => levelled!(other, |D| each_pair::<L, D>(row, sink)),
        }
    }
}

/// The weight rows of `range` in the order a decode step's products take
/// them: the first half's and the second half's by turns, so that the
/// weights stream from two places of memory at once (a thread reading one
/// stream left memory idle between its requests).
pub(crate) fn two_streams(range: std::ops::Range<usize>) -> impl Iterator<Item = usize> {
    let half = range.len().div_ceil(2);
    (0..half).flat_map(move |i| [range.start + i, range.start + half + i]).filter(move |n| *n < range.end)
}

/// Bytes ahead of the block in hand that a product asks for.
const PREFETCH_AHEAD: usize = 2048;

/// Asks for the cache lines [`PREFETCH_AHEAD`] bytes on from those of
/// `block` (into L1, a hint: nothing is read), so that reading the weights
/// from memory overlaps the arithmetic on the block in hand. Into L1, not
/// L2 only: on an AMD EPYC, a decode step's weights stream faster so
/// (the lines are read once, and soon).
#[inline(always)]
pub(crate) fn prefetch_ahead(block: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    for line in (0..block.len()).step_by(64) {
        let at = block.as_ptr().wrapping_add(PREFETCH_AHEAD + line);
        // SAFETY: a prefetch (SSE, on every x86-64) never reads or faults.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(at.cast()) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = block;
}

/// `Σₖ input[r][k] · value[k]` over a row of `D`'s blocks for each of `R`
/// input rows ([`Decoder::dot`]), `input_sums[r]` the sums of each 32
/// inputs of row `r` when `D` reads them.
///
/// # Safety
/// `row` holds whole blocks of `D`; each input row has the row's values
/// readable (and its sums of each 32 when `D::INPUT_SUMS`); the CPU has `L`'s
/// instruction set.
#[inline(always)]
unsafe fn dot_rows<L: ByteLanes, D: Decoder, const R: usize>(
    row: &[u8],
    inputs: [*const f32; R],
    input_sums: [*const f32; R],
) -> [f32; R] {
    // SAFETY: as the caller promises (the function's `# Safety`).
    unsafe {
        let mut sums = [[L::zero(); R]; 2];
        for (number, block) in row.chunks_exact(D::BYTES).enumerate() {
            prefetch_ahead(block);
            let at = number * D::VALUES;
            D::dot::<L, R>(
                block.as_ptr(),
                inputs.map(|input| input.add(at)),
                input_sums.map(|sums| sums.wrapping_add(at / 32)),
                &mut sums,
            );
        }
        let mut totals = [L::zero(); R];
        for (total, (even, odd)) in totals.iter_mut().zip(sums[0].iter().zip(&sums[1])) {
            *total = L::add(*even, *odd);
        }
        L::sums(&totals)
    }
}

/// Columns `range` of `R` output rows: weight row `n` (of `row_bytes`
/// bytes in `blocks`, `D`'s blocks) against each input row.
///
/// # Safety
/// As [`dot_columns`], for `R` rows of `D`'s blocks: each input row has `depth`
/// readable values, each output row room for the columns of `range`, which no
/// other thread writes; the CPU has `L`'s instruction set.
#[inline(always)]
unsafe fn dot_columns_of<L: ByteLanes, D: Decoder, const R: usize>(
    blocks: &[u8],
    row_bytes: usize,
    inputs: &[*const f32],
    outs: &[*mut f32],
    range: std::ops::Range<usize>,
) {
    let inputs: [*const f32; R] = inputs.try_into().expect("R input rows");
    let depth = row_bytes / D::BYTES * D::VALUES;
    // The sums of each 32 inputs, once for every weight row (when read).
    let chunks = if D::INPUT_SUMS { depth / 32 } else { 0 };
    let mut input_sums = vec![0f32; R * chunks];
    for (r, sums) in input_sums.chunks_exact_mut(chunks.max(1)).enumerate() {
        for (chunk, sum) in sums.iter_mut().enumerate() {
            // SAFETY: each input row has `depth` values.
            *sum = unsafe { std::slice::from_raw_parts(inputs[r].add(chunk * 32), 32) }.iter().sum();
        }
    }
    let input_sums: [*const f32; R] = std::array::from_fn(|r| input_sums.as_ptr().wrapping_add(r * chunks));
    for n in two_streams(range) {
        // SAFETY: as `dot_columns`' caller promises.
        unsafe {
            let sums = dot_rows::<L, D, R>(&blocks[n * row_bytes..(n + 1) * row_bytes], inputs, input_sums);
            for (out, sum) in outs.iter().zip(sums) {
                *out.add(n) = sum;
            }
        }
    }
}

/// [`dot_columns_of`] for `format` and as many rows as `inputs` holds
/// (one to [`DOT_ROWS`]).
///
/// # Safety
/// As [`dot_columns_of`], for one to [`DOT_ROWS`] rows.
#[inline(always)]
unsafe fn dot_columns_in<L: ByteLanes>(
    format: BlockFormat,
    blocks: &[u8],
    row_bytes: usize,
    inputs: &[*const f32],
    outs: &[*mut f32],
    range: std::ops::Range<usize>,
) {
    macro_rules! rows {
        ($d:ty) => {
            for_rows!(inputs.len(), dot_columns_of::<L, $d>(blocks, row_bytes, inputs, outs, range))
        };
    }
    // SAFETY: as `dot_columns`' caller promises.
    unsafe {
        match format {
            BlockFormat::Q8_0 => rows!(Q8_0),
            BlockFormat::Q4K => rows!(Q4K),
            BlockFormat::Q6K => rows!(Q6K),
            other => levelled!(other, |D| rows!(D)),
        }
    }
}

/// The most input rows [`dot_columns`] takes at once.
pub const DOT_ROWS: usize = 4;

/// Whether [`dot_columns`] runs on `isa` (else rows are decoded and
/// multiplied).
pub fn dots_on(isa: Isa) -> bool {
    isa != Isa::Portable
}

/// `outs[r][n] = Σₖ inputs[r][k] · value[n, k]` for the columns `n` in
/// `range`, where weight row `n` is `blocks[n · row_bytes..]` (whole
/// blocks of `format`), for one to [`DOT_ROWS`] input rows, on `isa`
/// ([`dots_on`]): each weight row's values go from the registers they are
/// decoded in straight into the rows' sums, with the numerics of `matmul`
/// over the decoded rows.
///
/// # Safety
/// Each input row has `row_bytes`' values' count of readable values; each
/// output row has room for the columns of `range`, which no other thread
/// writes.
pub unsafe fn dot_columns(
    isa: Isa,
    format: BlockFormat,
    blocks: &[u8],
    row_bytes: usize,
    inputs: &[*const f32],
    outs: &[*mut f32],
    range: std::ops::Range<usize>,
) {
    assert!(
        !inputs.is_empty() && inputs.len() <= DOT_ROWS && outs.len() == inputs.len(),
        "one to {DOT_ROWS} input rows, an output row each"
    );
    assert!(
        range.end * row_bytes <= blocks.len() && row_bytes.is_multiple_of(format.block_bytes()),
        "whole rows of blocks"
    );
    // SAFETY: as the caller promises, on a CPU with `isa`.
    unsafe {
        match isa.lanes() {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => x86::dot_columns_avx512(format, blocks, row_bytes, inputs, outs, range),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::dot_columns_avx2(format, blocks, row_bytes, inputs, outs, range),
            _ => unreachable!("no dot products on {}", isa.name()),
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{decode_row, dot_columns_in, each_pair_of, BlockFormat, ByteLanes};
    use crate::simd::{Avx2, Avx512};
    use std::arch::asm;
    use std::arch::x86_64::*;

    /// `splat_from` and `load_i8_from` in inline assembly (the compiler
    /// cannot turn an instruction it does not see into a shuffle), for
    /// vectors `$v`/`$i` in register class `$reg`, `$width` bytes widened.
    macro_rules! loads_from_memory {
        ($v:ty, $i:ty, $reg:ident, $feature:literal, $width:literal) => {
            /// # Safety
            /// [`ByteLanes`]'s contract.
            #[inline]
            #[target_feature(enable = $feature)]
            unsafe fn splat_from(at: *const f32) -> $v {
                let v: $v;
                // SAFETY: as the caller promises (the function's `# Safety`).
                unsafe {
                    asm!("vbroadcastss {v}, dword ptr [{at}]", v = out($reg) v, at = in(reg) at, options(pure, readonly, nostack, preserves_flags))
                };
                v
            }
            /// # Safety
            /// [`ByteLanes`]'s contract.
            #[inline]
            #[target_feature(enable = $feature)]
            unsafe fn load_i8_from(at: *const i8) -> $i {
                let v: $i;
                // SAFETY: as the caller promises (the function's `# Safety`).
                unsafe {
                    asm!(concat!("vpmovsxbd {v}, ", $width, " ptr [{at}]"), v = out($reg) v, at = in(reg) at, options(pure, readonly, nostack, preserves_flags))
                };
                v
            }
        };
    }

    impl ByteLanes for Avx512 {
        type I = __m512i;
        #[inline(always)]
        unsafe fn load_u8(at: *const u8) -> __m512i {
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe { _mm512_cvtepu8_epi32(_mm_loadu_si128(at as *const __m128i)) }
        }
        #[inline(always)]
        unsafe fn load_i8(at: *const u8) -> __m512i {
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe { _mm512_cvtepi8_epi32(_mm_loadu_si128(at as *const __m128i)) }
        }
        #[inline(always)]
        unsafe fn shift_right(v: __m512i, bits: u32) -> __m512i {
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe { _mm512_srlv_epi32(v, _mm512_set1_epi32(bits as i32)) }
        }
        #[inline(always)]
        unsafe fn and(v: __m512i, mask: i32) -> __m512i {
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe { _mm512_and_si512(v, _mm512_set1_epi32(mask)) }
        }
        #[inline(always)]
        unsafe fn float(v: __m512i) -> __m512 {
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe { _mm512_cvtepi32_ps(v) }
        }
        #[inline(always)]
        unsafe fn splat_half(at: *const u8) -> __m512 {
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe { _mm512_cvtph_ps(_mm256_set1_epi16(i16::from_le(at.cast::<i16>().read_unaligned()))) }
        }
        #[inline(always)]
        unsafe fn add(a: __m512, b: __m512) -> __m512 {
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe { _mm512_add_ps(a, b) }
        }
        loads_from_memory!(__m512, __m512i, zmm_reg, "avx512f", "xmmword");
        /// Sixty-four levels an instruction: `ql`'s nibbles masked, `qh`
        /// (in both halves of a register) shifted per half by word so that
        /// each quarter's two bits land at bits 4–5, the two merged.
        #[inline(always)]
        unsafe fn q6_k_levels(block: *const u8) -> [i8; 256] {
            let mut levels = [0i8; 256];
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe {
                let (nibble, high_bits, offset) =
                    (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(0x30), _mm512_set1_epi8(32));
                // Words of the lower half (quarters 0 and 2) and of the upper (1 and 3).
                let (left, right) = (
                    _mm512_inserti64x4::<1>(_mm512_set1_epi16(4), _mm256_set1_epi16(2)),
                    _mm512_inserti64x4::<1>(_mm512_set1_epi16(0), _mm256_set1_epi16(2)),
                );
                for half in 0..2 {
                    let low = _mm512_loadu_si512(block.add(half * 64).cast());
                    let high = _mm512_broadcast_i64x4(_mm256_loadu_si256(block.add(128 + half * 32).cast()));
                    // A | (B & C): the nibbles, and the two bits at 4–5.
                    let first = _mm512_ternarylogic_epi32::<0xf8>(
                        _mm512_and_si512(low, nibble),
                        _mm512_sllv_epi16(high, left),
                        high_bits,
                    );
                    let second = _mm512_ternarylogic_epi32::<0xf8>(
                        _mm512_and_si512(_mm512_srli_epi16::<4>(low), nibble),
                        _mm512_srlv_epi16(high, right),
                        high_bits,
                    );
                    let out = levels.as_mut_ptr().add(half * 128);
                    _mm512_storeu_si512(out.cast(), _mm512_sub_epi8(first, offset));
                    _mm512_storeu_si512(out.add(64).cast(), _mm512_sub_epi8(second, offset));
                }
            }
            levels
        }
        #[inline(always)]
        unsafe fn minus_products8(acc: __m512, a: *const f32, b: *const f32) -> __m512 {
            // Lanes past the eighth load zeros (and read nothing).
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe { _mm512_fnmadd_ps(_mm512_maskz_loadu_ps(0xff, a), _mm512_maskz_loadu_ps(0xff, b), acc) }
        }
        /// One permute of the sixteen values.
        #[inline(always)]
        unsafe fn lookup16(indices: __m512i, table: &[f32; 16]) -> __m512 {
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe { _mm512_permutexvar_ps(indices, _mm512_loadu_ps(table.as_ptr())) }
        }
    }

    impl ByteLanes for Avx2 {
        type I = __m256i;
        #[inline(always)]
        unsafe fn load_u8(at: *const u8) -> __m256i {
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe { _mm256_cvtepu8_epi32(_mm_loadl_epi64(at as *const __m128i)) }
        }
        #[inline(always)]
        unsafe fn load_i8(at: *const u8) -> __m256i {
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe { _mm256_cvtepi8_epi32(_mm_loadl_epi64(at as *const __m128i)) }
        }
        #[inline(always)]
        unsafe fn shift_right(v: __m256i, bits: u32) -> __m256i {
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe { _mm256_srlv_epi32(v, _mm256_set1_epi32(bits as i32)) }
        }
        #[inline(always)]
        unsafe fn and(v: __m256i, mask: i32) -> __m256i {
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe { _mm256_and_si256(v, _mm256_set1_epi32(mask)) }
        }
        #[inline(always)]
        unsafe fn float(v: __m256i) -> __m256 {
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe { _mm256_cvtepi32_ps(v) }
        }
        #[inline(always)]
        unsafe fn splat_half(at: *const u8) -> __m256 {
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe { _mm256_cvtph_ps(_mm_set1_epi16(i16::from_le(at.cast::<i16>().read_unaligned()))) }
        }
        #[inline(always)]
        unsafe fn add(a: __m256, b: __m256) -> __m256 {
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe { _mm256_add_ps(a, b) }
        }
        loads_from_memory!(__m256, __m256i, ymm_reg, "avx2", "qword");
        #[inline(always)]
        unsafe fn minus_products8(acc: __m256, a: *const f32, b: *const f32) -> __m256 {
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe { _mm256_fnmadd_ps(_mm256_loadu_ps(a), _mm256_loadu_ps(b), acc) }
        }
        /// A permute of each half of the table (by the index's low three
        /// bits), the half chosen by its fourth.
        #[inline(always)]
        unsafe fn lookup16(indices: __m256i, table: &[f32; 16]) -> __m256 {
            // SAFETY: as the caller promises (the function's `# Safety`).
            unsafe {
                let low = _mm256_permutevar8x32_ps(_mm256_loadu_ps(table.as_ptr()), indices);
                let high = _mm256_permutevar8x32_ps(_mm256_loadu_ps(table.as_ptr().add(8)), indices);
                let upper = _mm256_castsi256_ps(_mm256_cmpgt_epi32(indices, _mm256_set1_epi32(7)));
                _mm256_blendv_ps(low, high, upper)
            }
        }
    }

    /// # Safety
    /// The CPU has AVX-512 F and BW; `out` holds the row's values.
    #[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
    pub unsafe fn row_avx512(format: BlockFormat, row: &[u8], out: &mut [f32]) {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { decode_row::<Avx512>(format, row, out) }
    }

    /// # Safety
    /// The CPU has AVX-512 BF16; `out` holds the row's values.
    #[target_feature(enable = "avx512f,avx512bw,avx512bf16,avx2,f16c")]
    pub unsafe fn row_bf16_avx512(format: BlockFormat, row: &[u8], out: &mut [u16]) {
        let out = out.as_mut_ptr();
        // SAFETY: `out` has the row's values' room.
        unsafe {
            each_pair_of::<Avx512>(format, row, |at, even, odd| {
                let bits = std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(odd, even));
                _mm512_storeu_si512(out.add(at).cast(), bits);
            })
        }
    }

    /// # Safety
    /// As `super::dot_columns`; the CPU has AVX-512 F and BW.
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    pub unsafe fn dot_columns_avx512(
        format: BlockFormat,
        blocks: &[u8],
        row_bytes: usize,
        inputs: &[*const f32],
        outs: &[*mut f32],
        range: std::ops::Range<usize>,
    ) {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { dot_columns_in::<Avx512>(format, blocks, row_bytes, inputs, outs, range) }
    }

    /// # Safety
    /// The CPU has AVX2; `out` holds the row's values.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn row_avx2(format: BlockFormat, row: &[u8], out: &mut [f32]) {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { decode_row::<Avx2>(format, row, out) }
    }

    /// # Safety
    /// As `super::dot_columns`; the CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_columns_avx2(
        format: BlockFormat,
        blocks: &[u8],
        row_bytes: usize,
        inputs: &[*const f32],
        outs: &[*mut f32],
        range: std::ops::Range<usize>,
    ) {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { dot_columns_in::<Avx2>(format, blocks, row_bytes, inputs, outs, range) }
    }
}

#[cfg(test)]
mod tests {
    use super::{row, row_bf16, two_streams, BlockFormat};
    use crate::isa::Isa;

    /// Two streams take every row of a range once, the halves by turns.
    #[test]
    fn two_streams_take_every_row_once() {
        assert_eq!(two_streams(3..8).collect::<Vec<_>>(), [3, 6, 4, 7, 5]);
        assert_eq!(two_streams(0..4).collect::<Vec<_>>(), [0, 2, 1, 3]);
        assert_eq!(two_streams(5..5).count(), 0);
        for end in 0..40 {
            let mut rows: Vec<usize> = two_streams(7..7 + end).collect();
            rows.sort_unstable();
            assert_eq!(rows, (7..7 + end).collect::<Vec<_>>());
        }
    }

    /// Every instruction set decodes arbitrary blocks (any scales, any
    /// levels) to exactly `quant::dequantize`'s values, bit for bit.
    #[test]
    fn every_isa_decodes_exactly_as_the_definition() {
        for format in BlockFormat::ALL {
            let bytes = linnet_ir::quant::arbitrary_blocks(format, 4, 0x9e37_79b9_7f4a_7c15);
            let mut expected = vec![0f32; 4 * format.block_values()];
            linnet_ir::quant::dequantize(format, &bytes, &mut expected).unwrap();
            for isa in Isa::available() {
                let mut out = vec![f32::NAN; expected.len()];
                row(isa, format, &bytes, &mut out);
                for (at, (a, b)) in out.iter().zip(&expected).enumerate() {
                    assert_eq!(a.to_bits(), b.to_bits(), "{format} on {isa:?}, value {at}");
                }
            }
        }
    }

    /// Rows decoded and rounded (`row_bf16`) are the decoded values rounded
    /// to the nearest bf16, bit for bit, subnormal f16 scales and extreme
    /// ones included, on every instruction set (AVX-512 BF16's in one pass).
    #[test]
    fn rounded_rows_are_the_values_rounded() {
        for format in BlockFormat::ALL {
            let bytes = linnet_ir::quant::arbitrary_blocks(format, 64, 0x2545_f491_4f6c_dd1d);
            let mut values = vec![0f32; 64 * format.block_values()];
            linnet_ir::quant::dequantize(format, &bytes, &mut values).unwrap();
            for isa in Isa::available() {
                let mut rounded = vec![0u16; values.len()];
                row_bf16(isa, format, &bytes, &mut rounded);
                for (at, (bits, value)) in rounded.iter().zip(&values).enumerate() {
                    assert_eq!(
                        *bits,
                        linnet_ir::numerics::bf16_bits(*value),
                        "{format} on {isa:?}, value {at}: {value}"
                    );
                }
            }
        }
    }
}
