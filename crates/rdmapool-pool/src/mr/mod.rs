//! Memory registration that never blocks the caller: the [`Registrar`] and its state
//! machine ([`RegState`]), and 2 MiB-aligned huge-page memory ([`HugeRegion`]).

mod batch;
mod cache;
mod chunked;
mod huge;
mod monitor;
mod registrar;
mod state;

pub use batch::PreRegRing;
pub use cache::{CacheConfig, CacheStats, Cached, RegCache};
pub use chunked::region_for;
pub use huge::{HugeBacking, HugeOptions, HugeRegion, HUGE_PAGE};
pub use rdmapool_core::util::copy::copy_bytes;
pub use registrar::{
    LatencyClass, OwnedRegHandle, RegHandle, RegOwner, Registrar, RegistrarConfig, RegistrarStats,
    RetryPolicy, LATENCY_CLASSES,
};
pub use state::RegState;

/// Refuses the raw range a registration would start from: a null address
/// ([`CoreError::NullAddress`](crate::CoreError::NullAddress) naming `what`) or no bytes ([`CoreError::OutOfLimits`](crate::CoreError::OutOfLimits)
/// naming `bytes`).
fn check_raw(
    addr: *const u8,
    len: usize,
    what: &'static str,
    bytes: &'static str,
) -> crate::Result<()> {
    if addr.is_null() {
        return Err(crate::Error::Core(crate::CoreError::NullAddress { what }));
    }
    if len == 0 {
        return Err(crate::Error::Core(crate::CoreError::OutOfLimits {
            what: bytes,
            value: 0,
            min: 1,
            max: usize::MAX as u64,
        }));
    }
    Ok(())
}
