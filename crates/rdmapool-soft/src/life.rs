//! The process's life page: how a peer on this host learns that this process died, with one
//! load per operation and no window (docs/PROTOCOL.md section 6.3).
//!
//! A dead process's memory stays mapped in its intra-host peers: a WRITE executed on it
//! after the death "succeeds" and is lost. Probing the socket costs a system call, so it
//! runs once per clock tick, and operations posted in between went through (issue #40
//! measured 2.4 ms). What tells without a system call is a word the kernel itself writes
//! when the process dies: a **robust futex**. The serving loop's thread creates one page,
//! initialises a process-shared robust mutex at its start and holds it for as long as the
//! thread lives. When the thread ends, whether the process exits, is killed (`kill -9`) or
//! the loop stops with the last NIC, the kernel (or the thread's own exit, [`LifePage`]'s
//! drop) sets `FUTEX_OWNER_DIED` in the word, or clears the owner's thread id. The kernel
//! does so in the dying thread's exit path before it closes the process's descriptors, so
//! by the time anyone can see the death (a socket's hang-up, `waitpid`), the word says it.
//!
//! Peers get a read-only view of the page: it is sealed against new writable mappings
//! (`F_SEAL_FUTURE_WRITE`), so a peer can neither forge a death nor touch the mutex's list
//! pointers, which the kernel follows at exit.
//!
//! The futex word's place in the mutex is the C library's; the page is made only where it
//! checks out (after locking, the word holds the thread's id), and otherwise the process
//! sends no life page and its peers fall back to the periodic probe.

use crate::{Error, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, Ordering};

/// The kernel's mark of a robust futex whose owner died (`linux/futex.h`).
const FUTEX_OWNER_DIED: u32 = 0x4000_0000;
/// The owner's thread id in a robust futex word.
const FUTEX_TID_MASK: u32 = 0x3fff_ffff;

/// Whether a life word says its process is gone: the owner died, or the mutex is no longer
/// held (the loop's thread ended normally and released it).
#[inline]
pub(crate) fn word_says_dead(word: u32) -> bool {
    word & FUTEX_OWNER_DIED != 0 || word & FUTEX_TID_MASK == 0
}

