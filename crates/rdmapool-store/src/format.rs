//! The store's byte formats (docs/STORE.md section 3): the 8-byte index slot and the block
//! (header, key, value) a slot names. Pure functions, no I/O.

use rdmapool_pool::{CoreError, Result};
use std::ops::Range;

/// The first 8 bytes of every block.
pub const BLOCK_MAGIC: [u8; 8] = *b"RDSOBJ01";
/// Bytes of a block's header; the key follows it.
pub const HEADER_LEN: usize = 64;
/// The longest key, in bytes.
pub const MAX_KEY_LEN: usize = 255;
/// The largest value, in bytes (64 MiB).
pub const MAX_VALUE_LEN: u64 = 64 << 20;
/// Offsets a slot can name: below 2^48.
pub const MAX_OFFSET: u64 = (1 << 48) - 1;

/// Header offsets (docs/STORE.md section 3).
const SEQ: usize = 8;
const WRITER: usize = 16;
const VALUE_LEN: usize = 24;
const KEY_LEN: usize = 32;
const FLAGS: usize = 33;
const PIN: usize = 34;
const CRC: usize = 36;
const EXPIRES: usize = 40;
const ACCESSED: usize = 48;
const ACCESSES: usize = 56;

/// Header bytes 48..56, outside the checksum: when the block was last read, in milliseconds
/// since the Unix epoch by the reader's clock (its put's time at first). A cache's readers
/// WRITE it, and its eviction samples it (docs/STORE.md section 12).
pub const ACCESSED_AT: u64 = ACCESSED as u64;
/// Header bytes 56..64, outside the checksum: how many reads were counted on the block (a
/// cache's readers add them with fetch-and-add; an LFU eviction samples it).
pub const ACCESSES_AT: u64 = ACCESSES as u64;

/// Whether a cache may evict a value (header byte 34, under the checksum; docs/STORE.md
/// section 12). Only values and striped values' manifests are pinned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Pin {
    /// Evictable (byte 0).
    #[default]
    None,
    /// Never evicted (byte 1): it stays until it is replaced, removed or expires.
    Hard,
    /// Not evicted while it was read (or put) within the cache's soft-pin time, unless
    /// nothing else is left to evict (byte 2; Mooncake's soft pin).
    Soft,
}

impl Pin {
    /// The header byte.
    pub fn byte(self) -> u8 {
        match self {
            Pin::None => 0,
            Pin::Hard => 1,
            Pin::Soft => 2,
        }
    }

    /// The pin a header byte names; `None` for any other byte.
    pub fn from_byte(byte: u8) -> Option<Self> {
        match byte {
            0 => Some(Pin::None),
            1 => Some(Pin::Hard),
            2 => Some(Pin::Soft),
            _ => None,
        }
    }
}

/// When a value stops being returned: a time to live's end, in milliseconds since the Unix
/// epoch by the writer's wall clock (header bytes 40..48; 0, [`Expiry::NEVER`], is none).
/// Only values and striped values' manifests carry one (docs/STORE.md section 11).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Expiry(pub u64);

impl Expiry {
    /// No expiry: the value lives until it is replaced or removed.
    pub const NEVER: Expiry = Expiry(0);

    /// Whether the value has expired by the clock reading `now_ms` (milliseconds since the
    /// Unix epoch): at or past its end. Never, for [`Expiry::NEVER`].
    pub fn is_past(self, now_ms: u64) -> bool {
        self.0 != 0 && now_ms >= self.0
    }
}

/// What a block holds: header byte 33, the flags (docs/STORE.md section 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// A value (flags 0).
    Value,
    /// A removal's tombstone (flag bit 0; the value is empty).
    Tombstone,
    /// A striped value's manifest: the list of its parts (flag bit 1; section 9).
    Manifest,
    /// One part of a striped value, under a part key (flag bit 2; section 9).
    Part,
}

impl Kind {
    /// The flags byte.
    pub fn flags(self) -> u8 {
        match self {
            Kind::Value => 0,
            Kind::Tombstone => 1,
            Kind::Manifest => 2,
            Kind::Part => 4,
        }
    }

    /// The kind a flags byte names; `None` for any other byte.
    pub fn from_flags(flags: u8) -> Option<Self> {
        match flags {
            0 => Some(Kind::Value),
            1 => Some(Kind::Tombstone),
            2 => Some(Kind::Manifest),
            4 => Some(Kind::Part),
            _ => None,
        }
    }

    /// Whether a value of `len` bytes suits the kind (a tombstone's is empty, every other
    /// kind's is not).
    fn fits(self, len: u64) -> bool {
        (self == Kind::Tombstone) == (len == 0)
    }
}

