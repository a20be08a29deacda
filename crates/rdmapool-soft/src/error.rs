//! [`SoftError`]: what the soft provider's own operations fail with — reading its
//! configuration and opening its listener. The interface operations (connect, post, poll)
//! fail in the words every provider shares ([`rdmapool_core::Error`]), which a `SoftError`
//! converts into.

use rdmapool_core::Error as CoreError;

/// A failure of the soft provider's own operations; converts into [`rdmapool_core::Error`]
/// (and so into `rdmapool::Error`) with the same message.
///
/// ```
/// use rdmapool_soft::{SoftError, Transport};
/// let e = Transport::parse("carrier pigeon").unwrap_err();
/// assert!(matches!(e, SoftError::Setting { .. }));
/// assert!(matches!(rdmapool_core::Error::from(e), rdmapool_core::Error::BadSetting { .. }));
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SoftError {
    /// A setting (an `RDMAPOOL_SOFT_*` variable, or a value parsed like one) cannot be used.
    #[error("{name}={value:?}: {reason}")]
    Setting {
        /// The variable or setting.
        name: String,
        /// The value given.
        value: String,
        /// Why it cannot be used, and what would do.
        reason: String,
    },

    /// The pre-shared key file (`RDMAPOOL_SOFT_PSK_FILE`) cannot be used: unreadable,
    /// readable by others, or not a key.
    #[error(transparent)]
    Key(CoreError),

    /// The NIC's listening socket (TCP, or the local socket) cannot be opened.
    #[error("{addr}: cannot listen: {source}")]
    Listen {
        /// Where it was to listen.
        addr: String,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
}

impl From<SoftError> for CoreError {
    fn from(e: SoftError) -> Self {
        match e {
            SoftError::Setting {
                name,
                value,
                reason,
            } => CoreError::BadSetting {
                name,
                value,
                reason,
            },
            SoftError::Key(e) => e,
            SoftError::Listen { addr, source } => CoreError::Connection {
                peer: addr,
                reason: format!("cannot listen: {source}"),
            },
        }
    }
}
