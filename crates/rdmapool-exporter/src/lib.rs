//! rdmapool-exporter: serves the metrics of rdmapool contexts, one JSON snapshot per
//! connection on a local Unix socket and Prometheus text at `GET /metrics` over HTTP on
//! loopback (the names are in rdmapool's docs/METRICS.md). The library records (each
//! context owns its recorder, read with `ctx.metrics()`); this crate serves what it is given
//! to [watch](Endpoint::watch), together. Nothing starts unless [`Endpoint::start`] or
//! [`Endpoint::from_env`] is called.
//!
//! ```
//! use rdmapool::fabric::{AccessFlags, Context, SoftConfig};
//! use rdmapool_exporter::{Endpoint, EndpointConfig};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = Context::open(SoftConfig::default())?;
//! let ep = Endpoint::start(EndpointConfig {
//!     unix: None,
//!     http: Some("127.0.0.1:0".parse()?),
//! })?;
//! ep.watch(ctx.metrics());
//! println!("curl http://{}/metrics", ep.http_addr().unwrap());
//! drop(ctx.alloc_pd()?.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?);
//! assert_eq!(ep.snapshot().registrations, 1);   // the same numbers, in process
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

use parking_lot::Mutex;
use rdmapool::metrics::{snapshot_of, ContextMetrics, Snapshot};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Environment variable naming the Unix socket ([`UnixName::parse`] syntax).
pub const ENV_SOCKET: &str = "RDMAPOOL_METRICS_SOCKET";
/// Environment variable with the loopback `ip:port` to serve HTTP on.
pub const ENV_HTTP: &str = "RDMAPOOL_METRICS_HTTP";
/// Environment variable for [`Endpoint::from_env`]: time one signalled work request in this
/// many (`0` turns op latency off; unset: [`rdmapool::metrics::DEFAULT_OP_SAMPLE_EVERY`]).
pub const ENV_OP_SAMPLE: &str = "RDMAPOOL_METRICS_OP_SAMPLE";
/// Environment variable for [`Endpoint::from_env`]: `0` turns per-CQ and per-QP completion
/// counts off, `1` on (unset: on; see [`ContextMetrics::track_objects`]).
pub const ENV_PER_OBJECT: &str = "RDMAPOOL_METRICS_PER_OBJECT";

/// Why an endpoint could not start.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    /// HTTP is served on loopback only; the address was another.
    #[error("metrics over HTTP are served on loopback only (127.0.0.0/8 or ::1), not on {0}")]
    NotLoopback(SocketAddr),
    /// Binding or configuring a socket failed.
    #[error("metrics endpoint: binding {what}: {source}")]
    Bind {
        /// The address.
        what: String,
        /// The OS error.
        source: std::io::Error,
    },
    /// A serving thread could not be started.
    #[error("metrics endpoint: starting a thread: {0}")]
    Spawn(std::io::Error),
    /// An environment variable held something unusable.
    #[error("{var}={value:?}: {reason}")]
    BadEnv {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Neither a Unix socket nor an HTTP address was configured.
    #[error("metrics endpoint: nothing to serve on (give a Unix socket and/or an HTTP address)")]
    NothingConfigured,
}

/// Where the Unix-socket endpoint listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnixName {
    /// A filesystem path (removed again when the endpoint stops).
    Path(PathBuf),
    /// A Linux abstract socket name (no file; written `@name`).
    Abstract(String),
}

impl UnixName {
    /// `@name` is an abstract name, anything else a path.
    pub fn parse(s: &str) -> Self {
        match s.strip_prefix('@') {
            Some(name) => Self::Abstract(name.to_string()),
            None => Self::Path(PathBuf::from(s)),
        }
    }

    /// The socket address, for binding or connecting.
    pub fn to_addr(&self) -> std::io::Result<UnixAddr> {
        match self {
            Self::Path(p) => UnixAddr::from_pathname(p),
            Self::Abstract(n) => UnixAddr::from_abstract_name(n.as_bytes()),
        }
    }
}

impl std::fmt::Display for UnixName {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Path(p) => write!(f, "{}", p.display()),
            Self::Abstract(n) => write!(f, "@{n}"),
        }
    }
}

