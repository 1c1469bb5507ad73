//! The block formats against llama.cpp's own reading of them: random
//! blocks (scales at zero, subnormal, ±the largest f16 among them)
//! dequantize to exactly the values llama.cpp's `gguf` Python package
//! gives, in every format, and the formats it has reference quantizers
//! for quantize rows to exactly their bytes. The fixtures and the script that made them are in
//! `tests/fixtures/quant`.

use linnet_ir::quant::{dequantize, quantize, BlockFormat};
use std::path::PathBuf;

fn fixture(name: &str) -> Vec<u8> {
    let path = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../../tests/fixtures/quant")).join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect()
}

#[test]
fn every_format_dequantizes_as_llama_cpp_does() {
    for format in BlockFormat::ALL {
        let blocks = fixture(&format!("{}.blocks", format.name()));
        let expected = floats(&fixture(&format!("{}.values", format.name())));
        assert_eq!(blocks.len() / format.block_bytes(), 64);
        let mut ours = vec![0f32; expected.len()];
        dequantize(format, &blocks, &mut ours).unwrap();
        for (at, (ours, theirs)) in ours.iter().zip(&expected).enumerate() {
            let same = ours.to_bits() == theirs.to_bits() || ours.is_nan() && theirs.is_nan();
            assert!(
                same,
                "{format}: value {at} (block {}): ours {ours:e}, gguf {theirs:e}",
                at / format.block_values()
            );
        }
    }
}

#[test]
fn reference_quantizers_write_llama_cpps_bytes() {
    let rows = floats(&fixture("quantize.values"));
    for format in [
        BlockFormat::Q4_0,
        BlockFormat::Q4_1,
        BlockFormat::Q5_0,
        BlockFormat::Q5_1,
        BlockFormat::Q8_0,
        BlockFormat::Mxfp4,
    ] {
        let expected = fixture(&format!("{}-quantize.blocks", format.name()));
        let ours = quantize(format, &rows).unwrap();
        let (bytes, values) = (format.block_bytes(), format.block_values());
        for (block, (ours, theirs)) in ours.chunks(bytes).zip(expected.chunks(bytes)).enumerate() {
            assert_eq!(ours, theirs, "{format} block {block} of {:?}", &rows[block * values..block * values + 4]);
        }
    }
}
