#![no_main]
//! `cargo fuzz run descriptors`: see `rdmapool::fuzzing::descriptors` for what it drives and checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rdmapool::fuzzing::descriptors(data));
