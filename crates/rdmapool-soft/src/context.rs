//! One emulated NIC: its listeners, key table, QP registry and driver thread.

use super::addr::{self, SoftAddress};
use super::driver::Driver;
use super::keys::KeyTable;
use super::proto::handshake::TOKEN_LEN;
use super::proto::target::TargetQp;
use super::waker::Waker;
use super::SoftConfig;
use super::{device_info, MAX_MSG};
use crate::admission::Admission;
use crate::fabric::DeviceInfo;
use crate::SoftError;
use crate::Transport;
use crate::{Error, Result};
use parking_lot::{Mutex, RwLock};
use std::collections::HashMap;
use std::net::IpAddr;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// State shared by a context's objects and its serving loop.
pub(crate) struct CtxShared {
    pub(crate) keys: KeyTable,
    /// The context's QPs by number, as the responder sees them.
    pub(crate) qps: RwLock<HashMap<u32, Weak<dyn TargetQp>>>,
    /// The NIC's own thread for its requesters.
    pub(crate) driver: Arc<Driver>,
    /// Wakes the thread that serves its listeners and incoming connections.
    pub(crate) serving: Waker,
    pub(crate) address: SoftAddress,
    pub(crate) max_msg: u32,
    pub(crate) spin: Duration,
    /// The path this NIC's QPs take to their peers.
    pub(crate) transport: Transport,
    /// Who may connect, and how many.
    pub(crate) admission: Admission,
    /// Data connections open now, in total and per peer (user or address).
    connections: Mutex<Connections>,
    pub(crate) next_pd: AtomicU32,
    closing: AtomicBool,
}

impl CtxShared {
    /// A new QP number: unique in the process, not only in this context, as a NIC's are
    /// unique on the device (so a QP is named by device and number alone, e.g. in metrics).
    pub(crate) fn next_qpn(&self) -> u32 {
        static NEXT_QPN: AtomicU32 = AtomicU32::new(1);
        NEXT_QPN.fetch_add(1, Ordering::Relaxed)
    }
    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Relaxed)
    }

    /// Counts a new data connection from `peer`, or refuses it when a limit is reached. The
    /// slot is given back when the returned guard drops.
    pub(crate) fn admit(self: &Arc<Self>, peer: PeerKey) -> Option<ConnSlot> {
        let mut c = self.connections.lock();
        let a = &self.admission;
        let from_peer = c.per_peer.get(&peer).copied().unwrap_or(0);
        if c.total >= a.max_connections || from_peer >= a.max_connections_per_peer {
            return None;
        }
        c.total += 1;
        *c.per_peer.entry(peer).or_default() += 1;
        Some(ConnSlot {
            ctx: Arc::downgrade(self),
            peer,
        })
    }
}

/// Whose share of the connections a connection takes
/// ([`Admission::max_connections_per_peer`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum PeerKey {
    /// A user of this host (the local socket, or TCP from a socket of this host): users
    /// share this host's addresses, so each has a share of its own.
    User(u32),
    /// A peer elsewhere, by its address.
    Address(IpAddr),
    /// Neither is known.
    Unknown,
}

impl PeerKey {
    /// The key of a peer the acceptor described.
    pub(crate) fn of(peer: &super::peer::PeerInfo) -> Self {
        match (peer.uid, peer.ip) {
            (Some(uid), _) => Self::User(uid),
            (None, Some(ip)) => Self::Address(ip),
            (None, None) => Self::Unknown,
        }
    }
}

/// Data connections open now.
#[derive(Default)]
struct Connections {
    total: usize,
    per_peer: HashMap<PeerKey, usize>,
}

/// One admitted data connection; its slot is freed on drop.
pub(crate) struct ConnSlot {
    ctx: Weak<CtxShared>,
    peer: PeerKey,
}

impl Drop for ConnSlot {
    fn drop(&mut self) {
        if let Some(ctx) = self.ctx.upgrade() {
            let mut c = ctx.connections.lock();
            c.total -= 1;
            if let Some(n) = c.per_peer.get_mut(&self.peer) {
                *n -= 1;
                if *n == 0 {
                    c.per_peer.remove(&self.peer);
                }
            }
        }
    }
}

