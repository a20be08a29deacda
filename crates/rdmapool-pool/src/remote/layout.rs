//! How a memory server lays out its registered region, and the size classes of objects.
//!
//! ```text
//! [0, 4096)                pool header (64 bytes used)
//! [4096, ...)              client slots: 32 bytes each (owner id, heartbeat)
//! [table_offset, ...)      chunk table: 16 bytes per chunk (owner id, reserved)
//! [data_offset, ...)       chunks of chunk_size bytes; the first chunk_size bytes hold the
//!                          metadata above, so data_offset = chunk_size
//! ```
//! A chunk starts with its header: magic, owner, object size, object count, then the
//! allocation bitmap (one bit per object), then the objects. Every word a client changes is
//! changed with one RDMA atomic; the byte layout is in docs/PROTOCOL.md ("Remote pool").

use crate::{Error, Result};

/// Magic of the pool header ("RDPOOL01").
pub(crate) const POOL_MAGIC: u64 = u64::from_le_bytes(*b"RDPOOL01");
/// Magic of a chunk header ("RDCHUNK1"): the chunk holds objects (PROTOCOL.md 7.3).
pub const CHUNK_MAGIC: u64 = u64::from_le_bytes(*b"RDCHUNK1");
/// Layout version (2: the pool header and descriptor carry the server's incarnation).
pub const LAYOUT_VERSION: u8 = 2;
/// Bytes of a client slot (its first word the holder's client id, 0 when free).
pub const CLIENT_SLOT: u64 = 32;
/// Bytes of a chunk-table entry (its first word the owner: a client id, or
/// [`DURABLE_TAG`]` | id`, 0 when free).
pub const TABLE_ENTRY: u64 = 16;
/// Bit 63 of a chunk-table entry: a **durable** chunk, which no lease expiry reclaims;
/// `DURABLE_TAG | id` was claimed by client `id` (the object store keeps its index and
/// blocks in such chunks, docs/STORE.md section 2, through
/// [`Regions`](crate::remote::regions::Regions)).
pub const DURABLE_TAG: u64 = 1 << 63;
/// Offset of the client slots.
pub(crate) const CLIENTS_OFFSET: u64 = 4096;
/// The pool header's state word: the server accepts allocations.
pub(crate) const STATE_RUNNING: u64 = 1;
/// The pool header's state word: the server is draining (no new chunks).
pub(crate) const STATE_DRAINING: u64 = 2;

/// Pool header fields (byte offsets, each a little-endian u64).
pub(crate) mod header {
    pub(crate) const MAGIC: u64 = 0;
    pub(crate) const STATE: u64 = 8;
    /// The server's incarnation (see `PoolDescriptor::incarnation`).
    pub(crate) const INCARNATION: u64 = 16;
}

/// Client slot fields (byte offsets from the slot's start, u64 each).
pub(crate) mod slot {
    /// The id of the client that holds the slot (0: free).
    pub(crate) const OWNER: u64 = 0;
    /// The heartbeat the client renews (0: expired).
    pub(crate) const HEARTBEAT: u64 = 8;
}

/// Chunk header fields (byte offsets from the chunk's start, u64 each; PROTOCOL.md 7.3).
pub mod chunk {
    /// [`CHUNK_MAGIC`](super::CHUNK_MAGIC) when the chunk holds objects, 0 otherwise.
    pub const MAGIC: u64 = 0;
    /// The owner's client id (or [`DURABLE_TAG`](super::DURABLE_TAG)` | id`).
    pub const OWNER: u64 = 8;
    /// The object size.
    pub const OBJECT_SIZE: u64 = 16;
    /// The object count.
    pub const OBJECT_COUNT: u64 = 24;
    /// The allocation bitmap's first word (bit `o` of word `o / 64`: object `o` allocated).
    pub const BITMAP: u64 = 32;
}

/// Smallest object.
pub const MIN_OBJECT: u64 = 64;
/// Most client slots a pool may have (a descriptor naming more is refused: a client reads
/// every owner word when it joins, and probes slots one CAS each).
pub const MAX_CLIENT_SLOTS: u64 = 1 << 16;
/// Most chunks a pool may have (a client reads the whole table when it recovers).
pub const MAX_CHUNKS: u64 = 1 << 24;
/// Longest lease (a client that restarts watches its old heartbeat for half a lease: a
/// descriptor may not make it wait for days).
pub const MAX_LEASE: std::time::Duration = std::time::Duration::from_secs(3600);
/// Largest chunk (a chunk header and bitmap are read whole).
pub const MAX_CHUNK_SIZE: u64 = 1 << 30;

