//! The intra-host zero-copy path.
//!
//! Memory that a soft region owns lives in a memfd. Its last page is a control page that
//! publishes the region (rkey, PD, access, address, length) and a state word: a VALID bit and
//! a count of operations in flight. A peer process on the same host receives the memfd once
//! (SCM_RIGHTS over the local socket), maps it, and from then on executes one-sided
//! operations itself at memcpy speed: no socket, no target CPU. It makes the same checks the
//! target would, against the control page, and a violation moves the target QP to ERR through
//! its shared state page. Deregistration clears VALID, then waits for in-flight operations.

use super::access::RemoteAccess;
use super::control;
use super::keys::LocalList;
use crate::fabric::{AccessFlags, QpState, WcStatus};
use crate::os::mapping::Mapping;
use crate::util::copy::copy_bytes;
use crate::util::page_size;
use crate::{Error, Result};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// A peer's region mapped into this process.
pub(crate) struct RemoteMr {
    map: Mapping,
    /// Bytes before the control page: no operation reaches past them.
    data_len: usize,
}

impl RemoteMr {
    pub(crate) fn new(fd: OwnedFd) -> Result<Self> {
        let map = Mapping::from_fd(fd)?;
        if map.len() < 2 * page_size() {
            return Err(Error::Malformed {
                what: "shared region",
                reason: "too small to hold a control page".into(),
            });
        }
        let data_len = control::offset(&map);
        Ok(Self { map, data_len })
    }

    /// Whether the peer still has it registered (stale entries are dropped from caches).
    pub(crate) fn is_valid(&self) -> bool {
        self.page().state().load(Ordering::Acquire) & control::VALID != 0
    }

    fn page(&self) -> control::Page<'_> {
        control::page_at(&self.map, self.data_len)
    }
}

/// One one-sided operation for the fast path.
pub(crate) enum FastOp {
    Write,
    Read,
    CompareSwap { compare: u64, swap: u64 },
    FetchAdd { add: u64 },
}

/// A peer's region entered for the requests of one post: its count of operations in flight
/// raised once for all of them (a list of requests on one region touches the shared state
/// word once, not twice per request), and lowered when this is dropped. Deregistration
/// waits for it, as a NIC's waits for the DMA of requests already posted.
pub(crate) struct Entered {
    rm: Arc<RemoteMr>,
    /// Whether the region was registered when it was entered.
    valid: bool,
}

impl Entered {
    pub(crate) fn new(rm: Arc<RemoteMr>) -> Self {
        let before = rm.page().state().fetch_add(1, Ordering::AcqRel);
        Self {
            rm,
            valid: before & control::VALID != 0,
        }
    }

    /// Whether this is the region `rm`.
    pub(crate) fn is(&self, rm: &RemoteMr) -> bool {
        std::ptr::eq(Arc::as_ptr(&self.rm), rm)
    }

    /// [`execute`] on the entered region.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn execute(
        &self,
        target_pd: u32,
        rkey: u32,
        addr: u64,
        len: u64,
        op: &FastOp,
        local: &LocalList,
    ) -> WcStatus {
        execute_entered(&self.rm, self.valid, target_pd, rkey, addr, len, op, local)
    }
}

impl Drop for Entered {
    fn drop(&mut self) {
        self.rm.page().state().fetch_sub(1, Ordering::AcqRel);
    }
}

/// Executes `op` on the peer's mapped region with the checks the target's NIC makes.
/// Returns the completion status; on a remote error the caller moves the target QP to ERR.
pub(crate) fn execute(
    rm: &RemoteMr,
    target_pd: u32,
    rkey: u32,
    addr: u64,
    len: u64,
    op: &FastOp,
    local: &LocalList,
) -> WcStatus {
    let state = rm.page().state();
    let before = state.fetch_add(1, Ordering::AcqRel);
    let valid = before & control::VALID != 0;
    let status = execute_entered(rm, valid, target_pd, rkey, addr, len, op, local);
    state.fetch_sub(1, Ordering::AcqRel);
    status
}

/// [`execute`] on a region whose in-flight count the caller holds raised (`valid`: whether
/// it was registered then).
#[allow(clippy::too_many_arguments)]
#[inline]
fn execute_entered(
    rm: &RemoteMr,
    valid: bool,
    target_pd: u32,
    rkey: u32,
    addr: u64,
    len: u64,
    op: &FastOp,
    local: &LocalList,
) -> WcStatus {
    let need = match op {
        FastOp::Write => AccessFlags::REMOTE_WRITE,
        FastOp::Read => AccessFlags::REMOTE_READ,
        _ => AccessFlags::REMOTE_ATOMIC,
    };
    let access = RemoteAccess {
        pd: target_pd,
        need,
        addr,
        len,
        atomic: matches!(op, FastOp::CompareSwap { .. } | FastOp::FetchAdd { .. }),
    };
    let grant = valid.then(|| rm.page().grant(rkey)).flatten();
    if let Err(status) = access.check(grant) {
        return status;
    }
    let base = grant.map_or(0, |g| g.base);
    let offset = (addr - base) as usize;
    if offset + len as usize > rm.data_len {
        return WcStatus::RemAccessErr; // a lying control page cannot reach past the data
    }
    // SAFETY: offset + len lies inside the data part of the mapping (checked just above).
    let remote = unsafe { rm.map.ptr().add(offset) };
    copy(remote, op, local)
}

