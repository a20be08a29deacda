//! How the rest of a soft NIC reaches its serving loop (`serve`): an eventfd the loop
//! watches, and the QPs destroyed since it last looked.

use crate::{Error, Result};
use parking_lot::Mutex;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// How the rest of the NIC reaches its serving loop: a QP was destroyed (its connection
/// closes now), or the NIC is closing.
pub(crate) struct Waker {
    fd: OwnedFd,
    /// The QPs destroyed since the loop last looked.
    gone: Mutex<Vec<u32>>,
}

impl Waker {
    /// A new eventfd to wake a loop with.
    pub(crate) fn new() -> Result<Self> {
        // SAFETY: eventfd with valid flags; the descriptor is owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(Error::last_os("eventfd"));
        }
        Ok(Self {
            // SAFETY: a fresh descriptor nobody else owns.
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
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
        let one = 1u64;
        // SAFETY: writing 8 bytes from a local to our eventfd.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Takes the wake-up and the QPs destroyed since the last.
    pub(crate) fn take(&self) -> Vec<u32> {
        let mut n = 0u64;
        // SAFETY: reading 8 bytes into a local from our non-blocking eventfd.
        unsafe { libc::read(self.fd.as_raw_fd(), (&mut n as *mut u64).cast(), 8) };
        std::mem::take(&mut *self.gone.lock())
    }
}

impl AsRawFd for Waker {
    fn as_raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}
