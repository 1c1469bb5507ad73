#![no_main]
//! The `llama-gguf` target of `linnet_tests::fuzz` under libFuzzer.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| (linnet_tests::fuzz::target("llama-gguf").expect("a target").run)(data));
