//! `rdma-tool`'s tests, one binary (issue #42): each module runs the built tool as a user
//! would, one area each.

mod exit_codes;
mod hardening;
mod hostile_flags;
mod json_schemas;
mod monitor;
mod plots;
mod pool_cli;
mod serve_stats;
mod store_stats;
mod stress_cli;