/// A version of a key: ordered by `seq`, then by `writer`; the highest wins (docs/STORE.md
/// section 1, promise 3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// The sequence number, from 1: one more than the version a put replaced.
    pub seq: u64,
    /// The client id of the put.
    pub writer: u64,
}

/// A key's 64-bit hash (XXH3-64 of its bytes): it picks the bucket, the fingerprint and the
/// replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyHash(pub u64);

impl KeyHash {
    /// The hash of `key`.
    pub fn of(key: &[u8]) -> Self {
        Self(xxhash_rust::xxh3::xxh3_64(key))
    }

    /// The key's bucket among `buckets` (at least 1).
    pub fn bucket(self, buckets: u64) -> u64 {
        self.0 % buckets.max(1)
    }

    /// The fingerprint a slot holds for the key: the hash's top byte, never 0.
    pub fn fingerprint(self) -> u8 {
        ((self.0 >> 56) as u8).max(1)
    }
}

/// Checks a key and a value length against the store's limits.
pub fn check_sizes(key: &[u8], value_len: u64) -> Result<()> {
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err(CoreError::OutOfLimits {
            what: "key length",
            value: key.len() as u64,
            min: 1,
            max: MAX_KEY_LEN as u64,
        }
        .into());
    }
    if value_len == 0 || value_len > MAX_VALUE_LEN {
        return Err(CoreError::OutOfLimits {
            what: "value length",
            value: value_len,
            min: 1,
            max: MAX_VALUE_LEN,
        }
        .into());
    }
    Ok(())
}

/// The 8-bit code of the least bound `(8 + m) << e` at or above `len` (`m` < 8, `e` < 32),
/// so the bound is less than 2/15 over `len`. Lengths above the largest bound (about 32 GiB)
/// get the largest code.
pub fn length_code(len: u64) -> u8 {
    if len <= 8 {
        return 0;
    }
    // The smallest e with 15 << e >= len, then the smallest m for it.
    let mut e = 0u32;
    while (15u64 << e) < len {
        e += 1;
        if e > 31 {
            return u8::MAX;
        }
    }
    let m = len.div_ceil(1 << e).saturating_sub(8);
    ((e as u8) << 3) | (m.min(7) as u8)
}

/// The length bound a [`length_code`] stands for.
pub fn length_bound(code: u8) -> u64 {
    (8 + u64::from(code & 7)) << (code >> 3)
}

/// An occupied index slot: where the block is, how much to read, and whose it may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// The block's offset in the node's region (below 2^48).
    pub offset: u64,
    /// The length code ([`length_bound`] of it covers the block).
    pub length_code: u8,
    /// The key's fingerprint ([`KeyHash::fingerprint`]).
    pub fingerprint: u8,
}

impl Slot {
    /// The slot naming a block of `block_len` bytes at `offset` for the key hashed `h`.
    pub fn new(h: KeyHash, offset: u64, block_len: u64) -> Result<Self> {
        if offset > MAX_OFFSET {
            return Err(CoreError::OutOfLimits {
                what: "store block offset",
                value: offset,
                min: 0,
                max: MAX_OFFSET,
            }
            .into());
        }
        Ok(Self {
            offset,
            length_code: length_code(block_len),
            fingerprint: h.fingerprint(),
        })
    }

    /// The slot's word (never 0).
    pub fn word(self) -> u64 {
        self.offset | u64::from(self.length_code) << 48 | u64::from(self.fingerprint) << 56
    }

    /// The slot a word holds; `None` for an empty slot (0) or a word no writer makes
    /// (fingerprint 0).
    pub fn from_word(word: u64) -> Option<Self> {
        let fingerprint = (word >> 56) as u8;
        (fingerprint != 0).then_some(Self {
            offset: word & MAX_OFFSET,
            length_code: (word >> 48) as u8,
            fingerprint,
        })
    }

    /// Bytes to READ for the block (its bound, at least a header).
    pub fn read_len(self) -> u64 {
        length_bound(self.length_code).max(HEADER_LEN as u64)
    }
}

/// The bytes a slot word names, as a cache counts them (docs/STORE.md section 12): its
/// length bound; 0 for an empty slot or a word no writer makes.
pub fn named_bytes(word: u64) -> u64 {
    Slot::from_word(word).map_or(0, |s| length_bound(s.length_code))
}

/// Bytes of the block for `key` and a value of `value_len` bytes.
pub fn block_len(key: &[u8], value_len: u64) -> u64 {
    HEADER_LEN as u64 + key.len() as u64 + value_len
}

