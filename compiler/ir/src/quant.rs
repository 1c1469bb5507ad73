//! Block formats: how a quantized parameter is stored, bit for bit as
//! llama.cpp (GGML) lays it out, so that a tensor quantized by either tool
//! reads the same in the other. A row is a run of blocks; each block holds
//! `BLOCK` values as small integers with scales. What a stored parameter
//! means is its dequantized values: [`dequantize`] is the definition, in
//! f32 with the operations in the order written below (no fused
//! multiply-add), which is also what llama.cpp's `gguf` Python package
//! computes.
//!
//! - `Q8_0`: 32 values; an f16 scale `d`, then 32 `i8`: `d · q`.
//! - `Q4_K`: 256 values in 8 groups of 32; f16 `d` and `dmin`, 12 bytes of
//!   6-bit group scales and mins, 128 bytes of 4-bit values:
//!   `(d · scale) · q − dmin · min`.
//! - `Q6_K`: 256 values in 16 groups of 16; 128 bytes of low 4 bits, 64 of
//!   high 2 bits, 16 `i8` group scales, f16 `d`: `(d · scale) · (q − 32)`.
//!
//! [`quantize`] writes Q8_0 exactly as llama.cpp's reference quantizer
//! does. For Q4_K and Q6_K it is Linnet's own: each group's range (Q4_K)
//! or extreme (Q6_K) sets its scale, refined by a few rounds of least
//! squares, the scales are quantized, and the values are rounded with the
//! quantized scales. It is not llama.cpp's search, so the files differ in
//! their bytes; they are valid blocks, read the same by both.

use crate::numerics::{f16_bits, f16_value};
use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BlockFormat {
    Q8_0,
    Q4K,
    Q6K,
}

impl BlockFormat {
    pub const ALL: [BlockFormat; 3] = [BlockFormat::Q8_0, BlockFormat::Q4K, BlockFormat::Q6K];

    /// Values per block.
    pub fn block_values(self) -> usize {
        match self {
            BlockFormat::Q8_0 => 32,
            BlockFormat::Q4K | BlockFormat::Q6K => 256,
        }
    }

    /// Bytes per block.
    pub fn block_bytes(self) -> usize {
        match self {
            BlockFormat::Q8_0 => 34,
            BlockFormat::Q4K => 144,
            BlockFormat::Q6K => 210,
        }
    }

    /// Where a block's f16 scales lie: the bytes each starts at (Q8_0's
    /// `d`, Q4_K's `d` and `dmin`, Q6_K's `d`).
    pub fn half_scales(self) -> &'static [usize] {
        match self {
            BlockFormat::Q8_0 => &[0],
            BlockFormat::Q4K => &[0, 2],
            BlockFormat::Q6K => &[208],
        }
    }

    /// The name GGML and the command line give it.
    pub fn name(self) -> &'static str {
        match self {
            BlockFormat::Q8_0 => "q8_0",
            BlockFormat::Q4K => "q4_k",
            BlockFormat::Q6K => "q6_k",
        }
    }

    pub fn parse(name: &str) -> Option<BlockFormat> {
        BlockFormat::ALL.into_iter().find(|format| format.name().eq_ignore_ascii_case(name))
    }

    /// GGML's type id (`ggml_type`), as GGUF files record it.
    pub fn ggml_type(self) -> u32 {
        match self {
            BlockFormat::Q8_0 => 8,
            BlockFormat::Q4K => 12,
            BlockFormat::Q6K => 14,
        }
    }

    pub fn from_ggml_type(id: u32) -> Option<BlockFormat> {
        BlockFormat::ALL.into_iter().find(|format| format.ggml_type() == id)
    }

    /// Bytes of a row of `values` values, if the block divides it.
    pub fn row_bytes(self, values: usize) -> Option<usize> {
        values.is_multiple_of(self.block_values()).then(|| values / self.block_values() * self.block_bytes())
    }

    /// Bits per value, scales included.
    pub fn bits_per_value(self) -> f64 {
        (self.block_bytes() * 8) as f64 / self.block_values() as f64
    }
}

