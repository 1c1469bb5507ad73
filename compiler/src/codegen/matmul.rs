//! The kernel contractions run on: `out[m, n] = Σₖ input[m, k] ·
//! weight[n, k]`, with the language's numerics: each product an f32
//! multiply, the sum in order in f64 starting from the first product, and
//! the total rounded once to f32. Keeping the order per output is what
//! makes it bit-identical to the interpreter, so the speed comes from
//! computing many outputs at once: with AVX, sixteen rows of `weight` run
//! side by side in f64 lanes (four independent chains of adds), four
//! values of `k` at a time through a 4×4 transpose. Weights are f32 or
//! bf16 bits ([`Weight`]), widened exactly as they are read.

/// A weight element: f32, or bf16 held as its bits.
pub trait Weight: Copy {
    fn value(self) -> f32;
    /// Four consecutive weights, widened to f32.
    ///
    /// # Safety
    /// `at` points at four readable elements; the CPU has SSE4.1.
    #[cfg(target_arch = "x86_64")]
    unsafe fn four(at: *const Self) -> std::arch::x86_64::__m128;
}

impl Weight for f32 {
    fn value(self) -> f32 {
        self
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn four(at: *const f32) -> std::arch::x86_64::__m128 {
        // SAFETY: as the caller promises.
        unsafe { std::arch::x86_64::_mm_loadu_ps(at) }
    }
}

impl Weight for u16 {
    fn value(self) -> f32 {
        crate::numerics::bf16_value(self)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn four(at: *const u16) -> std::arch::x86_64::__m128 {
        use std::arch::x86_64::*;
        // SAFETY: as the caller promises: 8 bytes, then each u16 widened
        // to the high half of a 32-bit lane, which is the bf16's f32.
        unsafe { _mm_castsi128_ps(_mm_slli_epi32(_mm_cvtepu16_epi32(_mm_loadl_epi64(at as *const __m128i)), 16)) }
    }
}

/// Products at or above which the weight rows are shared among threads.
const PARALLEL_PRODUCTS: usize = 1 << 20;

/// `out[m, n] = Σₖ input[m, k] · weight[n, k]` for `rows` input rows
/// (`out` is `rows × columns`, `weight` `columns × depth`).
pub fn matmul<W: Weight + Sync>(input: &[f32], weight: &[W], out: &mut [f32], rows: usize) {
    if rows == 0 {
        return;
    }
    let (depth, columns) = (input.len() / rows, out.len() / rows);
    assert!(input.len() == rows * depth && out.len() == rows * columns && weight.len() == columns * depth, "operands of matching sizes");
    let (input_base, out_base) = (input.as_ptr(), out.as_mut_ptr());
    let rows = Rows {
        // SAFETY: row `m` of each is inside its slice.
        inputs: (0..rows).map(|m| unsafe { input_base.add(m * depth) }).collect(),
        outs: (0..rows).map(|m| unsafe { out_base.add(m * columns) }).collect(),
    };
    // SAFETY: the rows point into `input` and `out`, which outlive this
    // call, with `depth` and `columns` elements each.
    unsafe { matmul_rows(&rows, weight, columns, depth) }
}

/// Input rows and the output rows they produce, wherever they are.
pub struct Rows {
    pub inputs: Vec<*const f32>,
    pub outs: Vec<*mut f32>,
}

// SAFETY: the threads of `matmul_rows` read the inputs and write disjoint
// columns of the outputs.
unsafe impl Sync for Rows {}

/// `out[m][n] = Σₖ input[m][k] · weight[n, k]` for every row `m` of `rows`.
/// Weight rows are taken sixteen at a time against every input row while
/// they are in cache, so a prefill reads each weight once, not once per
/// token. Large products split the weight rows among the threads of the
/// pool; each output is computed the same way wherever it runs.
///
/// # Safety
/// Each input row has `depth` readable values and each output row room
/// for `columns`; no output row overlaps another or an input.
pub unsafe fn matmul_rows<W: Weight + Sync>(rows: &Rows, weight: &[W], columns: usize, depth: usize) {
    use rayon::prelude::*;
    assert_eq!(weight.len(), columns * depth, "a weight row per column");
    let threads = rayon::current_num_threads();
    if threads == 1 || rows.inputs.len() * columns * depth < PARALLEL_PRODUCTS {
        // SAFETY: all columns, on this thread.
        return unsafe { block_columns(rows, weight, depth, 0..columns) };
    }
    let chunk = columns.div_ceil(threads).next_multiple_of(16);
    (0..columns.div_ceil(chunk)).into_par_iter().for_each(|part| {
        let range = part * chunk..((part + 1) * chunk).min(columns);
        // SAFETY: each part writes its own columns of the outputs.
        unsafe { block_columns(rows, weight, depth, range) }
    });
}

/// Columns `range` of every output row.
///
/// # Safety
/// As `matmul_rows`, and no other thread writes these columns.
unsafe fn block_columns<W: Weight>(rows: &Rows, weight: &[W], depth: usize, range: std::ops::Range<usize>) {
    // SAFETY: the caller's promises: rows of `depth` inputs, outputs with
    // room for every column in `range`.
    let input = |m: usize| unsafe { std::slice::from_raw_parts(rows.inputs[m], depth) };
    let out = |m: usize, n: usize, count: usize| unsafe { std::slice::from_raw_parts_mut(rows.outs[m].add(n), count) };
    let mut done = range.start;
    #[cfg(target_arch = "x86_64")]
    if depth > 0 && std::arch::is_x86_feature_detected!("avx") {
        let count = rows.inputs.len();
        // SAFETY: AVX is present; `block` reads rows `done..done + 4·G` of
        // `weight` and the given input rows, and writes those columns of
        // the given output rows, all in bounds below.
        let block = |width: usize, done: usize| unsafe {
            let mut m = 0;
            while m + 2 <= count {
                let (inputs, outs) = ([rows.inputs[m], rows.inputs[m + 1]], [rows.outs[m], rows.outs[m + 1]]);
                if width == 16 {
                    avx::block::<4, 2, W>(inputs, depth, weight, done, outs);
                } else {
                    avx::block::<1, 2, W>(inputs, depth, weight, done, outs);
                }
                m += 2;
            }
            if m < count {
                if width == 16 {
                    avx::block::<4, 1, W>([rows.inputs[m]], depth, weight, done, [rows.outs[m]]);
                } else {
                    avx::block::<1, 1, W>([rows.inputs[m]], depth, weight, done, [rows.outs[m]]);
                }
            }
        };
        for width in [16, 4] {
            while done + width <= range.end {
                block(width, done);
                done += width;
            }
        }
    }
    for n in done..range.end {
        for m in 0..rows.inputs.len() {
            out(m, n, 1)[0] = row(input(m), &weight[n * depth..(n + 1) * depth]);
        }
    }
}

/// One output, as the interpreter computes it.
fn row<W: Weight>(input: &[f32], weight: &[W]) -> f32 {
    let mut products = input.iter().zip(weight).map(|(a, w)| f64::from(a * w.value()));
    let Some(first) = products.next() else { return 0.0 };
    products.fold(first, |total, product| total + product) as f32
}

#[cfg(target_arch = "x86_64")]
mod avx {
    use super::Weight;
    use std::arch::x86_64::*;

