//! `rdmapool-sys`'s tests, one binary (issue #42): loading rdma-core at run time, device
//! enumeration, struct layouts, the static-inline ports, and that nothing links rdma-core.
#![warn(clippy::undocumented_unsafe_blocks)]

mod devices;
mod inline_dispatch;
mod layout;
mod load;
mod no_link;
