//! Products of Q4_K weight rows against input rows quantized to 8 bits
//! (`int8::QuantizedRows`), sixteen weight rows at a time, in AVX-512
//! VNNI's byte dot products: the freedom `docs/language.md` gives a
//! parameter declared bf16 ("Quantized inputs"), taken past a decode
//! step's rows on CPUs with VNNI (`matmul`'s choice of kernel).
//!
//! A panel ([`PanelBlock`]s, one per span of the depth) holds sixteen
//! weight rows' blocks with their bytes interleaved: each 32-bit lane of
//! a register holds four bytes of one row, from the same place in each. One `vpdpbusd` then multiplies four
//! values of sixteen rows by the same four input levels (broadcast), and
//! after a group's 32 values every lane holds its row's whole sum, which
//! takes the group's 6-bit scale in one integer multiply. A panel is
//! gathered once and then multiplied by every input row, several at a
//! time, so its cost is shared the more rows there are: a prefill's
//! matrices and experts. The order of the f32 sums is
//! [`reference`]'s, on every CPU that runs the panels: per block, the
//! scaled sums of groups 0–3, then of groups 4–7 (each an exact integer
//! under 2²⁴: at most 4 · 63 · 32 · 15 · 127), each times `d · step` by
//! one fused multiply-add, then the mins against the levels' sums times
//! `−dmin · step`.

use super::int8::{assert_operands, has_vnni, QuantizedRows, SPAN};
#[cfg(test)]
use linnet_ir::quant;
use linnet_ir::quant::BlockFormat;

/// Weight rows in a panel: a register's 32-bit lanes.
pub const PANEL_ROWS: usize = 16;

/// Input rows multiplied together against a panel's registers.
const TILE_ROWS: usize = 8;

/// One block of sixteen weight rows, laid out for the lanes: row `i`'s
/// parts in lane `i` of each (zeros past the matrix's last row).
#[repr(C, align(64))]
#[derive(Clone, Copy, Default)]
struct PanelBlock {
    /// Four bytes of each row's quants, at `8c + j` bytes `32c + 4j..`:
    /// low nibbles values `64c + 4j..` (group `2c`), high nibbles values
    /// `64c + 32 + 4j..` (group `2c + 1`).
    quants: [[u32; PANEL_ROWS]; 32],
    /// Group `g`'s 6-bit scale.
    scales: [[i32; PANEL_ROWS]; 8],
    /// Groups `2i` and `2i + 1`'s mins, in the low and high 16 bits.
    mins: [[u32; PANEL_ROWS]; 4],
    d: [f32; PANEL_ROWS],
    dmin: [f32; PANEL_ROWS],
}

