//! Where each block format keeps its bits: a value's level (a small
//! integer, [`level`]) and its group's scale ([`group_scale`]), read from
//! a block's bytes exactly as GGML lays them out. A value is its group's
//! `step · level`, with the group's offset added or subtracted where the
//! format has one ([`GroupScale::value`]); `mod.rs` builds the formats'
//! definition from these two functions alone.
//!
//! Layouts (byte offsets in a block; `l` a value's place in its run of
//! 32, `g` its group):
//! - `Q4_0` (18): f16 `d`; 16 bytes of nibbles, values 0–15 low, 16–31
//!   high: `d · (q − 8)`. `Q4_1` (20): `d`, `m`, nibbles: `d · q + m`.
//! - `Q5_0` (22): `d`; a u32 of fifth bits (bit `i` for value `i`); the
//!   nibbles: `d · (q − 16)`. `Q5_1` (24): `d`, `m`, bits, nibbles:
//!   `d · q + m`.
//! - `Q8_0` (34): `d`, 32 `i8`: `d · q`.
//! - `IQ4_NL` (18): `d`, nibbles as Q4_0, each an index into the
//!   sixteen non-uniform levels [`IQ4_LEVELS`]: `d · level`.
//! - `MXFP4` (17): an E8M0 exponent `e`, nibbles as Q4_0, each an index
//!   into the doubled E2M1 values [`MXFP4_LEVELS`]: `2^(e − 128) · level`.
//! - `Q2_K` (84): sixteen bytes of 4-bit scales (low) and mins (high); 64
//!   bytes of 2-bit levels (value `128c + 32s + l` at byte `32c + l`,
//!   shifted `2s`); f16 `d`, `dmin`: `(d · scale) · q − dmin · min`.
//! - `Q3_K` (110): 32 bytes of high bits (value `i`'s bit `i / 32` of
//!   byte `i % 32`, a clear bit subtracting 4); 2-bit levels as Q2_K; 12
//!   bytes of sixteen 6-bit scales less 32; f16 `d`: `(d · scale) · q`.
//! - `Q4_K` (144): `d`, `dmin`, 12 bytes of 6-bit scales and mins
//!   ([`q4_k_scales_mins`]), 128 bytes of nibbles (group `g` in bytes
//!   `32 · (g / 2)`, low or high by `g % 2`): `(d · scale) · q − dmin · min`.
//! - `Q5_K` (176): as Q4_K, then 32 bytes of fifth bits (group `g`'s in
//!   bit `g` of byte `l`) before the nibbles.
//! - `Q6_K` (210): 128 bytes of low nibbles, 64 of high pairs
//!   ([`q6_k_level`]), sixteen `i8` scales, f16 `d`: `(d · scale) · (q − 32)`.
//! - `IQ4_XS` (136): `d`; a u16 of the eight groups' high scale bits
//!   (two each), four bytes of their low nibbles; 128 bytes of nibbles
//!   (group `g`'s sixteen bytes, low then high) indexing [`IQ4_LEVELS`]:
//!   `(d · (scale − 32)) · level`.

use super::BlockFormat;
use crate::numerics::f16_value;

/// IQ4_NL's and IQ4_XS's sixteen levels (GGML's `kvalues_iq4nl`).
pub const IQ4_LEVELS: [i8; 16] = [-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113];

/// MXFP4's sixteen E2M1 values, doubled to integers (GGML's
/// `kvalues_mxfp4`): the sign bit is the nibble's top bit.
pub const MXFP4_LEVELS: [i8; 16] = [0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12];

/// A group's scale: its values are `step · level`, then `± offset`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GroupScale {
    pub step: f32,
    pub offset: Offset,
}

/// What a group adds to its scaled levels (`None` adds nothing: not even
/// zero, which would turn a −0 into +0).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Offset {
    None,
    Plus(f32),
    Minus(f32),
}

impl GroupScale {
    /// The value of `level` in the group, in f32 with the definition's
    /// operations in order (no fused multiply-add).
    #[inline]
    pub fn value(self, level: i8) -> f32 {
        let scaled = self.step * f32::from(level);
        match self.offset {
            Offset::None => scaled,
            Offset::Plus(offset) => scaled + offset,
            Offset::Minus(offset) => scaled - offset,
        }
    }
}

