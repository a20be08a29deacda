//! RDMA CM (librdmacm) connection setup with user-managed QPs: the QP is ours (created on our
//! PD and CQs), RDMA CM resolves the address and route, carries private data both ways, and
//! tells us the QP attributes for each transition (`rdma_init_qp_attr`). Every connection
//! gets an event channel of its own, so its events are read from its own fd and never mixed
//! with another connection's.

mod id;

use super::qp::VerbsQp;
use crate::fabric::provider::{CmListenerOps, CmRequestOps, ConnectionManager};
use crate::fabric::{ConnectSpec, Cq, Pd, Qp, QpConfig};
use crate::{Error, Result};
use id::{cm_err, sockaddr_of, CmId, Event};
use rdmapool_sys as sys;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Keeps a connection's id alive with its QP; dropping it disconnects.
struct Established(CmId);

impl crate::fabric::ConnectionState for Established {
    /// RDMA CM events after establishment: DISCONNECTED is the peer's end (other events,
    /// such as TIMEWAIT_EXIT, are not for the application).
    fn wait_event(&self, timeout: Duration) -> Option<crate::fabric::QpEvent> {
        let deadline = Instant::now() + timeout;
        loop {
            let e = self.0.next_event(deadline, "a connection event").ok()?;
            if e.kind == sys::RDMA_CM_EVENT_DISCONNECTED {
                return Some(crate::fabric::QpEvent::PeerDisconnected);
            }
        }
    }
}

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

/// RDMA CM as the verbs provider's connection manager.
pub(crate) struct RdmaCm;

/// The verbs provider's connection manager.
pub(crate) static RDMA_CM: RdmaCm = RdmaCm;

impl ConnectionManager for RdmaCm {
    fn listen(&self, addr: SocketAddr) -> Result<Box<dyn CmListenerOps>> {
        Ok(Box::new(CmListener::bind(addr)?))
    }

    fn connect(&self, addr: SocketAddr, spec: &ConnectSpec<'_>) -> Result<(Qp, Vec<u8>)> {
        connect(addr, spec)
    }
}

/// A listening RDMA CM id.
struct CmListener {
    cm: CmId,
    addr: SocketAddr,
}

/// Connection requests RDMA CM queues for a listener before it drops more (the kernel
/// caps it at its `max_backlog`, 1024 by default): a burst of clients must not lose REQs
/// to a short queue (16 lost a third of a burst of 100 on rxe).
const LISTEN_BACKLOG: i32 = 1024;

impl CmListener {
    /// Listens on `addr` (an address of an RDMA device's netdev, or 0.0.0.0).
    fn bind(addr: SocketAddr) -> Result<Self> {
        let cm = CmId::new()?;
        let (mut ss, _) = sockaddr_of(addr);
        // SAFETY: a live id and a sockaddr of the right family.
        if unsafe { (cm.rc.rdma_bind_addr)(cm.id, (&mut ss as *mut libc::sockaddr_storage).cast()) }
            != 0
        {
            return Err(cm_err("rdma_bind_addr"));
        }
        // SAFETY: a bound id.
        if unsafe { (cm.rc.rdma_listen)(cm.id, LISTEN_BACKLOG) } != 0 {
            return Err(cm_err("rdma_listen"));
        }
        // SAFETY: a bound id; the port is in network order.
        let port = u16::from_be(unsafe { (cm.rc.rdma_get_src_port)(cm.id) });
        Ok(Self {
            cm,
            addr: SocketAddr::new(addr.ip(), port),
        })
    }
}

impl CmListenerOps for CmListener {
    fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    fn get_request(&self, timeout: Duration) -> Result<Box<dyn CmRequestOps>> {
        let deadline = Instant::now() + timeout;
        loop {
            let ev = self.cm.next_event(deadline, "a connection request")?;
            if ev.kind != sys::RDMA_CM_EVENT_CONNECT_REQUEST {
                tracing::debug!("listener ignored {}", self.cm.event_name(ev.kind));
                continue;
            }
            let cm = CmId::adopt(self.cm.rc, ev.new_id)?;
            match crate::fabric::private_data::decode_private_data(&ev.private) {
                Ok(private) => {
                    return Ok(Box::new(CmRequest {
                        private: private.to_vec(),
                        raw: ev.private,
                        initiator_depth: ev.initiator_depth,
                        responder_resources: ev.responder_resources,
                        cm,
                    }))
                }
                Err(e) => {
                    tracing::warn!("rejecting a connection request: {e}");
                    let why = crate::fabric::private_data::encode_private_data(
                        b"malformed private data",
                    )?;
                    // SAFETY: a live id from the request; the reason lives for the call.
                    unsafe { (cm.rc.rdma_reject)(cm.id, why.as_ptr().cast(), why.len() as u8) };
                    return Err(e);
                }
            }
        }
    }
}

/// A connection request waiting for an answer.
struct CmRequest {
    cm: CmId,
    private: Vec<u8>,
    raw: Vec<u8>,
    initiator_depth: u8,
    responder_resources: u8,
}

impl CmRequestOps for CmRequest {
    fn private_data(&self) -> &[u8] {
        &self.private
    }

    fn raw_private_data(&self) -> &[u8] {
        &self.raw
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        self.cm.peer_addr()
    }

    fn accept(
        self: Box<Self>,
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
        let framed = crate::fabric::private_data::encode_private_data(private)?;
        let mut param = conn_param(&framed, qp.qpn(), initiator, responder);
        self.cm.transition(vq, sys::IBV_QPS_INIT, depths)?;
        self.cm.transition(vq, sys::IBV_QPS_RTR, depths)?;
        // RTS before the REP goes out, as librdmacm does for the QPs it manages: a peer may
        // use the connection and disconnect as soon as it has our REP, and once its DREQ is
        // in, RDMA CM no longer computes RTS attributes for this id (EINVAL; seen on rxe).
        self.cm.transition(vq, sys::IBV_QPS_RTS, depths)?;
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
        Ok(qp.with_connection(Box::new(Established(self.cm))))
    }

    fn reject(self: Box<Self>, private: &[u8]) -> Result<()> {
        let framed = crate::fabric::private_data::encode_private_data(private)?;
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
fn connect(addr: SocketAddr, spec: &ConnectSpec<'_>) -> Result<(Qp, Vec<u8>)> {
    let ConnectSpec {
        pd,
        send_cq,
        recv_cq,
        qp: cfg,
        private_data: private,
        timeout,
    } = *spec;
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
    let framed = crate::fabric::private_data::encode_private_data(private)?;
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
            private_data: crate::fabric::private_data::decode_private_data(&ev.private)
                .map(<[u8]>::to_vec)
                .unwrap_or(ev.private),
        }),
        _ => Err(unreachable(&cm, &ev, "connecting")),
    }
}
