//! Weight rows in block formats decoded into f32 for the matrix kernel
//! (`matmul`), a few rows at a time: the values are exactly the blocks'
//! dequantized values as `linnet_ir::quant::dequantize` defines them, so
//! a product over decoded rows has the numerics of a product over f32
//! weights.

use super::matmul::Isa;
use linnet_ir::quant::{self, BlockFormat};

/// Row `blocks` (whole blocks of `format`) decoded into `out`, on `isa`.
pub fn row(isa: Isa, format: BlockFormat, blocks: &[u8], out: &mut [f32]) {
    let _ = isa;
    quant::dequantize(format, blocks, out).expect("rows of whole blocks");
}
