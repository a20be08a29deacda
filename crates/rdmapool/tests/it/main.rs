//! rdmapool's integration tests, one binary: each module is one area (its doc comment says
//! what it covers), and `support/` holds what they share (nodes and QP pairs on the provider
//! under test, child processes, raw wire peers, network namespaces and the fault relay).
//!
//! Run one area with a filter, e.g. `cargo test -p rdmapool --test it remote::`. Tests that
//! start child processes re-run this binary with `--exact <module>::child_entry`.
//!
//! One test keeps a binary of its own, because it needs a process to itself:
//! `tests/no_alloc.rs` (a counting global allocator).

mod support;

mod async_ops;
mod cache;
mod conn;
mod errors;
mod faults;
mod interop;
mod local_path;
mod memory;
mod model;
mod multiprocess;
mod object_metrics;
mod op_latency;
mod ops;
mod pool;
mod registrar;
mod remote;
#[cfg(feature = "etcd")]
mod remote_etcd;
mod remote_frozen;
mod remote_hosts;
mod remote_integrity;
mod remote_stats;
mod security;
mod soft_driver;
mod store;
mod store_hosts;
mod window;