impl fmt::Display for BlockFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A row that is not a whole number of blocks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RaggedRow {
    pub format: BlockFormat,
    pub len: usize,
}

impl fmt::Display for RaggedRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (format, unit) = (self.format, self.format.block_values());
        write!(f, "{} is not a whole number of {format} blocks ({unit} values, {} bytes each)", self.len, {
            format.block_bytes()
        })
    }
}

/// Writes the values `blocks` stores into `out` (`out.len()` values).
pub fn dequantize(format: BlockFormat, blocks: &[u8], out: &mut [f32]) -> Result<(), RaggedRow> {
    if format.row_bytes(out.len()) != Some(blocks.len()) {
        return Err(RaggedRow { format, len: blocks.len() });
    }
    for (block, out) in blocks.chunks_exact(format.block_bytes()).zip(out.chunks_exact_mut(format.block_values())) {
        match format {
            BlockFormat::Q8_0 => dequantize_q8_0(block, out),
            BlockFormat::Q4K => dequantize_q4_k(block, out),
            BlockFormat::Q6K => dequantize_q6_k(block, out),
        }
    }
    Ok(())
}

/// `count` blocks of arbitrary bytes from `seed` (any levels, any scales
/// but finite ones): what the tests of the formats' readers decode.
pub fn arbitrary_blocks(format: BlockFormat, count: usize, seed: u64) -> Vec<u8> {
    let mut state = seed | 1;
    let mut blocks: Vec<u8> = (0..format.block_bytes() * count)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    for block in blocks.chunks_exact_mut(format.block_bytes()) {
        // An f16 exponent below its maximum: finite.
        format.half_scales().iter().for_each(|at| block[at + 1] &= 0x7b);
    }
    blocks
}

/// The first block of `blocks` whose scales are not finite (then so are
/// its values): a block's values are finite exactly when its f16 scales
/// are, the levels being small integers.
pub fn first_non_finite_scale(format: BlockFormat, blocks: &[u8]) -> Option<usize> {
    // An f16 is infinite or NaN exactly when its five exponent bits
    // (those of 0x7c in its high byte) are all set.
    let unfinite = |block: &[u8], at: usize| block[at + 1] & 0x7c == 0x7c;
    blocks
        .chunks_exact(format.block_bytes())
        .position(|block| format.half_scales().iter().any(|at| unfinite(block, *at)))
}

/// Value `index` of the blocks `blocks` (the index must be inside them):
/// what [`dequantize`] writes there, computed alone.
pub fn value_at(format: BlockFormat, blocks: &[u8], index: usize) -> f32 {
    let (block, at) = (index / format.block_values(), index % format.block_values());
    let block = &blocks[block * format.block_bytes()..(block + 1) * format.block_bytes()];
    match format {
        BlockFormat::Q8_0 => f16_at(block, 0) * f32::from(block[2 + at] as i8),
        BlockFormat::Q4K => {
            let (chunk, part, l) = (at / 64, at % 64 / 32, at % 32);
            let (group, levels) = (chunk * 2 + part, q4_k_scales_mins(&block[4..16]));
            let (step, offset) =
                (f16_at(block, 0) * f32::from(levels[group]), f16_at(block, 2) * f32::from(levels[8 + group]));
            step * f32::from((block[16 + chunk * 32 + l] >> (4 * part)) & 0xf) - offset
        }
        BlockFormat::Q6K => {
            let (half_block, rest) = (at / 128, at % 128);
            let (quarter, l) = (rest / 32, rest % 32);
            let level = q6_k_level(&block[half_block * 64..], &block[128 + half_block * 32..], quarter, l);
            let scale = block[192 + at / 16] as i8;
            f16_at(block, 208) * f32::from(scale) * f32::from(level)
        }
    }
}

