//! Reading frames out of a byte stream that arrives in pieces of any size.
//!
//! A header accumulates in a small buffer; a payload goes straight to its destination: a
//! list of registered ranges ([`Sink`]), or nowhere (a payload that will not be executed).
//! Either the state machine copies bytes the driver already read into the destination, or
//! the driver receives into it directly ([`Sink::with_pieces`]): the zero-copy path.

use crate::keys::LocalList;

/// A fixed-size header being accumulated.
pub struct HeaderBuf<const N: usize> {
    buf: [u8; N],
    have: usize,
}

// Public only for the fuzz targets; `new` is what the parsers call.
#[allow(clippy::new_without_default)]
impl<const N: usize> HeaderBuf<N> {
    pub fn new() -> Self {
        Self {
            buf: [0; N],
            have: 0,
        }
    }

    /// Takes what it still needs from `input`; returns the bytes taken.
    pub fn fill(&mut self, input: &[u8]) -> usize {
        let n = (N - self.have).min(input.len());
        self.buf[self.have..self.have + n].copy_from_slice(&input[..n]);
        self.have += n;
        n
    }

    /// The whole header, once every byte is there (the buffer starts over).
    pub fn take(&mut self) -> Option<[u8; N]> {
        if self.have == N {
            self.have = 0;
            Some(self.buf)
        } else {
            None
        }
    }

    /// No byte of a header has arrived.
    pub fn is_empty(&self) -> bool {
        self.have == 0
    }
}

/// A payload's destination: registered ranges filled in order.
pub struct Sink {
    list: LocalList,
    /// Bytes of the payload, at most the ranges' total.
    total: usize,
    done: usize,
}

impl Sink {
    /// A sink for the first `total` bytes of `list`'s ranges.
    pub fn new(list: LocalList, total: usize) -> Self {
        Self {
            list,
            total,
            done: 0,
        }
    }

    /// Bytes still to come.
    pub fn remaining(&self) -> usize {
        self.total - self.done
    }

    /// Gives the ranges still to fill, as (address, length) pieces, to `f` while every
    /// region stays registered (`f` may write into them; it returns the bytes it wrote,
    /// counted from the first piece). `None` when a region was deregistered: the payload
    /// must then be discarded, nothing is written.
    pub fn with_pieces<R>(&mut self, f: impl FnOnce(&[(u64, usize)]) -> (usize, R)) -> Option<R> {
        let held: Option<arrayvec::ArrayVec<_, { crate::MAX_SGE }>> =
            self.list.iter().map(|r| r.mr.hold()).collect();
        let _held = held?;
        let mut pieces = arrayvec::ArrayVec::<(u64, usize), { crate::MAX_SGE }>::new();
        let (mut skip, mut want) = (self.done, self.remaining());
        for r in &self.list {
            let len = r.len as usize;
            if skip >= len {
                skip -= len;
                continue;
            }
            let n = (len - skip).min(want);
            if n == 0 {
                break;
            }
            pieces.push((r.addr + skip as u64, n));
            want -= n;
            skip = 0;
        }
        let (wrote, r) = f(&pieces);
        self.done += wrote.min(self.remaining());
        Some(r)
    }

    /// Copies the start of `input` into the ranges; returns the bytes taken, or `None` when
    /// a region was deregistered (nothing taken).
    pub fn copy_in(&mut self, input: &[u8]) -> Option<usize> {
        self.with_pieces(|pieces| {
            let mut at = 0;
            for &(addr, len) in pieces {
                let n = len.min(input.len() - at);
                // SAFETY: each piece lies in a registered range that was checked for
                // LOCAL_WRITE (or the target's REMOTE_WRITE) and is kept registered while
                // `with_pieces` runs; the source is the caller's slice; device-shared memory
                // is written through a raw pointer, never a reference.
                unsafe { std::ptr::copy_nonoverlapping(input[at..].as_ptr(), addr as *mut u8, n) };
                at += n;
                if at == input.len() {
                    break;
                }
            }
            (at, at)
        })
    }
}

/// Receives a due payload in place: gives `sink`'s pieces to `recv`. `None` when there is no
/// sink (the payload is being discarded) or a region was deregistered, in which case the
/// sink is dropped and the rest of the payload must be discarded.
pub fn receive_into<E>(
    sink: &mut Option<Sink>,
    recv: impl FnOnce(&[(u64, usize)]) -> Result<usize, E>,
) -> Option<Result<usize, E>> {
    let r = sink.as_mut()?.with_pieces(|p| match recv(p) {
        Ok(n) => (n, Ok(n)),
        Err(e) => (0, Err(e)),
    });
    if r.is_none() {
        *sink = None;
    }
    r
}
