//! Block formats: how a quantized parameter is stored, bit for bit as
//! llama.cpp (GGML) lays it out, so that a tensor quantized by either tool
//! reads the same in the other. A row is a run of blocks; each block holds
//! `BLOCK` values as small integers (levels) with scales, in groups of 16
//! or 32 values that share a scale ([`layouts`] has every format's bits).
//! What a stored parameter means is its dequantized values: [`dequantize`]
//! is the definition, each value its group's `step · level` with the
//! group's offset added or subtracted where the format has one, in f32
//! with the operations in that order (no fused multiply-add), which is
//! also what llama.cpp's `gguf` Python package computes.
//!
//! [`quantize`] writes blocks ([`fit`] says whose rules for which format).

mod fit;
pub mod layouts;

pub use layouts::{f16_at, q4_k_scales_mins, GroupScale, Offset};
use serde::{Deserialize, Serialize};
use std::fmt;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum BlockFormat {
    Q4_0,
    Q4_1,
    Q5_0,
    Q5_1,
    Q8_0,
    Q2K,
    Q3K,
    Q4K,
    Q5K,
    Q6K,
    Iq4Nl,
    Iq4Xs,
    Mxfp4,
}

impl BlockFormat {
    pub const ALL: [BlockFormat; 13] = [
        BlockFormat::Q4_0,
        BlockFormat::Q4_1,
        BlockFormat::Q5_0,
        BlockFormat::Q5_1,
        BlockFormat::Q8_0,
        BlockFormat::Q2K,
        BlockFormat::Q3K,
        BlockFormat::Q4K,
        BlockFormat::Q5K,
        BlockFormat::Q6K,
        BlockFormat::Iq4Nl,
        BlockFormat::Iq4Xs,
        BlockFormat::Mxfp4,
    ];

    /// Where the format is in [`BlockFormat::ALL`].
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Values per block.
    pub const fn block_values(self) -> usize {
        match self {
            BlockFormat::Q4_0
            | BlockFormat::Q4_1
            | BlockFormat::Q5_0
            | BlockFormat::Q5_1
            | BlockFormat::Q8_0
            | BlockFormat::Iq4Nl
            | BlockFormat::Mxfp4 => 32,
            BlockFormat::Q2K
            | BlockFormat::Q3K
            | BlockFormat::Q4K
            | BlockFormat::Q5K
            | BlockFormat::Q6K
            | BlockFormat::Iq4Xs => 256,
        }
    }

    /// Values that share a scale: a group.
    pub const fn group_values(self) -> usize {
        match self {
            BlockFormat::Q2K | BlockFormat::Q3K | BlockFormat::Q6K => 16,
            _ => 32,
        }
    }

    /// Whether a group's values add an offset to their scaled levels
    /// (`layouts::Offset` other than `None`; kernels branch on it at
    /// compile time).
    pub const fn has_offset(self) -> bool {
        matches!(self, BlockFormat::Q4_1 | BlockFormat::Q5_1 | BlockFormat::Q2K | BlockFormat::Q4K | BlockFormat::Q5K)
    }

    /// Bytes per block.
    pub const fn block_bytes(self) -> usize {
        match self {
            BlockFormat::Q4_0 | BlockFormat::Iq4Nl => 18,
            BlockFormat::Q4_1 => 20,
            BlockFormat::Q5_0 => 22,
            BlockFormat::Q5_1 => 24,
            BlockFormat::Q8_0 => 34,
            BlockFormat::Mxfp4 => 17,
            BlockFormat::Q2K => 84,
            BlockFormat::Q3K => 110,
            BlockFormat::Q4K => 144,
            BlockFormat::Q5K => 176,
            BlockFormat::Q6K => 210,
            BlockFormat::Iq4Xs => 136,
        }
    }

