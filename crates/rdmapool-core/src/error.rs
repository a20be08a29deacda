//! The errors of the object model and its providers, and the vocabulary every layer shares
//! (limits, ranges, settings, keys, system calls, connections).

use std::io;

/// What the object model (`fabric`) and its providers fail with, in words every layer shares:
/// a size outside its limits, a range past its end, a bad setting or key, a failed system
/// call, a refused connection. `rdmapool::Error` wraps it (`rdmapool::Error::Core`) beside the
/// failures of the layers above (registration, buffer pools, the remote pool).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A size, depth or count is outside what the device or the library allows.
    #[error("{what} is {value}: it must be {min}..={max}")]
    OutOfLimits {
        /// What was sized ("send queue depth", "region length", "SGEs in a work request").
        what: &'static str,
        /// The value asked for.
        value: u64,
        /// The least allowed.
        min: u64,
        /// The most allowed (the device's limit, or the library's).
        max: u64,
    },

    /// An offset and length reach past the memory they are in (a registration, a remote
    /// region); nothing was read or written.
    #[error("{len} bytes at offset {offset} reach past the {limit} bytes of the {what}")]
    OutOfRange {
        /// What the range is in ("registered memory", "remote region").
        what: &'static str,
        /// Offset of the range.
        offset: u64,
        /// Its length.
        len: u64,
        /// The length of what it is in.
        limit: u64,
    },

    /// A null pointer where memory was expected.
    #[error("{what}: a null address")]
    NullAddress {
        /// What the address was for.
        what: &'static str,
    },

    /// An address that must be 8-byte aligned (an atomic's target or result) is not.
    #[error("{what} address {addr:#x} is not 8-byte aligned")]
    Misaligned {
        /// Which address.
        what: &'static str,
        /// The address.
        addr: u64,
    },

    /// Access flags that cannot go together, or that the place they are used does not take.
    #[error("access {access:?}: {reason}")]
    BadAccess {
        /// The flags asked for.
        access: crate::fabric::AccessFlags,
        /// What is wrong with them.
        reason: &'static str,
    },

    /// A work request whose shape its opcode does not allow.
    #[error("work request {wr_id}: {reason}")]
    BadWorkRequest {
        /// Its id.
        wr_id: u64,
        /// What is wrong.
        reason: &'static str,
    },

    /// No device of that name on the provider.
    #[error("no {provider} device {name:?} (devices: {})", known.join(", "))]
    NoSuchDevice {
        /// The provider asked.
        provider: crate::fabric::ProviderKind,
        /// The name asked for.
        name: String,
        /// The devices it has.
        known: Vec<String>,
    },

    /// A setting (an environment variable, or a value parsed from text) is not one the
    /// library takes.
    #[error("{name}={value:?}: {reason}")]
    BadSetting {
        /// The variable or setting.
        name: String,
        /// The value given.
        value: String,
        /// What is wanted.
        reason: String,
    },

    /// The device's port cannot carry traffic (its link is down, or it cannot be queried).
    #[error("port {port} of {device} is {state}: bring its link up (ip link set <netdev> up, or check the cable and subnet manager)")]
    PortDown {
        /// The device.
        device: String,
        /// The port number.
        port: u8,
        /// Its state ("DOWN", "INIT", "not queryable").
        state: String,
    },

    /// A key (pre-shared, cluster, client) or the file it is read from is refused: too short,
    /// unreadable, or readable by others.
    #[error("{what}: {reason}")]
    BadKey {
        /// The key or its file.
        what: String,
        /// Why.
        reason: String,
    },

    /// Pinning memory failed because the locked-memory limit would be exceeded.
    #[error(
        "cannot pin {requested} bytes: RLIMIT_MEMLOCK is {limit} (errno {errno}); raise it with \
         `ulimit -l unlimited` (or a memlock line in /etc/security/limits.conf, or \
         LimitMEMLOCK= for a systemd service), or run with CAP_IPC_LOCK"
    )]
    MemlockLimit {
        /// Bytes the call tried to pin.
        requested: usize,
        /// The soft limit in force, as text ("8388608 bytes" or "unlimited").
        limit: String,
        /// The errno the kernel returned (ENOMEM or EAGAIN).
        errno: i32,
    },

    /// A system call failed.
    #[error("{call} failed: {source}")]
    Sys {
        /// The call that failed.
        call: &'static str,
        /// The OS error.
        #[source]
        source: io::Error,
    },

    /// The send or receive queue already holds its maximum number of work requests.
    #[error("{queue} queue full: {depth} work requests outstanding")]
    QueueFull {
        /// "send" or "receive".
        queue: &'static str,
        /// The configured depth.
        depth: u32,
    },

    /// The queue pair is not in a state that allows the operation.
    #[error("QP {qpn} is in state {state}; {needed}")]
    InvalidQpState {
        /// The QP number.
        qpn: u32,
        /// Its current state.
        state: crate::fabric::QpState,
        /// What the operation needs.
        needed: &'static str,
    },

    /// Connecting to a peer failed or the peer refused.
    #[error("connection to {peer} failed: {reason}")]
    Connection {
        /// The peer's address.
        peer: String,
        /// Why.
        reason: String,
    },

    /// The peer refused the connection; it may have said why in `private_data`.
    #[error("connection to {peer} rejected ({} bytes of private data)", private_data.len())]
    Rejected {
        /// The peer's address.
        peer: String,
        /// What the peer sent with the reject.
        private_data: Vec<u8>,
    },

    /// Private data from a connection peer was not framed as rdmapool frames it
    /// (`rdmapool::conn::decode_private_data`); `raw` is what arrived.
    #[error("bad private data from the peer: {reason} ({} bytes arrived)", raw.len())]
    BadPrivateData {
        /// What was wrong.
        reason: String,
        /// The bytes as they arrived.
        raw: Vec<u8>,
    },

    /// Bytes received from a peer or a caller did not decode.
    #[error("malformed {what}: {reason}")]
    Malformed {
        /// What was being decoded.
        what: &'static str,
        /// What was wrong.
        reason: String,
    },

    /// The completion queue overflowed; completions were lost and the CQ is unusable.
    #[error("completion queue overrun: more than {depth} completions were pending")]
    CqOverrun {
        /// The CQ depth.
        depth: u32,
    },

    /// The requested provider cannot be used on this machine.
    #[error("provider {provider} not available: {reason}")]
    ProviderUnavailable {
        /// The provider's name.
        provider: String,
        /// Why, and what to do.
        reason: String,
    },

    /// A memory-window bind or invalidate the window's state does not allow, refused before
    /// anything was posted (see [`crate::fabric::Mw`]).
    #[error("memory window: {0}")]
    Window(#[from] crate::fabric::WindowError),

    /// The device or provider does not support what was asked (the message says what).
    #[error("not supported: {0}")]
    Unsupported(String),

    /// Objects from different contexts or providers were mixed.
    #[error("object mismatch: {0}")]
    Mismatch(String),

    /// A listener beyond loopback was to start without a key (secure by default, as Redis's
    /// protected mode): anyone who can reach it could use it.
    #[error(
        "refusing to listen on {addr} for the {what} without a key: anyone who can reach it \
         could use it. {fix} To run without authentication anyway (a private network), set \
         RDMAPOOL_ALLOW_UNAUTHENTICATED=1 or the configuration's allow_unauthenticated"
    )]
    Unprotected {
        /// What would have listened.
        what: &'static str,
        /// Where.
        addr: std::net::SocketAddr,
        /// How to give it a key.
        fix: &'static str,
    },
}

/// Shorthand for `Result<T, rdmapool::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    /// Wraps the calling thread's last OS error for the named call.
    #[doc(hidden)]
    pub fn last_os(call: &'static str) -> Self {
        Error::Sys {
            call,
            source: io::Error::last_os_error(),
        }
    }
}