/// The f16 at byte `at` of `bytes` (a block's scale), as f32.
#[inline(always)]
pub fn f16_at(bytes: &[u8], at: usize) -> f32 {
    f16_value(u16::from_le_bytes([bytes[at], bytes[at + 1]]))
}

/// An E8M0 exponent as MXFP4 scales by it: `2^(e − 128)` (half the
/// power of two it names), bit for bit as GGML's `e8m0_to_fp32_half`
/// builds it (the two least exponents as subnormal f32s).
#[inline(always)]
pub fn e8m0_half(e: u8) -> f32 {
    let bits = if e < 2 { 0x0020_0000u32 << e } else { u32::from(e - 1) << 23 };
    f32::from_bits(bits)
}

/// The nibble of value `at` (of 32) of a run of sixteen bytes: values
/// 0–15 in the low halves, 16–31 in the high.
#[inline]
fn nibble_of_32(bytes: &[u8], at: usize) -> u8 {
    (bytes[at % 16] >> (4 * (at / 16))) & 0xf
}

/// The fifth bit of value `at` (of 32) from Q5_0's and Q5_1's u32 at
/// byte `start`.
#[inline]
pub fn fifth_bit(block: &[u8], start: usize, at: usize) -> u8 {
    (block[start + at / 8] >> (at % 8)) & 1
}

/// Q2_K's and Q3_K's two bits of value `at`: the 64 bytes at `start`
/// hold two halves of 128 values, each value `32s + l` of a half at byte
/// `l`, shifted `2s`.
#[inline]
fn two_bits(block: &[u8], start: usize, at: usize) -> u8 {
    let (half, within) = (at / 128, at % 128);
    (block[start + half * 32 + within % 32] >> (2 * (within / 32))) & 3
}

/// Q6_K's level of value `l` of quarter `part` of a half block (from its
/// 64 bytes of low bits and 32 of high bits), minus 32.
#[inline]
pub fn q6_k_level(low: &[u8], high: &[u8], part: usize, l: usize) -> i8 {
    let low = (low[l + 32 * (part % 2)] >> (4 * (part / 2))) & 0xf;
    let high = (high[l] >> (2 * part)) & 3;
    (low | (high << 4)) as i8 - 32
}

/// Q4_K's (and Q5_K's) eight 6-bit scales, then its eight 6-bit mins,
/// from the block's 12 packed bytes: groups 0–3 have their scale in the
/// low six bits of byte `j` and their min in those of byte `j + 4`;
/// groups 4–7 have the low four bits of each in byte `j + 4` (scale low
/// nibble, min high) and the top two in the two high bits of bytes
/// `j - 4` (scale) and `j` (min). Taken four bytes to a word. (Inlined
/// into the CPU backend's kernels, so that it is compiled with their
/// features.)
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

/// Q4_K's (and Q5_K's) 6-bit scale and min of group `group` alone, as
/// [`q4_k_scales_mins`] unpacks them all.
#[inline(always)]
pub fn q4_k_scale_min(packed: &[u8], group: usize) -> (u8, u8) {
    if group < 4 {
        (packed[group] & 0x3f, packed[group + 4] & 0x3f)
    } else {
        let (low, high) = (packed[group + 4], (packed[group - 4] >> 6, packed[group] >> 6));
        ((low & 0xf) | (high.0 << 4), (low >> 4) | (high.1 << 4))
    }
}

/// Q3_K's sixteen 6-bit scales (before the 32 is taken off): the low
/// nibbles of bytes 0–7 (groups 0–7), then their high nibbles (8–15);
/// the top two bits of group `g` in bits `2 · (g / 4)` of byte `8 + g % 4`.
#[inline(always)]
pub fn q3_k_scale(packed: &[u8], group: usize) -> u8 {
    let low = (packed[group % 8] >> (4 * (group / 8))) & 0xf;
    let high = (packed[8 + group % 4] >> (2 * (group / 4))) & 3;
    low | (high << 4)
}

/// IQ4_XS's 6-bit scale of group `group` (before the 32 is taken off).
#[inline(always)]
pub fn iq4_xs_scale(block: &[u8], group: usize) -> u8 {
    let low = (block[4 + group / 2] >> (4 * (group % 2))) & 0xf;
    let high = (u16::from_le_bytes([block[2], block[3]]) >> (2 * group)) as u8 & 3;
    low | (high << 4)
}

