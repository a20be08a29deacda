//! The library's typed errors: [`Error`], what every fallible call of `rdmapool` returns.

pub use rdmapool_core::Error as CoreError;

/// Every fallible call of `rdmapool` returns this error: a failure of the object model, its
/// providers or the vocabulary every layer shares ([`Error::Core`]: limits, ranges, settings,
/// keys, system calls, connections), or one of the layers this crate adds (registration,
/// buffer pools, the progress engine, the remote pool).
///
/// ```
/// use rdmapool_pool::{CoreError, Error};
/// use rdmapool_pool::buf::{BufferPool, PoolConfig};
/// use rdmapool_pool::fabric::{Context, SoftConfig};
/// # fn main() -> rdmapool_pool::Result<()> {
/// let pd = Context::open(SoftConfig::default())?.alloc_pd()?;   // a CoreError converts
/// let pool = BufferPool::new(pd, PoolConfig::default())?;
/// let err = pool.alloc(0).unwrap_err();
/// assert!(matches!(err, Error::Core(CoreError::OutOfLimits { what: "buffer length", .. })));
/// assert!(matches!(err.core(), Some(CoreError::OutOfLimits { .. })));
/// # Ok(()) }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The object model, a provider, or an argument, setting or system call of any layer
    /// (the shared vocabulary: [`CoreError`]).
    #[error(transparent)]
    Core(#[from] CoreError),

    /// A buffer pool has no free buffer of the class asked for right now.
    #[error(
        "buffer pool: no free {class}-byte buffer ({chunks} of at most {max_chunks} chunks \
         registered; below the limit more is being registered, so retry or use alloc_wait)"
    )]
    PoolExhausted {
        /// The size class (bytes) that ran out.
        class: usize,
        /// Chunks the pool has registered or is registering.
        chunks: usize,
        /// The pool's chunk limit.
        max_chunks: usize,
    },

    /// An operation of the progress engine completed with an error status.
    #[error("{opcode:?} work request completed with {status}")]
    Completion {
        /// The status (as `ibv_wc_status`).
        status: crate::fabric::WcStatus,
        /// What completed (the posted request's opcode; for a batch, the one that failed).
        opcode: crate::fabric::WcOpcode,
    },

    /// The request was cancelled before it completed.
    #[error("cancelled")]
    Cancelled,

    /// An operation of a pool batch was posted in one list with others, and the list
    /// failed with this (shown) error: whether this operation took effect is unknown.
    #[error("its list of work requests failed: {0}")]
    ListFailed(String),

    /// An operation did not finish in the time allowed.
    #[error("{0} timed out (ETIMEDOUT)")]
    TimedOut(String),

    /// The device failed (EIO/ENODEV) and refuses further work.
    #[error("device broken: {0}")]
    DeviceBroken(String),

    /// A memory server of the remote pool cannot be reached (it left, died, or is draining
    /// and refuses new allocations); pointers into it fail with this until it is back.
    #[error("pool node {node} is down: {reason}")]
    NodeDown {
        /// The node's id.
        node: u32,
        /// What was seen.
        reason: String,
    },

    /// An access through a remote pointer reaches past the allocation it names.
    #[error("access of {len} bytes at offset {offset} of a {limit}-byte remote allocation")]
    OutOfBounds {
        /// Offset of the access inside the allocation.
        offset: u64,
        /// Bytes accessed.
        len: u64,
        /// The allocation's length.
        limit: u64,
    },

    /// A peer did not prove it holds the cluster key this side was given (a pool server
    /// without the key, with another key, or answering for another connection).
    #[error("{peer} is not authenticated: {reason}")]
    Unauthenticated {
        /// Who (a pool node and its address).
        peer: String,
        /// What was missing or wrong.
        reason: String,
    },

    /// A remote pointer does not name a live allocation (never allocated, or freed already).
    #[error("not a live allocation: {0}")]
    NotAllocated(String),

    /// A remote pointer names an incarnation of its node that is not the one this client is
    /// connected to: the server restarted (its memory is new; the allocation is gone), or the
    /// pointer carries no incarnation (0, an old text form). Refused before any byte moves.
    #[error(
        "stale pointer: node {node} is incarnation {current:#x} now, the pointer names {}",
        if *incarnation == 0 { "no incarnation (an old node:offset:len form)".to_string() } else { format!("{incarnation:#x} (the server restarted since; the allocation is gone)") }
    )]
    StalePointer {
        /// The node.
        node: u32,
        /// The incarnation the pointer names (0: none).
        incarnation: u64,
        /// The node's incarnation as this client knows it.
        current: u64,
    },

    /// No memory server of the pool is reachable (none answered, or all are down).
    #[error("no memory server is reachable: {reason}")]
    NoServer {
        /// What was tried and seen.
        reason: String,
    },

    /// Every server that could take the allocation is draining (shutting down): it accepts
    /// no new allocations; existing ones stay usable until it stops.
    #[error("pool node {node} is draining: it takes no new allocations")]
    Draining {
        /// A draining node.
        node: u32,
    },

    /// No memory server has room for an allocation of this size.
    #[error("remote pool exhausted: no node has room for {size} bytes")]
    RemoteExhausted {
        /// The size asked for.
        size: u64,
    },

    /// Another live client holds this client id on a node.
    #[error("client id {id} is held by a live client on node {node}")]
    ClientIdInUse {
        /// The id.
        id: u64,
        /// The node where it is held.
        node: u32,
    },

    /// A node isolates its clients (`remote::Isolation::Isolated`) and this access is
    /// outside what it grants this client: another client's chunk, or a write to the
    /// header, lease slots or chunk table. Refused before anything is posted.
    #[error(
        "node {node} isolates its clients: offset {offset:#x} is not this client's ({reason})"
    )]
    Isolated {
        /// The node.
        node: u32,
        /// The offset in its region.
        offset: u64,
        /// Whose it is, or why not.
        reason: String,
    },

    /// The registration of a buffer pool's chunk failed, and the error it failed with was
    /// already reported.
    #[error("buffer pool: the chunk for the {class}-byte class could not be registered")]
    PoolChunkFailed {
        /// The size class (bytes) the chunk was for.
        class: usize,
    },

    /// A registration's outcome was asked for again after it was taken (a handle polled
    /// after it resolved).
    #[error("the registration's outcome was already taken")]
    OutcomeTaken,

    /// A remote pool's layout cannot be (a descriptor from a peer, or a server's settings).
    #[error("pool layout: {reason}")]
    BadLayout {
        /// What is wrong with it.
        reason: String,
    },

    /// Two live servers answer as the same pool node.
    #[error(
        "two servers call themselves node {node}: incarnation {first:#x} at {first_addr} still \
         answers, and incarnation {second:#x} at {second_addr}"
    )]
    NodeIdConflict {
        /// The node id both claim.
        node: u32,
        /// The incarnation this client knew.
        first: u64,
        /// Where that one answers.
        first_addr: String,
        /// The incarnation that also claims it.
        second: u64,
        /// Where that one answers.
        second_addr: String,
    },

    /// Every client slot (lease) of a node is taken.
    #[error("node {node}: all {slots} client slots are taken")]
    LeasesFull {
        /// The node.
        node: u32,
        /// Its client slots.
        slots: u64,
    },

    /// A call needs credentials the configuration does not have.
    #[error("no {service} credentials")]
    NoCredentials {
        /// For what ("etcd").
        service: &'static str,
    },

    /// The store's index bucket of a key on this node has no free slot (docs/STORE.md
    /// section 2): the key cannot be added there until repair clears obsolete slots.
    #[error("store index full on node {node}: the key's bucket has no free slot")]
    IndexFull {
        /// The node.
        node: u32,
    },

    /// A store put while a member of the pool has never been reached by this client: its
    /// node id is unknown, so no key's replicas can be placed for certain (docs/STORE.md
    /// section 4). The client dials it again by itself; gets go on.
    #[error(
        "the store places no put while the member at {addr} has never been reached \
         (it may be one of the key's replicas): {reason}"
    )]
    MemberUnreached {
        /// The member's address.
        addr: String,
        /// Why it was not reached.
        reason: String,
    },

    /// A pool pointer into a chunk the server took back when this client's lease there
    /// lapsed (the node was frozen or cut off longer than the lease, then rejoined under a
    /// new lease): the allocation is gone.
    #[error(
        "node {node}: chunk {chunk} was taken back when this client's lease there lapsed; \
         the allocation is gone (the node was rejoined under a new lease)"
    )]
    LeaseLapsed {
        /// The node.
        node: u32,
        /// The chunk the pointer is in.
        chunk: u64,
    },

    /// A store put needs more live servers than the pool has now (docs/STORE.md section 4).
    #[error("the store keeps {wanted} replicas of an object; {live} servers are live")]
    NotEnoughReplicas {
        /// Servers the store may use now.
        live: usize,
        /// Replicas asked for.
        wanted: usize,
    },

    /// An operation kept losing races on the same words and gave up.
    #[error("{what} lost {rounds} races in a row to concurrent writers")]
    Contended {
        /// What gave up ("store put").
        what: &'static str,
        /// How many times it started again.
        rounds: u32,
    },

    /// A store key that starts with the bytes reserved for the parts of striped values
    /// (`"\0RDSPART"`, docs/STORE.md section 9).
    #[error("store keys starting with \\0RDSPART are reserved for the parts of striped values")]
    ReservedKey,

    /// Store data that was read whole and is still not what it claims: a striped value's
    /// manifest that does not decode, or a part whose checksum is not the manifest's.
    #[error("store object {key:?} is damaged: {reason}")]
    Damaged {
        /// The key (lossy UTF-8).
        key: String,
        /// What is wrong.
        reason: String,
    },
}

