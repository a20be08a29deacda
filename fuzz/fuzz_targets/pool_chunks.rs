#![no_main]
//! `cargo fuzz run pool_chunks`: see `rdmapool::fuzzing::pool_chunks` for what it drives and checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rdmapool::fuzzing::pool_chunks(data));
