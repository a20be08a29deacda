//! The device's asynchronous events (`ibv_get_async_event`), read by one thread per open
//! device as a driver's event handler would: a CQ overrun (`IBV_EVENT_CQ_ERR`) marks the CQ,
//! whose next poll reports `Error::CqOverrun`; other events are logged.

use crate::{Error, Result};
use parking_lot::Mutex;
use rdmapool_sys as sys;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

/// CQs by handle address, for events that name a CQ.
type CqFlags = Arc<Mutex<HashMap<usize, Weak<AtomicBool>>>>;

/// The event thread of one device context.
pub(crate) struct AsyncEvents {
    cqs: CqFlags,
    /// An eventfd that tells the thread to stop.
    stop: OwnedFd,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// The context pointer, for the thread (which the context outlives: it joins the thread
/// before closing the device).
struct ContextPtr(*mut sys::ibv_context);
// SAFETY: a verbs handle, usable from any thread; see `AsyncEvents::start`.
unsafe impl Send for ContextPtr {}

impl AsyncEvents {
    /// Starts reading `ctx`'s events. The caller must call `stop` before closing `ctx`.
    pub(crate) fn start(v: &'static sys::Verbs, ctx: *mut sys::ibv_context) -> Result<Self> {
        // SAFETY: eventfd with valid flags; owned below.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(Error::last_os("eventfd"));
        }
        // SAFETY: a fresh descriptor nobody else owns.
        let stop = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: a live context; its async_fd is a plain descriptor we make non-blocking
        // so that the thread drains events without ever blocking in the library.
        let async_fd = unsafe { (*ctx).async_fd };
        // SAFETY: fcntl on the context's own descriptor.
        unsafe {
            libc::fcntl(
                async_fd,
                libc::F_SETFL,
                libc::fcntl(async_fd, libc::F_GETFL) | libc::O_NONBLOCK,
            )
        };
        let cqs: CqFlags = Arc::default();
        let (cqs2, stop_fd, ptr) = (cqs.clone(), stop.as_raw_fd(), ContextPtr(ctx));
        let thread = std::thread::Builder::new()
            .name("rdmapool-verbs-events".into())
            .spawn(move || {
                let ptr = ptr;
                run(v, ptr.0, async_fd, stop_fd, &cqs2)
            })
            .map_err(|e| Error::Sys {
                call: "spawn",
                source: e,
            })?;
        Ok(Self {
            cqs,
            stop,
            thread: Some(thread),
        })
    }

    /// Watches `cq` for overrun: `flag` is set when the device reports it.
    pub(crate) fn watch_cq(&self, cq: *mut sys::ibv_cq, flag: &Arc<AtomicBool>) {
        self.cqs.lock().insert(cq as usize, Arc::downgrade(flag));
    }

    /// Stops watching `cq` (before it is destroyed).
    pub(crate) fn unwatch_cq(&self, cq: *mut sys::ibv_cq) {
        self.cqs.lock().remove(&(cq as usize));
    }

    /// Stops the thread and waits for it.
    pub(crate) fn stop(&mut self) {
        let one = 1u64;
        // SAFETY: writing 8 bytes from a local to our eventfd.
        unsafe { libc::write(self.stop.as_raw_fd(), (&one as *const u64).cast(), 8) };
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn run(
    v: &'static sys::Verbs,
    ctx: *mut sys::ibv_context,
    async_fd: i32,
    stop_fd: i32,
    cqs: &Mutex<HashMap<usize, Weak<AtomicBool>>>,
) {
    loop {
        let mut fds = [
            libc::pollfd {
                fd: async_fd,
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stop_fd,
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: two valid pollfds on our stack; no timeout (the stop eventfd wakes us).
        let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
        if n < 0 {
            if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            tracing::error!("verbs async events: poll failed; no longer watching");
            return;
        }
        if fds[1].revents != 0 {
            return;
        }
        loop {
            // SAFETY: all-zero is a valid ibv_async_event (a union of pointers and an int).
            let mut ev: sys::ibv_async_event = unsafe { std::mem::zeroed() };
            // SAFETY: a live context (the owner joins us before closing it) with a
            // non-blocking async_fd, and a writable event.
            if unsafe { (v.ibv_get_async_event)(ctx, &mut ev) } != 0 {
                break; // EAGAIN: drained
            }
            handle(v, &ev, cqs);
            // SAFETY: acknowledging the event just read, exactly once.
            unsafe { (v.ibv_ack_async_event)(&mut ev) };
        }
    }
}

fn handle(
    v: &'static sys::Verbs,
    ev: &sys::ibv_async_event,
    cqs: &Mutex<HashMap<usize, Weak<AtomicBool>>>,
) {
    // SAFETY: ibv_event_type_str returns a static string for any value.
    let name = unsafe { std::ffi::CStr::from_ptr((v.ibv_event_type_str)(ev.event_type)) }
        .to_string_lossy()
        .into_owned();
    if ev.event_type == sys::IBV_EVENT_CQ_ERR {
        // SAFETY: for IBV_EVENT_CQ_ERR the union holds the CQ.
        let cq = unsafe { ev.element.cq } as usize;
        if let Some(flag) = cqs.lock().get(&cq).and_then(Weak::upgrade) {
            flag.store(true, Ordering::Release);
        }
        tracing::error!(event = %name, "completion queue overrun reported by the device");
    } else {
        tracing::warn!(event = %name, "verbs asynchronous event");
    }
}
