//! A memory monitor on userfaultfd: ranges are registered in write-protect mode (nothing is
//! ever write-protected, so no fault is ever delivered) only to receive the kernel's
//! non-cooperative events — UNMAP (munmap), REMOVE (madvise DONTNEED/REMOVE) and REMAP
//! (mremap) — for them. A thread reads the events and invalidates the cache, so it can
//! never hand out a registration whose memory was replaced. The kernel holds munmap until
//! the event is read, so the invalidation happens before the address can be reused.

use crate::{Error, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

const UFFD_API: u64 = 0xAA;
const UFFDIO_API: libc::c_ulong = 0xc018_aa3f;
const UFFDIO_REGISTER: libc::c_ulong = 0xc020_aa00;
const FEATURE_EVENT_REMAP: u64 = 1 << 1;
const FEATURE_EVENT_REMOVE: u64 = 1 << 3;
const FEATURE_EVENT_UNMAP: u64 = 1 << 6;
const MODE_WP: u64 = 2;
const EVENT_REMAP: u8 = 0x14;
const EVENT_REMOVE: u8 = 0x15;
const EVENT_UNMAP: u8 = 0x16;

#[repr(C)]
struct UffdioApi {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
struct UffdioRange {
    start: u64,
    len: u64,
}

#[repr(C)]
struct UffdioRegister {
    range: UffdioRange,
    mode: u64,
    ioctls: u64,
}

/// Held for writing while an event is read and applied, for reading by every lookup. The
/// kernel lets munmap return as soon as its event is *read*; taking the gate before the
/// read means no lookup can run between that moment and the invalidation being applied.
static GATE: parking_lot::RwLock<()> = parking_lot::RwLock::new(());

/// Blocks lookups only while an event is being applied.
pub(crate) fn gate() -> parking_lot::RwLockReadGuard<'static, ()> {
    GATE.read()
}

/// What the monitor calls for every range that stopped being the memory it was.
pub(crate) type OnInvalid = Arc<dyn Fn(usize, usize) + Send + Sync>;

/// The monitor: its userfaultfd and the thread reading it.
pub(crate) struct Monitor {
    fd: Arc<OwnedFd>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Monitor {
    /// Opens a userfaultfd with the unmap/remove/remap events. Fails where userfaultfd is
    /// not allowed (unprivileged without vm.unprivileged_userfaultfd, or seccomp).
    pub(crate) fn new(on_invalid: OnInvalid) -> Result<Self> {
        // SAFETY: the userfaultfd syscall with valid flags; the fd is owned below.
        let raw =
            unsafe { libc::syscall(libc::SYS_userfaultfd, libc::O_CLOEXEC | libc::O_NONBLOCK) }
                as i32;
        if raw < 0 {
            return Err(Error::last_os("userfaultfd"));
        }
        // SAFETY: a fresh descriptor we own.
        let fd = Arc::new(unsafe { OwnedFd::from_raw_fd(raw) });
        let mut api = UffdioApi {
            api: UFFD_API,
            features: FEATURE_EVENT_UNMAP | FEATURE_EVENT_REMOVE | FEATURE_EVENT_REMAP,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_API with a properly laid out argument.
        if unsafe { libc::ioctl(fd.as_raw_fd(), UFFDIO_API, &mut api) } != 0 {
            return Err(Error::last_os("ioctl(UFFDIO_API)"));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (f, s) = (fd.clone(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("rdmapool-memmon".into())
            .spawn(move || read_events(&f, &s, &on_invalid))
            .map_err(|e| {
                Error::Core(crate::CoreError::Sys {
                    call: "spawn",
                    source: e,
                })
            })?;
        Ok(Self {
            fd,
            stop,
            thread: Some(thread),
        })
    }

    /// Starts watching `[start, start+len)` (page aligned).
    pub(crate) fn watch(&self, start: usize, len: usize) -> Result<()> {
        let mut reg = UffdioRegister {
            range: UffdioRange {
                start: start as u64,
                len: len as u64,
            },
            mode: MODE_WP,
            ioctls: 0,
        };
        // SAFETY: UFFDIO_REGISTER with a properly laid out argument on our fd.
        if unsafe { libc::ioctl(self.fd.as_raw_fd(), UFFDIO_REGISTER, &mut reg) } != 0 {
            return Err(Error::last_os("ioctl(UFFDIO_REGISTER)"));
        }
        Ok(())
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn read_events(fd: &OwnedFd, stop: &AtomicBool, on_invalid: &OnInvalid) {
    let mut msg = [0u8; 32];
    while !stop.load(Ordering::Acquire) {
        let mut p = libc::pollfd {
            fd: fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd; 50 ms so that `stop` is noticed.
        if unsafe { libc::poll(&mut p, 1, 50) } <= 0 {
            continue;
        }
        let _applying = GATE.write();
        // SAFETY: reading one uffd_msg (32 bytes) into a local buffer.
        let n = unsafe { libc::read(fd.as_raw_fd(), msg.as_mut_ptr().cast(), msg.len()) };
        if n != 32 {
            continue;
        }
        let u64_at = |i: usize| u64::from_ne_bytes(msg[i..i + 8].try_into().unwrap()) as usize;
        match msg[0] {
            EVENT_UNMAP | EVENT_REMOVE => {
                let (start, end) = (u64_at(8), u64_at(16));
                on_invalid(start, end.saturating_sub(start));
            }
            EVENT_REMAP => {
                let (from, len) = (u64_at(8), u64_at(24));
                on_invalid(from, len);
            }
            _ => {}
        }
    }
}

/// The process-wide monitor: a VMA can be registered with one userfaultfd only, so every
/// cache shares this one and subscribes to its events.
pub(crate) struct Shared {
    monitor: Monitor,
    subscribers: parking_lot::Mutex<Vec<(u64, OnInvalid)>>,
    next: std::sync::atomic::AtomicU64,
}

impl Shared {
    /// The monitor, started on first use; the reason when it cannot run here.
    pub(crate) fn get() -> std::result::Result<&'static Shared, String> {
        static GLOBAL: std::sync::OnceLock<std::result::Result<Shared, String>> =
            std::sync::OnceLock::new();
        GLOBAL
            .get_or_init(|| {
                let dispatch: OnInvalid = Arc::new(|start, len| {
                    if let Ok(shared) = Shared::get() {
                        let subs: Vec<OnInvalid> = shared
                            .subscribers
                            .lock()
                            .iter()
                            .map(|(_, f)| f.clone())
                            .collect();
                        for f in subs {
                            f(start, len);
                        }
                    }
                });
                Monitor::new(dispatch)
                    .map(|monitor| Shared {
                        monitor,
                        subscribers: parking_lot::Mutex::new(Vec::new()),
                        next: std::sync::atomic::AtomicU64::new(1),
                    })
                    .map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Adds a subscriber; returns its id for [`Shared::unsubscribe`].
    pub(crate) fn subscribe(&self, f: OnInvalid) -> u64 {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        self.subscribers.lock().push((id, f));
        id
    }

    pub(crate) fn unsubscribe(&self, id: u64) {
        self.subscribers.lock().retain(|(i, _)| *i != id);
    }

    /// Starts watching a range (idempotent for ranges already watched).
    pub(crate) fn watch(&self, start: usize, len: usize) -> Result<()> {
        self.monitor.watch(start, len)
    }
}