/// `outs[r][n] = Σₖ x̂[r][k] · value[n, k]` for the columns `n` in `range`,
/// where weight row `n` is `blocks[n · row_bytes..]` (whole Q4_K blocks)
/// and `x̂` the quantized input rows, on a CPU with AVX-512 VNNI
/// (`choice::choose`).
///
/// # Safety
/// Each output row has room for the columns of `range`, which no other
/// thread writes; the CPU has AVX-512 VNNI.
pub unsafe fn dot_columns(
    blocks: &[u8],
    row_bytes: usize,
    inputs: &QuantizedRows,
    outs: &[*mut f32],
    range: std::ops::Range<usize>,
) {
    assert!(has_vnni(), "panels run on AVX-512 VNNI");
    assert_operands(BlockFormat::Q4K, blocks, row_bytes, inputs.depth(), (inputs.len(), outs.len()), &range);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as the caller promises; the CPU has VNNI.
    unsafe {
        x86::dot_columns_vnni(blocks, row_bytes, inputs, outs, range)
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("panels run on x86's VNNI ({} rows)", inputs.len())
}

/// Row `r` of `inputs` against weight row `n` of `blocks` in the panels'
/// order (the module's doc), in plain loops: what they compute, bit for
/// bit.
#[cfg(test)]
fn reference(blocks: &[u8], row_bytes: usize, inputs: &QuantizedRows, r: usize, n: usize) -> f32 {
    let row = &blocks[n * row_bytes..(n + 1) * row_bytes];
    let mut sum = 0f32;
    for (span, block) in row.chunks_exact(BlockFormat::Q4K.block_bytes()).enumerate() {
        let (levels, pair_sums, step) = inputs.span(r, span);
        let (d, dmin) = (quant::f16_at(block, 0), quant::f16_at(block, 2));
        let scales_mins = quant::q4_k_scales_mins(&block[4..16]);
        let nibble = |v: usize| {
            let (chunk, within) = (v / 64, v % 64);
            i32::from((block[16 + chunk * 32 + within % 32] >> (4 * (within / 32))) & 0xf)
        };
        for half in 0..2 {
            let part: i32 = (32 * 4 * half..32 * 4 * (half + 1))
                .map(|v| i32::from(scales_mins[v / 32]) * nibble(v) * i32::from(levels[v]))
                .sum();
            sum = (part as f32).mul_add(d * step, sum);
        }
        let mins: i32 = (0..8)
            .map(|group| {
                let pair = pair_sums[group / 2];
                let levels_sum = if group % 2 == 0 { pair as i16 } else { (pair >> 16) as i16 };
                i32::from(scales_mins[8 + group]) * i32::from(levels_sum)
            })
            .sum();
        sum = (mins as f32).mul_add(-(dmin * step), sum);
    }
    sum
}

/// [`reference`] for every input row against every one of `columns`
/// weight rows: what the tests compare.
#[cfg(test)]
pub(crate) fn reference_products(blocks: &[u8], inputs: &QuantizedRows, columns: usize) -> Vec<Vec<f32>> {
    let row_bytes = blocks.len() / columns;
    (0..inputs.len()).map(|r| (0..columns).map(|n| reference(blocks, row_bytes, inputs, r, n)).collect()).collect()
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod x86 {
    use super::{BlockFormat, PanelBlock, QuantizedRows, PANEL_ROWS, SPAN, TILE_ROWS};
    use std::arch::x86_64::*;

    /// `super::dot_columns` on AVX-512 VNNI: each panel of the range
    /// gathered once, then multiplied by the input rows [`TILE_ROWS`] at
    /// a time.
    ///
    /// # Safety
    /// As [`super::dot_columns`]: each output row has room for the columns of
    /// `range`, which no other thread writes; the CPU has AVX-512 F, BW and
    /// VNNI.
    #[target_feature(enable = "avx512f,avx512bw,avx512vnni,fma")]
    pub unsafe fn dot_columns_vnni(
        blocks: &[u8],
        row_bytes: usize,
        inputs: &QuantizedRows,
        outs: &[*mut f32],
        range: std::ops::Range<usize>,
    ) {
        let spans = row_bytes / BlockFormat::Q4K.block_bytes();
        let mut panel = vec![PanelBlock::default(); spans];
        for first_column in range.clone().step_by(PANEL_ROWS) {
            let rows = (range.end - first_column).min(PANEL_ROWS);
            let mask = (u32::MAX >> (32 - rows)) as u16;
            for (span, block) in panel.iter_mut().enumerate() {
                let at = first_column * row_bytes + span * BlockFormat::Q4K.block_bytes();
                // SAFETY: rows `first_column..` have their blocks (the caller's promise).
                unsafe { gather(blocks.as_ptr().add(at), row_bytes, rows, block) };
            }
            for first in (0..inputs.len()).step_by(TILE_ROWS) {
                let count = (inputs.len() - first).min(TILE_ROWS);
                // SAFETY: as the caller promises, for these columns.
                unsafe {
                    match count {
                        1 => tile::<1>(&panel, inputs, first, outs, first_column, mask),
                        2 => tile::<2>(&panel, inputs, first, outs, first_column, mask),
                        3 => tile::<3>(&panel, inputs, first, outs, first_column, mask),
                        4 => tile::<4>(&panel, inputs, first, outs, first_column, mask),
                        5 => tile::<5>(&panel, inputs, first, outs, first_column, mask),
                        6 => tile::<6>(&panel, inputs, first, outs, first_column, mask),
                        7 => tile::<7>(&panel, inputs, first, outs, first_column, mask),
                        8 => tile::<8>(&panel, inputs, first, outs, first_column, mask),
                        count => unreachable!("one to {TILE_ROWS} rows a tile, not {count}"),
                    }
                }
            }
        }
    }

    /// The headers of sixteen rows' Q4_K blocks, row `i`'s in lane `i`.
    pub(crate) struct Header {
        pub d: __m512,
        pub dmin: __m512,
        /// Group `g`'s 6-bit scale.
        pub scales: [__m512i; 8],
        /// Groups `2i` and `2i + 1`'s mins, in the low and high 16 bits.
        pub mins: [__m512i; 4],
    }

    /// The headers of the blocks at `first` and each `row_bytes` past it
    /// (`rows` of them; zeros in the other lanes): the halves widened and
    /// the scales and mins unpacked as `quant::q4_k_scales_mins` does, lane
    /// by lane.
    ///
    /// # Safety
    /// The blocks exist; the CPU has AVX-512 F and BW.
    #[inline(always)]
    pub(crate) unsafe fn header(first: *const u8, row_bytes: usize, rows: usize) -> Header {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            // Word `w` of each row's header, gathered into its lane (no
            // scalar stores, which a vector load could not forward).
            let present = (u32::MAX >> (32 - rows)) as __mmask16;
            let offsets = _mm512_mullo_epi32(
                _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                _mm512_set1_epi32(i32::try_from(row_bytes).expect("rows under 2 GiB")),
            );
            let [halves, first_word, second, third] = std::array::from_fn(|word| {
                let words = first.add(4 * word);
                _mm512_mask_i32gather_epi32::<1>(_mm512_setzero_si512(), present, offsets, words.cast())
            });
            let d = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(halves));
            let dmin = _mm512_cvtph_ps(_mm512_cvtepi32_epi16(_mm512_srli_epi32::<16>(halves)));
            let (six, four, two) =
                (_mm512_set1_epi32(0x3f3f_3f3f), _mm512_set1_epi32(0x0f0f_0f0f), _mm512_set1_epi32(0x0303_0303));
            let top_two = |word: __m512i| _mm512_slli_epi32::<4>(_mm512_and_si512(_mm512_srli_epi32::<6>(word), two));
            let scales_low = _mm512_and_si512(first_word, six);
            let mins_low = _mm512_and_si512(second, six);
            let scales_high = _mm512_or_si512(_mm512_and_si512(third, four), top_two(first_word));
            let mins_high = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32::<4>(third), four), top_two(second));
            let (low_byte, third_byte) = (_mm512_set1_epi32(0xff), _mm512_set1_epi32(0x00ff_0000));
            let scales = std::array::from_fn(|group| {
                let quarter = if group < 4 { scales_low } else { scales_high };
                _mm512_and_si512(_mm512_srlv_epi32(quarter, _mm512_set1_epi32(8 * (group % 4) as i32)), low_byte)
            });
            // Bytes 0 and 1, then 2 and 3, of each word to its two halves.
            let pair = |low: __m512i, high: __m512i| {
                _mm512_or_si512(_mm512_and_si512(low, low_byte), _mm512_and_si512(high, third_byte))
            };
            let mins = std::array::from_fn(|at| {
                let half = if at < 2 { mins_low } else { mins_high };
                if at % 2 == 0 {
                    pair(half, _mm512_slli_epi32::<8>(half))
                } else {
                    pair(_mm512_srli_epi32::<16>(half), _mm512_srli_epi32::<8>(half))
                }
            });
            Header { d, dmin, scales, mins }
        }
    }

    /// The blocks at `first` and each `row_bytes` past it (`rows` of them;
    /// zeros in the other lanes), laid out for the lanes: the quants by
    /// two transposes of sixteen rows' sixteen words, the headers as
    /// [`header`] unpacks them.
    ///
    /// # Safety
    /// `rows` (at most sixteen) rows of whole Q4_K blocks lie at `first`,
    /// `row_bytes` apart; the CPU has AVX-512 BW.
    #[inline(always)]
    unsafe fn gather(first: *const u8, row_bytes: usize, rows: usize, into: &mut PanelBlock) {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            let header = header(first, row_bytes, rows);
            _mm512_store_ps(into.d.as_mut_ptr(), header.d);
            _mm512_store_ps(into.dmin.as_mut_ptr(), header.dmin);
            for (lanes, scale) in into.scales.iter_mut().zip(header.scales) {
                _mm512_store_si512(lanes.as_mut_ptr().cast(), scale);
            }
            for (lanes, mins) in into.mins.iter_mut().zip(header.mins) {
                _mm512_store_si512(lanes.as_mut_ptr().cast(), mins);
            }
            for half in 0..2 {
                let words = std::array::from_fn(|row| {
                    if row < rows {
                        _mm512_loadu_si512(first.add(row * row_bytes + 16 + 64 * half).cast())
                    } else {
                        _mm512_setzero_si512()
                    }
                });
                for (at, lanes) in transposed(words).into_iter().enumerate() {
                    _mm512_store_si512(into.quants[16 * half + at].as_mut_ptr().cast(), lanes);
                }
            }
        }
    }

    /// Sixteen rows of sixteen 32-bit words transposed: word `w` of row
    /// `r` to word `r` of row `w`. Pairs of rows interleaved by words, then
    /// by pairs of words, which leaves each 128-bit lane `l` of row
    /// `4i + c` holding word `4l + c` of rows `4i..4i + 4`; then those
    /// lanes moved by two rounds of 128-bit shuffles.
    ///
    /// # Safety
    /// The CPU has AVX-512 F.
    #[inline(always)]
    unsafe fn transposed(rows: [__m512i; 16]) -> [__m512i; 16] {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            let mut words = [_mm512_setzero_si512(); 16];
            for pair in 0..8 {
                words[2 * pair] = _mm512_unpacklo_epi32(rows[2 * pair], rows[2 * pair + 1]);
                words[2 * pair + 1] = _mm512_unpackhi_epi32(rows[2 * pair], rows[2 * pair + 1]);
            }
            let mut fours = [_mm512_setzero_si512(); 16];
            for i in 0..4 {
                fours[4 * i] = _mm512_unpacklo_epi64(words[4 * i], words[4 * i + 2]);
                fours[4 * i + 1] = _mm512_unpackhi_epi64(words[4 * i], words[4 * i + 2]);
                fours[4 * i + 2] = _mm512_unpacklo_epi64(words[4 * i + 1], words[4 * i + 3]);
                fours[4 * i + 3] = _mm512_unpackhi_epi64(words[4 * i + 1], words[4 * i + 3]);
            }
            let mut out = [_mm512_setzero_si512(); 16];
            for c in 0..4 {
                let first_halves = _mm512_shuffle_i32x4::<0b01_00_01_00>(fours[c], fours[4 + c]);
                let second_halves = _mm512_shuffle_i32x4::<0b11_10_11_10>(fours[c], fours[4 + c]);
                let third_halves = _mm512_shuffle_i32x4::<0b01_00_01_00>(fours[8 + c], fours[12 + c]);
                let fourth_halves = _mm512_shuffle_i32x4::<0b11_10_11_10>(fours[8 + c], fours[12 + c]);
                out[c] = _mm512_shuffle_i32x4::<0b10_00_10_00>(first_halves, third_halves);
                out[4 + c] = _mm512_shuffle_i32x4::<0b11_01_11_01>(first_halves, third_halves);
                out[8 + c] = _mm512_shuffle_i32x4::<0b10_00_10_00>(second_halves, fourth_halves);
                out[12 + c] = _mm512_shuffle_i32x4::<0b11_01_11_01>(second_halves, fourth_halves);
            }
            out
        }
    }

    /// Four levels from `at`, in every lane.
    ///
    /// # Safety
    /// `at` has four readable bytes; the CPU has AVX-512 F.
    #[inline(always)]
    unsafe fn broadcast(at: *const i8) -> __m512i {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe { _mm512_set1_epi32(at.cast::<i32>().read_unaligned()) }
    }

    /// Input rows `first..first + R` against the panel: columns
    /// `first_column..` of their output rows, the lanes of `mask`.
    ///
    /// # Safety
    /// Each of the `R` input rows' levels and steps are readable for the
    /// panel's spans, and each output row has room for the panel's sixteen
    /// columns, which no other thread writes; the CPU has AVX-512 F, BW and
    /// VNNI.
    #[inline(always)]
    unsafe fn tile<const R: usize>(
        panel: &[PanelBlock],
        inputs: &QuantizedRows,
        first: usize,
        outs: &[*mut f32],
        first_column: usize,
        mask: u16,
    ) {
        // SAFETY: as the caller promises (the function's `# Safety`).
        unsafe {
            let nibble = _mm512_set1_epi8(0x0f);
            let mut sums = [_mm512_setzero_ps(); R];
            for (span, block) in panel.iter().enumerate() {
                let spans: [(&[i8], &[u32], f32); R] = std::array::from_fn(|r| inputs.span(first + r, span));
                let levels: [*const i8; R] = spans.map(|(levels, _, _)| levels.as_ptr());
                let d = _mm512_load_ps(block.d.as_ptr());
                for half in 0..2 {
                    let mut parts = [_mm512_setzero_si512(); R];
                    for group in 4 * half..4 * (half + 1) {
                        let (chunk, high) = (group / 2, group % 2 == 1);
                        let mut products = [_mm512_setzero_si512(); R];
                        for j in 0..8 {
                            let word = _mm512_load_si512(block.quants[8 * chunk + j].as_ptr().cast());
                            let weights = if high {
                                _mm512_and_si512(_mm512_srli_epi32::<4>(word), nibble)
                            } else {
                                _mm512_and_si512(word, nibble)
                            };
                            let at = 64 * chunk + 32 * usize::from(high) + 4 * j;
                            for (product, levels) in products.iter_mut().zip(levels) {
                                *product = _mm512_dpbusd_epi32(*product, weights, broadcast(levels.add(at)));
                            }
                        }
                        let scale = _mm512_load_si512(block.scales[group].as_ptr().cast());
                        for (part, product) in parts.iter_mut().zip(products) {
                            *part = _mm512_add_epi32(*part, _mm512_mullo_epi32(product, scale));
                        }
                    }
                    for ((sum, part), (_, _, step)) in sums.iter_mut().zip(parts).zip(spans) {
                        let scale = _mm512_mul_ps(d, _mm512_set1_ps(step));
                        *sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(part), scale, *sum);
                    }
                }
                let dmin = _mm512_load_ps(block.dmin.as_ptr());
                for (sum, (_, pair_sums, step)) in sums.iter_mut().zip(spans) {
                    let mut mins = _mm512_setzero_si512();
                    for (pair, pair_sum) in pair_sums.iter().enumerate() {
                        let pair_mins = _mm512_load_si512(block.mins[pair].as_ptr().cast());
                        mins = _mm512_dpwssd_epi32(mins, pair_mins, _mm512_set1_epi32(*pair_sum as i32));
                    }
                    let scale = _mm512_mul_ps(dmin, _mm512_set1_ps(-step));
                    *sum = _mm512_fmadd_ps(_mm512_cvtepi32_ps(mins), scale, *sum);
                }
            }
            for (r, sum) in sums.into_iter().enumerate() {
                _mm512_mask_storeu_ps(outs[first + r].add(first_column), mask, sum);
            }
        }
    }

    const _: () = assert!(SPAN == 256 && PANEL_ROWS == 16);
}

