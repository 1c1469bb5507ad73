//! The block formats against llama.cpp's own reading of them: random
//! blocks (scales at zero, subnormal, ±the largest f16 among them)
//! dequantize to exactly the values llama.cpp's `gguf` Python package
//! gives, and Q8_0 quantizes rows to exactly its reference quantizer's
//! bytes. The fixtures and the script that made them are in
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
fn q8_0_quantizes_as_llama_cpp_does() {
    let rows = floats(&fixture("q8_0-quantize.values"));
    let expected = fixture("q8_0-quantize.blocks");
    let ours = quantize(BlockFormat::Q8_0, &rows).unwrap();
    for (block, (ours, theirs)) in ours.chunks(34).zip(expected.chunks(34)).enumerate() {
        assert_eq!(ours, theirs, "block {block} of {:?}", &rows[block * 32..block * 32 + 4]);
    }
}