    /// Where a block's f16 scales lie: the bytes each starts at (MXFP4's
    /// one scale is an E8M0 byte, not an f16).
    pub fn half_scales(self) -> &'static [usize] {
        match self {
            BlockFormat::Q4_0 | BlockFormat::Q5_0 | BlockFormat::Q8_0 | BlockFormat::Iq4Nl | BlockFormat::Iq4Xs => &[0],
            BlockFormat::Q4_1 | BlockFormat::Q5_1 | BlockFormat::Q4K | BlockFormat::Q5K => &[0, 2],
            BlockFormat::Q2K => &[80, 82],
            BlockFormat::Q3K => &[108],
            BlockFormat::Q6K => &[208],
            BlockFormat::Mxfp4 => &[],
        }
    }

    /// The name GGML and the command line give it.
    pub fn name(self) -> &'static str {
        match self {
            BlockFormat::Q4_0 => "q4_0",
            BlockFormat::Q4_1 => "q4_1",
            BlockFormat::Q5_0 => "q5_0",
            BlockFormat::Q5_1 => "q5_1",
            BlockFormat::Q8_0 => "q8_0",
            BlockFormat::Q2K => "q2_k",
            BlockFormat::Q3K => "q3_k",
            BlockFormat::Q4K => "q4_k",
            BlockFormat::Q5K => "q5_k",
            BlockFormat::Q6K => "q6_k",
            BlockFormat::Iq4Nl => "iq4_nl",
            BlockFormat::Iq4Xs => "iq4_xs",
            BlockFormat::Mxfp4 => "mxfp4",
        }
    }

    pub fn parse(name: &str) -> Option<BlockFormat> {
        BlockFormat::ALL.into_iter().find(|format| format.name().eq_ignore_ascii_case(name))
    }

    /// GGML's type id (`ggml_type`), as GGUF files record it.
    pub fn ggml_type(self) -> u32 {
        match self {
            BlockFormat::Q4_0 => 2,
            BlockFormat::Q4_1 => 3,
            BlockFormat::Q5_0 => 6,
            BlockFormat::Q5_1 => 7,
            BlockFormat::Q8_0 => 8,
            BlockFormat::Q2K => 10,
            BlockFormat::Q3K => 11,
            BlockFormat::Q4K => 12,
            BlockFormat::Q5K => 13,
            BlockFormat::Q6K => 14,
            BlockFormat::Iq4Nl => 20,
            BlockFormat::Iq4Xs => 23,
            BlockFormat::Mxfp4 => 39,
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
    let group = format.group_values();
    for (block, out) in blocks.chunks_exact(format.block_bytes()).zip(out.chunks_exact_mut(format.block_values())) {
        for (number, out) in out.chunks_exact_mut(group).enumerate() {
            let scale = layouts::group_scale(format, block, number);
            for (at, value) in out.iter_mut().enumerate() {
                *value = scale.value(layouts::level(format, block, number * group + at));
            }
        }
    }
    Ok(())
}

/// Value `index` of the blocks `blocks` (the index must be inside them):
/// what [`dequantize`] writes there, computed alone.
pub fn value_at(format: BlockFormat, blocks: &[u8], index: usize) -> f32 {
    let (block, at) = (index / format.block_values(), index % format.block_values());
    let block = &blocks[block * format.block_bytes()..(block + 1) * format.block_bytes()];
    layouts::group_scale(format, block, at / format.group_values()).value(layouts::level(format, block, at))
}

/// A Q6_K block's 256 levels `q − 32`, in order. (Inlined into the CPU
/// backend's kernels, so that it is compiled with their features.)
#[inline]
pub fn q6_k_levels(block: &[u8]) -> [i8; 256] {
    let mut levels = [0i8; 256];
    for (half_block, levels) in levels.chunks_exact_mut(128).enumerate() {
        let (low, high) = (&block[half_block * 64..half_block * 64 + 64], &block[128 + half_block * 32..][..32]);
        for (part, levels) in levels.chunks_exact_mut(32).enumerate() {
            for (l, level) in levels.iter_mut().enumerate() {
                *level = layouts::q6_k_level(low, high, part, l);
            }
        }
    }
    levels
}

/// `count` blocks of arbitrary bytes from `seed` (any levels, any scales
/// but those that make a value infinite): what the tests of the formats'
/// readers decode.
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
        if format == BlockFormat::Mxfp4 {
            // Scales of 2^-21 to 2^19, as weights' are.
            block[0] = 107 + block[0] % 41;
        }
    }
    blocks
}