#[cfg(test)]
mod tests {
    use super::{dot_columns, has_vnni, reference, PANEL_ROWS};
    use crate::int8::tests::activations;
    use crate::int8::{QuantizedRows, SPAN};
    #[cfg(test)]
    use linnet_ir::quant;
    use linnet_ir::quant::BlockFormat;

    /// The panels compute the reference's bits on a CPU with VNNI, over
    /// arbitrary blocks, for whole panels and a part of one, and for every
    /// count of rows in a tile and past it.
    #[test]
    fn panels_compute_the_references_bits() {
        if !has_vnni() {
            return;
        }
        let depth = 3 * SPAN;
        let row_bytes = BlockFormat::Q4K.row_bytes(depth).unwrap();
        for columns in [PANEL_ROWS, 2 * PANEL_ROWS + 5, 7] {
            let blocks = quant::arbitrary_blocks(BlockFormat::Q4K, columns * depth / SPAN, columns as u64);
            for rows in (1..=9).chain([19]) {
                let values = activations(rows, depth, rows as u64 + 100);
                let inputs = QuantizedRows::new(values.chunks_exact(depth), depth);
                let mut outs = vec![vec![f32::NAN; columns]; rows];
                let pointers: Vec<*mut f32> = outs.iter_mut().map(|out| out.as_mut_ptr()).collect();
                // SAFETY: each output row has `columns` values; the CPU has VNNI.
                unsafe { dot_columns(&blocks, row_bytes, &inputs, &pointers, 0..columns) };
                for (r, out) in outs.iter().enumerate() {
                    for (n, ours) in out.iter().enumerate() {
                        let expected = reference(&blocks, row_bytes, &inputs, r, n);
                        assert_eq!(ours.to_bits(), expected.to_bits(), "{rows} rows, row {r} column {n} of {columns}");
                    }
                }
            }
        }
    }