/// Moves the bytes (or does the atomic) between the mapped remote range and the local SGEs.
fn copy(remote: *mut u8, op: &FastOp, local: &LocalList) -> WcStatus {
    // Filled in place (collecting into an Option moved the whole array once more).
    let mut held = arrayvec::ArrayVec::<_, { super::MAX_SGE }>::new();
    for l in local {
        match l.mr.hold() {
            Some(h) => held.push(h),
            None => return WcStatus::LocProtErr,
        }
    }
    match op {
        FastOp::Write | FastOp::Read => {
            let mut at = 0usize;
            for l in local {
                // SAFETY: each local piece lies in a region checked at post time and kept
                // registered by `held`; the remote range was bounds-checked by the caller.
                // Raw copies: both sides are device-shared memory, never Rust references.
                // The copy avoids `rep movsb`'s cliff at bad relative alignments.
                unsafe {
                    let r = remote.add(at);
                    if matches!(op, FastOp::Write) {
                        copy_bytes(r, l.addr as *const u8, l.len as usize);
                    } else {
                        copy_bytes(l.addr as *mut u8, r as *const u8, l.len as usize);
                    }
                }
                at += l.len as usize;
            }
        }
        FastOp::CompareSwap { .. } | FastOp::FetchAdd { .. } => {
            // SAFETY: 8-byte aligned (checked by the caller) and in bounds; every RDMA atomic
            // on this word is an AtomicU64 operation, in this process or the target's.
            let word = unsafe { &*(remote as *const AtomicU64) };
            let old = match *op {
                FastOp::CompareSwap { compare, swap } => {
                    match word.compare_exchange(compare, swap, Ordering::AcqRel, Ordering::Acquire)
                    {
                        Ok(v) | Err(v) => v,
                    }
                }
                FastOp::FetchAdd { add } => word.fetch_add(add, Ordering::AcqRel),
                _ => unreachable!("matched above"),
            };
            // SAFETY: the single 8-byte local SGE lies in a LOCAL_WRITE region held above.
            unsafe { std::ptr::write_unaligned(local[0].addr as *mut u64, old) };
        }
    }
    WcStatus::Success
}

/// Sends `data` with descriptors attached (SCM_RIGHTS), without waiting: the bytes sent
/// (the descriptors go with the first), 0 when the socket is full and nothing was sent.
pub(crate) fn send_with_fds_nowait(sock: RawFd, data: &[u8], fds: &[RawFd]) -> io::Result<usize> {
    let mut iov = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let payload = std::mem::size_of_val(fds) as u32;
    // SAFETY: CMSG_SPACE is a pure size computation.
    let space = unsafe { libc::CMSG_SPACE(payload) } as usize;
    let mut cbuf = vec![0u64; space.div_ceil(8)];
    // SAFETY: msghdr is plain data; zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = space as _;
    // SAFETY: the control buffer is large enough for one header carrying `fds` (CMSG_SPACE),
    // so CMSG_FIRSTHDR is non-null and CMSG_DATA has room for the descriptors.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_SOCKET;
        (*cmsg).cmsg_type = libc::SCM_RIGHTS;
        (*cmsg).cmsg_len = libc::CMSG_LEN(payload) as _;
        std::ptr::copy_nonoverlapping(fds.as_ptr(), libc::CMSG_DATA(cmsg) as *mut RawFd, fds.len());
    }
    // SAFETY: every pointer in msg refers to live local buffers.
    let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT) };
    if n < 0 {
        let e = io::Error::last_os_error();
        return if e.kind() == io::ErrorKind::WouldBlock {
            Ok(0)
        } else {
            Err(e)
        };
    }
    Ok(n as usize)
}

/// Receives exactly `buf.len()` bytes sent by [`send_with_fds_nowait`] and the descriptors with them.
pub(crate) fn recv_with_fds(
    sock: RawFd,
    buf: &mut [u8],
    deadline: Instant,
) -> io::Result<Vec<OwnedFd>> {
    if !super::io::wait_fd(sock, libc::POLLIN, Some(deadline))? {
        return Err(io::Error::new(
            io::ErrorKind::TimedOut,
            "no answer from the peer",
        ));
    }
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    let mut cbuf = [0u64; 16];
    // SAFETY: msghdr is plain data; zero is a valid empty header.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cbuf.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cbuf) as _;
    // SAFETY: the buffers above are live and sized as declared; MSG_CMSG_CLOEXEC marks the
    // received descriptors close-on-exec.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_WAITALL | libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    if n as usize != buf.len() {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    let mut fds = Vec::new();
    // SAFETY: walking the control messages the kernel wrote into `cbuf`, within msg_controllen.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let count = ((*cmsg).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<RawFd>();
                let data = libc::CMSG_DATA(cmsg) as *const RawFd;
                for i in 0..count {
                    // The kernel installed these descriptors for us; we own them now.
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
        }
    }
    Ok(fds)
}

/// A peer QP's state, shared through its state page.
pub(crate) struct RemoteQpState {
    page: Mapping,
}

impl RemoteQpState {
    pub(crate) fn new(fd: OwnedFd) -> Result<Self> {
        Ok(Self {
            page: Mapping::from_fd(fd)?,
        })
    }
    pub(crate) fn get(&self) -> QpState {
        QpState::from_u8(self.page.word(0).load(Ordering::Acquire) as u8)
    }
    /// Moves the peer QP to ERR (its owner flushes its receive queue when it next looks).
    pub(crate) fn set_error(&self) {
        self.page
            .word(0)
            .store(QpState::Error as u64, Ordering::Release);
    }
}

/// Keeps `fd`'s raw number for passing to [`send_with_fds_nowait`].
pub(crate) fn raw(m: &Mapping) -> RawFd {
    m.fd().as_raw_fd()
}
