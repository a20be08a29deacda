//! An rdma_cm_id with an event channel of its own: creating or adopting one, reading its
//! events (copied out, then acknowledged) with a deadline, and the QP attributes RDMA CM
//! computes for each transition.

use crate::qp::VerbsQp;
use crate::{Error, Result};
use rdmapool_sys as sys;
use std::ffi::CStr;
use std::net::SocketAddr;
use std::time::Instant;

fn lib() -> std::result::Result<&'static sys::Rdmacm, crate::VerbsError> {
    sys::rdmacm().map_err(|e| crate::VerbsError::Unavailable {
        what: "verbs (RDMA CM)",
        reason: e.to_string(),
    })
}

pub(super) fn cm_err(call: &'static str) -> Error {
    Error::last_os(call)
}

pub(super) fn sockaddr_of(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all-zero is a valid sockaddr_storage.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is large and aligned enough for a sockaddr_in.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is large and aligned enough for a sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// An event read from a channel, copied out before it is acknowledged.
pub(super) struct Event {
    pub(super) kind: u32,
    pub(super) status: i32,
    /// For CONNECT_REQUEST: the new connection's id.
    pub(super) new_id: *mut sys::rdma_cm_id,
    pub(super) private: Vec<u8>,
    /// For CONNECT_REQUEST: the READ/atomic depths the requester offers.
    pub(super) initiator_depth: u8,
    pub(super) responder_resources: u8,
}

/// An rdma_cm_id with an event channel of its own.
pub(super) struct CmId {
    pub(super) rc: &'static sys::Rdmacm,
    channel: *mut sys::rdma_event_channel,
    pub(super) id: *mut sys::rdma_cm_id,
}

// SAFETY: librdmacm ids and channels may be used from any thread; we never use one from two
// threads at once (each is owned by one object).
unsafe impl Send for CmId {}
// SAFETY: as above; shared references only read the raw handles.
unsafe impl Sync for CmId {}

fn new_channel(rc: &sys::Rdmacm) -> Result<*mut sys::rdma_event_channel> {
    // SAFETY: plain constructor.
    let ch = unsafe { (rc.rdma_create_event_channel)() };
    if ch.is_null() {
        return Err(cm_err("rdma_create_event_channel"));
    }
    // Non-blocking, so waiting can poll its fd with a timeout.
    // SAFETY: fcntl on the channel's own fd.
    unsafe {
        let fd = (*ch).fd;
        libc::fcntl(
            fd,
            libc::F_SETFL,
            libc::fcntl(fd, libc::F_GETFL) | libc::O_NONBLOCK,
        );
    }
    Ok(ch)
}

impl CmId {
    pub(super) fn new() -> Result<Self> {
        let rc = lib()?;
        let channel = new_channel(rc)?;
        let mut id = std::ptr::null_mut();
        // SAFETY: a live channel and an out-pointer.
        if unsafe { (rc.rdma_create_id)(channel, &mut id, std::ptr::null_mut(), sys::RDMA_PS_TCP) }
            != 0
        {
            let e = cm_err("rdma_create_id");
            // SAFETY: the channel we just made, unused.
            unsafe { (rc.rdma_destroy_event_channel)(channel) };
            return Err(e);
        }
        Ok(Self { rc, channel, id })
    }

    /// Takes over an id that arrived with a connection request, giving it its own channel.
    pub(super) fn adopt(rc: &'static sys::Rdmacm, id: *mut sys::rdma_cm_id) -> Result<Self> {
        let channel = new_channel(rc)?;
        // SAFETY: a live id from a CONNECT_REQUEST event (already acknowledged).
        if unsafe { (rc.rdma_migrate_id)(id, channel) } != 0 {
            let e = cm_err("rdma_migrate_id");
            // SAFETY: our unused channel, and the id nobody else owns.
            unsafe {
                (rc.rdma_destroy_id)(id);
                (rc.rdma_destroy_event_channel)(channel);
            }
            return Err(e);
        }
        Ok(Self { rc, channel, id })
    }

    fn fd(&self) -> i32 {
        // SAFETY: a live channel.
        unsafe { (*self.channel).fd }
    }

    /// The next event on this id's channel, or an error at `deadline`.
    pub(super) fn next_event(&self, deadline: Instant, what: &str) -> Result<Event> {
        loop {
            let mut ev = std::ptr::null_mut();
            // SAFETY: a live channel and an out-pointer.
            if unsafe { (self.rc.rdma_get_cm_event)(self.channel, &mut ev) } == 0 {
                // SAFETY: a live event until acknowledged below; private data is copied first.
                let out = unsafe {
                    let e = &*ev;
                    let conn = e.param.conn;
                    let private = if conn.private_data.is_null() {
                        Vec::new()
                    } else {
                        std::slice::from_raw_parts(
                            conn.private_data as *const u8,
                            conn.private_data_len as usize,
                        )
                        .to_vec()
                    };
                    Event {
                        kind: e.event,
                        status: e.status,
                        new_id: e.id,
                        private,
                        initiator_depth: conn.initiator_depth,
                        responder_resources: conn.responder_resources,
                    }
                };
                // SAFETY: acknowledging the event we got, once.
                unsafe { (self.rc.rdma_ack_cm_event)(ev) };
                return Ok(out);
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::WouldBlock {
                return Err(Error::Sys {
                    call: "rdma_get_cm_event",
                    source: err,
                });
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(Error::Connection {
                    peer: "RDMA CM".into(),
                    reason: format!("timed out waiting for {what}"),
                });
            }
            let mut p = libc::pollfd {
                fd: self.fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd.
            unsafe {
                libc::poll(
                    &mut p,
                    1,
                    left.as_millis().clamp(1, i32::MAX as u128) as i32,
                )
            };
        }
    }

    pub(super) fn event_name(&self, kind: u32) -> String {
        // SAFETY: rdma_event_str returns a static string for any value.
        unsafe { CStr::from_ptr((self.rc.rdma_event_str)(kind)) }
            .to_string_lossy()
            .into_owned()
    }

    /// Moves our QP to `state` with the attributes RDMA CM computes for this connection,
    /// except the READ/atomic depths, which are the negotiated ones (as librdmacm does for
    /// the QPs it manages): `responder` for RTR, `initiator` for RTS.
    pub(super) fn transition(&self, qp: &VerbsQp, state: u32, depths: (u8, u8)) -> Result<()> {
        // SAFETY: all-zero is a valid ibv_qp_attr.
        let mut attr: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        attr.qp_state = state;
        let mut mask = 0;
        // SAFETY: a live id (address and route resolved, or from a request) and out-pointers.
        if unsafe { (self.rc.rdma_init_qp_attr)(self.id, &mut attr, &mut mask) } != 0 {
            return Err(cm_err("rdma_init_qp_attr"));
        }
        let (initiator, responder) = depths;
        if state == sys::IBV_QPS_RTR {
            attr.max_dest_rd_atomic = responder;
        } else if state == sys::IBV_QPS_RTS {
            attr.max_rd_atomic = initiator;
        }
        qp.modify_raw(&mut attr, mask as u32)
    }

    /// The peer's address (RDMA CM's `rdma_get_peer_addr`), if the id has one of IPv4 or
    /// IPv6.
    pub(super) fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: a live id; its route's destination is a sockaddr whose family says which
        // member of the union is valid, and both members read here fit in the union.
        unsafe {
            let dst = &(*self.id).route.addr.__bindgen_anon_2;
            match i32::from(dst.dst_addr.sa_family) {
                libc::AF_INET => {
                    let sin = dst.dst_sin;
                    let ip = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                    Some(SocketAddr::new(ip.into(), u16::from_be(sin.sin_port)))
                }
                libc::AF_INET6 => {
                    let sin6 = dst.dst_sin6;
                    let ip = std::net::Ipv6Addr::from(sin6.sin6_addr.__in6_u.__u6_addr8);
                    Some(SocketAddr::new(ip.into(), u16::from_be(sin6.sin6_port)))
                }
                _ => None,
            }
        }
    }

    pub(super) fn device_name(&self) -> String {
        // SAFETY: a resolved id has a verbs context whose device name is a C string.
        unsafe {
            let ctx = (*self.id).verbs;
            if ctx.is_null() {
                return String::new();
            }
            let v = crate::lib().ok();
            v.map(|v| {
                CStr::from_ptr((v.ibv_get_device_name)((*ctx).device))
                    .to_string_lossy()
                    .into_owned()
            })
            .unwrap_or_default()
        }
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: every event we read was acknowledged; the QP is ours, not the id's.
        unsafe {
            (self.rc.rdma_destroy_id)(self.id);
            (self.rc.rdma_destroy_event_channel)(self.channel);
        }
    }
}