/// A value's length and CRC state, computed once and used for every replica's header (the
/// header's CRC covers the header, the key, then the value).
#[derive(Debug, Clone)]
pub struct ValueDigest {
    len: u64,
    crc: crc32fast::Hasher,
}

impl ValueDigest {
    /// The digest of `value`.
    pub fn of(value: &[u8]) -> Self {
        let mut crc = crc32fast::Hasher::new();
        crc.update(value);
        Self {
            len: value.len() as u64,
            crc,
        }
    }

    /// The digest of no bytes yet; [`ValueDigest::update`] adds bytes in order.
    pub fn new() -> Self {
        Self {
            len: 0,
            crc: crc32fast::Hasher::new(),
        }
    }

    /// Adds the value's next bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.len += bytes.len() as u64;
        self.crc.update(bytes);
    }

    /// The CRC-32 (IEEE) of the value's bytes so far.
    pub fn crc(&self) -> u32 {
        self.crc.clone().finalize()
    }

    /// The value's length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Whether the value is empty (a tombstone's).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Default for ValueDigest {
    fn default() -> Self {
        Self::new()
    }
}

/// Writes the header of a block into `header` (its first [`HEADER_LEN`] bytes), with the
/// CRC over the header, `key` and `value`.
pub fn encode_header(
    header: &mut [u8; HEADER_LEN],
    key: &[u8],
    value: &[u8],
    version: Version,
    kind: Kind,
) -> Result<()> {
    encode_header_for(
        header,
        key,
        &ValueDigest::of(value),
        version,
        kind,
        (Expiry::NEVER, Pin::None),
    )
}

/// [`encode_header`] from the value's digest (so a put to several replicas, or a retried
/// one, reads the value once), with an `expiry` and a `pin` (a value's or a manifest's
/// only). The access bytes (48..64, outside the checksum) are left zero: [`stamp_access`].
pub fn encode_header_for(
    header: &mut [u8; HEADER_LEN],
    key: &[u8],
    value: &ValueDigest,
    version: Version,
    kind: Kind,
    (expiry, pin): (Expiry, Pin),
) -> Result<()> {
    check_expiry(kind, expiry)?;
    if pin != Pin::None && !expires(kind) {
        return Err(CoreError::BadSetting {
            name: "store block pin".into(),
            value: format!("{pin:?}"),
            reason: "only a value or a striped value's manifest is pinned".into(),
        }
        .into());
    }
    if kind != Kind::Tombstone {
        check_sizes(key, value.len)?;
    } else {
        check_sizes(key, 1)?;
        if value.len != 0 {
            return Err(CoreError::OutOfLimits {
                what: "tombstone value length",
                value: value.len,
                min: 0,
                max: 0,
            }
            .into());
        }
    }
    *header = [0; HEADER_LEN];
    header[..8].copy_from_slice(&BLOCK_MAGIC);
    header[SEQ..SEQ + 8].copy_from_slice(&version.seq.to_le_bytes());
    header[WRITER..WRITER + 8].copy_from_slice(&version.writer.to_le_bytes());
    header[VALUE_LEN..VALUE_LEN + 8].copy_from_slice(&value.len.to_le_bytes());
    header[KEY_LEN] = key.len() as u8;
    header[FLAGS] = kind.flags();
    header[PIN] = pin.byte();
    header[EXPIRES..EXPIRES + 8].copy_from_slice(&expiry.0.to_le_bytes());
    let mut crc = crc32fast::Hasher::new();
    header_crc(&mut crc, header);
    crc.update(key);
    crc.combine(&value.crc);
    header[CRC..CRC + 4].copy_from_slice(&crc.finalize().to_le_bytes());
    Ok(())
}

/// Writes the access bytes of `header` (outside the checksum): last read at `at_us`
/// (microseconds since the Unix epoch), `count` reads.
pub fn stamp_access(header: &mut [u8; HEADER_LEN], at_us: u64, count: u64) {
    header[ACCESSED..ACCESSED + 8].copy_from_slice(&at_us.to_le_bytes());
    header[ACCESSES..ACCESSES + 8].copy_from_slice(&count.to_le_bytes());
}

/// A whole block (header, key, value) in one buffer.
pub fn encode_block(key: &[u8], value: &[u8], version: Version, kind: Kind) -> Result<Vec<u8>> {
    let mut header = [0u8; HEADER_LEN];
    encode_header(&mut header, key, value, version, kind)?;
    let mut out = Vec::with_capacity(HEADER_LEN + key.len() + value.len());
    out.extend_from_slice(&header);
    out.extend_from_slice(key);
    out.extend_from_slice(value);
    Ok(out)
}

