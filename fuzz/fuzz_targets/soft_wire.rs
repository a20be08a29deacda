#![no_main]
//! `cargo fuzz run soft_wire`: see `rdmapool::fuzzing::soft_wire` for what it drives and checks.

libfuzzer_sys::fuzz_target!(|data: &[u8]| rdmapool::fuzzing::soft_wire(data));
