//! Entry points for the fuzz targets in `fuzz/` (cargo-fuzz, libFuzzer), compiled only with
//! the feature `fuzzing`. Each takes the fuzzer's bytes; a panic is a bug (a decoder or a
//! state machine that trusted its input, or a broken invariant), never an expected outcome.
//!
//! The decoders run on the bytes as they are. The state machines run a small program read
//! from the bytes: frames aimed at real keys of real registered memory (a fuzzer cannot
//! guess a CSPRNG key), raw bytes, and what the application and the driver do meanwhile.
//! `seeds` gives valid inputs to start from (`fuzz/corpus/`), and the unit tests here
//! replay that corpus, so every input the fuzzer kept stays a test on stable Rust.

mod arena;
mod chunks;
mod descriptors;
mod handshake;
mod input;
mod lease;
mod requester;
mod requester_steps;
mod responder;
mod responder_steps;
mod seeds;
#[cfg(test)]
mod tests;
mod wire;

/// The fuzz targets, by name (the names of `fuzz/fuzz_targets/*.rs`).
pub const TARGETS: [&str; 7] = [
    "soft_wire",
    "soft_responder",
    "soft_requester",
    "handshake",
    "descriptors",
    "pool_lease",
    "pool_chunks",
];

/// Soft frame decoders (request, response, hello, hello acknowledgement) and round trips.
pub fn soft_wire(data: &[u8]) {
    wire::run(data)
}

/// A soft responder against a target QP with real keys, fed a program of frames and events.
pub fn soft_responder(data: &[u8]) {
    responder::run(data)
}

/// A soft requester with operations posted, fed a program of responses and events.
pub fn soft_requester(data: &[u8]) {
    requester::run(data)
}

/// The soft hello, RDMA CM private data, endpoints and region descriptors.
pub fn handshake(data: &[u8]) {
    handshake::run(data)
}

/// The remote pool's descriptor and client hello, and remote pointers as text.
pub fn descriptors(data: &[u8]) {
    descriptors::run(data)
}

/// Taking a pool lease slot against arbitrary slot words and read timings.
pub fn pool_lease(data: &[u8]) {
    lease::run(data)
}

/// The pool client's recovery, allocation and free against arbitrary region contents and
/// answers that contradict them.
pub fn pool_chunks(data: &[u8]) {
    chunks::run(data)
}

/// Runs the target called `name` on `data`; false if there is no such target.
pub fn run(name: &str, data: &[u8]) -> bool {
    let f: fn(&[u8]) = match name {
        "soft_wire" => soft_wire,
        "soft_responder" => soft_responder,
        "soft_requester" => soft_requester,
        "handshake" => handshake,
        "descriptors" => descriptors,
        "pool_lease" => pool_lease,
        "pool_chunks" => pool_chunks,
        _ => return false,
    };
    f(data);
    true
}

pub use seeds::seeds;
