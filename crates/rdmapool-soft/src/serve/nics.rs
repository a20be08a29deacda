//! The NICs the process's serving loop serves: handing a NIC to the loop ([`start`], which
//! starts the loop with the first NIC of the process), and the loop's side of it: taking
//! new NICs, a NIC's waker (destroyed QPs, closing), closing a NIC, and the spin budget the
//! NICs set.

use super::super::context::CtxShared;
use super::super::waker::{epoll, EventFd};
use super::conn::End;
use super::{ctl, Loop, Phase, FIRST_CONN, IN, LOOP_WAKE, NIC_TOKEN, TCP, UNIX, WAKE};
use crate::util::spin::AdaptiveSpin;
use crate::{Error, Result};
use std::collections::{BinaryHeap, HashMap};
use std::net::TcpListener;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn nic_token(nic: u64, what: u64) -> u64 {
    NIC_TOKEN | nic << 2 | what
}

/// The process's serving loop, while it runs: its epoll set, its waker, and the NICs
/// handed to it that it has not taken yet.
pub(super) struct Running {
    epoll: Arc<OwnedFd>,
    wake: Arc<EventFd>,
    pending: Vec<Nic>,
    next_nic: u64,
    /// The process it runs in: a child forked without exec has none of its threads, and
    /// starts its own loop.
    pid: u32,
}

/// The loop of this process (`None` while no NIC is open).
static LOOP: parking_lot::Mutex<Option<Running>> = parking_lot::const_mutex(None);

/// Serves the context's listeners and every connection they bring, on the process's serving
/// loop (started now if no other NIC of the process runs one), until the context closes.
pub(crate) fn start(tcp: TcpListener, unix: UnixListener, ctx: &Arc<CtxShared>) -> Result<()> {
    let nonblocking = |r: std::io::Result<()>| {
        r.map_err(|e| Error::Sys {
            call: "fcntl",
            source: e,
        })
    };
    nonblocking(tcp.set_nonblocking(true))?;
    nonblocking(unix.set_nonblocking(true))?;
    let mut running = LOOP.lock();
    if running.as_ref().is_none_or(|r| r.pid != std::process::id()) {
        *running = Some(Loop::spawn()?);
    }
    let r = running.as_mut().expect("started above");
    let id = r.next_nic;
    // Registered here, from this thread (epoll_ctl on a shared set is safe): a failure is
    // this caller's error. Events that come before the loop took the NIC stay ready
    // (level-triggered) and are served once it has.
    let fds = [
        (ctx.serving.as_raw_fd(), WAKE),
        (tcp.as_raw_fd(), TCP),
        (unix.as_raw_fd(), UNIX),
    ];
    for (i, &(fd, what)) in fds.iter().enumerate() {
        if !ctl(&r.epoll, libc::EPOLL_CTL_ADD, fd, IN, nic_token(id, what)) {
            let e = Error::last_os("epoll_ctl");
            for &(fd, _) in &fds[..i] {
                ctl(&r.epoll, libc::EPOLL_CTL_DEL, fd, 0, 0);
            }
            return Err(e);
        }
    }
    r.next_nic += 1;
    r.pending.push(Nic {
        id,
        ctx: ctx.clone(),
        tcp: Some(tcp),
        unix: Some(unix),
        accept_paused_until: None,
    });
    r.wake.signal();
    Ok(())
}

/// One NIC the loop serves.
pub(super) struct Nic {
    pub(super) id: u64,
    pub(super) ctx: Arc<CtxShared>,
    pub(super) tcp: Option<TcpListener>,
    pub(super) unix: Option<UnixListener>,
    pub(super) accept_paused_until: Option<Instant>,
}

