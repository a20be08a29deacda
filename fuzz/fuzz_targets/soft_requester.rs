#![no_main]
//! `cargo fuzz run soft_requester`: see `rdmapool::fuzzing::soft_requester` for what it drives and checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rdmapool::fuzzing::soft_requester(data));
