//! What a put writes: bytes, or a registered view of the caller's memory.

use crate::format::ValueDigest;
use rdmapool_pool::fabric::{Mr, RegisteredMemory, Shared};
use rdmapool_pool::Result;

/// A value to put: bytes (copied through a staging buffer), or a registered view whose
/// bytes are WRITten straight from its memory.
#[derive(Clone, Copy)]
pub(crate) enum Source<'a> {
    Bytes(&'a [u8]),
    Mr(&'a Mr<Shared>),
}

impl Source<'_> {
    pub(super) fn len(&self) -> u64 {
        match self {
            Source::Bytes(b) => b.len() as u64,
            Source::Mr(m) => m.len() as u64,
        }
    }

    /// The value's digest (a view's bytes are read for it in pieces, not copied whole).
    pub(super) fn digest(&self) -> Result<ValueDigest> {
        match self {
            Source::Bytes(b) => Ok(ValueDigest::of(b)),
            Source::Mr(m) => digest_of(m, 0, m.len()),
        }
    }
}

/// The digest of `len` bytes at `offset` of `m`, read in 64 KiB pieces.
pub(super) fn digest_of(m: &Mr<Shared>, offset: usize, len: usize) -> Result<ValueDigest> {
    let mut d = ValueDigest::new();
    let mut piece = vec![0u8; len.min(64 << 10)];
    let mut at = 0;
    while at < len {
        let n = piece.len().min(len - at);
        m.read_at(offset + at, &mut piece[..n])?;
        d.update(&piece[..n]);
        at += n;
    }
    Ok(d)
}
