//! The loom facade (as tokio's `loom/mod.rs`): the synchronisation primitives of the code
//! that loom checks, the registration state (`mr/state.rs`) and the engine's slot table
//! (`cq/engine/slots.rs`), from one place. Under `--cfg loom` they are loom's, so the model
//! checker sees every synchronising access; otherwise std's atomics, parking_lot's locks and
//! a lock-free bounded queue. The checked code names `crate::loom::sync` and nothing else,
//! and carries no `cfg(loom)` of its own.

#[cfg(loom)]
mod mocked;
#[cfg(loom)]
pub(crate) use mocked::sync;

#[cfg(not(loom))]
mod std;
#[cfg(not(loom))]
pub(crate) use self::std::sync;