/// Where things are in a server's region.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Bytes of the region.
    pub len: u64,
    /// Bytes per chunk (a power of two, at least 64 KiB).
    pub chunk_size: u64,
    /// Client slots.
    pub client_count: u64,
    /// Offset of the chunk table.
    pub table_offset: u64,
    /// Chunks.
    pub chunk_count: u64,
    /// Offset of the first chunk.
    pub data_offset: u64,
}

impl Layout {
    /// The layout of a region of `len` bytes in chunks of `chunk_size` with `clients`
    /// client slots.
    pub fn new(len: u64, chunk_size: u64, clients: u64) -> Result<Self> {
        if !chunk_size.is_power_of_two() || chunk_size < 64 * 1024 {
            return Err(Error::Core(crate::CoreError::BadSetting {
                name: "chunk size".into(),
                value: chunk_size.to_string(),
                reason: "a power of two of at least 64 KiB".into(),
            }));
        }
        if clients == 0 {
            return Err(Error::Core(crate::CoreError::OutOfLimits {
                what: "client slots of a pool",
                value: 0,
                min: 1,
                max: MAX_CLIENT_SLOTS,
            }));
        }
        let chunk_count = (len / chunk_size).saturating_sub(1);
        let table_offset = (CLIENTS_OFFSET + clients * CLIENT_SLOT).next_multiple_of(4096);
        let l = Self {
            len,
            chunk_size,
            client_count: clients,
            table_offset,
            chunk_count,
            data_offset: chunk_size,
        };
        l.check()?;
        Ok(l)
    }

    /// Whether the layout is possible: metadata inside the first chunk, chunks inside the
    /// region, at least one chunk. (A descriptor from the wire is checked with this too.)
    pub fn check(&self) -> Result<()> {
        let bad = |reason: String| Err(Error::BadLayout { reason });
        if !self.chunk_size.is_power_of_two()
            || !(64 * 1024..=MAX_CHUNK_SIZE).contains(&self.chunk_size)
        {
            return bad(format!(
                "chunk size {}: a power of two from 64 KiB to {MAX_CHUNK_SIZE}",
                self.chunk_size
            ));
        }
        if self.client_count > MAX_CLIENT_SLOTS || self.chunk_count > MAX_CHUNKS {
            return bad(format!(
                "{} client slots and {} chunks: at most {MAX_CLIENT_SLOTS} and {MAX_CHUNKS} (a \
                 client reads every slot and table entry)",
                self.client_count, self.chunk_count
            ));
        }
        if self.chunk_count == 0 {
            return bad(format!(
                "{} bytes hold no chunk of {} after the metadata",
                self.len, self.chunk_size
            ));
        }
        let meta_end = self
            .client_count
            .checked_mul(CLIENT_SLOT)
            .and_then(|c| c.checked_add(CLIENTS_OFFSET))
            .filter(|&end| end <= self.table_offset);
        let table_end = self
            .chunk_count
            .checked_mul(TABLE_ENTRY)
            .and_then(|t| t.checked_add(self.table_offset));
        let data_end = self
            .chunk_count
            .checked_mul(self.chunk_size)
            .and_then(|d| d.checked_add(self.data_offset));
        match (meta_end, table_end, data_end) {
            (Some(_), Some(t), Some(d)) if t <= self.data_offset && d <= self.len => Ok(()),
            _ => bad(format!("tables or chunks do not fit: {self:?}")),
        }
    }

    /// Offset of client slot `i`.
    pub fn client_slot(&self, i: u64) -> u64 {
        CLIENTS_OFFSET + i * CLIENT_SLOT
    }

    /// Offset of chunk-table entry `i`.
    pub fn table_entry(&self, i: u64) -> u64 {
        self.table_offset + i * TABLE_ENTRY
    }

    /// Offset of chunk `i`.
    pub fn chunk(&self, i: u64) -> u64 {
        self.data_offset + i * self.chunk_size
    }

    /// The chunk an offset falls in, if it is in the data area.
    pub fn chunk_of(&self, offset: u64) -> Option<u64> {
        let rel = offset.checked_sub(self.data_offset)?;
        let i = rel / self.chunk_size;
        (i < self.chunk_count).then_some(i)
    }
}

/// How a chunk of one size class is divided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkShape {
    /// Bytes per object.
    pub object_size: u64,
    /// Objects in the chunk.
    pub object_count: u64,
    /// Offset of the first object from the chunk's start.
    pub first_object: u64,
}

impl ChunkShape {
    /// The shape of a chunk of `chunk_size` bytes holding objects of `object_size`.
    pub fn new(chunk_size: u64, object_size: u64) -> Self {
        let most = chunk_size / object_size;
        let header = (chunk::BITMAP + most.div_ceil(64) * 8).next_multiple_of(64);
        let first_object = header.next_multiple_of(object_size.min(4096));
        Self {
            object_size,
            object_count: (chunk_size - first_object) / object_size,
            first_object,
        }
    }

