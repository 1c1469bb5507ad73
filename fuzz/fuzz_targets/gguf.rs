#![no_main]
//! The `gguf` target of `linnet_tests::fuzz` under libFuzzer.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| (linnet_tests::fuzz::target("gguf").expect("a target").run)(data));
