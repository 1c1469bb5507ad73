#![no_main]
//! The `card` target of `linnet_tests::fuzz` under libFuzzer.

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| (linnet_tests::fuzz::target("card").expect("a target").run)(data));