/// The first block of `blocks` that holds a value that is not finite.
/// Where a format's scales are f16s, a block's values are finite exactly
/// when those are (the levels and scales being small integers); an
/// MXFP4 block's values overflow only from its three largest exponents.
pub fn first_non_finite_block(format: BlockFormat, blocks: &[u8]) -> Option<usize> {
    // An f16 is infinite or NaN exactly when its five exponent bits
    // (those of 0x7c in its high byte) are all set.
    let unfinite = |block: &[u8], at: usize| block[at + 1] & 0x7c == 0x7c;
    let overflows =
        |block: &[u8]| block[0] > 252 && (0..32).any(|at| !value_at(BlockFormat::Mxfp4, block, at).is_finite());
    blocks.chunks_exact(format.block_bytes()).position(|block| match format {
        BlockFormat::Mxfp4 => overflows(block),
        _ => format.half_scales().iter().any(|at| unfinite(block, *at)),
    })
}

/// The blocks that store `values` (a whole number of blocks).
pub fn quantize(format: BlockFormat, values: &[f32]) -> Result<Vec<u8>, RaggedRow> {
    let len = format.row_bytes(values.len()).ok_or(RaggedRow { format, len: values.len() })?;
    let mut out = vec![0u8; len];
    for (block, values) in out.chunks_exact_mut(format.block_bytes()).zip(values.chunks_exact(format.block_values())) {
        fit::block(format, values, block);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numerics::{f16_bits, f16_value};

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
    /// rounding), relative to the group's largest magnitude. (The
    /// non-uniform levels, whose steps vary, and Q2_K, whose 4-bit scales
    /// leave a group of small values at zero beside one of large values,
    /// are held to their share of the signal below.)
    #[test]
    fn quantized_values_come_back_within_their_step() {
        // Each format's levels, and its scales' levels where a block's
        // groups have scales of their own (their rounding costs a group up
        // to half a scale step of the block's largest).
        let uniform = [
            (BlockFormat::Q8_0, 254.0, None),
            (BlockFormat::Q4_0, 15.0, None),
            (BlockFormat::Q4_1, 15.0, None),
            (BlockFormat::Q5_0, 31.0, None),
            (BlockFormat::Q5_1, 31.0, None),
            (BlockFormat::Q3K, 7.0, Some(32.0)),
            (BlockFormat::Q4K, 15.0, Some(63.0)),
            (BlockFormat::Q5K, 31.0, Some(63.0)),
            (BlockFormat::Q6K, 63.0, Some(128.0)),
        ];
        let largest = |values: &[f32]| values.iter().fold(0f32, |m, v| m.max(v.abs()));
        for (format, levels, scale_levels) in uniform {
            let values = sample(4096, 7);
            let back = round_trip(format, &values);
            let group = format.group_values();
            for (block, back) in values.chunks(format.block_values()).zip(back.chunks(format.block_values())) {
                let scales_rounding = scale_levels.map_or(0.0, |levels: f32| 2.0 * largest(block) / levels);
                for (original, back) in block.chunks(group).zip(back.chunks(group)) {
                    let low = original.iter().fold(0f32, |m, v| m.min(*v));
                    let high = original.iter().fold(0f32, |m, v| m.max(*v));
                    // A symmetric format spends a level on the far side of zero.
                    let span = if matches!(format, BlockFormat::Q3K | BlockFormat::Q4_0 | BlockFormat::Q5_0) {
                        2.0 * largest(original)
                    } else {
                        high - low
                    };
                    let bound = span / levels * 1.2 + largest(original) * 0.02 + scales_rounding + 1e-6;
                    for (a, b) in original.iter().zip(back) {
                        assert!((a - b).abs() <= bound, "{format}: {a} came back as {b} (bound {bound})");
                    }
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
        let shares = [
            (BlockFormat::Q8_0, 0.005),
            (BlockFormat::Q6K, 0.016),
            (BlockFormat::Q5K, 0.035),
            (BlockFormat::Q5_0, 0.04),
            (BlockFormat::Q5_1, 0.04),
            (BlockFormat::Q4K, 0.065),
            (BlockFormat::Iq4Xs, 0.07),
            (BlockFormat::Iq4Nl, 0.08),
            (BlockFormat::Q4_0, 0.09),
            (BlockFormat::Q4_1, 0.09),
            (BlockFormat::Mxfp4, 0.15),
            (BlockFormat::Q3K, 0.15),
            (BlockFormat::Q2K, 0.3),
        ];
        for (format, most) in shares {
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
            for &at in format.half_scales() {
                let mut blocks = arbitrary_blocks(format, 3, 7);
                assert_eq!(first_non_finite_block(format, &blocks), None, "{format}");
                for bits in 0..=u16::MAX {
                    blocks[format.block_bytes() + at..][..2].copy_from_slice(&bits.to_le_bytes());
                    let expected = (!f16_value(bits).is_finite()).then_some(1);
                    assert_eq!(first_non_finite_block(format, &blocks), expected, "{format} {bits:#06x} at {at}");
                }
            }
        }
    }

    /// Every E8M0 exponent with every level: an MXFP4 block is found
    /// exactly when one of its values overflows.
    #[test]
    fn an_overflowing_mxfp4_block_is_found() {
        let format = BlockFormat::Mxfp4;
        for level in 0..16u8 {
            for e in 0..=u8::MAX {
                let mut blocks = vec![0u8; 2 * format.block_bytes()];
                blocks[format.block_bytes()] = e;
                blocks[format.block_bytes() + 5] = level << 4;
                let mut values = vec![0f32; 64];
                dequantize(format, &blocks, &mut values).unwrap();
                let expected = values.iter().any(|v| !v.is_finite()).then_some(1);
                assert_eq!(first_non_finite_block(format, &blocks), expected, "e {e}, level {level}");
            }
        }
    }

    /// `has_offset` says what every group's scale holds.
    #[test]
    fn a_format_has_an_offset_exactly_where_its_groups_do() {
        for format in BlockFormat::ALL {
            let blocks = arbitrary_blocks(format, 4, 11);
            for block in blocks.chunks_exact(format.block_bytes()) {
                for group in 0..format.block_values() / format.group_values() {
                    let offset = layouts::group_scale(format, block, group).offset;
                    assert_eq!(offset != Offset::None, format.has_offset(), "{format} group {group}");
                }
            }
        }
    }

    /// A group's scale and min read alone are what unpacking all sixteen
    /// gives, for every group of arbitrary packed bytes.
    #[test]
    fn a_k_quant_group_scale_read_alone_is_the_unpacked_one() {
        for packed in arbitrary_blocks(BlockFormat::Q4K, 64, 3).chunks_exact(BlockFormat::Q4K.block_bytes()) {
            let packed = &packed[4..16];
            let all = q4_k_scales_mins(packed);
            for group in 0..8 {
                assert_eq!(layouts::q4_k_scale_min(packed, group), (all[group], all[8 + group]), "group {group}");
            }
        }
    }

    /// Each format's metadata agrees with itself and GGML's sizes; a
    /// block's groups divide it.
    #[test]
    fn every_format_is_described_consistently() {
        for format in BlockFormat::ALL {
            assert_eq!(BlockFormat::ALL[format.index()], format);
            assert_eq!(format.block_values() % format.group_values(), 0, "{format}");
            assert!(format.block_values() / format.group_values() <= 16, "{format}");
            assert!(format.half_scales().iter().all(|at| at + 2 <= format.block_bytes()), "{format}");
        }
        let sizes: Vec<(usize, usize)> = BlockFormat::ALL.iter().map(|f| (f.block_values(), f.block_bytes())).collect();
        let ggml = [(32, 18), (32, 20), (32, 22), (32, 24), (32, 34), (256, 84), (256, 110), (256, 144), (256, 176)];
        assert_eq!(&sizes[..9], &ggml);
        assert_eq!(&sizes[9..], &[(256, 210), (32, 18), (256, 136), (32, 17)]);
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
