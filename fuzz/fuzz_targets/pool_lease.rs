#![no_main]
//! `cargo fuzz run pool_lease`: see `rdmapool::fuzzing::pool_lease` for what it drives and checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rdmapool::fuzzing::pool_lease(data));
