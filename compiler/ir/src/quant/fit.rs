//! Quantizers: the blocks that store a run of values. Q8_0, Q4_0, Q4_1,
//! Q5_0, Q5_1 and MXFP4 follow llama.cpp's reference quantizers (the
//! rules its `gguf` Python package writes), so their bytes are llama.cpp's.
//! The others are Linnet's own: each group's scale is fitted (its range
//! or extreme, refined by a few rounds of least squares, or for the
//! non-uniform levels a search over candidate scales), the block's scales
//! are quantized, and the values are rounded with the quantized scales.
//! Those are not llama.cpp's searches, so the bytes differ from its files;
//! they are valid blocks, read the same by both.

use super::layouts::{e8m0_half, IQ4_LEVELS, MXFP4_LEVELS};
use super::BlockFormat;
use crate::numerics::{f16_bits, f16_value};

/// Writes the block of `format` that stores `values` (one block's worth).
pub fn block(format: BlockFormat, values: &[f32], out: &mut [u8]) {
    match format {
        BlockFormat::Q8_0 => q8_0(values, out),
        BlockFormat::Q4_0 => symmetric_legacy(values, out, 4),
        BlockFormat::Q5_0 => symmetric_legacy(values, out, 5),
        BlockFormat::Q4_1 => affine_legacy(values, out, 4),
        BlockFormat::Q5_1 => affine_legacy(values, out, 5),
        BlockFormat::Mxfp4 => mxfp4(values, out),
        BlockFormat::Iq4Nl => iq4_nl(values, out),
        BlockFormat::Q2K => q2_k(values, out),
        BlockFormat::Q3K => q3_k(values, out),
        BlockFormat::Q4K => q4_k(values, out),
        BlockFormat::Q5K => q5_k(values, out),
        BlockFormat::Q6K => q6_k(values, out),
        BlockFormat::Iq4Xs => iq4_xs(values, out),
    }
}

/// Stores `value` as the f16 at byte `at`; the value it holds.
fn put_half(bytes: &mut [u8], at: usize, value: f32) -> f32 {
    let bits = f16_bits(value);
    bytes[at..at + 2].copy_from_slice(&bits.to_le_bytes());
    f16_value(bits)
}

/// The first value of largest magnitude (its sign kept).
fn extreme(values: &[f32]) -> f32 {
    values.iter().fold(0f32, |m, v| if v.abs() > m.abs() { *v } else { m })
}

/// Sixteen bytes of nibbles from 32 levels: values 0–15 low, 16–31 high.
fn pack_nibbles_of_32(levels: &[u8], out: &mut [u8]) {
    for (at, byte) in out[..16].iter_mut().enumerate() {
        *byte = (levels[at] & 0xf) | (levels[at + 16] << 4);
    }
}

/// llama.cpp's reference: the largest magnitude maps to ±127, values are
/// rounded half away from zero with the f32 scale, the scale stored as f16.
fn q8_0(values: &[f32], block: &mut [u8]) {
    let largest = values.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = largest / 127.0;
    let inverse = if d != 0.0 { 1.0 / d } else { 0.0 };
    put_half(block, 0, d);
    for (q, value) in block[2..34].iter_mut().zip(values) {
        *q = (value * inverse).round() as i8 as u8;
    }
}

/// Q4_0 (`bits` 4) and Q5_0 (5), llama.cpp's reference: the value of
/// largest magnitude maps to the lowest level, `−2^(bits−1)`; levels are
/// `x / d + 2^(bits−1)` rounded half up (truncated after adding ½).
fn symmetric_legacy(values: &[f32], block: &mut [u8], bits: u32) {
    let middle = (1u32 << (bits - 1)) as f32;
    let d = extreme(values) / -middle;
    let inverse = if d != 0.0 { 1.0 / d } else { 0.0 };
    let top = ((1u32 << bits) - 1) as f32;
    let levels: Vec<u8> = values.iter().map(|v| (v * inverse + (middle + 0.5)).trunc().clamp(0.0, top) as u8).collect();
    put_half(block, 0, d);
    pack_legacy_levels(&levels, &mut block[2..], bits);
}

/// Q4_1 (`bits` 4) and Q5_1 (5), llama.cpp's reference: the range spans
/// the levels from the minimum, rounded half up.
fn affine_legacy(values: &[f32], block: &mut [u8], bits: u32) {
    let top = ((1u32 << bits) - 1) as f32;
    let low = values.iter().fold(f32::INFINITY, |m, v| m.min(*v));
    let high = values.iter().fold(f32::NEG_INFINITY, |m, v| m.max(*v));
    let d = (high - low) / top;
    let inverse = if d != 0.0 { 1.0 / d } else { 0.0 };
    let levels: Vec<u8> = values.iter().map(|v| ((v - low) * inverse + 0.5).trunc().clamp(0.0, top) as u8).collect();
    put_half(block, 0, d);
    put_half(block, 2, low);
    pack_legacy_levels(&levels, &mut block[4..], bits);
}