/// The level of value `at` of `block` (a whole block of `format`).
#[inline]
pub fn level(format: BlockFormat, block: &[u8], at: usize) -> i8 {
    match format {
        BlockFormat::Q4_0 => nibble_of_32(&block[2..], at) as i8 - 8,
        BlockFormat::Q4_1 => nibble_of_32(&block[4..], at) as i8,
        BlockFormat::Q5_0 => (nibble_of_32(&block[6..], at) | (fifth_bit(block, 2, at) << 4)) as i8 - 16,
        BlockFormat::Q5_1 => (nibble_of_32(&block[8..], at) | (fifth_bit(block, 4, at) << 4)) as i8,
        BlockFormat::Q8_0 => block[2 + at] as i8,
        BlockFormat::Iq4Nl => IQ4_LEVELS[nibble_of_32(&block[2..], at) as usize],
        BlockFormat::Mxfp4 => MXFP4_LEVELS[nibble_of_32(&block[1..], at) as usize],
        BlockFormat::Q2K => two_bits(block, 16, at) as i8,
        BlockFormat::Q3K => {
            let high = (block[at % 32] >> (at / 32)) & 1;
            two_bits(block, 32, at) as i8 - if high == 0 { 4 } else { 0 }
        }
        BlockFormat::Q4K => {
            let (group, l) = (at / 32, at % 32);
            ((block[16 + group / 2 * 32 + l] >> (4 * (group % 2))) & 0xf) as i8
        }
        BlockFormat::Q5K => {
            let (group, l) = (at / 32, at % 32);
            let low = (block[48 + group / 2 * 32 + l] >> (4 * (group % 2))) & 0xf;
            (low | (((block[16 + l] >> group) & 1) << 4)) as i8
        }
        BlockFormat::Q6K => {
            let (half_block, rest) = (at / 128, at % 128);
            q6_k_level(&block[half_block * 64..], &block[128 + half_block * 32..], rest / 32, rest % 32)
        }
        BlockFormat::Iq4Xs => {
            let (group, l) = (at / 32, at % 32);
            IQ4_LEVELS[((block[8 + group * 16 + l % 16] >> (4 * (l / 16))) & 0xf) as usize]
        }
    }
}

/// The scale of group `group` (of [`BlockFormat::group_values`] values)
/// of `block` (a whole block of `format`).
#[inline]
pub fn group_scale(format: BlockFormat, block: &[u8], group: usize) -> GroupScale {
    group_scale_reading(format, block, group, f16_at)
}

/// [`group_scale`], the block's f16s read by `half` (which must give
/// [`f16_at`]'s value: a kernel's widening instruction). (Inlined into the
/// CPU backend's kernels, so that it is compiled with their features.)
#[inline(always)]
pub fn group_scale_reading(
    format: BlockFormat,
    block: &[u8],
    group: usize,
    half: impl Fn(&[u8], usize) -> f32,
) -> GroupScale {
    let plain = |step| GroupScale { step, offset: Offset::None };
    match format {
        BlockFormat::Q4_0 | BlockFormat::Q5_0 | BlockFormat::Q8_0 | BlockFormat::Iq4Nl => plain(half(block, 0)),
        BlockFormat::Q4_1 | BlockFormat::Q5_1 => {
            GroupScale { step: half(block, 0), offset: Offset::Plus(half(block, 2)) }
        }
        BlockFormat::Mxfp4 => plain(e8m0_half(block[0])),
        BlockFormat::Q2K => {
            let packed = block[group];
            GroupScale {
                step: half(block, 80) * f32::from(packed & 0xf),
                offset: Offset::Minus(half(block, 82) * f32::from(packed >> 4)),
            }
        }
        BlockFormat::Q3K => plain(half(block, 108) * f32::from(q3_k_scale(&block[96..108], group) as i8 - 32)),
        BlockFormat::Q4K | BlockFormat::Q5K => {
            let (scale, min) = q4_k_scale_min(&block[4..16], group);
            GroupScale {
                step: half(block, 0) * f32::from(scale),
                offset: Offset::Minus(half(block, 2) * f32::from(min)),
            }
        }
        BlockFormat::Q6K => plain(half(block, 208) * f32::from(block[192 + group] as i8)),
        BlockFormat::Iq4Xs => plain(half(block, 0) * f32::from(iq4_xs_scale(block, group) as i8 - 32)),
    }
}
