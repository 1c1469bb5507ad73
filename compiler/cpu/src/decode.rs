//! Weight rows in block formats decoded into f32 for the matrix kernel
//! (`matmul`), a few rows at a time. The values are exactly the blocks'
//! dequantized values as `linnet_ir::quant::dequantize` defines them (the
//! same operations in the same order, no fused multiply-add), so a product
//! over decoded rows has the numerics of a product over f32 weights.
//!
//! A few input rows against a weight row ([`dot`], a decode step's
//! products) take the decoded values straight from registers into their
//! sums: f32 fused multiply-adds over the lanes, as `matmul`'s tiles
//! compute over decoded values, in another order (two sums a lane).
//!
//! The formats are written once over [`ByteLanes`], small integers widened
//! to i32 lanes and converted, each block's vectors handed in order to a
//! sink (stored, or summed), and instantiated for AVX-512 (sixteen lanes)
//! and AVX2 (eight) inside functions with those target features (the
//! blocks' f16 scales widened by F16C, exactly); other CPUs decode with
//! `quant::dequantize` itself.

use super::matmul::Isa;
use super::simd::Lanes;
use linnet_ir::quant::{self, q4_k_scale_min, BlockFormat};

/// Row `blocks` (whole blocks of `format`) decoded into `out`, on `isa`.
pub fn row(isa: Isa, format: BlockFormat, blocks: &[u8], out: &mut [f32]) {
    assert_eq!(format.row_bytes(out.len()), Some(blocks.len()), "rows of whole blocks");
    // SAFETY: the CPU has `isa`'s features (`matmul` runs on the ones it
    // has), and the sizes were checked above.
    unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Bf16 | Isa::Avx512 => x86::row_avx512(format, blocks, out),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::row_avx2(format, blocks, out),
            _ => quant::dequantize(format, blocks, out).expect("rows of whole blocks"),
        }
    }
}

/// i32 lanes of small integers and their conversion to the f32 lanes of
/// `Lanes`.
trait ByteLanes: Lanes {
    type I: Copy;
    /// `WIDTH` bytes at `at`, zero-extended.
    unsafe fn load_u8(at: *const u8) -> Self::I;
    /// `WIDTH` bytes at `at`, sign-extended.
    unsafe fn load_i8(at: *const u8) -> Self::I;
    unsafe fn shift_right(v: Self::I, bits: u32) -> Self::I;
    unsafe fn shift_left(v: Self::I, bits: u32) -> Self::I;
    unsafe fn and(v: Self::I, mask: i32) -> Self::I;
    unsafe fn or(a: Self::I, b: Self::I) -> Self::I;
    unsafe fn minus(v: Self::I, k: i32) -> Self::I;
    unsafe fn float(v: Self::I) -> Self::V;
    unsafe fn sub(a: Self::V, b: Self::V) -> Self::V;
}