/// The blocks that store `values` (a whole number of blocks).
pub fn quantize(format: BlockFormat, values: &[f32]) -> Result<Vec<u8>, RaggedRow> {
    let len = format.row_bytes(values.len()).ok_or(RaggedRow { format, len: values.len() })?;
    let mut out = vec![0u8; len];
    for (block, values) in out.chunks_exact_mut(format.block_bytes()).zip(values.chunks_exact(format.block_values())) {
        match format {
            BlockFormat::Q8_0 => quantize_q8_0(values, block),
            BlockFormat::Q4K => quantize_q4_k(values, block),
            BlockFormat::Q6K => quantize_q6_k(values, block),
        }
    }
    Ok(out)
}

/// The f16 at byte `at` of `bytes` (a block's scale), as f32.
pub fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16_value(u16::from_le_bytes([bytes[at], bytes[at + 1]]))
}

fn put_half(bytes: &mut [u8], at: usize, value: f32) -> f32 {
    let bits = f16_bits(value);
    bytes[at..at + 2].copy_from_slice(&bits.to_le_bytes());
    f16_value(bits)
}

fn dequantize_q8_0(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    for (value, q) in out.iter_mut().zip(&block[2..34]) {
        *value = d * f32::from(*q as i8);
    }
}

/// llama.cpp's reference: the largest magnitude maps to ±127, values are
/// rounded half away from zero with the f32 scale, the scale stored as f16.
fn quantize_q8_0(values: &[f32], block: &mut [u8]) {
    let largest = values.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = largest / 127.0;
    let inverse = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_half(block, 0, d);
    for (q, value) in block[2..34].iter_mut().zip(values) {
        *q = (value * inverse).round() as i8 as u8;
    }
}

/// Q4_K's eight 6-bit scales, then its eight 6-bit mins, from the block's
/// 12 packed bytes: groups 0–3 have their scale in the low six bits of
/// byte `j` and their min in those of byte `j + 4`; groups 4–7 have the
/// low four bits of each in byte `j + 4` (scale low nibble, min high) and
/// the top two in the two high bits of bytes `j - 4` (scale) and `j`
/// (min). Taken four bytes to a word. (Inlined into the CPU backend's
/// kernels, so that it is compiled with their features.)
#[inline]
pub fn q4_k_scales_mins(packed: &[u8]) -> [u8; 16] {
    let word = |at: usize| u32::from_le_bytes([packed[at], packed[at + 1], packed[at + 2], packed[at + 3]]);
    let (first, second, third) = (word(0), word(4), word(8));
    let scales_low = first & 0x3f3f_3f3f;
    let mins_low = second & 0x3f3f_3f3f;
    let scales_high = (third & 0x0f0f_0f0f) | (((first >> 6) & 0x0303_0303) << 4);
    let mins_high = ((third >> 4) & 0x0f0f_0f0f) | (((second >> 6) & 0x0303_0303) << 4);
    let mut out = [0u8; 16];
    for (at, word) in [scales_low, scales_high, mins_low, mins_high].into_iter().enumerate() {
        out[at * 4..at * 4 + 4].copy_from_slice(&word.to_le_bytes());
    }
    out
}

fn dequantize_q4_k(block: &[u8], out: &mut [f32]) {
    let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
    let (levels, quants) = (q4_k_scales_mins(&block[4..16]), &block[16..144]);
    for chunk in 0..4 {
        let nibbles = &quants[chunk * 32..chunk * 32 + 32];
        for (part, shift) in [(0usize, 0u8), (1, 4)] {
            let group = chunk * 2 + part;
            let (step, offset) = (d * f32::from(levels[group]), dmin * f32::from(levels[8 + group]));
            let out = &mut out[chunk * 64 + part * 32..chunk * 64 + part * 32 + 32];
            for (value, q) in out.iter_mut().zip(nibbles) {
                *value = step * f32::from((q >> shift) & 0xf) - offset;
            }
        }
    }
}