/// Checks that a block of `kind` may carry `expiry` (only a value or a manifest expires).
pub fn check_expiry(kind: Kind, expiry: Expiry) -> Result<()> {
    if expiry != Expiry::NEVER && !expires(kind) {
        return Err(CoreError::BadSetting {
            name: "store block expiry".into(),
            value: expiry.0.to_string(),
            reason: "only a value or a striped value's manifest expires".into(),
        }
        .into());
    }
    Ok(())
}

/// Whether blocks of `kind` may carry an expiry.
fn expires(kind: Kind) -> bool {
    matches!(kind, Kind::Value | Kind::Manifest)
}

/// Adds what the CRC covers of `header`: bytes 0..36, then the expiry when there is one
/// (a block without one has the CRC it had before expiries existed).
fn header_crc(crc: &mut crc32fast::Hasher, header: &[u8; HEADER_LEN]) {
    crc.update(&header[..CRC]);
    if header[EXPIRES..EXPIRES + 8] != [0; 8] {
        crc.update(&header[EXPIRES..EXPIRES + 8]);
    }
}

/// The expiry and the pin in `header`, if its reserved bytes are as a block's must be:
/// byte 35 zero, byte 34 a pin (none unless `kind` may be pinned), and bytes 40..48 zero
/// unless `kind` may expire. Bytes 48..64 (the access bytes) may hold anything.
fn expiry_of(header: &[u8; HEADER_LEN], kind: Kind) -> Option<(Expiry, Pin)> {
    let pin = Pin::from_byte(header[PIN])?;
    let expiry = Expiry(u64::from_le_bytes(
        header[EXPIRES..EXPIRES + 8].try_into().unwrap_or([0; 8]),
    ));
    let may = expires(kind);
    (header[PIN + 1] == 0 && (expiry == Expiry::NEVER || may) && (pin == Pin::None || may))
        .then_some((expiry, pin))
}

fn block_crc(header: &[u8; HEADER_LEN], key: &[u8], value: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    header_crc(&mut h, header);
    h.update(key);
    h.update(value);
    h.finalize()
}

/// A block that verified: its version, whether it is a tombstone, where its value is in the
/// bytes read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// The version the put gave it.
    pub version: Version,
    /// A remove (its kind is [`Kind::Tombstone`]).
    pub tombstone: bool,
    /// What it holds.
    pub kind: Kind,
    /// The value's bytes within what was decoded.
    pub value: Range<usize>,
    /// When it expires (a value's or a manifest's; [`Expiry::NEVER`] for the rest).
    pub expiry: Expiry,
    /// Whether a cache may evict it.
    pub pin: Pin,
}

/// Why bytes read from a slot are not the object looked for. None of these is an error of
/// the store: the block was recycled, torn by a concurrent reuse, or damaged, and the
/// reader tries the next candidate or replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Reject {
    /// Fewer bytes than the header and the lengths it gives.
    #[error("short block")]
    Short,
    /// The magic, a length, the flags or a zero field is wrong.
    #[error("not a block")]
    NotABlock,
    /// Another key's block.
    #[error("another key")]
    OtherKey,
    /// The CRC does not match: torn or damaged.
    #[error("checksum mismatch")]
    Checksum,
}

/// What a block's header and key say, read without its value (so without the checksum's
/// verdict): for listing keys, where reading every value would be too much.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peek {
    /// The key.
    pub key: Vec<u8>,
    /// The version the header names.
    pub version: Version,
    /// A remove (its kind is [`Kind::Tombstone`]).
    pub tombstone: bool,
    /// What it holds.
    pub kind: Kind,
    /// When it expires, as its header says.
    pub expiry: Expiry,
    /// Whether a cache may evict it, as its header says.
    pub pin: Pin,
    /// When it was last read or put, in microseconds since the Unix epoch (header bytes
    /// 48..56, outside the checksum).
    pub accessed_us: u64,
    /// Reads counted on it (header bytes 56..64, outside the checksum).
    pub accesses: u64,
}