/// The f16 at byte `at` of `bytes`, widened by F16C: exactly
/// `quant::f16_at`'s value, without its branches.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "f16c")]
#[inline]
fn half_at(bytes: &[u8], at: usize) -> f32 {
    use std::arch::x86_64::{_mm_cvtph_ps, _mm_cvtsi32_si128, _mm_cvtss_f32};
    let bits = u16::from_le_bytes([bytes[at], bytes[at + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

#[cfg(not(target_arch = "x86_64"))]
fn half_at(bytes: &[u8], at: usize) -> f32 {
    quant::f16_at(bytes, at)
}

/// `d · q` for each of a Q8_0 block's 32 values, to `sink` by position.
#[inline(always)]
unsafe fn q8_0<L: ByteLanes>(block: &[u8], sink: &mut impl FnMut(usize, L::V)) {
    unsafe {
        let d = L::splat(half_at(block, 0));
        for at in (0..32).step_by(L::WIDTH) {
            let q = L::float(L::load_i8(block.as_ptr().add(2 + at)));
            sink(at, L::mul(d, q));
        }
    }
}

/// `(d · scale) · q − dmin · min` for each of a Q4_K block's 256 values:
/// four chunks of 32 bytes, the low nibbles one group, the high the next.
#[inline(always)]
unsafe fn q4_k<L: ByteLanes>(block: &[u8], sink: &mut impl FnMut(usize, L::V)) {
    unsafe {
        let (d, dmin) = (half_at(block, 0), half_at(block, 2));
        let packed = &block[4..16];
        for chunk in 0..4 {
            for part in 0..2 {
                let (scale, min) = q4_k_scale_min(chunk * 2 + part, packed);
                let step = L::splat(d * f32::from(scale));
                let offset = L::splat(dmin * f32::from(min));
                for l in (0..32).step_by(L::WIDTH) {
                    let bytes = L::load_u8(block.as_ptr().add(16 + chunk * 32 + l));
                    let q = L::float(L::and(L::shift_right(bytes, 4 * part as u32), 0xf));
                    sink(chunk * 64 + part * 32 + l, L::sub(L::mul(step, q), offset));
                }
            }
        }
    }
}

/// `(d · scale) · (q − 32)` for each of a Q6_K block's 256 values: two
/// halves of four quarters, each value's low four bits from `ql` and high
/// two from `qh`.
#[inline(always)]
unsafe fn q6_k<L: ByteLanes>(block: &[u8], sink: &mut impl FnMut(usize, L::V)) {
    unsafe {
        let d = half_at(block, 208);
        for half_block in 0..2 {
            let (low, high) = (block.as_ptr().add(half_block * 64), block.as_ptr().add(128 + half_block * 32));
            for part in 0..4 {
                for l in (0..32).step_by(L::WIDTH) {
                    let at = half_block * 128 + part * 32 + l;
                    let scale = L::splat(d * f32::from(block[192 + at / 16] as i8));
                    let low =
                        L::and(L::shift_right(L::load_u8(low.add(l + 32 * (part % 2))), 4 * (part / 2) as u32), 0xf);
                    let high = L::shift_left(L::and(L::shift_right(L::load_u8(high.add(l)), 2 * part as u32), 3), 4);
                    let level = L::float(L::minus(L::or(low, high), 32));
                    sink(at, L::mul(scale, level));
                }
            }
        }
    }
}

/// A row of blocks, each block's vectors handed to `sink` with their
/// position in the row, in order (the decoders are called directly, so
/// that they are inlined with the caller's features).
#[inline(always)]
unsafe fn each_vector<L: ByteLanes>(format: BlockFormat, row: &[u8], mut sink: impl FnMut(usize, L::V)) {
    let values = format.block_values();
    for (number, block) in row.chunks_exact(format.block_bytes()).enumerate() {
        let mut at_block = |at: usize, v: L::V| sink(number * values + at, v);
        // SAFETY: the decoders read inside their block.
        unsafe {
            match format {
                BlockFormat::Q8_0 => q8_0::<L>(block, &mut at_block),
                BlockFormat::Q4K => q4_k::<L>(block, &mut at_block),
                BlockFormat::Q6K => q6_k::<L>(block, &mut at_block),
            }
        }
    }
}

/// A row of blocks decoded into `out`.
#[inline(always)]
unsafe fn decode_row<L: ByteLanes>(format: BlockFormat, row: &[u8], out: &mut [f32]) {
    let out = out.as_mut_ptr();
    // SAFETY: `out` has the row's values' room.
    unsafe { each_vector::<L>(format, row, |at, v| L::store(out.add(at), v)) }
}

/// `Σₖ input[r][k] · value[k]` over a row of blocks for each of `R`
/// input rows, in f32 fused multiply-adds over the lanes.
#[inline(always)]
unsafe fn dot_rows<L: ByteLanes, const R: usize>(format: BlockFormat, row: &[u8], inputs: [*const f32; R]) -> [f32; R] {
    unsafe {
        // Two sums a row, for alternate vectors: two chains of fused
        // multiply-adds in flight instead of one.
        let (mut even, mut odd) = ([L::zero(); R], [L::zero(); R]);
        each_vector::<L>(format, row, |at, w| {
            let sums = if (at / L::WIDTH) % 2 == 0 { &mut even } else { &mut odd };
            for (sum, input) in sums.iter_mut().zip(&inputs) {
                *sum = L::fma(L::load(input.add(at)), w, *sum);
            }
        });
        let mut sums = [L::zero(); R];
        for ((sum, even), odd) in sums.iter_mut().zip(even).zip(odd) {
            *sum = L::fma(even, L::splat(1.0), odd);
        }
        L::sums(&sums)
    }
}

/// [`dot_rows`] for as many rows as `inputs` holds (one to four), the
/// sums into `out`.
#[inline(always)]
unsafe fn dot_any<L: ByteLanes>(format: BlockFormat, row: &[u8], inputs: &[*const f32], out: &mut [f32]) {
    unsafe {
        match *inputs {
            [a] => out.copy_from_slice(&dot_rows::<L, 1>(format, row, [a])),
            [a, b] => out.copy_from_slice(&dot_rows::<L, 2>(format, row, [a, b])),
            [a, b, c] => out.copy_from_slice(&dot_rows::<L, 3>(format, row, [a, b, c])),
            [a, b, c, d] => out.copy_from_slice(&dot_rows::<L, 4>(format, row, [a, b, c, d])),
            _ => unreachable!("one to four rows at a time"),
        }
    }
}

/// The most input rows [`dot`] takes at once.
pub const DOT_ROWS: usize = 4;

/// Whether [`dot`] runs on `isa` (else rows are decoded and multiplied).
pub fn dots_on(isa: Isa) -> bool {
    isa != Isa::Portable
}

/// `out[r] = Σₖ inputs[r][k] · value[k]` for the values of `row` (whole
/// blocks of `format`) and one to [`DOT_ROWS`] input rows, on `isa`
/// ([`dots_on`]): the numerics of `matmul` over the decoded row.
///
/// # Safety
/// Each input row has the row's values' count of readable values.
pub unsafe fn dot(isa: Isa, format: BlockFormat, row: &[u8], inputs: &[*const f32], out: &mut [f32]) {
    assert!(!inputs.is_empty() && inputs.len() <= DOT_ROWS && out.len() == inputs.len(), "one to four rows");
    // SAFETY: as the caller promises, on a CPU with `isa`.
    unsafe {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512Bf16 | Isa::Avx512 => x86::dot_avx512(format, row, inputs, out),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => x86::dot_avx2(format, row, inputs, out),
            _ => unreachable!("no dot products on {}", isa.name()),
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{decode_row, dot_any, BlockFormat, ByteLanes};
    use crate::simd::{Avx2, Avx512};
    use std::arch::x86_64::*;

    impl ByteLanes for Avx512 {
        type I = __m512i;
        #[inline(always)]
        unsafe fn load_u8(at: *const u8) -> __m512i {
            unsafe { _mm512_cvtepu8_epi32(_mm_loadu_si128(at as *const __m128i)) }
        }
        #[inline(always)]
        unsafe fn load_i8(at: *const u8) -> __m512i {
            unsafe { _mm512_cvtepi8_epi32(_mm_loadu_si128(at as *const __m128i)) }
        }
        #[inline(always)]
        unsafe fn shift_right(v: __m512i, bits: u32) -> __m512i {
            unsafe { _mm512_srlv_epi32(v, _mm512_set1_epi32(bits as i32)) }
        }
        #[inline(always)]
        unsafe fn shift_left(v: __m512i, bits: u32) -> __m512i {
            unsafe { _mm512_sllv_epi32(v, _mm512_set1_epi32(bits as i32)) }
        }
        #[inline(always)]
        unsafe fn and(v: __m512i, mask: i32) -> __m512i {
            unsafe { _mm512_and_si512(v, _mm512_set1_epi32(mask)) }
        }
        #[inline(always)]
        unsafe fn or(a: __m512i, b: __m512i) -> __m512i {
            unsafe { _mm512_or_si512(a, b) }
        }
        #[inline(always)]
        unsafe fn minus(v: __m512i, k: i32) -> __m512i {
            unsafe { _mm512_sub_epi32(v, _mm512_set1_epi32(k)) }
        }
        #[inline(always)]
        unsafe fn float(v: __m512i) -> __m512 {
            unsafe { _mm512_cvtepi32_ps(v) }
        }
        #[inline(always)]
        unsafe fn sub(a: __m512, b: __m512) -> __m512 {
            unsafe { _mm512_sub_ps(a, b) }
        }
    }

    impl ByteLanes for Avx2 {
        type I = __m256i;
        #[inline(always)]
        unsafe fn load_u8(at: *const u8) -> __m256i {
            unsafe { _mm256_cvtepu8_epi32(_mm_loadl_epi64(at as *const __m128i)) }
        }
        #[inline(always)]
        unsafe fn load_i8(at: *const u8) -> __m256i {
            unsafe { _mm256_cvtepi8_epi32(_mm_loadl_epi64(at as *const __m128i)) }
        }
        #[inline(always)]
        unsafe fn shift_right(v: __m256i, bits: u32) -> __m256i {
            unsafe { _mm256_srlv_epi32(v, _mm256_set1_epi32(bits as i32)) }
        }
        #[inline(always)]
        unsafe fn shift_left(v: __m256i, bits: u32) -> __m256i {
            unsafe { _mm256_sllv_epi32(v, _mm256_set1_epi32(bits as i32)) }
        }
        #[inline(always)]
        unsafe fn and(v: __m256i, mask: i32) -> __m256i {
            unsafe { _mm256_and_si256(v, _mm256_set1_epi32(mask)) }
        }
        #[inline(always)]
        unsafe fn or(a: __m256i, b: __m256i) -> __m256i {
            unsafe { _mm256_or_si256(a, b) }
        }
        #[inline(always)]
        unsafe fn minus(v: __m256i, k: i32) -> __m256i {
            unsafe { _mm256_sub_epi32(v, _mm256_set1_epi32(k)) }
        }
        #[inline(always)]
        unsafe fn float(v: __m256i) -> __m256 {
            unsafe { _mm256_cvtepi32_ps(v) }
        }
        #[inline(always)]
        unsafe fn sub(a: __m256, b: __m256) -> __m256 {
            unsafe { _mm256_sub_ps(a, b) }
        }
    }

    /// # Safety
    /// The CPU has AVX-512 F and BW; `out` holds the row's values.
    #[target_feature(enable = "avx512f,avx512bw,avx2,f16c")]
    pub unsafe fn row_avx512(format: BlockFormat, row: &[u8], out: &mut [f32]) {
        unsafe { decode_row::<Avx512>(format, row, out) }
    }

    /// # Safety
    /// As `super::dot`; the CPU has AVX-512 F and BW.
    #[target_feature(enable = "avx512f,avx512bw,avx2,fma,f16c")]
    pub unsafe fn dot_avx512(format: BlockFormat, row: &[u8], inputs: &[*const f32], out: &mut [f32]) {
        unsafe { dot_any::<Avx512>(format, row, inputs, out) }
    }

    /// # Safety
    /// The CPU has AVX2; `out` holds the row's values.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn row_avx2(format: BlockFormat, row: &[u8], out: &mut [f32]) {
        unsafe { decode_row::<Avx2>(format, row, out) }
    }

    /// # Safety
    /// As `super::dot`; the CPU has AVX2 and FMA.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_avx2(format: BlockFormat, row: &[u8], inputs: &[*const f32], out: &mut [f32]) {
        unsafe { dot_any::<Avx2>(format, row, inputs, out) }
    }
}

#[cfg(test)]
mod tests {
    use super::{row, BlockFormat};
    use crate::matmul::Isa;

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
}
