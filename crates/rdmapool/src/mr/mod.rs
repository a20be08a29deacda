//! Memory registration that never blocks the caller: the [`Registrar`] and its state
//! machine ([`RegState`]), and 2 MiB-aligned huge-page memory ([`HugeRegion`]).

mod batch;
mod cache;
mod chunked;
mod huge;
mod monitor;
mod registrar;
mod state;

pub use batch::{PreRegRing, SharedMr};
pub use cache::{CacheConfig, CacheStats, CachedMr, RegCache};
pub use chunked::ChunkedMr;
pub use huge::{HugeBacking, HugeOptions, HugeRegion, HUGE_PAGE};
pub use registrar::{
    LatencyClass, OwnedRegHandle, RegHandle, Registrar, RegistrarConfig, RegistrarStats,
    RetryPolicy, LATENCY_CLASSES,
};
pub use state::RegState;
