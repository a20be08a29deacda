//! The two-sided baseline: a server thread that allocates on request over SEND/RECV, and
//! its clients.

use super::*;
use crate::device_args::DeviceArgs;
use crate::{Result, ToolError};
use rdmapool::conn::{self, Listener, Manager};
use std::collections::VecDeque;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The two-sided baseline's server: one thread, a free list, SEND/RECV.
pub(super) struct TwoSidedServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Result<()>>>,
}

pub(super) const MSG: usize = 16;
pub(super) const OP_ALLOC: u64 = 1;
pub(super) const OP_FREE: u64 = 2;
/// Receives kept posted per connection.
pub(super) const RECVS: usize = 2;
pub(super) const MAX_CONNS: usize = 256;
/// How long the baseline server spins on an empty CQ before sleeping on its channel.
pub(super) const SERVER_SPIN: Duration = Duration::from_micros(50);

impl TwoSidedServer {
    pub(super) fn start(
        device: &DeviceArgs,
        transport: Transport,
        ip: IpAddr,
        size: usize,
        object: u64,
    ) -> Result<Self> {
        let ctx = device.open(transport)?;
        let pd = ctx.alloc_pd()?;
        let listener = Listener::bind(Manager::from(&pd), SocketAddr::new(ip, 0))?;
        let addr = listener.local_addr();
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let objects = (size as u64 / object.max(1)) as usize;
        let thread = std::thread::Builder::new()
            .name("two-sided-server".into())
            .spawn(move || serve_two_sided(ctx, pd, listener, s, objects, object))
            .map_err(|e| ToolError::Io("spawn".into(), e))?;
        Ok(Self {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    pub(super) fn stop(mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            match t.join() {
                Ok(Err(e)) => crate::errln!("two-sided server: {e}"),
                Err(_) => crate::errln!("two-sided server panicked"),
                Ok(Ok(())) => {}
            }
        }
    }
}

/// The baseline server's loop: accepts connections (between polls) and answers requests.
pub(super) fn serve_two_sided(
    ctx: Context,
    pd: Pd,
    listener: Listener,
    stop: Arc<AtomicBool>,
    objects: usize,
    object: u64,
) -> Result<()> {
    let cq = ctx.create_cq(8192)?;
    let recv = pd.alloc_mr(MAX_CONNS * RECVS * MSG, AccessFlags::LOCAL_WRITE)?;
    let send = pd.alloc_mr(MAX_CONNS * MSG, AccessFlags::LOCAL_WRITE)?;
    let mut free: Vec<u64> = (0..objects as u64).rev().collect();
    let mut allocated = vec![false; objects];
    let mut qps: Vec<Qp> = Vec::new();
    let post_recv = |qp: &Qp, slot: usize| -> Result<()> {
        let sge = recv.sge(slot * MSG, MSG as u32)?;
        qp.post_recv(&[RecvWr {
            wr_id: slot as u64,
            sg_list: &[sge],
        }])?;
        Ok(())
    };
    // Accept on a thread of its own so that the serving loop only polls.
    let (tx, rx) = std::sync::mpsc::channel::<rdmapool::conn::ConnRequest>();
    let s = stop.clone();
    let acceptor = std::thread::spawn(move || {
        while !s.load(Ordering::SeqCst) {
            match listener.get_request(Duration::from_millis(50)) {
                Ok(r) => {
                    if tx.send(r).is_err() {
                        return;
                    }
                }
                Err(_) => continue,
            }
        }
    });
    let mut buf = [Completion::EMPTY; 32];
    let mut req = [0u8; MSG];
    let mut idle_since: Option<Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        while let Ok(r) = rx.try_recv() {
            if qps.len() == MAX_CONNS {
                let _ = r.reject(b"full");
                continue;
            }
            let qp = r.accept(&pd, &cq, &cq, &QpConfig::default(), b"ok")?;
            let i = qps.len();
            for k in 0..RECVS {
                post_recv(&qp, i * RECVS + k)?;
            }
            qps.push(qp);
        }
        let mut n = cq.poll(&mut buf)?;
        if n == 0 {
            // Spin a while, then sleep on the completion channel (as the soft NIC's responders
            // do): on a machine with fewer cores than spinning threads, a server that never
            // sleeps takes the CPU its clients need.
            let since = *idle_since.get_or_insert_with(Instant::now);
            if since.elapsed() < SERVER_SPIN {
                continue;
            }
            cq.req_notify()?;
            n = cq.poll(&mut buf)?; // what arrived before arming raises no event
            if n == 0 {
                sleep_on(&cq)?;
                idle_since = None;
                continue;
            }
        }
        idle_since = None;
        for c in &buf[..n] {
            if c.opcode != WcOpcode::Recv || !c.is_ok() {
                continue; // our SENDs' completions; flushed receives of closed connections
            }
            let slot = c.wr_id as usize;
            let conn = slot / RECVS;
            recv.read_at(slot * MSG, &mut req)?;
            let op = u64::from_le_bytes(req[..8].try_into().expect("8 bytes"));
            let arg = u64::from_le_bytes(req[8..].try_into().expect("8 bytes"));
            let (status, value) = match op {
                OP_ALLOC => match free.pop() {
                    Some(i) => {
                        allocated[i as usize] = true;
                        (0u64, i * object)
                    }
                    None => (1, 0),
                },
                OP_FREE => {
                    let i = (arg / object) as usize;
                    if arg % object == 0 && i < objects && allocated[i] {
                        allocated[i] = false;
                        free.push(i as u64);
                        (0, 0)
                    } else {
                        (2, 0)
                    }
                }
                _ => (3, 0),
            };
            let mut reply = [0u8; MSG];
            reply[..8].copy_from_slice(&status.to_le_bytes());
            reply[8..].copy_from_slice(&value.to_le_bytes());
            send.write_at(conn * MSG, &reply)?;
            let qp = &qps[conn];
            post_recv(qp, slot)?;
            let sge = send.sge(conn * MSG, MSG as u32)?;
            qp.post_send(&[SendWr {
                wr_id: conn as u64,
                op: WrOp::Send { imm: None },
                sg_list: &[sge],
                signaled: true,
            }])?;
        }
    }
    let _ = acceptor.join();
    Ok(())
}

/// Sleeps until the armed `cq` signals a completion (at most 10 ms), then consumes the event.
pub(super) fn sleep_on(cq: &Cq) -> Result<()> {
    let mut pfd = libc::pollfd {
        fd: cq.event_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one pollfd we own, for the CQ's live descriptor.
    unsafe { libc::poll(&mut pfd, 1, 10) };
    cq.ack_events()?;
    Ok(())
}

/// One client of the baseline: a QP and a buffer for a request and its reply.
pub(super) struct TwoSidedClient {
    _ctx: Context,
    cq: Cq,
    qp: Qp,
    mr: Mr,
}

impl TwoSidedClient {
    fn connect(device: &DeviceArgs, transport: Transport, addr: SocketAddr) -> Result<Self> {
        let ctx = device.open(transport)?;
        let pd = ctx.alloc_pd()?;
        let cq = ctx.create_cq(64)?;
        let c = conn::connect(
            Manager::from(&pd),
            addr,
            &conn::ConnectSpec::new(&pd, &cq, &QpConfig::default())
                .private_data(b"two-sided")
                .timeout(WAIT),
        )?;
        let mr = pd.alloc_mr(2 * MSG, AccessFlags::LOCAL_WRITE)?;
        Ok(Self {
            _ctx: ctx,
            cq,
            qp: c.qp,
            mr,
        })
    }

    /// One request and its reply: post the receive, SEND, busy-poll both completions.
    fn call(&self, op: u64, arg: u64) -> Result<u64> {
        let mut req = [0u8; MSG];
        req[..8].copy_from_slice(&op.to_le_bytes());
        req[8..].copy_from_slice(&arg.to_le_bytes());
        self.mr.write_at(0, &req)?;
        let rsge = self.mr.sge(MSG, MSG as u32)?;
        self.qp.post_recv(&[RecvWr {
            wr_id: 1,
            sg_list: &[rsge],
        }])?;
        let ssge = self.mr.sge(0, MSG as u32)?;
        self.qp.post_send(&[SendWr {
            wr_id: 0,
            op: WrOp::Send { imm: None },
            sg_list: &[ssge],
            signaled: true,
        }])?;
        let (mut sent, mut got) = (false, false);
        let mut buf = [Completion::EMPTY; 2];
        let t0 = Instant::now();
        while !(sent && got) {
            let mut n = self.cq.poll(&mut buf)?;
            if n == 0 {
                let waited = t0.elapsed();
                if waited > WAIT {
                    return Err(ToolError::Msg("two-sided server: no reply in 30 s".into()));
                }
                if waited < SERVER_SPIN {
                    continue;
                }
                // Spin, then sleep (as the server does), so that the threads that move the
                // messages get the CPU on a small machine.
                self.cq.req_notify()?;
                n = self.cq.poll(&mut buf)?;
                if n == 0 {
                    sleep_on(&self.cq)?;
                    continue;
                }
            }
            for c in &buf[..n] {
                if !c.is_ok() {
                    return Err(ToolError::Msg(format!(
                        "two-sided request failed: {}",
                        c.status
                    )));
                }
                match c.opcode {
                    WcOpcode::Recv => got = true,
                    _ => sent = true,
                }
            }
        }
        let mut reply = [0u8; MSG];
        self.mr.read_at(MSG, &mut reply)?;
        let status = u64::from_le_bytes(reply[..8].try_into().expect("8 bytes"));
        if status != 0 {
            return Err(ToolError::Msg(format!(
                "two-sided server refused op {op}: status {status}"
            )));
        }
        Ok(u64::from_le_bytes(reply[8..].try_into().expect("8 bytes")))
    }
}

/// alloc+free through the two-sided server.
pub(super) fn two_sided(
    device: &DeviceArgs,
    transport: Transport,
    server: &TwoSidedServer,
    n: usize,
    _object: u64,
    live: usize,
    secs: f64,
) -> Result<Rate> {
    let addr = server.addr;
    clients(n, secs, |_| {
        let c = TwoSidedClient::connect(device, transport, addr)?;
        let mut held = VecDeque::with_capacity(live + 1);
        for _ in 0..live {
            held.push_back(c.call(OP_ALLOC, 0)?);
        }
        let mut state = Some((c, held));
        Ok(move || -> Result<()> {
            let (c, held) = state.as_mut().expect("set until dropped");
            held.push_back(c.call(OP_ALLOC, 0)?);
            if let Some(old) = held.pop_front() {
                c.call(OP_FREE, old)?;
            }
            Ok(())
        })
    })
}