impl From<rdmapool_soft::SoftError> for Error {
    fn from(e: rdmapool_soft::SoftError) -> Self {
        Error::Core(e.into())
    }
}

impl From<rdmapool_verbs::VerbsError> for Error {
    fn from(e: rdmapool_verbs::VerbsError) -> Self {
        Error::Core(e.into())
    }
}

impl From<rdmapool_core::fabric::WindowError> for Error {
    fn from(e: rdmapool_core::fabric::WindowError) -> Self {
        Error::Core(e.into())
    }
}

impl<B> From<rdmapool_core::fabric::RegisterError<B>> for Error {
    fn from(e: rdmapool_core::fabric::RegisterError<B>) -> Self {
        Error::Core(e.error)
    }
}

impl<B> From<rdmapool_core::fabric::RegisterError<B, Error>> for Error {
    fn from(e: rdmapool_core::fabric::RegisterError<B, Error>) -> Self {
        e.error
    }
}

impl Error {
    /// Wraps the calling thread's last OS error for the named call.
    #[doc(hidden)]
    pub fn last_os(call: &'static str) -> Self {
        Error::Core(CoreError::last_os(call))
    }

    /// The shared-vocabulary error inside, if this is one ([`Error::Core`]).
    pub fn core(&self) -> Option<&CoreError> {
        match self {
            Error::Core(e) => Some(e),
            _ => None,
        }
    }
}

/// Shorthand for `Result<T, rdmapool_pool::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;
