//! The TCP CM port's passive side: connection requests read from many peers at once.
//!
//! Each accepted connection gets [`HANDSHAKE_TIMEOUT`] to deliver its request; meanwhile
//! others are accepted and read too (one `poll` over the listener and every pending socket),
//! so idle or slow peers delay nobody. At most [`MAX_PENDING`] handshakes are in progress,
//! and at most [`MAX_PENDING_PER_SOURCE`] from one IP address. Beyond either bound a
//! connection is made room for at the expense of the address with the most in progress (its
//! oldest): a flood from a few addresses evicts only its own connections, never a request
//! from an address that has few.

use super::message::{io_err, Message, HEADER_LEN, REQ};
use crate::fabric::Endpoint;
use crate::{Error, Result};
use parking_lot::Mutex;
use std::io::{ErrorKind, Read};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

/// How long a connected peer may take to send its request.
pub(super) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// Handshakes in progress at once, at most.
pub(super) const MAX_PENDING: usize = 64;
/// Handshakes in progress from one IP address, at most.
pub(super) const MAX_PENDING_PER_SOURCE: usize = 16;

/// One connection whose request has not fully arrived.
struct Pending {
    stream: TcpStream,
    peer: SocketAddr,
    buf: Vec<u8>,
    deadline: Instant,
}

/// What a pending connection did when read.
enum Progress {
    Waiting,
    Done(Message),
    Dropped,
}

impl Pending {
    /// Reads what has arrived; a full message ends it.
    fn read(&mut self) -> Progress {
        let mut chunk = [0u8; 1024];
        loop {
            let want = match self.buf.len() {
                n if n < HEADER_LEN => HEADER_LEN - n,
                _ => {
                    let h: &[u8; HEADER_LEN] = self.buf[..HEADER_LEN].try_into().unwrap();
                    let Ok(body) = Message::body_len(h) else {
                        return Progress::Dropped;
                    };
                    let total = HEADER_LEN + body;
                    if self.buf.len() == total {
                        return match Message::parse(h, &self.buf[HEADER_LEN..]) {
                            Ok(m) => Progress::Done(m),
                            Err(_) => Progress::Dropped,
                        };
                    }
                    total - self.buf.len()
                }
            };
            match self.stream.read(&mut chunk[..want.min(1024)]) {
                Ok(0) => return Progress::Dropped,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Progress::Waiting,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Progress::Dropped,
            }
        }
    }
}

/// A listening CM port and the handshakes in progress on it.
pub(super) struct CmPort {
    listener: TcpListener,
    addr: SocketAddr,
    pending: Mutex<Vec<Pending>>,
}

impl CmPort {
    pub(super) fn new(listener: TcpListener, addr: SocketAddr) -> Result<Self> {
        listener
            .set_nonblocking(true)
            .map_err(io_err(addr, "listener"))?;
        Ok(Self {
            listener,
            addr,
            pending: Mutex::new(Vec::new()),
        })
    }

    /// The next complete, well-formed request within `timeout`: its stream (blocking
    /// again), peer, endpoint and private data.
    pub(super) fn next_request(&self, timeout: Duration) -> Result<Request> {
        let deadline = Instant::now() + timeout;
        let mut pending = self.pending.lock();
        loop {
            if let Some(r) = self.accept_all(&mut pending)? {
                return Ok(r);
            }
            let now = Instant::now();
            let mut i = 0;
            while i < pending.len() {
                let p = &mut pending[i];
                let progress = if now >= p.deadline {
                    Progress::Dropped
                } else {
                    p.read()
                };
                match progress {
                    Progress::Waiting => i += 1,
                    Progress::Dropped => {
                        let p = pending.swap_remove(i);
                        warn_dropped(p.peer, "malformed, closed or too slow");
                    }
                    Progress::Done(m) => {
                        if let Some(r) = finish(pending.swap_remove(i), m)? {
                            return Ok(r);
                        }
                    }
                }
            }
            if now >= deadline {
                return Err(Error::Core(crate::CoreError::Connection {
                    peer: self.addr.to_string(),
                    reason: format!("no connection request within {timeout:?}"),
                }));
            }
            let wake = pending
                .iter()
                .map(|p| p.deadline)
                .fold(deadline, Instant::min);
            self.wait(&pending, wake);
        }
    }