impl Loop {
    /// Starts the process's loop thread, serving no NIC yet.
    pub(super) fn spawn() -> Result<Running> {
        let epoll = Arc::new(epoll()?);
        let wake = Arc::new(EventFd::new()?);
        if !ctl(&epoll, libc::EPOLL_CTL_ADD, wake.as_raw_fd(), IN, LOOP_WAKE) {
            return Err(Error::last_os("epoll_ctl"));
        }
        let lp = Loop {
            epoll: epoll.clone(),
            wake: wake.clone(),
            nics: HashMap::new(),
            conns: HashMap::new(),
            next_token: FIRST_CONN,
            timers: BinaryHeap::new(),
            last_traffic: Instant::now(),
            by_qpn: HashMap::new(),
            spun_after: None,
            spin: AdaptiveSpin::new(Duration::ZERO),
            spin_max: Duration::ZERO,
            life: None,
        };
        // The life page is made and held on the loop's own thread (its death is what the
        // page tells): the first NIC's handshakes wait for it.
        let (held_tx, held_rx) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("rdmapool-soft-serve".into())
            .spawn(move || {
                let mut lp = lp;
                let life = crate::life::LifePage::hold();
                lp.life = life.as_ref().map(crate::life::LifePage::fd);
                let _ = held_tx.send(());
                lp.run();
                drop(life); // after the loop: peers see the process gone from now on
            })
            .map_err(|e| Error::Sys {
                call: "spawn",
                source: e,
            })?;
        let _ = held_rx.recv();
        Ok(Running {
            epoll,
            wake,
            pending: Vec::new(),
            next_nic: 0,
            pid: std::process::id(),
        })
    }

    /// Registers or re-registers a NIC's listeners (those still open) for `events`.
    pub(super) fn listeners(&self, nic: &Nic, op: libc::c_int, events: u32) -> bool {
        let tcp = nic.tcp.as_ref().map(|l| (l.as_raw_fd(), TCP));
        let unix = nic.unix.as_ref().map(|l| (l.as_raw_fd(), UNIX));
        [tcp, unix]
            .into_iter()
            .flatten()
            .all(|(fd, what)| self.ctl(op, fd, events, nic_token(nic.id, what)))
    }

    /// Takes the NICs handed to the loop since it last looked.
    pub(super) fn take_new_nics(&mut self) {
        let new = LOOP
            .lock()
            .as_mut()
            .map(|r| std::mem::take(&mut r.pending))
            .unwrap_or_default();
        for nic in new {
            self.nics.insert(nic.id, nic);
        }
        self.adapt_spin();
    }

    /// With no NIC left, ends the loop unless one was handed to it meanwhile (then taken).
    /// Whoever opens the next NIC starts a new loop.
    pub(super) fn may_end(&mut self) -> bool {
        let mut running = LOOP.lock();
        let handed = running.as_ref().is_some_and(|r| !r.pending.is_empty());
        if !handed {
            *running = None;
            return true;
        }
        drop(running);
        self.take_new_nics();
        false
    }

    /// The spin budget follows the longest `spin` of the NICs served.
    pub(super) fn adapt_spin(&mut self) {
        let max = self
            .nics
            .values()
            .map(|n| n.ctx.spin)
            .max()
            .unwrap_or_default();
        if max != self.spin_max {
            self.spin_max = max;
            self.spin = AdaptiveSpin::new(max);
        }
    }

    /// A NIC's waker: some of its QPs were destroyed (their connections close now), or it
    /// is closing.
    pub(super) fn nic_woken(&mut self, id: u64) {
        let Some(nic) = self.nics.get(&id) else {
            self.take_new_nics(); // its waker rang before the loop took it
            return;
        };
        let ctx = nic.ctx.clone();
        let gone = ctx.serving.take();
        if ctx.is_closing() {
            self.close_nic(id);
            return;
        }
        for qpn in gone {
            if let Some(token) = self.by_qpn.get(&(id, qpn)).copied() {
                self.close(token, End::Clean);
            }
        }
    }

    /// A NIC closes: its listeners and connections close (its QPs are being destroyed with
    /// it, so no peer-lost events), and its waker leaves the epoll set.
    pub(super) fn close_nic(&mut self, id: u64) {
        let Some(nic) = self.nics.remove(&id) else {
            return;
        };
        self.ctl(libc::EPOLL_CTL_DEL, nic.ctx.serving.as_raw_fd(), 0, 0);
        self.listeners(&nic, libc::EPOLL_CTL_DEL, 0);
        let tokens: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, e)| e.nic == id)
            .map(|(t, _)| *t)
            .collect();
        for token in tokens {
            if let Some(e) = self.conns.remove(&token) {
                self.ctl(libc::EPOLL_CTL_DEL, e.fd.as_raw_fd(), 0, 0);
                if let Phase::Serving(s) = &e.phase {
                    self.by_qpn.remove(&(id, s.qpn));
                }
            }
        }
        self.adapt_spin();
    }
}
