//! One emulated NIC: its listeners, key table, QP registry and driver thread.

use super::addr::{self, SoftAddress};
use super::driver::Driver;
use super::keys::KeyTable;
use super::proto::target::TargetQp;
use super::SoftConfig;
use super::{device_info, MAX_MSG};
use crate::fabric::{DeviceInfo, Transport};
use crate::{Error, Result};
use parking_lot::RwLock;
use std::collections::HashMap;
use std::net::TcpListener;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// State shared by a context's objects and its responder threads.
pub(crate) struct CtxShared {
    pub(crate) keys: KeyTable,
    /// The context's QPs by number, as the responder sees them.
    pub(crate) qps: RwLock<HashMap<u32, Weak<dyn TargetQp>>>,
    /// The NIC's own thread.
    pub(crate) driver: Arc<Driver>,
    pub(crate) address: SoftAddress,
    pub(crate) max_msg: u32,
    pub(crate) spin: Duration,
    /// The path this NIC's QPs take to their peers.
    pub(crate) transport: Transport,
    next_qpn: AtomicU32,
    pub(crate) next_pd: AtomicU32,
    closing: AtomicBool,
}

impl CtxShared {
    pub(crate) fn next_qpn(&self) -> u32 {
        self.next_qpn.fetch_add(1, Ordering::Relaxed)
    }
    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Relaxed)
    }
}

/// One emulated NIC.
pub(crate) struct SoftContext {
    pub(crate) shared: Arc<CtxShared>,
    pub(crate) device: DeviceInfo,
    listeners: Vec<OwnedFd>,
    socket_path: PathBuf,
}

impl SoftContext {
    /// Opens the NIC: its listeners are returned for the caller to serve (`serve::accept`).
    pub(crate) fn open(cfg: SoftConfig) -> Result<(Self, TcpListener, UnixListener)> {
        let tcp = TcpListener::bind(cfg.bind).map_err(|e| Error::Connection {
            peer: cfg.bind.to_string(),
            reason: format!("cannot listen: {e}"),
        })?;
        let tcp_addr = tcp.local_addr().map_err(|e| Error::Sys {
            call: "getsockname",
            source: e,
        })?;
        let mut tag = [0u8; 6];
        let _ = getrandom::fill(&mut tag);
        let socket_path = std::env::temp_dir().join(format!(
            "rdmapool-{}-{}.sock",
            std::process::id(),
            crate::util::hex_encode(&tag)
        ));
        let unix = UnixListener::bind(&socket_path).map_err(|e| Error::Connection {
            peer: socket_path.display().to_string(),
            reason: format!("cannot listen: {e}"),
        })?;
        let shared = Arc::new(CtxShared {
            keys: KeyTable::default(),
            qps: RwLock::new(HashMap::new()),
            address: SoftAddress {
                host_id: addr::host_id(),
                tcp: tcp_addr,
                local: socket_path.display().to_string(),
            },
            max_msg: MAX_MSG,
            spin: cfg.spin,
            transport: cfg.transport,
            driver: Driver::start()?,
            next_qpn: AtomicU32::new(1),
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
            socket_path,
        };
        Ok((ctx, tcp, unix))
    }
}

impl Drop for SoftContext {
    fn drop(&mut self) {
        self.shared.closing.store(true, Ordering::Relaxed);
        self.shared.driver.stop();
        for l in &self.listeners {
            // SAFETY: shutdown on a listening descriptor we own wakes its accept loop, which
            // then exits; the descriptor itself is closed when `listeners` drops.
            unsafe { libc::shutdown(l.as_raw_fd(), libc::SHUT_RDWR) };
        }
        let _ = std::fs::remove_file(&self.socket_path);
    }
}