/// The key and version of the block at the start of `bytes`, from its header and key alone
/// (at least [`HEADER_LEN`] + 255 bytes, or up to the block's end); `None` if the header is
/// not a block's.
pub fn peek(bytes: &[u8]) -> Option<Peek> {
    let header: &[u8; HEADER_LEN] = bytes.get(..HEADER_LEN)?.try_into().ok()?;
    let word = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().unwrap_or([0; 8]));
    let key_len = header[KEY_LEN] as usize;
    let kind = Kind::from_flags(header[FLAGS])?;
    let (expiry, pin) = expiry_of(header, kind)?;
    if header[..8] != BLOCK_MAGIC
        || key_len == 0
        || word(SEQ) == 0
        || word(VALUE_LEN) > MAX_VALUE_LEN
        || !kind.fits(word(VALUE_LEN))
    {
        return None;
    }
    Some(Peek {
        key: bytes.get(HEADER_LEN..HEADER_LEN + key_len)?.to_vec(),
        version: Version {
            seq: word(SEQ),
            writer: word(WRITER),
        },
        tombstone: kind == Kind::Tombstone,
        kind,
        expiry,
        pin,
        accessed_us: word(ACCESSED),
        accesses: word(ACCESSES),
    })
}

/// Decodes and verifies the block for `key` at the start of `bytes` (which may run past
/// the block's end, as a READ of a slot's length bound does).
pub fn decode_block(bytes: &[u8], key: &[u8]) -> std::result::Result<Block, Reject> {
    let header: &[u8; HEADER_LEN] = bytes
        .get(..HEADER_LEN)
        .and_then(|h| h.try_into().ok())
        .ok_or(Reject::Short)?;
    let word = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().unwrap_or([0; 8]));
    let value_len = word(VALUE_LEN);
    let key_len = header[KEY_LEN] as usize;
    let Some(kind) = Kind::from_flags(header[FLAGS]) else {
        return Err(Reject::NotABlock);
    };
    let Some((expiry, pin)) = expiry_of(header, kind) else {
        return Err(Reject::NotABlock);
    };
    if header[..8] != BLOCK_MAGIC
        || key_len == 0
        || value_len > MAX_VALUE_LEN
        || !kind.fits(value_len)
        || word(SEQ) == 0
    {
        return Err(Reject::NotABlock);
    }
    if key_len != key.len() {
        return Err(Reject::OtherKey);
    }
    let key_end = HEADER_LEN + key_len;
    let end = key_end + value_len as usize;
    let stored_key = bytes.get(HEADER_LEN..key_end).ok_or(Reject::Short)?;
    if stored_key != key {
        return Err(Reject::OtherKey);
    }
    let value = bytes.get(key_end..end).ok_or(Reject::Short)?;
    let crc = u32::from_le_bytes(header[CRC..CRC + 4].try_into().unwrap_or([0; 4]));
    if block_crc(header, key, value) != crc {
        return Err(Reject::Checksum);
    }
    Ok(Block {
        version: Version {
            seq: word(SEQ),
            writer: word(WRITER),
        },
        tombstone: kind == Kind::Tombstone,
        kind,
        value: key_end..end,
        expiry,
        pin,
    })
}

/// Verifies a block read in two pieces: `head`, its header and key (at least
/// [`HEADER_LEN`] + the key's length bytes), and its value, of which only the digest is
/// given (the value itself landed elsewhere, e.g. straight in a caller's buffer). The
/// checks are [`decode_block`]'s; the value's range in the answer is `0..value.len()`.
pub fn decode_split(
    head: &[u8],
    key: &[u8],
    value: &ValueDigest,
) -> std::result::Result<Block, Reject> {
    let key_end = HEADER_LEN + key.len();
    let head = head.get(..key_end).ok_or(Reject::Short)?;
    let header: &[u8; HEADER_LEN] = head[..HEADER_LEN].try_into().map_err(|_| Reject::Short)?;
    let p = peek(head).ok_or(Reject::NotABlock)?;
    let word = |at: usize| u64::from_le_bytes(header[at..at + 8].try_into().unwrap_or([0; 8]));
    if p.key != key {
        return Err(Reject::OtherKey);
    }
    if word(VALUE_LEN) != value.len {
        return Err(Reject::Short);
    }
    let mut crc = crc32fast::Hasher::new();
    header_crc(&mut crc, header);
    crc.update(key);
    crc.combine(&value.crc);
    let stored = u32::from_le_bytes(header[CRC..CRC + 4].try_into().unwrap_or([0; 4]));
    if crc.finalize() != stored {
        return Err(Reject::Checksum);
    }
    Ok(Block {
        version: p.version,
        tombstone: p.tombstone,
        kind: p.kind,
        value: 0..value.len as usize,
        expiry: p.expiry,
        pin: p.pin,
    })
}

/// The value length a block's header gives (`None` unless it is a block's header).
pub fn value_len(head: &[u8]) -> Option<u64> {
    peek(head)?;
    Some(u64::from_le_bytes(
        head.get(VALUE_LEN..VALUE_LEN + 8)?.try_into().ok()?,
    ))
}

#[cfg(test)]
mod tests;
