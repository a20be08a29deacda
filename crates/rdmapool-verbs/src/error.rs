//! [`VerbsError`]: what the verbs provider's own operations fail with — reading its
//! configuration, loading rdma-core. The interface operations (open, register, connect,
//! post, poll) fail in the words every provider shares ([`rdmapool_core::Error`]), which a
//! `VerbsError` converts into.

use rdmapool_core::Error as CoreError;

/// A failure of the verbs provider's own operations; converts into [`rdmapool_core::Error`]
/// (and so into `rdmapool::Error`) with the same message.
///
/// ```
/// use rdmapool_verbs::VerbsError;
/// let e = VerbsError::Setting {
///     name: "RDMAPOOL_GID_INDEX".into(),
///     value: "300".into(),
///     reason: "out of range: want a GID table index, 0..=255".into(),
/// };
/// let shared: rdmapool_core::Error = e.into();
/// assert!(matches!(shared, rdmapool_core::Error::BadSetting { .. }));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum VerbsError {
    /// A setting (`RDMAPOOL_DEVICE`, `RDMAPOOL_GID_INDEX`) cannot be used.
    #[error("{name}={value:?}: {reason}")]
    Setting {
        /// The variable or setting.
        name: String,
        /// The value given.
        value: String,
        /// Why it cannot be used, and what would do.
        reason: String,
    },

    /// rdma-core cannot be used here: a library is missing, or there is no device.
    #[error("provider {what} not available: {reason}")]
    Unavailable {
        /// What ("verbs", "verbs (RDMA CM)").
        what: &'static str,
        /// Why, and what would fix it.
        reason: String,
    },
}

impl From<VerbsError> for CoreError {
    fn from(e: VerbsError) -> Self {
        match e {
            VerbsError::Setting {
                name,
                value,
                reason,
            } => CoreError::BadSetting {
                name,
                value,
                reason,
            },
            VerbsError::Unavailable { what, reason } => CoreError::ProviderUnavailable {
                provider: what.into(),
                reason,
            },
        }
    }
}