/// One shared page, mapped at `ptr`.
struct Page {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: the page is plain shared memory read through atomics (or, by its owner, through the
// C library's mutex calls on the owning thread only); the handle may move between threads.
unsafe impl Send for Page {}
// SAFETY: as above: shared access is only by atomic loads.
unsafe impl Sync for Page {}

impl Page {
    fn map(fd: RawFd, len: usize, prot: libc::c_int) -> Result<Self> {
        // SAFETY: mapping a descriptor the caller holds, with the length it has; the kernel
        // picks the address.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED, fd, 0) };
        if ptr == libc::MAP_FAILED {
            return Err(Error::last_os("mmap"));
        }
        Ok(Self {
            ptr: ptr.cast(),
            len,
        })
    }

    /// The futex word at the page's start.
    fn word(&self) -> &AtomicU32 {
        // SAFETY: the page is mapped, page-aligned and at least 4 bytes long for as long as
        // `self` lives.
        unsafe { &*(self.ptr as *const AtomicU32) }
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `map` mapped; no borrow of it outlives `self`.
        unsafe { libc::munmap(self.ptr.cast(), self.len) };
    }
}

/// This process's life page, held by the thread that made it (the serving loop's) until it
/// is dropped on that thread.
pub(crate) struct LifePage {
    page: Page,
    fd: OwnedFd,
    /// Made and held on one thread, released on it: not `Send`.
    _owner: std::marker::PhantomData<*const ()>,
}

impl LifePage {
    /// Makes the page and holds its mutex from the calling thread; `None` where the system
    /// does not support it (no sealing, or a C library whose mutex does not keep the
    /// owner's thread id in its first word): peers then probe instead.
    pub(crate) fn hold() -> Option<Self> {
        match Self::try_hold() {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::debug!("no life page ({e}): local peers will probe the socket");
                None
            }
        }
    }

    fn try_hold() -> Result<Self> {
        let len = crate::util::page_size();
        // SAFETY: a valid NUL-terminated name and valid flags.
        let raw = unsafe {
            libc::memfd_create(
                c"rdmapool-life".as_ptr(),
                libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
            )
        };
        if raw < 0 {
            return Err(Error::last_os("memfd_create"));
        }
        // SAFETY: memfd_create returned a fresh descriptor that we now own.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate on our own descriptor.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) } != 0 {
            return Err(Error::last_os("ftruncate"));
        }
        let page = Page::map(fd.as_raw_fd(), len, libc::PROT_READ | libc::PROT_WRITE)?;
        // Our own mapping stays writable; nobody can map it writable from now on.
        let seals =
            libc::F_SEAL_FUTURE_WRITE | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: fcntl on our own descriptor with valid seals.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(Error::last_os("fcntl(F_ADD_SEALS)"));
        }
        let mutex = page.ptr.cast::<libc::pthread_mutex_t>();
        debug_assert!(std::mem::size_of::<libc::pthread_mutex_t>() <= len);
        // SAFETY: `attr` is initialised by pthread_mutexattr_init before any other use and
        // destroyed after the mutex is made; `mutex` points to zeroed, page-aligned shared
        // memory of this process, large enough, that nothing else uses yet.
        unsafe {
            let mut attr: libc::pthread_mutexattr_t = std::mem::zeroed();
            if libc::pthread_mutexattr_init(&mut attr) != 0 {
                return Err(Error::last_os("pthread_mutexattr_init"));
            }
            let set = libc::pthread_mutexattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED)
                == 0
                && libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST) == 0
                && libc::pthread_mutex_init(mutex, &attr) == 0;
            libc::pthread_mutexattr_destroy(&mut attr);
            if !set {
                return Err(Error::Malformed {
                    what: "life page",
                    reason: "no process-shared robust mutex".into(),
                });
            }
            if libc::pthread_mutex_lock(mutex) != 0 {
                return Err(Error::last_os("pthread_mutex_lock"));
            }
        }
        let held = Self {
            page,
            fd,
            _owner: std::marker::PhantomData,
        };
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        let word = held.page.word().load(Ordering::Acquire);
        if word & FUTEX_TID_MASK != tid & FUTEX_TID_MASK {
            // Dropping `held` unlocks the mutex again on this thread.
            return Err(Error::Malformed {
                what: "life page",
                reason: format!("the mutex's first word is {word:#x}, not the owner {tid}"),
            });
        }
        Ok(held)
    }

    /// The descriptor to hand to a peer on this host (it can map it read-only only).
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

impl Drop for LifePage {
    /// The holder is done (the loop ends): release the mutex, which takes it off this
    /// thread's robust list (the kernel must not follow the list into an unmapped page) and
    /// clears the owner in the word, so peers see the process gone.
    fn drop(&mut self) {
        // SAFETY: the mutex was initialised and locked by this thread (a LifePage is not
        // Send, so it is dropped on the thread that made it).
        unsafe { libc::pthread_mutex_unlock(self.page.ptr.cast()) };
        self.page
            .word()
            .fetch_or(FUTEX_OWNER_DIED, Ordering::Release);
    }
}

/// A peer's life page, mapped read-only: whether the process behind it is gone.
pub(crate) struct PeerLife {
    page: Page,
}

