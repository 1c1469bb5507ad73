//! f32 vectors on the instruction sets the Rust kernels are compiled for
//! (`Lanes`: AVX-512, AVX2 with FMA, and one lane for any CPU), written
//! once over `Lanes` and instantiated per set inside functions with that
//! set's target features, chosen at run time (`isa::Isa`). The matrix
//! kernel's tiles and the delta rule's passes over its state use them.

use super::matrix::Weight;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// Vectors of f32 lanes on one instruction set.
///
/// # Safety
/// Every method: the CPU has the implementing set's instructions (a
/// caller has checked `Isa::available` or runs inside a function with
/// those target features); a pointer it loads from has `WIDTH` readable
/// elements (f32, or `W` for `load_weight`) and one it stores to `WIDTH`
/// writable f32, unaligned allowed. `prefetch` reads nothing and takes
/// any address.
pub trait Lanes {
    type V: Copy;
    const WIDTH: usize;
    unsafe fn zero() -> Self::V;
    /// Every lane `value`.
    unsafe fn splat(value: f32) -> Self::V;
    unsafe fn load(at: *const f32) -> Self::V;
    unsafe fn store(at: *mut f32, v: Self::V);
    unsafe fn load_weight<W: Weight>(at: *const W) -> Self::V;
    unsafe fn mul(a: Self::V, b: Self::V) -> Self::V;
    /// `a · b + c`.
    unsafe fn fma(a: Self::V, b: Self::V, c: Self::V) -> Self::V;
    unsafe fn sum(v: Self::V) -> f32;
    /// Asks for the cache line at `at` into L2 ahead of its use (a hint:
    /// any address, never a fault).
    unsafe fn prefetch<T>(_at: *const T) {}
    /// The sums of `N` vectors.
    #[inline(always)]
    unsafe fn sums<const N: usize>(v: &[Self::V; N]) -> [f32; N] {
        let mut out = [0f32; N];
        for (total, v) in out.iter_mut().zip(v) {
            // SAFETY: as the caller promises (the function's `# Safety`).
            *total = unsafe { Self::sum(*v) };
        }
        out
    }
}

/// One lane, for CPUs without vectors the kernels know.
pub struct OneLane;

