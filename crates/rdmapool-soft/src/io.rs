//! Socket I/O on raw descriptors: whole frames, deadlines, scatter/gather straight into and
//! out of registered memory (no Rust references to device-shared memory are ever made).

use arrayvec::ArrayVec;
use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

/// Most iovecs in one frame: a header plus up to [`super::MAX_SGE`] SGEs.
pub(crate) const MAX_IOV: usize = super::MAX_SGE + 1;

/// A list of (pointer, length) pieces that a transfer walks through.
pub(crate) struct IoVecs {
    iov: ArrayVec<libc::iovec, MAX_IOV>,
    first: usize,
}

impl IoVecs {
    pub(crate) fn new() -> Self {
        Self {
            iov: ArrayVec::new(),
            first: 0,
        }
    }

    /// Adds a piece. Panics only on internal misuse (more than MAX_IOV pieces).
    pub(crate) fn push(&mut self, ptr: *const u8, len: usize) {
        if len > 0 {
            self.iov.push(libc::iovec {
                iov_base: ptr as *mut libc::c_void,
                iov_len: len,
            });
        }
    }

    /// Whether every piece has been transferred.
    pub(crate) fn is_done(&self) -> bool {
        self.first >= self.iov.len()
    }

    /// Skips the first `n` bytes (they were transferred).
    pub(crate) fn advance(&mut self, mut n: usize) {
        while n > 0 && !self.is_done() {
            let v = &mut self.iov[self.first];
            if n >= v.iov_len {
                n -= v.iov_len;
                self.first += 1;
            } else {
                // SAFETY: n < iov_len, so the new base stays inside the same piece.
                v.iov_base = unsafe { (v.iov_base as *mut u8).add(n) }.cast();
                v.iov_len -= n;
                n = 0;
            }
        }
    }

    fn msghdr(&mut self) -> libc::msghdr {
        // SAFETY: msghdr is plain data; all-zero is a valid empty header.
        let mut m: libc::msghdr = unsafe { std::mem::zeroed() };
        m.msg_iov = self.iov[self.first..].as_mut_ptr();
        m.msg_iovlen = (self.iov.len() - self.first) as _;
        m
    }
}

/// How long a transfer that hits a full or empty socket retries before sleeping in poll:
/// the peer is usually mid-frame, and a sleep/wake-up pair costs more than this.
const BUSY_RETRY: Duration = Duration::from_micros(30);

/// Tracks the busy-retry window of one transfer.
struct Backoff(Option<Instant>);

impl Backoff {
    /// True while the transfer should retry at once rather than sleep.
    fn spin(&mut self) -> bool {
        let until = *self.0.get_or_insert_with(|| Instant::now() + BUSY_RETRY);
        if Instant::now() < until {
            std::hint::spin_loop();
            true
        } else {
            false
        }
    }
    /// Progress was made: the next stall gets a fresh window.
    fn reset(&mut self) {
        self.0 = None;
    }
}

fn timed_out() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "peer did not answer in time")
}

/// Waits until `fd` has any of `events` or `deadline` passes. Returns false on timeout.
pub(crate) fn wait_fd(fd: RawFd, events: i16, deadline: Option<Instant>) -> io::Result<bool> {
    loop {
        let timeout_ms = match deadline {
            None => -1,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Ok(false);
                }
                left.as_millis().clamp(1, i32::MAX as u128) as i32
            }
        };
        let mut p = libc::pollfd {
            fd,
            events,
            revents: 0,
        };
        // SAFETY: one valid pollfd on our stack.
        let r = unsafe { libc::poll(&mut p, 1, timeout_ms) };
        if r > 0 {
            return Ok(true);
        }
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() != io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

/// Receives until every piece of `iov` is filled; EOF is an error.
///
/// # Safety
/// Every piece must be writable memory that stays valid for the call.
pub(crate) unsafe fn recv_all(fd: RawFd, iov: &mut IoVecs, deadline: Instant) -> io::Result<()> {
    let mut backoff = Backoff(None);
    while !iov.is_done() {
        let mut m = iov.msghdr();
        // SAFETY: the caller guarantees the iovecs point at writable memory.
        let n = unsafe { libc::recvmsg(fd, &mut m, libc::MSG_DONTWAIT) };
        if n > 0 {
            iov.advance(n as usize);
            backoff.reset();
        } else if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        } else {
            let e = io::Error::last_os_error();
            match e.kind() {
                io::ErrorKind::WouldBlock if backoff.spin() => {}
                io::ErrorKind::WouldBlock => {
                    if !wait_fd(fd, libc::POLLIN, Some(deadline))? {
                        return Err(timed_out());
                    }
                }
                io::ErrorKind::Interrupted => {}
                _ => return Err(e),
            }
        }
    }
    Ok(())
}

/// Receives exactly `buf.len()` bytes into a local buffer.
pub(crate) fn recv_exact(fd: RawFd, buf: &mut [u8], deadline: Instant) -> io::Result<()> {
    let mut iov = IoVecs::new();
    iov.push(buf.as_mut_ptr(), buf.len());
    // SAFETY: the one piece is the caller's exclusive buffer.
    unsafe { recv_all(fd, &mut iov, deadline) }
}

/// Reads whatever of a `buf.len()`-byte frame is available now, without waiting.
/// Returns Ok(0) when nothing is there, Err(UnexpectedEof) on EOF.
pub(crate) fn recv_nowait(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        // SAFETY: buf is an exclusive local buffer of the given length.
        let n = unsafe { libc::recv(fd, buf.as_mut_ptr().cast(), buf.len(), libc::MSG_DONTWAIT) };
        if n > 0 {
            return Ok(n as usize);
        }
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => return Ok(0),
            io::ErrorKind::Interrupted => {}
            _ => return Err(e),
        }
    }
}

