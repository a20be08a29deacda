//! Memory registration that never blocks the caller: the [`Registrar`] and its state
//! machine ([`RegState`]).

mod registrar;
mod state;

pub use registrar::{RegHandle, Registrar, RegistrarConfig, RegistrarStats, RetryPolicy};
pub use state::RegState;