/// Says loudly that a NIC listening beyond loopback without a pre-shared key (started so by
/// the operator's choice) admits anyone who learns one of its QPs' endpoints: through
/// `tracing` for each such NIC, and on stderr once per process.
fn warn_if_exposed(addr: std::net::SocketAddr, admission: &Admission) {
    if admission.psk.is_none() && !addr.ip().is_loopback() {
        let msg = format!(
            "rdmapool: WARNING: the soft NIC listens on {addr} without a pre-shared key: its \
             connections are not authenticated beyond the endpoint exchange (anyone who sees an \
             endpoint can connect to that QP). Set RDMAPOOL_SOFT_PSK_FILE on every node."
        );
        tracing::warn!("{msg}");
        // On stderr once per process (a program opening several NICs would repeat it), and
        // never a panic: eprintln! panics when stderr cannot be written.
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            use std::io::Write;
            let _ = writeln!(std::io::stderr(), "{msg}");
        });
    }
}

/// One emulated NIC.
pub(crate) struct SoftContext {
    pub(crate) shared: Arc<CtxShared>,
    pub(crate) device: DeviceInfo,
    listeners: Vec<OwnedFd>,
}

impl SoftContext {
    /// Opens the NIC: its listeners are returned for the caller to serve (`serve::start`).
    pub(crate) fn open(cfg: SoftConfig) -> Result<(Self, TcpListener, UnixListener)> {
        crate::fabric::check_exposure(
            "soft NIC",
            cfg.bind,
            cfg.admission.psk.is_some(),
            cfg.admission.allow_unauthenticated,
            "Give every node the same pre-shared key: `head -c 32 /dev/urandom > /etc/rdmapool.key; \
             chmod 600 /etc/rdmapool.key`, then RDMAPOOL_SOFT_PSK_FILE=/etc/rdmapool.key \
             (Admission::psk).",
        )?;
        let tcp = TcpListener::bind(cfg.bind).map_err(|source| SoftError::Listen {
            addr: cfg.bind.to_string(),
            source,
        })?;
        let tcp_addr = tcp.local_addr().map_err(|e| Error::Sys {
            call: "getsockname",
            source: e,
        })?;
        // The local socket lives in the abstract namespace: no file to leave behind, whatever
        // way the process ends.
        let mut tag = [0u8; 8];
        let _ = getrandom::fill(&mut tag);
        let name = format!(
            "rdmapool-{}-{}",
            std::process::id(),
            crate::util::hex_encode(&tag)
        );
        let unix = SocketAddr::from_abstract_name(name.as_bytes())
            .and_then(|a| UnixListener::bind_addr(&a))
            .map_err(|source| SoftError::Listen {
                addr: format!("@{name}"),
                source,
            })?;
        warn_if_exposed(tcp_addr, &cfg.admission);
        let shared = Arc::new(CtxShared {
            keys: KeyTable::default(),
            qps: RwLock::new(HashMap::new()),
            address: SoftAddress {
                host_id: addr::host_id(),
                token: [0; TOKEN_LEN],
                tcp: tcp_addr,
                local: format!("@{name}"),
            },
            max_msg: MAX_MSG,
            spin: cfg.spin,
            transport: cfg.transport,
            admission: cfg.admission,
            connections: Mutex::new(Connections::default()),
            driver: Driver::start()?,
            serving: Waker::new()?,
            next_pd: AtomicU32::new(1),
            closing: AtomicBool::new(false),
        });
        let listeners = vec![
            tcp.try_clone()
                .map_err(|e| Error::Sys {
                    call: "dup",
                    source: e,
                })?
                .into(),
            unix.try_clone()
                .map_err(|e| Error::Sys {
                    call: "dup",
                    source: e,
                })?
                .into(),
        ];
        let ctx = Self {
            shared,
            device: device_info(tcp_addr),
            listeners,
        };
        Ok((ctx, tcp, unix))
    }
}

impl Drop for SoftContext {
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::Relaxed);
        self.shared.driver.stop();
        self.shared.serving.wake();
        for l in &self.listeners {
            // SAFETY: shutdown on a listening descriptor we own ends its accepting (the
            // serving loop drops it); the descriptor itself is closed when `listeners` drops.
            unsafe { libc::shutdown(l.as_raw_fd(), libc::SHUT_RDWR) };
        }
    }
}
