//! The matrix–vector kernel contractions run on: `out[n] = Σₖ input[k] ·
//! weight[n, k]`, with the language's numerics: each product an f32
//! multiply, the sum in order in f64 starting from the first product, and
//! the total rounded once to f32. Keeping the order per output is what
//! makes it bit-identical to the interpreter, so the speed comes from
//! computing many outputs at once: with AVX, sixteen rows of `weight` run
//! side by side in f64 lanes (four independent chains of adds), four
//! values of `k` at a time through a 4×4 transpose.

/// `out[n]` for every row `n` of `weight` (`out.len()` rows of
/// `input.len()` values).
pub fn matvec(input: &[f32], weight: &[f32], out: &mut [f32]) {
    let depth = input.len();
    assert_eq!(weight.len(), out.len() * depth, "a weight row per output");
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if depth > 0 && std::arch::is_x86_feature_detected!("avx") {
        // SAFETY: AVX is present; `block` reads rows `done..done + 4·G` of
        // `weight` and writes as many outputs, all in bounds below.
        unsafe {
            while done + 16 <= out.len() {
                avx::block::<4>(input, weight, done, &mut out[done..done + 16]);
                done += 16;
            }
            while done + 4 <= out.len() {
                avx::block::<1>(input, weight, done, &mut out[done..done + 4]);
                done += 4;
            }
        }
    }
    for (n, slot) in out.iter_mut().enumerate().skip(done) {
        *slot = row(input, &weight[n * depth..(n + 1) * depth]);
    }
}

/// One output, as the interpreter computes it.
fn row(input: &[f32], weight: &[f32]) -> f32 {
    let mut products = input.iter().zip(weight).map(|(a, w)| f64::from(a * w));
    let Some(first) = products.next() else { return 0.0 };
    products.fold(first, |total, product| total + product) as f32
}

#[cfg(target_arch = "x86_64")]
mod avx {
    use std::arch::x86_64::*;

    /// Columns `k..k + 4` of four rows, as four vectors of one `k` each.
    #[inline(always)]
    unsafe fn transposed(rows: [*const f32; 4], k: usize) -> [__m128; 4] {
        unsafe {
            let [r0, r1, r2, r3] = rows.map(|row| _mm_loadu_ps(row.add(k)));
            let (t0, t1) = (_mm_unpacklo_ps(r0, r1), _mm_unpacklo_ps(r2, r3));
            let (t2, t3) = (_mm_unpackhi_ps(r0, r1), _mm_unpackhi_ps(r2, r3));
            [_mm_movelh_ps(t0, t1), _mm_movehl_ps(t1, t0), _mm_movelh_ps(t2, t3), _mm_movehl_ps(t3, t2)]
        }
    }

    /// Column `k` of four rows.
    #[inline(always)]
    unsafe fn column(rows: [*const f32; 4], k: usize) -> __m128 {
        unsafe { _mm_set_ps(*rows[3].add(k), *rows[2].add(k), *rows[1].add(k), *rows[0].add(k)) }
    }

    /// Rows `first..first + 4·G` of `weight` against `input`, into `out`.
    #[target_feature(enable = "avx")]
    pub unsafe fn block<const G: usize>(input: &[f32], weight: &[f32], first: usize, out: &mut [f32]) {
        let depth = input.len();
        let base = weight.as_ptr();
        let groups: [[*const f32; 4]; G] = std::array::from_fn(|g| std::array::from_fn(|r| unsafe { base.add((first + 4 * g + r) * depth) }));
        unsafe {
            // The first product starts each sum.
            let a = _mm_set1_ps(input[0]);
            let mut sums: [__m256d; G] = std::array::from_fn(|g| _mm256_cvtps_pd(_mm_mul_ps(a, column(groups[g], 0))));
            let mut k = 1;
            while k + 4 <= depth {
                for (g, sum) in sums.iter_mut().enumerate() {
                    let columns = transposed(groups[g], k);
                    for (j, values) in columns.into_iter().enumerate() {
                        let a = _mm_set1_ps(*input.get_unchecked(k + j));
                        *sum = _mm256_add_pd(*sum, _mm256_cvtps_pd(_mm_mul_ps(a, values)));
                    }
                }
                k += 4;
            }
            while k < depth {
                let a = _mm_set1_ps(input[k]);
                for (g, sum) in sums.iter_mut().enumerate() {
                    *sum = _mm256_add_pd(*sum, _mm256_cvtps_pd(_mm_mul_ps(a, column(groups[g], k))));
                }
                k += 1;
            }
            for (g, sum) in sums.into_iter().enumerate() {
                _mm_storeu_ps(out.as_mut_ptr().add(4 * g), _mm256_cvtpd_ps(sum));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{matvec, row};

    #[test]
    fn every_output_is_the_ordered_f64_sum() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut draw = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            // Wide exponents, so that order and rounding matter.
            ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2f32.powi(((seed >> 8) % 24) as i32 - 12)
        };
        for depth in [0, 1, 2, 3, 4, 5, 7, 8, 9, 31, 64, 130] {
            for columns in [1, 3, 4, 5, 15, 16, 17, 33, 64] {
                let input: Vec<f32> = (0..depth).map(|_| draw()).collect();
                let weight: Vec<f32> = (0..depth * columns).map(|_| draw()).collect();
                let mut out = vec![f32::NAN; columns];
                matvec(&input, &weight, &mut out);
                for (n, value) in out.iter().enumerate() {
                    let expected = row(&input, &weight[n * depth..(n + 1) * depth]);
                    assert_eq!(value.to_bits(), expected.to_bits(), "depth {depth}, columns {columns}, row {n}");
                }
            }
        }
    }
}
