//! RDMA CM (librdmacm) connection setup with user-managed QPs: the QP is ours (created on our
//! PD and CQs), RDMA CM resolves the address and route, carries private data both ways, and
//! tells us the QP attributes for each transition (`rdma_init_qp_attr`). Every connection
//! gets an event channel of its own, so its events are read from its own fd and never mixed
//! with another connection's.

use super::qp::VerbsQp;
use crate::fabric::{Cq, Pd, Qp, QpConfig};
use crate::{Error, Result};
use rdmapool_sys as sys;
use std::ffi::CStr;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

fn lib() -> Result<&'static sys::Rdmacm> {
    sys::rdmacm().map_err(|e| Error::ProviderUnavailable {
        provider: "verbs (RDMA CM)".into(),
        reason: e.to_string(),
    })
}

fn cm_err(call: &'static str) -> Error {
    Error::last_os(call)
}

fn sockaddr_of(addr: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
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
struct Event {
    kind: u32,
    status: i32,
    /// For CONNECT_REQUEST: the new connection's id.
    new_id: *mut sys::rdma_cm_id,
    private: Vec<u8>,
    /// For CONNECT_REQUEST: the READ/atomic depths the requester offers.
    initiator_depth: u8,
    responder_resources: u8,
}

/// An rdma_cm_id with an event channel of its own.
struct CmId {
    rc: &'static sys::Rdmacm,
    channel: *mut sys::rdma_event_channel,
    id: *mut sys::rdma_cm_id,
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
    fn new() -> Result<Self> {
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
    fn adopt(rc: &'static sys::Rdmacm, id: *mut sys::rdma_cm_id) -> Result<Self> {
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
    fn next_event(&self, deadline: Instant, what: &str) -> Result<Event> {
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

    fn event_name(&self, kind: u32) -> String {
        // SAFETY: rdma_event_str returns a static string for any value.
        unsafe { CStr::from_ptr((self.rc.rdma_event_str)(kind)) }
            .to_string_lossy()
            .into_owned()
    }

    /// Moves our QP to `state` with the attributes RDMA CM computes for this connection,
    /// except the READ/atomic depths, which are the negotiated ones (as librdmacm does for
    /// the QPs it manages): `responder` for RTR, `initiator` for RTS.
    fn transition(&self, qp: &VerbsQp, state: u32, depths: (u8, u8)) -> Result<()> {
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

    fn device_name(&self) -> String {
        // SAFETY: a resolved id has a verbs context whose device name is a C string.
        unsafe {
            let ctx = (*self.id).verbs;
            if ctx.is_null() {
                return String::new();
            }
            let v = super::lib().ok();
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

/// Keeps a connection's id alive with its QP; dropping it disconnects.
struct Established(CmId);

impl Drop for Established {
    fn drop(&mut self) {
        // SAFETY: a connected id; disconnecting twice or after the peer did is harmless.
        unsafe { (self.0.rc.rdma_disconnect)(self.0.id) };
    }
}

/// Connection parameters: framed private data, and the READ/atomic depths this side offers
/// (`initiator_depth`: READs/atomics it will have outstanding; `responder_resources`: how
/// many of the peer's it accepts).
fn conn_param(
    private: &[u8],
    qpn: u32,
    initiator_depth: u8,
    responder_resources: u8,
) -> sys::rdma_conn_param {
    // SAFETY: all-zero is a valid rdma_conn_param.
    let mut p: sys::rdma_conn_param = unsafe { std::mem::zeroed() };
    p.private_data = private.as_ptr().cast();
    p.private_data_len = private.len() as u8;
    p.responder_resources = responder_resources;
    p.initiator_depth = initiator_depth;
    p.retry_count = 7;
    p.rnr_retry_count = 7;
    p.qp_num = qpn;
    p
}

fn verbs_qp(qp: &Qp) -> Result<&VerbsQp> {
    qp.provider_qp()
        .downcast_ref::<VerbsQp>()
        .ok_or_else(|| Error::Mismatch("RDMA CM connections need a verbs PD".into()))
}

fn check_device(id: &CmId, pd: &Pd) -> Result<()> {
    let (cm_dev, ours) = (id.device_name(), pd.device_name());
    if cm_dev != ours {
        return Err(Error::Mismatch(format!(
            "RDMA CM routed this connection through device {cm_dev:?}, but the PD is on {ours:?}"
        )));
    }
    Ok(())
}

/// A listening RDMA CM id.
pub(crate) struct CmListener {
    cm: CmId,
    addr: SocketAddr,
}

impl CmListener {
    pub(crate) fn bind(addr: SocketAddr) -> Result<Self> {
        let cm = CmId::new()?;
        let (mut ss, _) = sockaddr_of(addr);
        // SAFETY: a live id and a sockaddr of the right family.
        if unsafe { (cm.rc.rdma_bind_addr)(cm.id, (&mut ss as *mut libc::sockaddr_storage).cast()) }
            != 0
        {
            return Err(cm_err("rdma_bind_addr"));
        }
        // SAFETY: a bound id.
        if unsafe { (cm.rc.rdma_listen)(cm.id, 16) } != 0 {
            return Err(cm_err("rdma_listen"));
        }
        // SAFETY: a bound id; the port is in network order.
        let port = u16::from_be(unsafe { (cm.rc.rdma_get_src_port)(cm.id) });
        Ok(Self {
            cm,
            addr: SocketAddr::new(addr.ip(), port),
        })
    }

    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub(crate) fn get_request(&self, timeout: Duration) -> Result<CmRequest> {
        let deadline = Instant::now() + timeout;
        loop {
            let ev = self.cm.next_event(deadline, "a connection request")?;
            if ev.kind != sys::RDMA_CM_EVENT_CONNECT_REQUEST {
                tracing::debug!("listener ignored {}", self.cm.event_name(ev.kind));
                continue;
            }
            let cm = CmId::adopt(self.cm.rc, ev.new_id)?;
            match crate::conn::decode_private_data(&ev.private) {
                Ok(private) => {
                    return Ok(CmRequest {
                        private: private.to_vec(),
                        raw: ev.private,
                        initiator_depth: ev.initiator_depth,
                        responder_resources: ev.responder_resources,
                        cm,
                    })
                }
                Err(e) => {
                    tracing::warn!("rejecting a connection request: {e}");
                    let why = crate::conn::encode_private_data(b"malformed private data")?;
                    // SAFETY: a live id from the request; the reason lives for the call.
                    unsafe { (cm.rc.rdma_reject)(cm.id, why.as_ptr().cast(), why.len() as u8) };
                    return Err(e);
                }
            }
        }
    }
}

/// A connection request waiting for an answer.
pub(crate) struct CmRequest {
    cm: CmId,
    private: Vec<u8>,
    raw: Vec<u8>,
    initiator_depth: u8,
    responder_resources: u8,
}

impl CmRequest {
    pub(crate) fn private_data(&self) -> &[u8] {
        &self.private
    }

    pub(crate) fn raw_private_data(&self) -> &[u8] {
        &self.raw
    }

    pub(crate) fn accept(
        self,
        pd: &Pd,
        send_cq: &Cq,
        recv_cq: &Cq,
        cfg: &QpConfig,
        private: &[u8],
        timeout: Duration,
    ) -> Result<Qp> {
        check_device(&self.cm, pd)?;
        let qp = pd.create_qp(send_cq, recv_cq, cfg)?;
        let vq = verbs_qp(&qp)?;
        // Negotiated from the request, bounded by this QP (and so the device): we accept no
        // more of the peer's READs than it will send, and send no more than it accepts.
        let ours = vq.rd_atomic();
        let responder = self.initiator_depth.min(ours);
        let initiator = self.responder_resources.min(ours);
        let depths = (initiator, responder);
        let framed = crate::conn::encode_private_data(private)?;
        let mut param = conn_param(&framed, qp.qpn(), initiator, responder);
        self.cm.transition(vq, sys::IBV_QPS_INIT, depths)?;
        self.cm.transition(vq, sys::IBV_QPS_RTR, depths)?;
        // SAFETY: a live id from the request; the parameters point into `framed`, alive here.
        if unsafe { (self.cm.rc.rdma_accept)(self.cm.id, &mut param) } != 0 {
            return Err(cm_err("rdma_accept"));
        }
        let ev = self
            .cm
            .next_event(Instant::now() + timeout, "the connection to be established")?;
        if ev.kind != sys::RDMA_CM_EVENT_ESTABLISHED {
            return Err(Error::Connection {
                peer: "RDMA CM".into(),
                reason: format!(
                    "expected ESTABLISHED, got {} (status {})",
                    self.cm.event_name(ev.kind),
                    ev.status
                ),
            });
        }
        self.cm.transition(vq, sys::IBV_QPS_RTS, depths)?;
        Ok(qp.with_connection(Box::new(Established(self.cm))))
    }

    pub(crate) fn reject(self, private: &[u8]) -> Result<()> {
        let framed = crate::conn::encode_private_data(private)?;
        // SAFETY: a live id from the request; the data lives for the call.
        if unsafe {
            (self.cm.rc.rdma_reject)(self.cm.id, framed.as_ptr().cast(), framed.len() as u8)
        } != 0
        {
            return Err(cm_err("rdma_reject"));
        }
        Ok(())
    }
}

/// Connects to an RDMA CM listener; returns the QP (RTS) and the acceptor's private data as
/// it arrived (framed and padded).
pub(crate) fn connect(
    addr: SocketAddr,
    pd: &Pd,
    send_cq: &Cq,
    recv_cq: &Cq,
    cfg: &QpConfig,
    private: &[u8],
    timeout: Duration,
) -> Result<(Qp, Vec<u8>)> {
    let deadline = Instant::now() + timeout;
    let cm = CmId::new()?;
    let ms = timeout.as_millis().clamp(1, i32::MAX as u128) as i32;
    let (mut dst, _) = sockaddr_of(addr);
    let unreachable = |cm: &CmId, ev: &Event, step: &str| Error::Connection {
        peer: addr.to_string(),
        reason: format!("{step}: {} (status {})", cm.event_name(ev.kind), ev.status),
    };
    // SAFETY: a live id and a destination sockaddr.
    if unsafe {
        (cm.rc.rdma_resolve_addr)(
            cm.id,
            std::ptr::null_mut(),
            (&mut dst as *mut libc::sockaddr_storage).cast(),
            ms,
        )
    } != 0
    {
        return Err(cm_err("rdma_resolve_addr"));
    }
    let ev = cm.next_event(deadline, "address resolution")?;
    if ev.kind != sys::RDMA_CM_EVENT_ADDR_RESOLVED {
        return Err(unreachable(&cm, &ev, "resolving the address"));
    }
    // SAFETY: an id with a resolved address.
    if unsafe { (cm.rc.rdma_resolve_route)(cm.id, ms) } != 0 {
        return Err(cm_err("rdma_resolve_route"));
    }
    let ev = cm.next_event(deadline, "route resolution")?;
    if ev.kind != sys::RDMA_CM_EVENT_ROUTE_RESOLVED {
        return Err(unreachable(&cm, &ev, "resolving the route"));
    }
    check_device(&cm, pd)?;
    let qp = pd.create_qp(send_cq, recv_cq, cfg)?;
    let vq = verbs_qp(&qp)?;
    let depth = vq.rd_atomic();
    cm.transition(vq, sys::IBV_QPS_INIT, (depth, depth))?;
    let framed = crate::conn::encode_private_data(private)?;
    let mut param = conn_param(&framed, qp.qpn(), depth, depth);
    // SAFETY: a routed id; the parameters point into `framed`, alive here.
    if unsafe { (cm.rc.rdma_connect)(cm.id, &mut param) } != 0 {
        return Err(cm_err("rdma_connect"));
    }
    let ev = cm.next_event(deadline, "the peer's answer")?;
    match ev.kind {
        sys::RDMA_CM_EVENT_CONNECT_RESPONSE => {
            // The acceptor answered with what it accepts of ours (responder resources) and
            // what it will send (initiator depth); never above what we offered.
            let depths = (
                ev.responder_resources.min(depth),
                ev.initiator_depth.min(depth),
            );
            let theirs = ev.private;
            cm.transition(vq, sys::IBV_QPS_RTR, depths)?;
            cm.transition(vq, sys::IBV_QPS_RTS, depths)?;
            // SAFETY: a connected id whose QP is now in RTS.
            if unsafe { (cm.rc.rdma_establish)(cm.id) } != 0 {
                return Err(cm_err("rdma_establish"));
            }
            Ok((qp.with_connection(Box::new(Established(cm))), theirs))
        }
        sys::RDMA_CM_EVENT_REJECTED => Err(Error::Rejected {
            peer: addr.to_string(),
            private_data: crate::conn::decode_private_data(&ev.private)
                .map(<[u8]>::to_vec)
                .unwrap_or(ev.private),
        }),
        _ => Err(unreachable(&cm, &ev, "connecting")),
    }
}