/// What to serve on.
#[derive(Debug, Clone, Default)]
pub struct EndpointConfig {
    /// A Unix socket sending one JSON snapshot per connection.
    pub unix: Option<UnixName>,
    /// A loopback address serving Prometheus text at `GET /metrics` (port 0: any free port).
    pub http: Option<SocketAddr>,
}

/// The contexts an endpoint serves.
type Watched = Arc<Mutex<Vec<ContextMetrics>>>;

/// A running metrics endpoint serving the contexts it [watches](Endpoint::watch); dropping
/// it stops the serving threads.
#[derive(Debug)]
pub struct Endpoint {
    watched: Watched,
    /// The rates from the environment ([`Endpoint::from_env`]) given to each watched context;
    /// `None`: the defaults, unless the program chose.
    op_sample: Option<u32>,
    per_object: Option<bool>,
    stop: Arc<AtomicBool>,
    unix: Option<(UnixName, JoinHandle<()>)>,
    http: Option<(SocketAddr, JoinHandle<()>)>,
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, EndpointError> {
    std::thread::Builder::new()
        .name(name.into())
        .spawn(f)
        .map_err(EndpointError::Spawn)
}

impl Endpoint {
    /// Binds what `cfg` names and serves, on background threads, the contexts given to
    /// [`Endpoint::watch`] (none yet: the snapshot of no context).
    pub fn start(cfg: EndpointConfig) -> Result<Self, EndpointError> {
        if cfg.unix.is_none() && cfg.http.is_none() {
            return Err(EndpointError::NothingConfigured);
        }
        if let Some(a) = cfg.http {
            if !a.ip().is_loopback() {
                return Err(EndpointError::NotLoopback(a));
            }
        }
        let stop = Arc::new(AtomicBool::new(false));
        let watched = Watched::default();
        let mut ep = Self {
            watched: watched.clone(),
            op_sample: None,
            per_object: None,
            stop: stop.clone(),
            unix: None,
            http: None,
        };
        if let Some(name) = cfg.unix {
            let bind = |e| EndpointError::Bind {
                what: name.to_string(),
                source: e,
            };
            let l = UnixListener::bind_addr(&name.to_addr().map_err(bind)?).map_err(bind)?;
            let (s, w) = (stop.clone(), watched.clone());
            let h = spawn("rdmapool-metrics-unix", move || serve_unix(l, s, w));
            // On a failed spawn the listener is gone; a path socket must not stay behind.
            if h.is_err() {
                remove_path(&name);
            }
            ep.unix = Some((name, h?));
        }
        if let Some(a) = cfg.http {
            let bind = |e| EndpointError::Bind {
                what: a.to_string(),
                source: e,
            };
            let l = TcpListener::bind(a).map_err(bind)?;
            let local = l.local_addr().map_err(bind)?;
            let (s, w) = (stop.clone(), watched.clone());
            ep.http = Some((
                local,
                spawn("rdmapool-metrics-http", move || serve_http(l, s, w))?,
            ));
        }
        Ok(ep)
    }

    /// Starts an endpoint from [`ENV_SOCKET`] and/or [`ENV_HTTP`]; `Ok(None)` when neither
    /// is set (or both are empty). [`ENV_OP_SAMPLE`] sets the op latency sampling rate and
    /// [`ENV_PER_OBJECT`] whether completions are counted per CQ and per QP, of each context
    /// it watches.
    pub fn from_env() -> Result<Option<Self>, EndpointError> {
        let var = |k| std::env::var(k).ok().filter(|v: &String| !v.is_empty());
        let unix = var(ENV_SOCKET).map(|v| UnixName::parse(&v));
        let http = match var(ENV_HTTP) {
            None => None,
            Some(v) => Some(v.parse::<SocketAddr>().map_err(|e| EndpointError::BadEnv {
                var: ENV_HTTP,
                value: v.clone(),
                reason: format!("not an ip:port address ({e})"),
            })?),
        };
        if unix.is_none() && http.is_none() {
            return Ok(None);
        }
        let op_sample = match var(ENV_OP_SAMPLE) {
            None => None,
            Some(v) => Some(v.trim().parse::<u32>().map_err(|e| EndpointError::BadEnv {
                var: ENV_OP_SAMPLE,
                value: v.clone(),
                reason: format!("want a whole number, 0 for off ({e})"),
            })?),
        };
        let per_object = match var(ENV_PER_OBJECT) {
            None => None,
            Some(v) => match v.trim() {
                "0" => Some(false),
                "1" => Some(true),
                _ => {
                    return Err(EndpointError::BadEnv {
                        var: ENV_PER_OBJECT,
                        value: v.clone(),
                        reason: "want 0 (off) or 1 (on)".into(),
                    })
                }
            },
        };
        let mut ep = Self::start(EndpointConfig { unix, http })?;
        ep.op_sample = op_sample;
        ep.per_object = per_object;
        Ok(Some(ep))
    }

