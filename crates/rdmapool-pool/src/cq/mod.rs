//! Completion queues for many QPs ([`CqPool`]) and the progress engine that turns
//! completions into finished futures ([`Engine`], [`AsyncQp`]).
//!
//! Dispatch is by `wr_id`: every in-flight operation owns a slot of a fixed table (taken
//! from a lock-free free list), and the `wr_id` names the slot and its generation, so a
//! completion finds its future without a heap allocation or a global lock. A future that is
//! dropped while its work request is in flight leaves the slot, and the local buffer it
//! holds, to the engine, which releases both when the completion arrives. The `wr_id` stays
//! inside the engine: futures resolve to an [`OpCompletion`].

mod engine;
#[cfg(not(loom))]
mod event;
mod placement;

pub use engine::{
    AsyncQp, Engine, EngineConfig, EngineStats, OpCompletion, OpFuture, Progress, WindowBinding,
};
pub use placement::{Assignment, CqPool};
