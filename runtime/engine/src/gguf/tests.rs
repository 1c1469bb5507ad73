use super::write::Planned;
use super::*;
use linnet_ir::quant::{quantize, BlockFormat};

fn temp(name: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("linnet-gguf-{}-{name}.gguf", std::process::id()))
}

/// A file with metadata of every kind and tensors of three storages.
fn sample(name: &str) -> (std::path::PathBuf, Vec<u8>) {
    let path = temp(name);
    let metadata = vec![
        ("general.architecture".to_string(), Meta::Str("qwen3".into())),
        ("qwen3.block_count".to_string(), Meta::U32(4)),
        ("tokenizer.ggml.tokens".to_string(), Meta::Array(vec![Meta::Str("a".into()), Meta::Str("b".into())])),
        ("x.f".to_string(), Meta::F64(0.5)),
        ("x.b".to_string(), Meta::Bool(true)),
    ];
    let quantized = quantize(BlockFormat::Q8_0, &(0..64).map(|v| v as f32).collect::<Vec<_>>()).unwrap();
    let tensors = vec![
        Planned { name: "norm".into(), shape: vec![3], storage: Storage::Plain(linnet_ir::Dtype::F32) },
        Planned { name: "w".into(), shape: vec![2, 32], storage: Storage::Blocks(BlockFormat::Q8_0) },
    ];
    let mut writer = Writer::create(&path, &metadata, &tensors).unwrap();
    writer.write_tensor(&[1.0f32, 2.0, 3.0].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>()).unwrap();
    writer.write_tensor(&quantized).unwrap();
    writer.finish().unwrap();
    let bytes = std::fs::read(&path).unwrap();
    (path, bytes)
}

#[test]
fn a_written_file_reads_back() {
    let (path, bytes) = sample("reads-back");
    let gguf = read(&bytes).unwrap();
    assert_eq!(gguf.meta("general.architecture").and_then(Meta::as_str), Some("qwen3"));
    assert_eq!(gguf.meta("qwen3.block_count").and_then(Meta::as_u64), Some(4));
    assert_eq!(gguf.meta("general.alignment").and_then(Meta::as_u64), Some(32));
    let w = gguf.tensor("w").unwrap();
    assert_eq!((w.dims.clone(), w.shape(), w.bytes), (vec![32, 2], vec![2, 32], 68));
    assert_eq!(w.offset % 32, 0);
    let norm = gguf.tensor("norm").unwrap();
    assert_eq!(
        gguf.tensor_bytes(&bytes, norm),
        [1.0f32, 2.0, 3.0].iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<_>>()
    );
    std::fs::remove_file(path).unwrap();
}

/// Every truncation of a file before its last tensor's end is an error,
/// never a panic; every single-byte corruption of its header and table is
/// read or refused, never a panic.
#[test]
fn truncated_and_corrupted_files_are_errors() {
    let (path, bytes) = sample("truncated");
    let gguf = read(&bytes).unwrap();
    let table_end = gguf.data_offset as usize;
    let content_end = gguf.tensors.iter().map(|t| gguf.data_offset + t.offset + t.bytes).max().unwrap() as usize;
    for len in 0..content_end {
        assert!(read(&bytes[..len]).is_err(), "{len} of {} bytes read as a whole file", bytes.len());
    }
    for at in 0..table_end {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut corrupt = bytes.clone();
            corrupt[at] ^= flip;
            let _ = read(&corrupt);
        }
    }
    std::fs::remove_file(path).unwrap();
}

#[test]
fn errors_say_what_and_where() {
    let (path, bytes) = sample("errors");
    let message = |bytes: &[u8]| read(bytes).unwrap_err().to_string();
    assert!(message(b"GGML\x03\0\0\0").contains("not a GGUF file"));
    let cut = &bytes[..bytes.len() - 40];
    assert!(message(cut).contains("tensor `w`") && message(cut).contains("truncated"), "{}", message(cut));
    // A tensor count no file could hold.
    let mut huge = bytes.clone();
    huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(message(&huge).contains("the tensor count"), "{}", message(&huge));
    // A tensor type Linnet does not read (IQ2_XXS is 16), named with its tensor.
    let mut unknown = bytes.clone();
    let type_at = find_type_field(&bytes, "w");
    unknown[type_at..type_at + 4].copy_from_slice(&16u32.to_le_bytes());
    let text = message(&unknown);
    assert!(text.contains("tensor `w`") && text.contains("GGML type 16"), "{text}");
    std::fs::remove_file(path).unwrap();
}

/// Where tensor `name`'s type id lies in the table.
fn find_type_field(bytes: &[u8], name: &str) -> usize {
    let mut key = (name.len() as u64).to_le_bytes().to_vec();
    key.extend(name.as_bytes());
    let at = bytes.windows(key.len()).position(|w| w == key.as_slice()).unwrap() + key.len();
    let rank = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    at + 4 + 8 * rank
}

#[test]
fn a_row_the_block_does_not_divide_is_refused_by_name() {
    let path = temp("ragged");
    let tensors = vec![Planned { name: "odd".into(), shape: vec![4, 33], storage: Storage::Blocks(BlockFormat::Q8_0) }];
    let error = Writer::create(&path, &[], &tensors).err().unwrap().to_string();
    assert!(error.contains("`odd`") && error.contains("33"), "{error}");
}