/// Each group of 32 spans `[-offset, 15 · step - offset]` ([`fit_affine`]);
/// the steps and offsets are 6-bit multiples of `d` and `dmin`.
fn quantize_q4_k(values: &[f32], block: &mut [u8]) {
    let mut steps = [0f32; 8];
    let mut offsets = [0f32; 8];
    for (group, values) in values.chunks_exact(32).enumerate() {
        (steps[group], offsets[group]) = fit_affine(values, 15.0);
    }
    let d = put_half(block, 0, steps.iter().fold(0f32, |m, s| m.max(*s)) / 63.0);
    let dmin = put_half(block, 2, offsets.iter().fold(0f32, |m, s| m.max(*s)) / 63.0);
    let six_bits = |value: f32, unit: f32| if unit > 0.0 { (value / unit).round().clamp(0.0, 63.0) as u8 } else { 0 };
    let scales: Vec<u8> = steps.iter().map(|s| six_bits(*s, d)).collect();
    let mins: Vec<u8> = offsets.iter().map(|m| six_bits(*m, dmin)).collect();
    let packed = &mut block[4..16];
    for j in 0..4 {
        packed[j] = scales[j] | ((scales[j + 4] >> 4) << 6);
        packed[j + 4] = mins[j] | ((mins[j + 4] >> 4) << 6);
        packed[j + 8] = (scales[j + 4] & 0xf) | ((mins[j + 4] & 0xf) << 4);
    }
    let mut quants = [0u8; 256];
    for (group, values) in values.chunks_exact(32).enumerate() {
        let step = d * f32::from(scales[group]);
        let offset = dmin * f32::from(mins[group]);
        for (q, value) in quants[group * 32..group * 32 + 32].iter_mut().zip(values) {
            *q = if step > 0.0 { ((value + offset) / step).round().clamp(0.0, 15.0) as u8 } else { 0 };
        }
    }
    for chunk in 0..4 {
        for l in 0..32 {
            block[16 + chunk * 32 + l] = quants[chunk * 64 + l] | (quants[chunk * 64 + 32 + l] << 4);
        }
    }
}

/// A group's step and offset for levels `0..=top` (`value ≈ step · q −
/// offset`, the offset at least 0): from the group's range, then refined
/// by least squares on the levels that range gives, kept only where it
/// lowers the squared error.
fn fit_affine(values: &[f32], top: f32) -> (f32, f32) {
    let low = values.iter().fold(0f32, |m, v| m.min(*v));
    let high = values.iter().fold(f32::MIN, |m, v| m.max(*v));
    let mut best = ((high - low).max(0.0) / top, -low);
    let error = |(step, offset): (f32, f32)| -> f32 {
        values
            .iter()
            .map(|v| {
                let q = if step > 0.0 { ((v + offset) / step).round().clamp(0.0, top) } else { 0.0 };
                (step * q - offset - v).powi(2)
            })
            .sum()
    };
    let mut best_error = error(best);
    for _ in 0..4 {
        let (step, offset) = best;
        if step <= 0.0 {
            break;
        }
        let levels: Vec<f32> = values.iter().map(|v| ((v + offset) / step).round().clamp(0.0, top)).collect();
        let n = values.len() as f32;
        let (mean_q, mean_v) = (levels.iter().sum::<f32>() / n, values.iter().sum::<f32>() / n);
        let covariance: f32 = levels.iter().zip(values).map(|(q, v)| (q - mean_q) * (v - mean_v)).sum();
        let variance: f32 = levels.iter().map(|q| (q - mean_q).powi(2)).sum();
        if variance <= 0.0 {
            break;
        }
        let fitted_step = covariance / variance;
        let fitted = (fitted_step, (fitted_step * mean_q - mean_v).max(0.0));
        let fitted_error = error(fitted);
        if !(fitted.0 > 0.0 && fitted_error < best_error) {
            break;
        }
        (best, best_error) = (fitted, fitted_error);
    }
    best
}

