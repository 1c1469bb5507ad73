//! MXFP4 tensors as OpenAI's checkpoints store them (gpt-oss's experts,
//! read by transformers' `Mxfp4` integration): a parameter `NAME` is two
//! u8 tensors, `NAME_blocks` `[..., rows, groups, 16]` (each group's 32
//! 4-bit codes, two a byte, the even value in the low nibble) and
//! `NAME_scales` `[..., rows, groups]` (each group's power of two, biased
//! by 127). They are rewritten as GGML's MXFP4 blocks (the scale byte,
//! then 16 bytes holding the group's first 16 codes in their low nibbles
//! and its last 16 in their high ones), which every backend reads: the
//! codes and the scale byte mean the same in both layouts, so the values
//! are the same bits.

use linnet_ir::quant::BlockFormat;

/// The suffixes of the two tensors that hold a parameter in MXFP4.
pub const BLOCKS: &str = "_blocks";
pub const SCALES: &str = "_scales";

/// The bytes of one group's codes.
const GROUP_BYTES: usize = 16;

/// The value shape an MXFP4 pair of `blocks` (`[..., groups, 16]`) and
/// `scales` (`[..., groups]`) shapes holds; `None` where the shapes are
/// not such a pair.
pub fn value_shape(blocks: &[usize], scales: &[usize]) -> Option<Vec<usize>> {
    match blocks.split_last() {
        Some((&GROUP_BYTES, groups)) if groups == scales && !groups.is_empty() => {
            let mut shape = groups.to_vec();
            *shape.last_mut().expect("not empty") *= BlockFormat::Mxfp4.block_values();
            Some(shape)
        }
        _ => None,
    }
}

/// GGML's MXFP4 blocks of the groups OpenAI's layout stores as `blocks`
/// (16 bytes a group) and `scales` (one byte a group).
pub fn to_ggml(blocks: &[u8], scales: &[u8]) -> Vec<u8> {
    debug_assert_eq!(blocks.len(), scales.len() * GROUP_BYTES);
    let mut out = Vec::with_capacity(scales.len() * BlockFormat::Mxfp4.block_bytes());
    for (codes, &scale) in blocks.chunks_exact(GROUP_BYTES).zip(scales) {
        // The code of the group's value `at`: even values in low nibbles.
        let code = |at: usize| (codes[at / 2] >> (4 * (at % 2))) & 0x0f;
        out.push(scale);
        out.extend((0..GROUP_BYTES).map(|at| code(at) | code(at + GROUP_BYTES) << 4));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use linnet_ir::quant;

    /// transformers' reading of OpenAI's layout, written out: value `2j`
    /// of a group is the low nibble of byte `j`, value `2j + 1` the high
    /// one, each code's FP4 value times two to the scale less 127.
    fn openai_values(blocks: &[u8], scales: &[u8]) -> Vec<f32> {
        const FP4: [f32; 16] = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0];
        let mut values = Vec::new();
        for (codes, &scale) in blocks.chunks_exact(GROUP_BYTES).zip(scales) {
            let power = (2f64).powi(i32::from(scale) - 127) as f32;
            for &byte in codes {
                values.push(FP4[usize::from(byte & 0x0f)] * power);
                values.push(FP4[usize::from(byte >> 4)] * power);
            }
        }
        values
    }

    #[test]
    fn rewritten_blocks_hold_the_values_openais_layout_holds() {
        let blocks: Vec<u8> = (0..3 * GROUP_BYTES).map(|at| (at * 37 + 11) as u8).collect();
        let scales = [127u8, 120, 133];
        let mut values = vec![0f32; 3 * 32];
        quant::dequantize(BlockFormat::Mxfp4, &to_ggml(&blocks, &scales), &mut values).unwrap();
        let expected = openai_values(&blocks, &scales);
        // Equal as numbers (FP4's -0 is GGML's 0).
        assert_eq!(values, expected);
    }

    #[test]
    fn shapes_pair_up_or_not() {
        assert_eq!(value_shape(&[8, 64, 2, 16], &[8, 64, 2]), Some(vec![8, 64, 64]));
        assert_eq!(value_shape(&[8, 64, 2, 16], &[8, 64, 3]), None);
        assert_eq!(value_shape(&[8, 64, 2, 8], &[8, 64, 2]), None);
    }
}
