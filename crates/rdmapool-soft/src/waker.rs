//! Waking a soft NIC's threads: an eventfd each thread watches in its epoll set
//! ([`EventFd`], [`epoll`]), and for the serving loop the QPs destroyed since it last looked
//! ([`Waker`]).

use crate::{Error, Result};
use parking_lot::Mutex;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// A new epoll set (close-on-exec).
pub(crate) fn epoll() -> Result<OwnedFd> {
    // SAFETY: epoll_create1 with a valid flag; the descriptor is owned below.
    let ep = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
    if ep < 0 {
        return Err(Error::last_os("epoll_create1"));
    }
    // SAFETY: a fresh descriptor nobody else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(ep) })
}

/// A non-blocking eventfd: one side signals, the thread that watches it drains it.
pub(crate) struct EventFd(OwnedFd);

impl EventFd {
    /// A new eventfd, not signalled.
    pub(crate) fn new() -> Result<Self> {
        // SAFETY: eventfd with valid flags; the descriptor is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(Error::last_os("eventfd"));
        }
        // SAFETY: a fresh descriptor nobody else owns.
        Ok(Self(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes it readable (wakes the thread watching it).
    pub(crate) fn signal(&self) {
        let one = 1u64;
        // SAFETY: writing 8 bytes from a local to our eventfd.
        unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Takes the signals so far (it is no longer readable).
    pub(crate) fn drain(&self) {
        let mut n = 0u64;
        // SAFETY: reading 8 bytes into a local from our non-blocking eventfd.
        unsafe { libc::read(self.0.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// How the rest of the NIC reaches its serving loop: a QP was destroyed (its connection
/// closes now), or the NIC is closing.
pub(crate) struct Waker {
    fd: EventFd,
    /// The QPs destroyed since the loop last looked.
    gone: Mutex<Vec<u32>>,
}

impl Waker {
    /// A new waker, for a loop that watches it.
    pub(crate) fn new() -> Result<Self> {
        Ok(Self {
            fd: EventFd::new()?,
            gone: Mutex::new(Vec::new()),
        })
    }

    /// QP `qpn` was destroyed: the connection serving it closes (its peer learns so).
    pub(crate) fn qp_gone(&self, qpn: u32) {
        self.gone.lock().push(qpn);
        self.wake();
    }

    /// Wakes the loop (it then checks whether the NIC closes).
    pub(crate) fn wake(&self) {
        self.fd.signal();
    }

    /// Takes the wake-up and the QPs destroyed since the last.
    pub(crate) fn take(&self) -> Vec<u32> {
        self.fd.drain();
        std::mem::take(&mut *self.gone.lock())
    }
}

impl AsRawFd for Waker {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

/// Waits for events on `epoll` for at most `timeout` (forever: `None`), to the microsecond
/// where the kernel has `epoll_pwait2`. Returns how many arrived (0 on timeout or signal).
pub(crate) fn epoll_wait(
    epoll: &OwnedFd,
    events: &mut [libc::epoll_event],
    timeout: Option<Duration>,
) -> usize {
    use std::sync::atomic::{AtomicBool, Ordering};
    static NO_PWAIT2: AtomicBool = AtomicBool::new(false);
    let max = events.len() as libc::c_int;
    if !NO_PWAIT2.load(Ordering::Relaxed) {
        let ts = timeout.map(|t| libc::timespec {
            tv_sec: t.as_secs().min(i32::MAX as u64) as libc::time_t,
            tv_nsec: t.subsec_nanos() as libc::c_long,
        });
        let tsp = ts
            .as_ref()
            .map_or(std::ptr::null(), |t| t as *const libc::timespec);
        // SAFETY: our epoll descriptor, a local array of the length given, a local timespec
        // (or null: wait forever) and no signal mask.
        let n = unsafe {
            libc::epoll_pwait2(
                epoll.as_raw_fd(),
                events.as_mut_ptr(),
                max,
                tsp,
                std::ptr::null(),
            )
        };
        if n >= 0 {
            return n as usize;
        }
        if std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOSYS) {
            return 0;
        }
        NO_PWAIT2.store(true, Ordering::Relaxed);
    }
    let ms = timeout.map_or(-1, |t| {
        t.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32
    });
    // SAFETY: our epoll descriptor and a local array of the length given.
    let n = unsafe { libc::epoll_wait(epoll.as_raw_fd(), events.as_mut_ptr(), max, ms) };
    n.max(0) as usize
}