impl Lanes for OneLane {
    type V = f32;
    const WIDTH: usize = 1;
    unsafe fn zero() -> f32 {
        0.0
    }
    unsafe fn splat(value: f32) -> f32 {
        value
    }
    unsafe fn load(at: *const f32) -> f32 {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { *at }
    }
    unsafe fn store(at: *mut f32, v: f32) {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { *at = v }
    }
    unsafe fn load_weight<W: Weight>(at: *const W) -> f32 {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { (*at).value() }
    }
    unsafe fn mul(a: f32, b: f32) -> f32 {
        a * b
    }
    unsafe fn fma(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
    unsafe fn sum(v: f32) -> f32 {
        v
    }
}

/// Sixteen lanes of AVX-512 F.
#[cfg(target_arch = "x86_64")]
pub struct Avx512;

#[cfg(target_arch = "x86_64")]
impl Lanes for Avx512 {
    type V = __m512;
    const WIDTH: usize = 16;
    #[inline(always)]
    unsafe fn zero() -> __m512 {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { _mm512_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(value: f32) -> __m512 {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { _mm512_set1_ps(value) }
    }
    #[inline(always)]
    unsafe fn load(at: *const f32) -> __m512 {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { _mm512_loadu_ps(at) }
    }
    #[inline(always)]
    unsafe fn store(at: *mut f32, v: __m512) {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { _mm512_storeu_ps(at, v) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m512, b: __m512) -> __m512 {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { _mm512_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn load_weight<W: Weight>(at: *const W) -> __m512 {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            if W::BF16 {
                // Each bf16 to the high half of a 32-bit lane: its f32.
                let bits = _mm256_loadu_si256(at as *const __m256i);
                _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16))
            } else {
                _mm512_loadu_ps(at as *const f32)
            }
        }
    }
    #[inline(always)]
    unsafe fn fma(a: __m512, b: __m512, c: __m512) -> __m512 {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { _mm512_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn prefetch<T>(at: *const T) {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { _mm_prefetch::<_MM_HINT_T1>(at as *const i8) }
    }
    #[inline(always)]
    unsafe fn sum(v: __m512) -> f32 {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            // The upper half moved down by F's shuffle (DQ's extract would
            // need a target feature the kernels do not enable); then the
            // quarters, then two horizontal adds: the tree `sums` folds
            // four vectors in, so that a sum is the same bits whichever
            // of the two takes it (a column in a tile of four or alone).
            let upper = _mm512_castps512_ps256(_mm512_shuffle_f32x4::<0b11_10_11_10>(v, v));
            let half = _mm256_add_ps(_mm512_castps512_ps256(v), upper);
            let quarter = _mm_add_ps(_mm256_castps256_ps128(half), _mm256_extractf128_ps(half, 1));
            let pairs = _mm_hadd_ps(quarter, quarter);
            _mm_cvtss_f32(_mm_hadd_ps(pairs, pairs))
        }
    }
    /// Four vectors' sums folded together: halves, then quarters, then
    /// one horizontal add per pair.
    #[inline(always)]
    unsafe fn sums<const N: usize>(v: &[__m512; N]) -> [f32; N] {
        let mut out = [0f32; N];
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            if N == 8 {
                let (low, high) = (Self::sums(&[v[0], v[1], v[2], v[3]]), Self::sums(&[v[4], v[5], v[6], v[7]]));
                out[..4].copy_from_slice(&low);
                out[4..].copy_from_slice(&high);
            } else if N == 4 {
                // [v0: blocks 0+2, 1+3 | v1: 0+2, 1+3], and so for v2, v3.
                let x01 = _mm512_add_ps(_mm512_shuffle_f32x4(v[0], v[1], 0x44), _mm512_shuffle_f32x4(v[0], v[1], 0xEE));
                let x23 = _mm512_add_ps(_mm512_shuffle_f32x4(v[2], v[3], 0x44), _mm512_shuffle_f32x4(v[2], v[3], 0xEE));
                // One block of four partial sums per vector.
                let y = _mm512_add_ps(_mm512_shuffle_f32x4(x01, x23, 0x88), _mm512_shuffle_f32x4(x01, x23, 0xDD));
                let (b0, b1) = (_mm512_castps512_ps128(y), _mm512_extractf32x4_ps(y, 1));
                let (b2, b3) = (_mm512_extractf32x4_ps(y, 2), _mm512_extractf32x4_ps(y, 3));
                let totals = _mm_hadd_ps(_mm_hadd_ps(b0, b1), _mm_hadd_ps(b2, b3));
                _mm_storeu_ps(out.as_mut_ptr(), totals);
            } else {
                for (total, v) in out.iter_mut().zip(v) {
                    *total = Self::sum(*v);
                }
            }
        }
        out
    }
}

/// Eight lanes of AVX2 with FMA.
#[cfg(target_arch = "x86_64")]
pub struct Avx2;

#[cfg(target_arch = "x86_64")]
impl Lanes for Avx2 {
    type V = __m256;
    const WIDTH: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> __m256 {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { _mm256_setzero_ps() }
    }
    #[inline(always)]
    unsafe fn splat(value: f32) -> __m256 {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { _mm256_set1_ps(value) }
    }
    #[inline(always)]
    unsafe fn load(at: *const f32) -> __m256 {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { _mm256_loadu_ps(at) }
    }
    #[inline(always)]
    unsafe fn store(at: *mut f32, v: __m256) {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { _mm256_storeu_ps(at, v) }
    }
    #[inline(always)]
    unsafe fn mul(a: __m256, b: __m256) -> __m256 {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { _mm256_mul_ps(a, b) }
    }
    #[inline(always)]
    unsafe fn load_weight<W: Weight>(at: *const W) -> __m256 {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            if W::BF16 {
                let bits = _mm_loadu_si128(at as *const __m128i);
                _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16))
            } else {
                _mm256_loadu_ps(at as *const f32)
            }
        }
    }
    #[inline(always)]
    unsafe fn fma(a: __m256, b: __m256, c: __m256) -> __m256 {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { _mm256_fmadd_ps(a, b, c) }
    }
    #[inline(always)]
    unsafe fn prefetch<T>(at: *const T) {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { _mm_prefetch::<_MM_HINT_T1>(at as *const i8) }
    }
    #[inline(always)]
    unsafe fn sum(v: __m256) -> f32 {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            let halves = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
            let pairs = _mm_add_ps(halves, _mm_movehl_ps(halves, halves));
            _mm_cvtss_f32(_mm_add_ss(pairs, _mm_shuffle_ps(pairs, pairs, 1)))
        }
    }
}