/// The 32 levels of a legacy format of `bits` bits, from its first byte
/// after the scales: the fifth bits first (a u32, bit `i` for level `i`)
/// where there are five, then the nibbles.
fn pack_legacy_levels(levels: &[u8], out: &mut [u8], bits: u32) {
    let nibbles_at = if bits == 5 {
        let fifth = levels.iter().enumerate().fold(0u32, |word, (at, level)| word | (u32::from(level >> 4) << at));
        out[..4].copy_from_slice(&fifth.to_le_bytes());
        4
    } else {
        0
    };
    pack_nibbles_of_32(levels, &mut out[nibbles_at..]);
}

/// The index of MXFP4's level (times `step`) nearest `value`, the first
/// of equals (as llama.cpp's reference picks it).
fn nearest_mxfp4(step: f32, value: f32) -> usize {
    let error = |level: &i8| (step * f32::from(*level) - value).abs();
    (0..16).fold(0, |best, at| if error(&MXFP4_LEVELS[at]) < error(&MXFP4_LEVELS[best]) { at } else { best })
}

/// llama.cpp's reference: the exponent puts the largest magnitude in the
/// top E2M1 binade (`⌊log2 max⌋ − 2`), each value the nearest level.
fn mxfp4(values: &[f32], block: &mut [u8]) {
    let largest = values.iter().fold(0f32, |m, v| m.max(v.abs()));
    let e = if largest > 0.0 { (largest.log2().floor() - 2.0 + 127.0).clamp(0.0, 255.0) as u8 } else { 0 };
    let step = e8m0_half(e);
    let levels: Vec<u8> = values.iter().map(|v| nearest_mxfp4(step, *v) as u8).collect();
    block[0] = e;
    pack_nibbles_of_32(&levels, &mut block[1..]);
}

/// The index of IQ4_NL's level nearest `value / step` (its levels are
/// sorted; the lower of two as near).
fn nearest_iq4(step: f32, value: f32) -> usize {
    let target = if step != 0.0 { value / step } else { 0.0 };
    let above = IQ4_LEVELS.partition_point(|level| f32::from(*level) < target);
    match above {
        0 => 0,
        16 => 15,
        _ => {
            let (low, high) = (f32::from(IQ4_LEVELS[above - 1]), f32::from(IQ4_LEVELS[above]));
            if target - low <= high - target {
                above - 1
            } else {
                above
            }
        }
    }
}

/// The step of 32 values on IQ4_NL's levels that least errs: candidates
/// mapping the extreme to either end of the levels and eight steps
/// around, each refined once by least squares on its levels.
fn fit_iq4(values: &[f32]) -> f32 {
    let most = extreme(values);
    if most == 0.0 {
        return 0.0;
    }
    let level = |step: f32, value: f32| f32::from(IQ4_LEVELS[nearest_iq4(step, value)]);
    let error = |step: f32| -> f32 { values.iter().map(|v| (step * level(step, *v) - v).powi(2)).sum() };
    let (mut best, mut best_error) = (most / -127.0, error(most / -127.0));
    for candidate in (-4..=4).map(|k| most / (-127.0 + k as f32 * 2.0)).chain([most / 113.0]) {
        let (products, squares) = values
            .iter()
            .fold((0f32, 0f32), |(p, s), v| (p + level(candidate, *v) * v, s + level(candidate, *v).powi(2)));
        for step in [candidate, if squares > 0.0 { products / squares } else { candidate }] {
            let step_error = error(step);
            if step != 0.0 && step_error < best_error {
                (best, best_error) = (step, step_error);
            }
        }
    }
    best
}

fn iq4_nl(values: &[f32], block: &mut [u8]) {
    let d = put_half(block, 0, fit_iq4(values));
    let levels: Vec<u8> = values.iter().map(|v| nearest_iq4(d, *v) as u8).collect();
    pack_nibbles_of_32(&levels, &mut block[2..]);
}