/// Receives whatever has arrived (without waiting) into `pieces` in order. Ok(0): nothing
/// there; Err(UnexpectedEof) on EOF.
///
/// # Safety
/// Every piece (address, length) must be writable memory that stays valid for the call.
pub(crate) unsafe fn recv_into_nowait(fd: RawFd, pieces: &[(u64, usize)]) -> io::Result<usize> {
    let mut iov = IoVecs::new();
    for &(addr, len) in pieces {
        iov.push(addr as *const u8, len);
    }
    if iov.is_done() {
        return Ok(0);
    }
    loop {
        let mut m = iov.msghdr();
        // SAFETY: the caller guarantees the pieces are writable memory.
        let n = unsafe { libc::recvmsg(fd, &mut m, libc::MSG_DONTWAIT) };
        if n > 0 {
            return Ok(n as usize);
        }
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => return Ok(0),
            io::ErrorKind::Interrupted => {}
            _ => return Err(e),
        }
    }
}

/// Sends every piece of `iov`. While the socket is full it calls `on_block`, which may read
/// responses so that neither side waits for the other forever; `on_block` returning false
/// aborts the send.
///
/// # Safety
/// Every piece must be readable memory that stays valid for the call.
pub(crate) unsafe fn send_all(
    fd: RawFd,
    iov: &mut IoVecs,
    deadline: Instant,
    more: bool,
    mut on_block: impl FnMut() -> bool,
) -> io::Result<()> {
    // MSG_MORE: more requests of the same post follow, so the kernel may hold this one
    // back and put the whole list into one segment (a doorbell for a list of WRs).
    let flags = libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL | if more { libc::MSG_MORE } else { 0 };
    let mut backoff = Backoff(None);
    while !iov.is_done() {
        let m = iov.msghdr();
        // SAFETY: the caller guarantees the iovecs point at readable memory.
        let n = unsafe { libc::sendmsg(fd, &m, flags) };
        if n >= 0 {
            iov.advance(n as usize);
            backoff.reset();
            continue;
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => {
                if !on_block() {
                    return Err(io::Error::new(io::ErrorKind::BrokenPipe, "send aborted"));
                }
                if Instant::now() >= deadline {
                    return Err(timed_out());
                }
                if backoff.spin() {
                    continue;
                }
                let short = Instant::now() + Duration::from_millis(1);
                wait_fd(fd, libc::POLLOUT | libc::POLLIN, Some(short.min(deadline)))?;
            }
            io::ErrorKind::Interrupted => {}
            _ => return Err(e),
        }
    }
    Ok(())
}

/// One send of what `iov` holds, without waiting: the bytes the socket took (0 when it is
/// full). The pieces are not advanced.
///
/// # Safety
/// Every piece must be readable memory that stays valid for the call.
pub(crate) unsafe fn send_nowait(fd: RawFd, iov: &mut IoVecs) -> io::Result<usize> {
    if iov.is_done() {
        return Ok(0);
    }
    loop {
        let m = iov.msghdr();
        // SAFETY: the caller guarantees the iovecs point at readable memory.
        let n = unsafe { libc::sendmsg(fd, &m, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
        if n >= 0 {
            return Ok(n as usize);
        }
        let e = io::Error::last_os_error();
        match e.kind() {
            io::ErrorKind::WouldBlock => return Ok(0),
            io::ErrorKind::Interrupted => {}
            _ => return Err(e),
        }
    }
}

/// Sends a local buffer completely (no interleaved reading).
pub(crate) fn send_buf(fd: RawFd, buf: &[u8], deadline: Instant) -> io::Result<()> {
    let mut iov = IoVecs::new();
    iov.push(buf.as_ptr(), buf.len());
    // SAFETY: the piece is the caller's buffer, borrowed for the call.
    unsafe { send_all(fd, &mut iov, deadline, false, || true) }
}

/// Bytes read from a socket ahead of the frame being parsed. One `recv` takes every frame
/// that has arrived, so a list of requests (or their responses) costs one system call rather
/// than one or two per frame. Payloads go to their destination: buffered bytes are copied,
/// the rest is received straight into registered memory.
pub(crate) struct RxBuf {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

/// Read-ahead per connection: a few hundred frames, small next to a socket buffer.
const RX_AHEAD: usize = 64 * 1024;

impl RxBuf {
    pub(crate) fn new() -> Self {
        Self {
            buf: vec![0u8; RX_AHEAD].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    /// Bytes buffered and not yet taken.
    pub(crate) fn len(&self) -> usize {
        self.end - self.start
    }

    fn compact(&mut self) {
        if self.start > 0 {
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
    }

    /// One non-blocking read of whatever has arrived. Ok(0): nothing new (or the buffer is
    /// full); Err(UnexpectedEof) on EOF.
    pub(crate) fn fill_nowait(&mut self, fd: RawFd) -> io::Result<usize> {
        if self.end == self.buf.len() {
            self.compact();
        }
        if self.end == self.buf.len() {
            return Ok(0);
        }
        let n = recv_nowait(fd, &mut self.buf[self.end..])?;
        self.end += n;
        Ok(n)
    }

    /// The buffered bytes.
    pub(crate) fn data(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    /// Drops the first `n` buffered bytes (they were used).
    pub(crate) fn consume(&mut self, n: usize) {
        self.start += n.min(self.len());
        if self.start == self.end {
            (self.start, self.end) = (0, 0);
        }
    }
}