    /// Columns `k..k + 4` of four rows, as four vectors of one `k` each.
    #[inline(always)]
    unsafe fn transposed<W: Weight>(rows: [*const W; 4], k: usize) -> [__m128; 4] {
        unsafe {
            let [r0, r1, r2, r3] = rows.map(|row| W::four(row.add(k)));
            let (t0, t1) = (_mm_unpacklo_ps(r0, r1), _mm_unpacklo_ps(r2, r3));
            let (t2, t3) = (_mm_unpackhi_ps(r0, r1), _mm_unpackhi_ps(r2, r3));
            [_mm_movelh_ps(t0, t1), _mm_movehl_ps(t1, t0), _mm_movelh_ps(t2, t3), _mm_movehl_ps(t3, t2)]
        }
    }

    /// Column `k` of four rows.
    #[inline(always)]
    unsafe fn column<W: Weight>(rows: [*const W; 4], k: usize) -> __m128 {
        unsafe { _mm_set_ps((*rows[3].add(k)).value(), (*rows[2].add(k)).value(), (*rows[1].add(k)).value(), (*rows[0].add(k)).value()) }
    }

    /// Rows `first..first + 4·G` of `weight` against each of the `R`
    /// input rows, into the `R` output rows (from their column `first`):
    /// `R · G` sums in flight, each weight column transposed once for all
    /// the input rows.
    #[target_feature(enable = "avx")]
    pub unsafe fn block<const G: usize, const R: usize, W: Weight>(inputs: [*const f32; R], depth: usize, weight: &[W], first: usize, outs: [*mut f32; R]) {
        let base = weight.as_ptr();
        let groups: [[*const W; 4]; G] = std::array::from_fn(|g| std::array::from_fn(|r| unsafe { base.add((first + 4 * g + r) * depth) }));
        unsafe {
            // The first product starts each sum.
            let mut sums: [[__m256d; G]; R] = std::array::from_fn(|m| {
                let a = _mm_set1_ps(*inputs[m]);
                std::array::from_fn(|g| _mm256_cvtps_pd(_mm_mul_ps(a, column(groups[g], 0))))
            });
            let mut k = 1;
            while k + 4 <= depth {
                for g in 0..G {
                    let columns = transposed(groups[g], k);
                    for (m, row) in sums.iter_mut().enumerate() {
                        for (j, values) in columns.iter().enumerate() {
                            let a = _mm_set1_ps(*inputs[m].add(k + j));
                            row[g] = _mm256_add_pd(row[g], _mm256_cvtps_pd(_mm_mul_ps(a, *values)));
                        }
                    }
                }
                k += 4;
            }
            while k < depth {
                for g in 0..G {
                    let values = column(groups[g], k);
                    for (m, row) in sums.iter_mut().enumerate() {
                        let a = _mm_set1_ps(*inputs[m].add(k));
                        row[g] = _mm256_add_pd(row[g], _mm256_cvtps_pd(_mm_mul_ps(a, values)));
                    }
                }
                k += 1;
            }
            for (m, row) in sums.into_iter().enumerate() {
                for (g, sum) in row.into_iter().enumerate() {
                    _mm_storeu_ps(outs[m].add(first + 4 * g), _mm256_cvtpd_ps(sum));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{matmul, row};

    #[test]
    fn every_output_is_the_ordered_f64_sum() {
        for bf16 in [false, true] {
            check(bf16);
        }
    }

    fn check(bf16: bool) {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut draw = || {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            // Wide exponents, so that order and rounding matter.
            ((seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2f32.powi(((seed >> 8) % 24) as i32 - 12)
        };
        // The last pair is large enough to be shared among threads.
        let shapes = [0, 1, 2, 3, 4, 5, 7, 8, 9, 31, 64, 130].into_iter().flat_map(|depth| [1, 3, 4, 5, 15, 16, 17, 33, 64].map(|columns| (depth, columns, 1 + depth % 3)));
        for (depth, columns, rows) in shapes.chain([(1030, 1021, 1), (515, 70, 9), (257, 300, 20)]) {
            {
                let input: Vec<f32> = (0..rows * depth).map(|_| draw()).collect();
                let weight: Vec<f32> = (0..depth * columns).map(|_| draw()).collect();
                let bits: Vec<u16> = weight.iter().map(|w| crate::numerics::bf16_bits(*w)).collect();
                let widened: Vec<f32> = bits.iter().map(|b| crate::numerics::bf16_value(*b)).collect();
                let mut out = vec![f32::NAN; rows * columns];
                if bf16 {
                    matmul(&input, &bits, &mut out, rows);
                } else {
                    matmul(&input, &weight, &mut out, rows);
                }
                let reference = if bf16 { &widened } else { &weight };
                for (at, value) in out.iter().enumerate() {
                    let (m, n) = (at / columns, at % columns);
                    let expected = row(&input[m * depth..(m + 1) * depth], &reference[n * depth..(n + 1) * depth]);
                    assert_eq!(value.to_bits(), expected.to_bits(), "bf16 {bf16}, depth {depth}, columns {columns}, output {m}, {n}");
                }
            }
        }
    }
}
