//! A tokenizer from a GGUF file's metadata gives the Hugging Face
//! tokenizer's ids: llama.cpp's tokenizer test data for the Qwen3.5
//! vocabulary (`ggml-vocab-qwen35.gguf`, its `.inp` strings and the ids
//! transformers gives for them in `.out`), and text round-trips.

use linnet_runtime::text::TextModel;
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../tests/fixtures/llama-cpp")).join(name)
}

#[test]
fn qwen35_vocabulary_gives_the_hugging_face_ids() {
    let text = TextModel::from_gguf(&fixture("ggml-vocab-qwen35.gguf")).unwrap().expect("the file has a vocabulary");
    let inputs = std::fs::read_to_string(fixture("ggml-vocab-qwen35.gguf.inp")).unwrap();
    let outputs = std::fs::read_to_string(fixture("ggml-vocab-qwen35.gguf.out")).unwrap();
    // Each string is followed by the separator line.
    let inputs: Vec<&str> = inputs.split("\n__ggml_vocab_test__\n").collect();
    let inputs = &inputs[..inputs.len() - 1];
    let outputs: Vec<&str> = outputs.lines().collect();
    assert_eq!(inputs.len(), outputs.len(), "one line of ids per test string");
    assert!(inputs.len() > 30);
    for (input, output) in inputs.iter().zip(&outputs) {
        let expected: Vec<i64> = output.split_whitespace().map(|id| id.parse().unwrap()).collect();
        assert_eq!(text.encode(input).unwrap(), expected, "{input:?}");
        assert_eq!(text.decode(&expected), *input, "{input:?} decodes back");
    }
    // Special tokens are single ids; the end of sequence is the file's.
    assert_eq!(text.encode("<|im_start|>user\nhi<|im_end|>").unwrap()[0], 151644);
    assert_eq!(text.end_ids, vec![151643]);
    assert!(text.has_chat_template());
}
