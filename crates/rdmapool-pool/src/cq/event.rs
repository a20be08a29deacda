//! The completion channel as tokio sees it.

use crate::fabric::Cq;
use std::os::fd::{AsRawFd, RawFd};

/// A CQ's completion-channel descriptor, kept open by holding the CQ, for `AsyncFd`.
pub(crate) struct CompletionChannel {
    cq: Cq,
}

impl CompletionChannel {
    pub(crate) fn new(cq: Cq) -> Self {
        Self { cq }
    }

    /// Whether the channel has an event queued right now (a zero-timeout `poll(2)`): the
    /// "would block" test before clearing tokio's readiness.
    pub(crate) fn readable_now(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.cq.event_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd on the stack; timeout 0.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n > 0 && p.revents & libc::POLLIN != 0
    }
}

impl AsRawFd for CompletionChannel {
    fn as_raw_fd(&self) -> RawFd {
        self.cq.event_fd()
    }
}