    /// Accepts the connections waiting on the listener, reading each at once: the first
    /// whose request has already arrived whole (a requester sends it with its connect) is
    /// returned, the rest of the backlog left for the next call. Only connections still
    /// waiting for their request join the handshakes in progress and their bounds.
    fn accept_all(&self, pending: &mut Vec<Pending>) -> Result<Option<Request>> {
        loop {
            match self.listener.accept() {
                Ok((stream, peer)) => {
                    if stream.set_nonblocking(true).is_err() {
                        continue;
                    }
                    let mut p = Pending {
                        stream,
                        peer,
                        buf: Vec::new(),
                        deadline: Instant::now() + HANDSHAKE_TIMEOUT,
                    };
                    match p.read() {
                        Progress::Done(m) => match finish(p, m)? {
                            Some(r) => return Ok(Some(r)),
                            None => continue,
                        },
                        Progress::Dropped => {
                            warn_dropped(p.peer, "malformed or closed");
                            continue;
                        }
                        Progress::Waiting => {}
                    }
                    let held: Vec<(IpAddr, Instant)> =
                        pending.iter().map(|p| (p.peer.ip(), p.deadline)).collect();
                    if let Some(i) = make_room(&held, peer.ip()) {
                        let p = pending.swap_remove(i);
                        warn_dropped(p.peer, "too many in progress from its address");
                    }
                    pending.push(p);
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(None),
                Err(e) if e.kind() == ErrorKind::ConnectionAborted => continue,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(io_err(self.addr, "accept")(e)),
            }
        }
    }

    /// Sleeps until the listener or a pending socket is readable, or `until`.
    fn wait(&self, pending: &[Pending], until: Instant) {
        let mut fds: Vec<libc::pollfd> = std::iter::once(self.listener.as_raw_fd())
            .chain(pending.iter().map(|p| p.stream.as_raw_fd()))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        let left = until.saturating_duration_since(Instant::now());
        let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        // SAFETY: `fds` is a live array of `fds.len()` pollfds over descriptors we own.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, ms) };
    }
}

/// A complete request: its stream (blocking again), peer, endpoint and private data.
pub(super) type Request = (TcpStream, SocketAddr, Endpoint, Vec<u8>);

/// A connection whose message `m` arrived whole: the request, if it is one (anything else
/// is dropped).
fn finish(p: Pending, m: Message) -> Result<Option<Request>> {
    match (m.kind, m.endpoint) {
        (REQ, Some(endpoint)) => {
            p.stream
                .set_nonblocking(false)
                .map_err(io_err(p.peer, "socket"))?;
            let _ = p.stream.set_nodelay(true);
            Ok(Some((p.stream, p.peer, endpoint, m.private)))
        }
        _ => {
            warn_dropped(p.peer, "not a REQ");
            Ok(None)
        }
    }
}

/// Which of the `held` handshakes (source address, deadline) to drop before one from
/// `source` joins, if any: the oldest from `source` when it has [`MAX_PENDING_PER_SOURCE`];
/// when all [`MAX_PENDING`] are taken, the oldest from the address with the most (never an
/// address that will have fewer than `source`).
fn make_room(held: &[(IpAddr, Instant)], source: IpAddr) -> Option<usize> {
    let oldest_of = |ip: IpAddr| {
        (0..held.len())
            .filter(|&i| held[i].0 == ip)
            .min_by_key(|&i| held[i].1)
    };
    let count = |ip: IpAddr| held.iter().filter(|h| h.0 == ip).count();
    if count(source) >= MAX_PENDING_PER_SOURCE {
        return oldest_of(source);
    }
    if held.len() < MAX_PENDING {
        return None;
    }
    let busiest = held.iter().map(|h| h.0).max_by_key(|&ip| count(ip))?;
    oldest_of(busiest)
}

/// Logs a dropped connection request, at most once a second per process: anyone who can
/// reach the port can open and close connections, and a line each (about 180 bytes) would
/// let them fill the log. The next line logged says how many were held back meanwhile.
fn warn_dropped(peer: std::net::SocketAddr, why: &str) {
    static LOG: std::sync::Mutex<(Option<Instant>, u64)> = std::sync::Mutex::new((None, 0));
    let mut log = LOG
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let now = Instant::now();
    if log
        .0
        .is_some_and(|at| now.saturating_duration_since(at) < Duration::from_secs(1))
    {
        log.1 += 1;
        return;
    }
    let held_back = std::mem::take(&mut log.1);
    log.0 = Some(now);
    drop(log);
    if held_back == 0 {
        tracing::warn!(%peer, "dropping a connection request: {why}");
    } else {
        tracing::warn!(
            %peer,
            "dropping a connection request: {why} ({held_back} more dropped since the last \
             such line, not logged)"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    /// `n` handshakes from each address in `sources`, in that order, a millisecond apart.
    fn held(sources: &[(u8, usize)]) -> Vec<(IpAddr, Instant)> {
        let t0 = Instant::now();
        let mut v = Vec::new();
        for &(s, n) in sources {
            for _ in 0..n {
                v.push((ip(s), t0 + Duration::from_millis(v.len() as u64)));
            }
        }
        v
    }

    #[test]
    fn a_source_at_its_bound_makes_room_from_its_own_oldest() {
        let h = held(&[(1, 1), (2, MAX_PENDING_PER_SOURCE), (1, 1)]);
        assert_eq!(make_room(&h, ip(2)), Some(1));
        assert_eq!(make_room(&h, ip(1)), None, "room left: nobody is dropped");
        assert_eq!(make_room(&h, ip(3)), None);
    }

    #[test]
    fn a_full_table_makes_room_from_the_busiest_source_never_a_quiet_one() {
        // Eight flooders at their bound fill the table; a ninth address and a quiet one.
        let per = MAX_PENDING_PER_SOURCE;
        let mut sources: Vec<(u8, usize)> = (0..(MAX_PENDING / per) as u8 - 1)
            .map(|s| (s + 10, per))
            .collect();
        sources.insert(0, (1, 1)); // a legitimate request, the oldest of all
        sources.push((9, per - 1));
        let h = held(&sources);
        assert_eq!(h.len(), MAX_PENDING);
        for newcomer in [1u8, 2, 9] {
            let i = make_room(&h, ip(newcomer)).expect("full: someone goes");
            assert_ne!(h[i].0, ip(1), "the quiet address lost its request");
            assert_ne!(
                h[i].0,
                ip(9),
                "an address below the bound lost one to a flooder"
            );
            let oldest_of_source = h.iter().filter(|x| x.0 == h[i].0).map(|x| x.1).min();
            assert_eq!(Some(h[i].1), oldest_of_source, "not the source's oldest");
        }
    }

    /// docs/PROTOCOL.md section 4 states the bounds as the code has them.
    #[test]
    fn protocol_md_states_the_bounds_on_handshakes_in_progress() {
        use crate::doc_check::{all_say, section, PROTOCOL};
        let s4 = section(PROTOCOL, 4);
        all_say(
            s4,
            "Requests are read from up to ",
            MAX_PENDING as u64,
            "MAX_PENDING",
        );
        all_say(s4, "When all ", MAX_PENDING as u64, "MAX_PENDING");
        all_say(
            s4,
            "address may have ",
            MAX_PENDING_PER_SOURCE as u64,
            "MAX_PENDING_PER_SOURCE",
        );
        all_say(
            s4,
            "within ",
            HANDSHAKE_TIMEOUT.as_secs(),
            "HANDSHAKE_TIMEOUT",
        );
    }
}