impl PeerLife {
    /// Maps a life page a peer sent; it must be one page and the word must say the peer is
    /// alive now.
    pub(crate) fn from_fd(fd: OwnedFd) -> Result<Self> {
        let len = crate::util::page_size();
        // SAFETY: fstat writes into the struct we own, for a descriptor we own.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(Error::last_os("fstat"));
        }
        if st.st_size as usize != len {
            return Err(Error::Malformed {
                what: "life page",
                reason: format!("{} bytes, not one page", st.st_size),
            });
        }
        let page = Page::map(fd.as_raw_fd(), len, libc::PROT_READ)?;
        Ok(Self { page })
    }

    /// Whether the peer process is gone (one load).
    #[inline]
    pub(crate) fn is_dead(&self) -> bool {
        word_says_dead(self.page.word().load(Ordering::Acquire))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_word_says_dead_when_the_owner_died_or_let_go() {
        assert!(!word_says_dead(1234));
        assert!(word_says_dead(1234 | FUTEX_OWNER_DIED));
        assert!(word_says_dead(0));
        assert!(word_says_dead(FUTEX_OWNER_DIED));
    }

    #[test]
    fn a_peer_sees_the_holder_alive_then_gone_when_its_thread_ends() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let holder = std::thread::spawn(move || {
            let page = LifePage::hold().expect("a life page on Linux with glibc");
            // SAFETY: duplicating a descriptor we hold.
            let dup = unsafe { libc::dup(page.fd()) };
            assert!(dup >= 0);
            // SAFETY: dup returned a fresh descriptor that we hand over.
            tx.send(unsafe { OwnedFd::from_raw_fd(dup) }).unwrap();
            stop_rx.recv().unwrap();
            drop(page);
        });
        let fd = rx.recv().unwrap();
        // The seal: no writable mapping for a peer.
        // SAFETY: a probe mapping of a descriptor we own; unmapped at once if it succeeds.
        let w = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                crate::util::page_size(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        assert_eq!(
            w,
            libc::MAP_FAILED,
            "a peer could map the life page writable"
        );
        let peer = PeerLife::from_fd(fd).unwrap();
        assert!(!peer.is_dead(), "the holder is alive");
        stop_tx.send(()).unwrap();
        holder.join().unwrap();
        assert!(peer.is_dead(), "the holder's thread ended");
    }

    #[test]
    fn a_thread_that_dies_holding_the_page_is_seen_dead_by_the_kernel_s_mark() {
        // The page leaks out of its thread (forgotten, never dropped): the thread's exit
        // alone, through the robust list, must mark the word.
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let page = LifePage::hold().unwrap();
            // SAFETY: duplicating a descriptor we hold.
            let dup = unsafe { libc::dup(page.fd()) };
            // SAFETY: dup returned a fresh descriptor that we hand over.
            tx.send(unsafe { OwnedFd::from_raw_fd(dup) }).unwrap();
            std::mem::forget(page); // stays mapped and locked: as at a kill
        })
        .join()
        .unwrap();
        let peer = PeerLife::from_fd(rx.recv().unwrap()).unwrap();
        assert!(peer.is_dead(), "the thread's exit did not mark the futex");
    }
}

#[cfg(test)]
mod process_tests {
    use super::*;
    use std::os::unix::net::{UnixListener, UnixStream};

    /// The child's side of the test below (this test binary run again): holds a life page
    /// on a thread of its own, sends its descriptor to the socket the parent named, and
    /// waits to be killed. An ordinary run does nothing.
    #[test]
    fn life_child_entry() {
        let Ok(path) = std::env::var("RDMAPOOL_SOFT_LIFE_CHILD") else {
            return;
        };
        let to_parent = UnixStream::connect(path).unwrap();
        // Held on a thread that is not the main one, as the serving loop's is.
        std::thread::spawn(move || {
            let page = LifePage::hold().expect("a life page");
            crate::shm::send_with_fds_nowait(to_parent.as_raw_fd(), &[1u8], &[page.fd()]).unwrap();
            loop {
                std::thread::sleep(std::time::Duration::from_secs(1));
            }
        })
        .join()
        .unwrap();
    }

    /// A process killed (SIGKILL) while a thread of it holds a life page: the page says
    /// dead by the time `waitpid` returns.
    #[test]
    fn a_killed_process_is_seen_dead_once_it_was_reaped() {
        let dir = std::env::temp_dir().join(format!("rdmapool-life-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sock");
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path).unwrap();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "life::process_tests::life_child_entry",
                "--nocapture",
            ])
            .env("RDMAPOOL_SOFT_LIFE_CHILD", &path)
            .spawn()
            .unwrap();
        let (from_child, _) = listener.accept().unwrap();
        let mut one = [0u8; 1];
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let fds = crate::shm::recv_with_fds(from_child.as_raw_fd(), &mut one, deadline).unwrap();
        let peer = PeerLife::from_fd(fds.into_iter().next().unwrap()).unwrap();
        assert!(!peer.is_dead(), "alive");
        child.kill().unwrap();
        child.wait().unwrap();
        assert!(peer.is_dead(), "reaped, and the page does not say so");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