    /// Serves `context`'s metrics too (from [`rdmapool::fabric::Context::metrics`]: its
    /// objects, and the registrars, caches, pools, connections and memory servers built on
    /// it). Op latency sampling is turned on for it at
    /// [`rdmapool::metrics::DEFAULT_OP_SAMPLE_EVERY`] unless a rate was chosen
    /// ([`ContextMetrics::sample_op_latency`], or [`ENV_OP_SAMPLE`] for
    /// [`Endpoint::from_env`]), and so are per-CQ and per-QP completion counts unless they
    /// were turned off.
    pub fn watch(&self, context: ContextMetrics) {
        context.turn_on_defaults();
        if let Some(every) = self.op_sample {
            context.sample_op_latency(every);
        }
        if let Some(on) = self.per_object {
            context.track_objects(on);
        }
        self.watched.lock().push(context);
    }

    /// What this endpoint serves, now: the watched contexts together.
    pub fn snapshot(&self) -> Snapshot {
        watched_snapshot(&self.watched)
    }

    /// The address HTTP is served on (with the port chosen, when 0 was asked for).
    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http.as_ref().map(|(a, _)| *a)
    }

    /// The Unix socket served on.
    pub fn unix_name(&self) -> Option<&UnixName> {
        self.unix.as_ref().map(|(n, _)| n)
    }
}

fn remove_path(name: &UnixName) {
    if let UnixName::Path(p) = name {
        let _ = std::fs::remove_file(p);
    }
}

impl Drop for Endpoint {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake each accept loop with a connection of our own; it sees `stop` and returns.
        if let Some((name, h)) = self.unix.take() {
            if let Ok(a) = name.to_addr() {
                let _ = UnixStream::connect_addr(&a);
            }
            let _ = h.join();
            remove_path(&name);
        }
        if let Some((a, h)) = self.http.take() {
            let _ = TcpStream::connect_timeout(&a, Duration::from_secs(1));
            let _ = h.join();
        }
    }
}

/// Connections answered at once, at most; beyond that a new connection is closed
/// unanswered (a scraper retries at its next interval).
pub const MAX_ANSWERING: usize = 16;
/// How long one connection may take, request and answer together.
pub const ANSWER_DEADLINE: Duration = Duration::from_secs(2);

/// Accepts connections and answers each on a thread of its own, at most
/// [`MAX_ANSWERING`] at once: a slow or idle client holds its own thread for at most
/// [`ANSWER_DEADLINE`] and delays no other scrape.
fn serve<C: Send + 'static>(
    incoming: impl Iterator<Item = std::io::Result<C>>,
    stop: Arc<AtomicBool>,
    watched: Watched,
    answer: fn(C, &Watched),
) {
    let answering = Arc::new(AtomicUsize::new(0));
    let mut threads: Vec<JoinHandle<()>> = Vec::new();
    for conn in incoming {
        if stop.load(Ordering::Acquire) {
            break;
        }
        threads.retain(|h| !h.is_finished());
        let Ok(c) = conn else { continue };
        let Some(ticket) = Answering::try_begin(&answering) else {
            continue; // dropped: closed unanswered
        };
        let w = watched.clone();
        let run = move || {
            answer(c, &w);
            drop(ticket);
        };
        if let Ok(h) = spawn("rdmapool-metrics-answer", run) {
            threads.push(h);
        }
    }
    for h in threads {
        let _ = h.join(); // each ends within ANSWER_DEADLINE
    }
}