/// Eight groups of 32 on IQ4_NL's levels; their steps 6-bit multiples of
/// `d` (less 32), the largest mapped to −32.
fn iq4_xs(values: &[f32], block: &mut [u8]) {
    let steps: Vec<f32> = values.chunks_exact(32).map(fit_iq4).collect();
    let d = put_half(block, 0, extreme(&steps) / -32.0);
    let scales: Vec<u8> =
        steps.iter().map(|s| if d != 0.0 { ((s / d).round().clamp(-32.0, 31.0) + 32.0) as u8 } else { 32 }).collect();
    let high =
        scales.iter().enumerate().fold(0u16, |bits, (group, scale)| bits | (u16::from(scale >> 4) << (2 * group)));
    block[2..4].copy_from_slice(&high.to_le_bytes());
    for pair in 0..4 {
        block[4 + pair] = (scales[2 * pair] & 0xf) | ((scales[2 * pair + 1] & 0xf) << 4);
    }
    for (group, values) in values.chunks_exact(32).enumerate() {
        let step = d * f32::from(scales[group] as i8 - 32);
        let levels: Vec<u8> = values.iter().map(|v| nearest_iq4(step, *v) as u8).collect();
        pack_nibbles_of_32(&levels, &mut block[8 + group * 16..]);
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

/// A group's step for levels `low..=high` (`low` negative, `value ≈ step
/// · q`): its value of largest magnitude at `low`, then refined by least
/// squares on the levels that gives, kept only where it lowers the
/// squared error.
fn fit_symmetric(values: &[f32], low: f32, high: f32) -> f32 {
    let levels = |step: f32| values.iter().map(move |v| (v / step).round().clamp(low, high));
    let error = |step: f32| -> f32 {
        if step == 0.0 {
            return values.iter().map(|v| v * v).sum();
        }
        levels(step).zip(values).map(|(q, v)| (step * q - v).powi(2)).sum()
    };
    let start = extreme(values) / low;
    let (mut best, mut best_error) = (start, error(start));
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

/// The groups of an affine K format (`group` values each, levels
/// `0..=top`), their steps and offsets as `scale_bits`-bit multiples of
/// the block's `d` and `dmin` (stored at `at_d` and `at_d + 2`): the
/// quantized scales, the mins, and each value's level.
struct AffineGroups {
    scales: Vec<u8>,
    mins: Vec<u8>,
    levels: Vec<u8>,
}

fn affine_groups(
    values: &[f32],
    group: usize,
    top: f32,
    scale_bits: u32,
    block: &mut [u8],
    at_d: usize,
) -> AffineGroups {
    let fits: Vec<(f32, f32)> = values.chunks_exact(group).map(|g| fit_affine(g, top)).collect();
    let most = ((1u32 << scale_bits) - 1) as f32;
    let d = put_half(block, at_d, fits.iter().fold(0f32, |m, f| m.max(f.0)) / most);
    let dmin = put_half(block, at_d + 2, fits.iter().fold(0f32, |m, f| m.max(f.1)) / most);
    let quantized = |value: f32, unit: f32| if unit > 0.0 { (value / unit).round().clamp(0.0, most) as u8 } else { 0 };
    let scales: Vec<u8> = fits.iter().map(|f| quantized(f.0, d)).collect();
    let mins: Vec<u8> = fits.iter().map(|f| quantized(f.1, dmin)).collect();
    let mut levels = vec![0u8; values.len()];
    for (number, (values, levels)) in values.chunks_exact(group).zip(levels.chunks_exact_mut(group)).enumerate() {
        let (step, offset) = (d * f32::from(scales[number]), dmin * f32::from(mins[number]));
        for (q, value) in levels.iter_mut().zip(values) {
            *q = if step > 0.0 { ((value + offset) / step).round().clamp(0.0, top) as u8 } else { 0 };
        }
    }
    AffineGroups { scales, mins, levels }
}

/// Q4_K's and Q5_K's twelve bytes of 6-bit scales and mins (the packing
/// `layouts::q4_k_scales_mins` reads).
fn pack_scales_mins(scales: &[u8], mins: &[u8], packed: &mut [u8]) {
    for j in 0..4 {
        packed[j] = scales[j] | ((scales[j + 4] >> 4) << 6);
        packed[j + 4] = mins[j] | ((mins[j + 4] >> 4) << 6);
        packed[j + 8] = (scales[j + 4] & 0xf) | ((mins[j + 4] & 0xf) << 4);
    }
}

/// The nibbles of Q4_K's and Q5_K's eight groups: group `g` in the 32
/// bytes from `32 · (g / 2)`, low or high by `g % 2`.
fn pack_k_nibbles(levels: &[u8], out: &mut [u8]) {
    for chunk in 0..4 {
        for l in 0..32 {
            out[chunk * 32 + l] = (levels[chunk * 64 + l] & 0xf) | ((levels[chunk * 64 + 32 + l] & 0xf) << 4);
        }
    }
}

/// Q2_K's and Q3_K's 64 bytes of 2-bit levels (`levels` already 0–3).
fn pack_two_bits(levels: &[u8], out: &mut [u8]) {
    for half in 0..2 {
        for l in 0..32 {
            out[half * 32 + l] = (0..4).fold(0, |byte, s| byte | ((levels[half * 128 + s * 32 + l] & 3) << (2 * s)));
        }
    }
}

/// Each group of 32 spans `[-offset, 15 · step - offset]`; the steps and
/// offsets are 6-bit multiples of `d` and `dmin`.
fn q4_k(values: &[f32], block: &mut [u8]) {
    let groups = affine_groups(values, 32, 15.0, 6, block, 0);
    pack_scales_mins(&groups.scales, &groups.mins, &mut block[4..16]);
    pack_k_nibbles(&groups.levels, &mut block[16..144]);
}

/// As Q4_K, with 32 levels: the fifth bits of group `g` in bit `g`.
fn q5_k(values: &[f32], block: &mut [u8]) {
    let groups = affine_groups(values, 32, 31.0, 6, block, 0);
    pack_scales_mins(&groups.scales, &groups.mins, &mut block[4..16]);
    for l in 0..32 {
        block[16 + l] = (0..8).fold(0, |byte, group| byte | ((groups.levels[group * 32 + l] >> 4) << group));
    }
    pack_k_nibbles(&groups.levels, &mut block[48..176]);
}

/// Sixteen groups of 16 on levels 0–3; 4-bit scales (low) and mins (high).
fn q2_k(values: &[f32], block: &mut [u8]) {
    let groups = affine_groups(values, 16, 3.0, 4, block, 80);
    for (byte, (scale, min)) in block[..16].iter_mut().zip(groups.scales.iter().zip(&groups.mins)) {
        *byte = scale | (min << 4);
    }
    pack_two_bits(&groups.levels, &mut block[16..80]);
}

/// The steps of `group`-value groups on levels `low..=high`, as signed
/// multiples of the block's `d` (stored at `at_d`) of `scale_low..=
/// -scale_low - 1`, the largest mapped to `scale_low`: the quantized
/// scales and each value's level.
fn symmetric_groups(
    values: &[f32],
    group: usize,
    (low, high): (f32, f32),
    scale_low: f32,
    block: &mut [u8],
    at_d: usize,
) -> (Vec<i8>, Vec<i8>) {
    let steps: Vec<f32> = values.chunks_exact(group).map(|g| fit_symmetric(g, low, high)).collect();
    let d = put_half(block, at_d, extreme(&steps) / scale_low);
    let scales: Vec<i8> = steps
        .iter()
        .map(|s| if d != 0.0 { (s / d).round().clamp(scale_low, -scale_low - 1.0) as i8 } else { 0 })
        .collect();
    let levels = values
        .iter()
        .enumerate()
        .map(|(at, value)| {
            let step = d * f32::from(scales[at / group]);
            if step != 0.0 {
                (value / step).round().clamp(low, high) as i8
            } else {
                0
            }
        })
        .collect();
    (scales, levels)
}

/// Sixteen groups of 16 on levels −4–3 (a clear high bit subtracts 4);
/// 6-bit scales less 32, the largest mapped to −32.
fn q3_k(values: &[f32], block: &mut [u8]) {
    let (scales, levels) = symmetric_groups(values, 16, (-4.0, 3.0), -32.0, block, 108);
    let unsigned: Vec<u8> = levels.iter().map(|q| (q + 4) as u8).collect();
    for l in 0..32 {
        block[l] = (0..8).fold(0, |byte, j| byte | ((unsigned[j * 32 + l] >> 2) << j));
    }
    pack_two_bits(&unsigned, &mut block[32..96]);
    let scales: Vec<u8> = scales.iter().map(|s| (s + 32) as u8).collect();
    for j in 0..8 {
        block[96 + j] = (scales[j] & 0xf) | ((scales[j + 8] & 0xf) << 4);
    }
    for j in 0..4 {
        block[104 + j] = (0..4).fold(0, |byte, k| byte | ((scales[k * 4 + j] >> 4) << (2 * k)));
    }
}

/// Each group of 16 gets its step; the group scales are `i8` steps of
/// `d`, the largest mapped to -128.
fn q6_k(values: &[f32], block: &mut [u8]) {
    let (scales, levels) = symmetric_groups(values, 16, (-32.0, 31.0), -128.0, block, 208);
    for (slot, scale) in block[192..208].iter_mut().zip(&scales) {
        *slot = *scale as u8;
    }
    let quants: Vec<u8> = levels.iter().map(|q| (q + 32) as u8).collect();
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
