#![no_main]
//! `cargo fuzz run handshake`: see `rdmapool::fuzzing::handshake` for what it drives and checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rdmapool::fuzzing::handshake(data));