fn watched_snapshot(watched: &Watched) -> Snapshot {
    let contexts = watched.lock().clone();
    snapshot_of(&contexts)
}

/// Whether the peer of a Unix connection may read the metrics: a process of the user this
/// one runs as, or root. An abstract socket has no file permissions, so any local user
/// could connect (issue #41, finding 7); the kernel's record of who connected decides.
fn same_user(c: &UnixStream) -> bool {
    match rustix::net::sockopt::socket_peercred(c) {
        Ok(cred) => {
            let uid = cred.uid.as_raw();
            uid == 0 || uid == rustix::process::geteuid().as_raw()
        }
        Err(_) => false,
    }
}

fn serve_unix(l: UnixListener, stop: Arc<AtomicBool>, watched: Watched) {
    serve(l.incoming(), stop, watched, |mut c, w| {
        if !same_user(&c) {
            return; // closed unanswered
        }
        let _ = c.set_write_timeout(Some(ANSWER_DEADLINE));
        let mut body = watched_snapshot(w).to_json();
        body.push('\n');
        let _ = c.write_all(body.as_bytes());
    });
}

fn serve_http(l: TcpListener, stop: Arc<AtomicBool>, watched: Watched) {
    serve(l.incoming(), stop, watched, |c, w| {
        let _ = answer_http(c, w);
    });
}

/// Reads one request head and answers it; `GET /metrics` is the only thing served.
/// The head must arrive within [`ANSWER_DEADLINE`] of the connection, however it trickles
/// in.
fn answer_http(mut c: TcpStream, watched: &Watched) -> std::io::Result<()> {
    let deadline = Instant::now() + ANSWER_DEADLINE;
    let left = || {
        let d = deadline.saturating_duration_since(Instant::now());
        if d.is_zero() {
            Err(std::io::Error::from(std::io::ErrorKind::TimedOut))
        } else {
            Ok(d)
        }
    };
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < 8192 {
        c.set_read_timeout(Some(left()?))?;
        let n = c.read(&mut buf)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let mut parts = line.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, ctype, body) = match (method, path) {
        ("GET", "/metrics") => (
            "200 OK",
            "text/plain; version=0.0.4; charset=utf-8",
            watched_snapshot(watched).to_prometheus(),
        ),
        ("GET", _) => (
            "404 Not Found",
            "text/plain",
            "only /metrics is served\n".into(),
        ),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET is served\n".into(),
        ),
    };
    c.set_write_timeout(Some(left()?))?;
    write!(
        c,
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )?;
    c.flush()
}

/// One connection being answered: at most [`MAX_ANSWERING`] exist at once.
struct Answering(Arc<AtomicUsize>);

impl Answering {
    /// A place among the connections answered, if there is one.
    fn try_begin(count: &Arc<AtomicUsize>) -> Option<Answering> {
        count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_ANSWERING).then_some(n + 1)
            })
            .ok()
            .map(|_| Answering(count.clone()))
    }
}

impl Drop for Answering {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_refuses_non_loopback() {
        let e = Endpoint::start(EndpointConfig {
            unix: None,
            http: Some("0.0.0.0:0".parse().unwrap()),
        })
        .unwrap_err();
        assert!(matches!(e, EndpointError::NotLoopback(_)), "{e}");
    }

    /// docs/METRICS.md states the endpoint's bounds as the code has them.
    #[test]
    fn metrics_md_states_the_endpoints_bounds() {
        let doc = include_str!("../../../docs/METRICS.md");
        let want = format!("{MAX_ANSWERING} at once at most");
        assert!(doc.contains(&want), "METRICS.md should say: {want}");
        let want = format!("each has {} s for its request", ANSWER_DEADLINE.as_secs());
        assert!(doc.contains(&want), "METRICS.md should say: {want}");
    }

    #[test]
    fn at_most_max_answering_connections_are_answered_at_once() {
        let count = Arc::new(AtomicUsize::new(0));
        let held: Vec<_> = (0..MAX_ANSWERING)
            .map(|_| Answering::try_begin(&count).expect("room"))
            .collect();
        assert!(Answering::try_begin(&count).is_none());
        drop(held);
        assert_eq!(count.load(Ordering::Acquire), 0);
        assert!(Answering::try_begin(&count).is_some());
    }
}
