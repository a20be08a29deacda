//! The cross-node memory pool: memory servers export registered memory, clients allocate,
//! free, read, write and atomically update it with one-sided RDMA only.
//!
//! - A [`MemoryServer`] registers one huge-page region, lays it out as a pool (a header,
//!   client lease slots, a chunk table, chunks: [`layout`]), and hands every client a
//!   [`PoolDescriptor`] in the accept's private data. Its CPU does not take part in
//!   allocation or access; a reaper thread takes back the chunks of clients whose lease
//!   expired.
//! - A [`PoolClient`] connects to the servers its [`Membership`] names and learns each from
//!   its descriptor. It claims whole chunks with RDMA compare-and-swap on the chunk table
//!   (probing from a hash of its id, so no word is hot), sub-allocates objects of one size
//!   class per chunk by setting bits of the chunk's bitmap with compare-and-swap, and frees
//!   (any client can) by clearing them. Its lease is a heartbeat word it increments with
//!   fetch-and-add four times per lease.
//! - Membership is a static list ([`StaticMembership`]) or, with the `etcd` feature, etcd
//!   (`etcd`): servers register under a lease, clients follow the prefix.
//!
//! ```
//! use rdmapool_pool::fabric::*;
//! use rdmapool_pool::remote::*;
//! # fn main() -> rdmapool_pool::Result<()> {
//! let ctx = Context::open(SoftConfig::default())?;
//! let server = MemoryServer::start(&ctx, ServerConfig { size: 8 << 20, chunk_size: 1 << 20,
//!     ..ServerConfig::default() })?;
//! let members = StaticMembership::new(vec![server.addr()]);
//! let pd = ctx.alloc_pd()?;
//! let client = PoolClient::connect(&ctx, &pd, &members, ClientConfig::new(42))?;
//! let ptr = client.block_on(client.alloc(100, None))?;            // one-sided: CAS only
//! let buf = std::sync::Arc::new(pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?);
//! buf.write_at(0, b"hello, pool")?;
//! let (r, buf) = client.block_on(client.write(ptr, 0, buf, 0, 11)); // zero-copy WRITE
//! r?;
//! let (r, buf) = client.block_on(client.read(ptr, 0, buf, 64, 11));
//! r?;
//! let mut got = [0u8; 11];
//! buf.read_at(64, &mut got)?;
//! assert_eq!(&got, b"hello, pool");
//! assert_eq!(client.block_on(client.fetch_and_add(ptr, 16, 5))?, 0);
//! client.block_on(client.free(ptr))?;
//! assert_eq!(server.stats().requests_handled, 0);   // the server's CPU did nothing
//! # Ok(()) }
//! ```

pub(crate) mod client;
pub use client::regions;
pub(crate) mod descriptor;
pub(crate) mod hello;
pub mod isolation;
pub mod layout;
pub(crate) mod lease;
mod membership;
mod placement;
mod server;
#[cfg(any(test, doc, feature = "sim"))]
pub mod sim;
pub mod step;
pub(crate) mod sweep;

pub use client::{BatchOutcome, ClientConfig, NodeStats, PoolBatch, PoolClient, DEPARTED_MEMORY};
pub use descriptor::{PoolDescriptor, DESCRIPTOR_LEN};
pub use hello::{
    client_key, client_key_text, ClientHello, HELLO_LEN, MAX_CLOCK_SKEW, MAX_REMEMBERED_HELLOS,
    PROVEN_HELLO_LEN,
};
pub use isolation::Isolation;
pub use layout::Layout;
pub use membership::{Membership, StaticMembership};
pub use placement::{KeyHash, LeastUsed, NodeLoad, Placement, RoundRobin};
pub use server::ServerStats;
pub use server::{
    MemoryServer, ServerConfig, MAX_CONNECTIONS_PER_CLIENT, MAX_HANDSHAKES, MAX_HANDSHAKES_PER_PEER,
};

/// The highest client id, `2^63 − 1`: chunk-table entries with bit 63 set are durable
/// chunks (the object store's, docs/STORE.md section 2), so no client's lease can ever
/// name them.
pub const MAX_CLIENT_ID: u64 = layout::DURABLE_TAG - 1;

/// A remote allocation: the node it lives on, that node's incarnation when it was allocated,
/// its offset in that node's region, its length.
///
/// As text it is `node:offset:len:incarnation` (decimal, the incarnation in `0x` hex; `0x` hex
/// is accepted for every field when parsing), which is how tools print and take pointers.
/// The older three-field form `node:offset:len` still parses, with incarnation 0 ("unknown"):
/// such a pointer cannot be told apart from one into a restarted server's new memory, so
/// every operation refuses it with [`crate::Error::StalePointer`]; take the pointer again
/// from where it was allocated.
///
/// ```
/// use rdmapool_pool::remote::RemotePtr;
/// let p: RemotePtr = "3:0x100000:64:0xabc".parse().unwrap();
/// assert_eq!((p.node, p.offset, p.len, p.incarnation), (3, 1 << 20, 64, 0xabc));
/// assert_eq!(p.to_string(), "3:1048576:64:0xabc");
/// let old: RemotePtr = "3:1048576:64".parse().unwrap();
/// assert_eq!(old.incarnation, 0);
/// assert!("3:1".parse::<RemotePtr>().is_err());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RemotePtr {
    /// The node (a server's id).
    pub node: u32,
    /// Offset in the node's region.
    pub offset: u64,
    /// Bytes allocated.
    pub len: u64,
    /// The incarnation of the node the allocation was made in
    /// ([`PoolDescriptor::incarnation`]); 0 when unknown (an old text form).
    pub incarnation: u64,
}

impl std::fmt::Display for RemotePtr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}:{}", self.node, self.offset, self.len)?;
        if self.incarnation != 0 {
            write!(f, ":{:#x}", self.incarnation)?;
        }
        Ok(())
    }
}

impl std::str::FromStr for RemotePtr {
    type Err = crate::Error;

    fn from_str(s: &str) -> crate::Result<Self> {
        let bad = |why: &str| {
            crate::Error::Core(crate::CoreError::BadSetting {
                name: "remote pointer".into(),
                value: s.into(),
                reason: format!("{why} (want node:offset:len:incarnation)"),
            })
        };
        let num = |t: &str| {
            let t = t.trim();
            match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                Some(h) => u64::from_str_radix(h, 16),
                None => t.parse(),
            }
        };
        let parts: Vec<&str> = s.trim().split(':').collect();
        let (node, offset, len, incarnation) = match parts[..] {
            [node, offset, len] => (node, offset, len, None),
            [node, offset, len, inc] => (node, offset, len, Some(inc)),
            _ => return Err(bad("four fields separated by ':'")),
        };
        let node = num(node).map_err(|_| bad("node is not a number"))?;
        Ok(Self {
            node: u32::try_from(node).map_err(|_| bad("node does not fit 32 bits"))?,
            offset: num(offset).map_err(|_| bad("offset is not a number"))?,
            len: num(len).map_err(|_| bad("len is not a number"))?,
            incarnation: match incarnation {
                Some(i) => num(i).map_err(|_| bad("incarnation is not a number"))?,
                None => 0,
            },
        })
    }
}
