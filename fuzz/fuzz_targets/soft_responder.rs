#![no_main]
//! `cargo fuzz run soft_responder`: see `rdmapool::fuzzing::soft_responder` for what it drives and checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rdmapool::fuzzing::soft_responder(data));