    /// The object at `rel` bytes from the chunk's start, if `rel` is one's first byte.
    pub fn object_at(&self, rel: u64) -> Option<u64> {
        let r = rel.checked_sub(self.first_object)?;
        (r % self.object_size == 0 && r / self.object_size < self.object_count)
            .then_some(r / self.object_size)
    }
}

/// The largest object a chunk of `chunk_size` bytes holds (one per chunk).
pub fn largest_object(chunk_size: u64) -> u64 {
    chunk_size - ChunkShape::new(chunk_size, chunk_size / 2).first_object
}

/// Whether `size` is an object size a chunk of `chunk_size` bytes can hold: a size class
/// ([`size_class`] gives only these). A chunk header read from a server that says anything
/// else is damaged (or hostile) and is not used.
pub fn is_class(size: u64, chunk_size: u64) -> bool {
    (size.is_power_of_two() && (MIN_OBJECT..=chunk_size / 4).contains(&size))
        || size == largest_object(chunk_size)
}

/// The object size that serves `size` bytes in chunks of `chunk_size`: the next power of two
/// from [`MIN_OBJECT`], or one object per chunk; `None` when it does not fit in a chunk.
pub fn size_class(size: u64, chunk_size: u64) -> Option<u64> {
    if size == 0 {
        return None;
    }
    let pow = size.max(MIN_OBJECT).checked_next_power_of_two()?;
    if pow <= chunk_size / 4 {
        return Some(pow);
    }
    // One object per chunk: the largest that fits after a minimal header.
    let whole = largest_object(chunk_size);
    (size <= whole).then_some(whole)
}

/// splitmix64: where client and server start scanning a table for an id, so that ids
/// spread over it.
pub fn hash64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_fit_and_bad_ones_are_refused() {
        let l = Layout::new(1 << 30, 2 << 20, 256).unwrap();
        assert_eq!(l.chunk_count, 511);
        assert_eq!(l.table_offset, 4096 + 256 * 32);
        assert!(l.table_entry(l.chunk_count) <= l.data_offset);
        assert!(
            Layout::new(2 << 20, 2 << 20, 16).is_err(),
            "no room for a chunk"
        );
        assert!(
            Layout::new(1 << 30, 3 << 20, 16).is_err(),
            "not a power of two"
        );
        let lying = Layout {
            chunk_count: 1 << 40,
            ..l
        };
        assert!(lying.check().is_err());
        // Within the region's arithmetic but past what a client reads.
        let huge = Layout::new(1 << 44, 1 << 20, 1 << 20);
        assert!(huge.is_err(), "2^20 client slots: {huge:?}");
        let many = Layout::new((MAX_CHUNKS + 2) * (64 << 10), 64 << 10, 16);
        assert!(many.is_err(), "more than MAX_CHUNKS chunks");
        assert!(Layout::new(4 << 30, 2 << 30, 16).is_err(), "a 2 GiB chunk");
        assert_eq!(l.chunk_of(l.data_offset), Some(0));
        assert_eq!(l.chunk_of(l.data_offset - 1), None);
        assert_eq!(l.chunk_of(l.len), None);
    }

    #[test]
    fn every_class_size_class_gives_is_a_class_and_nothing_else_is() {
        for chunk in [64 << 10, 256 << 10, 2 << 20] {
            for size in [
                1,
                63,
                64,
                65,
                1000,
                4096,
                chunk / 4,
                chunk / 4 + 1,
                chunk / 2,
            ] {
                if let Some(c) = size_class(size, chunk) {
                    assert!(is_class(c, chunk), "{size} -> {c} in {chunk}");
                }
            }
            for bad in [0, 1, 63, 96, chunk / 2, chunk, chunk + 1, u64::MAX] {
                assert!(!is_class(bad, chunk), "{bad} in {chunk}");
            }
        }
    }

    #[test]
    fn shapes_and_classes() {
        let c = 2 << 20;
        let s = ChunkShape::new(c, 64);
        assert!(s.first_object >= chunk::BITMAP + s.object_count.div_ceil(64) * 8);
        assert!(s.first_object + s.object_count * 64 <= c);
        assert_eq!(s.object_at(s.first_object), Some(0));
        assert_eq!(s.object_at(s.first_object + 64), Some(1));
        assert_eq!(s.object_at(s.first_object + 1), None);
        assert_eq!(size_class(1, c), Some(64));
        assert_eq!(size_class(65, c), Some(128));
        assert_eq!(size_class(c / 4, c), Some(c / 4));
        let whole = size_class(c / 4 + 1, c).unwrap();
        assert!(whole > c / 2 && whole < c);
        assert_eq!(ChunkShape::new(c, whole).object_count, 1);
        assert_eq!(size_class(c, c), None);
        assert_eq!(size_class(0, c), None);
    }
}