    /// The reference's products are those of the quantized inputs and the
    /// weights' exact values, up to f32 rounding of their scales.
    #[test]
    fn the_reference_multiplies_the_quantized_inputs() {
        let (columns, depth) = (5, 4 * SPAN);
        let values = activations(1, columns * depth, 9);
        let blocks = quant::quantize(BlockFormat::Q4K, &values).unwrap();
        let mut weights = vec![0f32; columns * depth];
        quant::dequantize(BlockFormat::Q4K, &blocks, &mut weights).unwrap();
        let row_bytes = blocks.len() / columns;
        let inputs = activations(3, depth, 4);
        let quantized = QuantizedRows::new(inputs.chunks_exact(depth), depth);
        for r in 0..3 {
            for n in 0..columns {
                let (mut of_quantized, mut magnitude) = (0f64, 0f64);
                for k in 0..depth {
                    let (levels, _, step) = quantized.span(r, k / SPAN);
                    let x = f64::from(step) * f64::from(levels[k % SPAN]);
                    of_quantized += f64::from(weights[n * depth + k]) * x;
                    magnitude += f64::from(weights[n * depth + k].abs()) * x.abs();
                }
                let ours = f64::from(reference(&blocks, row_bytes, &quantized, r, n));
                assert!(
                    (ours - of_quantized).abs() <= magnitude * 1e-5,
                    "row {r} column {n}: {ours} vs {of_quantized}"
                );
            }
        }
    }
}
