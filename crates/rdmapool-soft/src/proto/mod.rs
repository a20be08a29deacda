//! The soft NIC's protocol, without I/O: plain state machines over bytes and time values.
//!
//! - [`handshake`]: how a data connection opens (challenge, authenticated hello, answer);
//! - [`wire`]: the frames (request, response), byte-exact in docs/PROTOCOL.md;
//! - [`requester`]: a QP's send side (post, frames out, responses in, timeouts, completions);
//! - [`responder`]: a connection's target side (requests in, checks, execution, answers),
//!   against a [`target::TargetQp`];
//! - [`local`]: the intra-host path's decisions (direct or through the socket, liveness).
//!
//! Drivers (`soft::qp`, `soft::serve`, `soft::driver`) own sockets, mappings, threads and
//! the clock; they pass `now` in. `tests` wires a requester to a responder in memory with a
//! fake clock, so loss, reordering, duplication and timeouts are tested exactly.

pub mod handshake;
pub mod local;
#[cfg(any(test, feature = "fuzzing"))]
pub mod mem_target;
pub mod requester;
pub mod responder;
pub mod stream;
pub mod target;
pub mod wire;

#[cfg(test)]
mod tests;