/// A group's step for levels `-32..=31` (`value ≈ step · q`): its value
/// of largest magnitude at -32, then refined by least squares on the
/// levels that gives, kept only where it lowers the squared error.
fn fit_symmetric(values: &[f32]) -> f32 {
    let extreme = values.iter().fold(0f32, |m, v| if v.abs() > m.abs() { *v } else { m });
    let levels = |step: f32| values.iter().map(move |v| (v / step).round().clamp(-32.0, 31.0));
    let error = |step: f32| -> f32 {
        if step == 0.0 {
            return values.iter().map(|v| v * v).sum();
        }
        levels(step).zip(values).map(|(q, v)| (step * q - v).powi(2)).sum()
    };
    let (mut best, mut best_error) = (extreme / -32.0, error(extreme / -32.0));
    for _ in 0..4 {
        if best == 0.0 {
            break;
        }
        let (products, squares) = levels(best).zip(values).fold((0f32, 0f32), |(p, s), (q, v)| (p + q * v, s + q * q));
        let fitted = if squares > 0.0 { products / squares } else { break };
        let fitted_error = error(fitted);
        if !(fitted != 0.0 && fitted_error < best_error) {
            break;
        }
        (best, best_error) = (fitted, fitted_error);
    }
    best
}

/// Q6_K's level of value `l` of quarter `part` of a half block (from its
/// 64 bytes of low bits and 32 of high bits), minus 32.
fn q6_k_level(low: &[u8], high: &[u8], part: usize, l: usize) -> i8 {
    let low = (low[l + 32 * (part % 2)] >> (4 * (part / 2))) & 0xf;
    let high = (high[l] >> (2 * part)) & 3;
    (low | (high << 4)) as i8 - 32
}

/// A Q6_K block's 256 levels ([`q6_k_level`]), in order. (Inlined into
/// the CPU backend's kernels, so that it is compiled with their features.)
#[inline]
pub fn q6_k_levels(block: &[u8]) -> [i8; 256] {
    let mut levels = [0i8; 256];
    for (half_block, levels) in levels.chunks_exact_mut(128).enumerate() {
        let (low, high) = (&block[half_block * 64..half_block * 64 + 64], &block[128 + half_block * 32..][..32]);
        for (part, levels) in levels.chunks_exact_mut(32).enumerate() {
            for (l, level) in levels.iter_mut().enumerate() {
                *level = q6_k_level(low, high, part, l);
            }
        }
    }
    levels
}

fn dequantize_q6_k(block: &[u8], out: &mut [f32]) {
    let (scales, d) = (&block[192..208], f16_at(block, 208));
    for (at, (value, level)) in out.iter_mut().zip(q6_k_levels(block)).enumerate() {
        *value = d * f32::from(scales[at / 16] as i8) * f32::from(level);
    }
}

/// Each group of 16 gets its step ([`fit_symmetric`]); the group scales
/// are `i8` steps of `d`, the largest mapped to -128.
fn quantize_q6_k(values: &[f32], block: &mut [u8]) {
    let mut group_scales = [0f32; 16];
    for (group, values) in values.chunks_exact(16).enumerate() {
        group_scales[group] = fit_symmetric(values);
    }
    let largest = group_scales.iter().fold(0f32, |m, s| if s.abs() > m.abs() { *s } else { m });
    let d = put_half(block, 208, largest / -128.0);
    let scales: Vec<i8> =
        group_scales.iter().map(|s| if d != 0.0 { (s / d).round().clamp(-128.0, 127.0) as i8 } else { 0 }).collect();
    for (slot, scale) in block[192..208].iter_mut().zip(&scales) {
        *slot = *scale as u8;
    }
    let mut quants = [0u8; 256];
    for (at, value) in values.iter().enumerate() {
        let step = d * f32::from(scales[at / 16]);
        let q = if step != 0.0 { (value / step).round().clamp(-32.0, 31.0) } else { 0.0 };
        quants[at] = (q as i8 + 32) as u8;
    }
    for half_block in 0..2 {
        for l in 0..32 {
            let q = |part: usize| quants[half_block * 128 + part * 32 + l];
            block[half_block * 64 + l] = (q(0) & 0xf) | ((q(2) & 0xf) << 4);
            block[half_block * 64 + l + 32] = (q(1) & 0xf) | ((q(3) & 0xf) << 4);
            block[128 + half_block * 32 + l] =
                (q(0) >> 4) | ((q(1) >> 4) << 2) | ((q(2) >> 4) << 4) | ((q(3) >> 4) << 6);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic spread of values: signs, magnitudes over decades,
    /// zeros, and a group of equal values.
    fn sample(len: usize, seed: u64) -> Vec<f32> {
        let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (0..len)
            .map(|at| {
                state = state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let unit = (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5;
                match at % 97 {
                    0 => 0.0,
                    1..=16 if at < 97 => 0.25,
                    _ => unit * 10f32.powi((at % 5) as i32 - 2),
                }
            })
            .collect()
    }

    fn round_trip(format: BlockFormat, values: &[f32]) -> Vec<f32> {
        let blocks = quantize(format, values).unwrap();
        assert_eq!(blocks.len(), format.row_bytes(values.len()).unwrap());
        let mut out = vec![0f32; values.len()];
        dequantize(format, &blocks, &mut out).unwrap();
        out
    }

    /// Every value read alone is the bit pattern `dequantize` writes, for
    /// arbitrary bytes (whatever scales and levels they hold; the scales'
    /// exponents kept finite).
    #[test]
    fn a_value_read_alone_is_what_dequantize_writes() {
        for format in BlockFormat::ALL {
            let blocks = arbitrary_blocks(format, 3, 0x2545_f491_4f6c_dd1d);
            let mut all = vec![0f32; 3 * format.block_values()];
            dequantize(format, &blocks, &mut all).unwrap();
            for (index, value) in all.iter().enumerate() {
                assert_eq!(value_at(format, &blocks, index).to_bits(), value.to_bits(), "{format} value {index}");
            }
        }
    }

    /// Each group's error is within half its step (plus the scale's own
    /// rounding), relative to the group's largest magnitude.
    #[test]
    fn quantized_values_come_back_within_their_step() {
        for (format, group, levels) in
            [(BlockFormat::Q8_0, 32, 254.0), (BlockFormat::Q4K, 32, 15.0), (BlockFormat::Q6K, 16, 63.0)]
        {
            let values = sample(4096, 7);
            let back = round_trip(format, &values);
            for (original, back) in values.chunks(group).zip(back.chunks(group)) {
                let low = original.iter().fold(0f32, |m, v| m.min(*v));
                let high = original.iter().fold(0f32, |m, v| m.max(*v));
                let bound = (high - low) / levels * 1.2 + high.abs().max(low.abs()) * 0.02 + 1e-6;
                for (a, b) in original.iter().zip(back) {
                    assert!((a - b).abs() <= bound, "{format}: {a} came back as {b} (bound {bound})");
                }
            }
        }
    }

    /// Bell-shaped values (a sum of four uniforms), as weights are.
    fn bell(len: usize) -> Vec<f32> {
        let uniform = sample(len * 4, 11);
        uniform.chunks(4).map(|four| four.iter().map(|v| v.clamp(-5.0, 5.0)).sum()).collect()
    }

    /// The error of each format on bell-shaped values, relative to their
    /// spread: what a quantized model's weights lose.
    #[test]
    fn each_format_keeps_its_share_of_the_signal() {
        let values = bell(1 << 16);
        let mean = values.iter().sum::<f32>() / values.len() as f32;
        let spread = (values.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / values.len() as f32).sqrt();
        for (format, most) in [(BlockFormat::Q8_0, 0.005), (BlockFormat::Q6K, 0.016), (BlockFormat::Q4K, 0.065)] {
            let back = round_trip(format, &values);
            let squared: f32 = values.iter().zip(&back).map(|(a, b)| (a - b).powi(2)).sum();
            let relative = (squared / values.len() as f32).sqrt() / spread;
            assert!(relative < most, "{format}: rmse/σ {relative:.4}, more than {most}");
        }
    }

    #[test]
    fn zeros_stay_zeros_and_blocks_are_the_ggml_sizes() {
        for format in BlockFormat::ALL {
            let back = round_trip(format, &vec![0.0; 512]);
            assert!(back.iter().all(|v| *v == 0.0), "{format}");
            assert_eq!(BlockFormat::from_ggml_type(format.ggml_type()), Some(format));
            assert_eq!(BlockFormat::parse(&format.name().to_uppercase()), Some(format));
        }
        assert_eq!(BlockFormat::Q4K.row_bytes(2048), Some(8 * 144));
        assert_eq!(BlockFormat::Q6K.row_bytes(100), None);
        assert!((BlockFormat::Q4K.bits_per_value() - 4.5).abs() < 1e-12);
    }

    #[test]
    fn a_ragged_row_is_an_error() {
        assert_eq!(
            quantize(BlockFormat::Q8_0, &[1.0; 33]).unwrap_err(),
            RaggedRow { format: BlockFormat::Q8_0, len: 33 }
        );
        let mut out = [0f32; 32];
        assert!(dequantize(BlockFormat::Q8_0, &[0; 33], &mut out).is_err());
    }

    /// Q8_0 of known values, worked by hand: the scale is 127 / 127 = 1,
    /// stored as f16 1.0 (0x3c00), and -0.5 rounds away from zero.
    #[test]
    fn q8_0_rounds_as_llama_cpp_does() {
        let mut values = [0f32; 32];
        values[0] = 127.0;
        values[1] = -0.5;
        values[2] = 2.5;
        let blocks = quantize(BlockFormat::Q8_0, &values).unwrap();
        assert_eq!(&blocks[..5], &[0x00, 0x3c, 127, (-1i8) as u8, 3]);
    }

    /// Every f16 a scale can hold, in each scale of each format: the
    /// block is found exactly when that f16 is infinite or NaN.
    #[test]
    fn a_block_with_an_unfinite_scale_is_found() {
        for format in BlockFormat::ALL {
            // GGML's layouts: Q8_0's `d`, Q4_K's `d` and `dmin`, Q6_K's `d` last.
            let scales: &[usize] = match format {
                BlockFormat::Q8_0 => &[0],
                BlockFormat::Q4K => &[0, 2],
                BlockFormat::Q6K => &[208],
            };
            assert_eq!(format.half_scales(), scales, "{format}");
            for &at in scales {
                let mut blocks = arbitrary_blocks(format, 3, 7);
                assert_eq!(first_non_finite_scale(format, &blocks), None, "{format}");
                for bits in 0..=u16::MAX {
                    blocks[format.block_bytes() + at..][..2].copy_from_slice(&bits.to_le_bytes());
                    let expected = (!f16_value(bits).is_finite()).then_some(1);
                    assert_eq!(first_non_finite_scale(format, &blocks), expected, "{format} {bits:#06x} at {at}");
                }
            }
        }
    }

    #[test]
    fn f16_conversion_is_exact_and_rounds_to_nearest_even() {
        for bits in 0..=u16::MAX {
            let value = f16_value(bits);
            if value.is_nan() {
                assert!(f16_value(f16_bits(value)).is_nan());
            } else {
                assert_eq!(f16_bits(value), bits, "{bits:#06x} {value}");
            }
        }
        assert_eq!(f16_bits(65519.0), 0x7bff);
        assert_eq!(f16_bits(65520.0), 0x7c00);
        // Halfway between 1 and its successor 1 + 2^-10 goes to the even 1.
        assert_eq!(f16_bits(1.0 + 2f32.powi(-11)), 0x3c00);
        assert_eq!(f16_bits(1.0 + 3.0 * 2f32.powi(-11)), 0x3c02);
        assert_eq!(f16_bits(2f32.powi(-25)), 0);
        assert_eq!(f16_bits(3.0 * 2f32.powi(-25)), 2);
    }
}
