//! The target process used by `demo` and `bench`: it exports a registered region over the
//! soft provider, optionally runs TCP and Unix-socket echo servers (busy-polled while requests
//! flow: the raw references benchmarks compare against), and answers a few commands on stdin.
//!
//! The parent connects through the connection manager ([`rdmapool::conn`]): the peer accepts
//! with its region descriptor as private data. The pipes carry only what a test harness
//! needs, one line each, prefixed with `@`: peer -> parent `@listen <cm-addr>`,
//! `@echo <tcp-addr> <unix-path>`, `@dump <hex>`; parent -> peer `@dump <offset> <len>`.

use crate::device_args::DeviceArgs;
use crate::{Result, ToolError};
use rdmapool::conn::{Listener, Manager};
use rdmapool::fabric::{
    AccessFlags, Cq, Pd, Qp, QpConfig, RegisteredMemory, RemoteRegion, Transport,
};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::net::{TcpListener, TcpStream};
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixListener, UnixStream};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

/// Arguments of the hidden `peer` command.
#[derive(clap::Args)]
pub struct Args {
    /// Bytes to export.
    #[arg(long, value_parser = crate::units::message_size_arg)]
    size: usize,
    /// auto, tcp or local.
    #[arg(long, default_value = "auto", value_parser = crate::device_args::single_transport_arg)]
    transport: String,
    /// Also run the raw echo servers used as references.
    #[arg(long)]
    echo: bool,
    #[command(flatten)]
    device: DeviceArgs,
}

fn read_command(lines: &mut impl BufRead) -> Option<String> {
    loop {
        let mut l = String::new();
        if lines.read_line(&mut l).ok()? == 0 {
            return None;
        }
        if let Some(rest) = l.trim_end().strip_prefix('@') {
            return Some(rest.to_string());
        }
    }
}

/// The environment variable that hands the peer its secret (not the command line, which
/// other users can read in /proc).
const SECRET_VAR: &str = "RDMA_TOOL_PEER_SECRET";

/// A fresh 16-byte secret, as hex, from the OS CSPRNG.
fn fresh_secret() -> Result<String> {
    let mut b = [0u8; 16];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .map_err(|e| ToolError::Io("/dev/urandom".into(), e))?;
    Ok(b.iter().map(|x| format!("{x:02x}")).collect())
}

/// Waits (up to `deadline`) for a connection request carrying `secret`; requests without it
/// are rejected and waiting goes on, so no other local user can stop or take the peer.
fn request_with_secret(
    listener: &Listener,
    secret: &[u8],
    deadline: std::time::Instant,
) -> Result<rdmapool::conn::ConnRequest> {
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        let request = listener.get_request(left.max(Duration::from_millis(1)))?;
        if request.private_data() == secret {
            return Ok(request);
        }
        crate::errln!("peer: rejected a connection request without the secret");
        let _ = request.reject(b"unknown client");
    }
}

/// Runs the peer until its stdin closes.
pub fn run(args: Args) -> Result<()> {
    let transport = Transport::parse(&args.transport)?;
    let ctx = args.device.open(transport)?;
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(1024)?;
    let mr = pd.alloc_mr(args.size, AccessFlags::all_remote())?;
    // The TCP handshake on loopback on every provider (RDMA CM cannot route over lo).
    let listener = Listener::bind(Manager::Tcp, SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let mut out = std::io::stdout().lock();
    let say = |out: &mut std::io::StdoutLock, s: String| -> Result<()> {
        writeln!(out, "@{s}")
            .and_then(|_| out.flush())
            .map_err(|e| ToolError::Io("stdout".into(), e))
    };
    say(&mut out, format!("listen {}", listener.local_addr()))?;
    if args.echo {
        let (tcp, unix) = start_echo_servers()?;
        say(&mut out, format!("echo {tcp} {unix}"))?;
    }
    let secret = std::env::var(SECRET_VAR)
        .map_err(|_| {
            ToolError::Msg(format!(
                "{SECRET_VAR} is not set: `rdma-tool peer` is started by demo and bench"
            ))
        })?
        .into_bytes();
    let request = request_with_secret(
        &listener,
        &secret,
        std::time::Instant::now() + Duration::from_secs(60),
    )?;
    let cfg = QpConfig::default();
    let region = mr.remote_region().to_bytes();
    let _qp = request.accept(&pd, &cq, &cq, &cfg, &region)?;
    // Benchmarks with several QPs connect again: accept them in the background.
    std::thread::spawn(move || {
        let mut more = Vec::new();
        let forever = std::time::Instant::now() + Duration::from_secs(24 * 3600);
        while let Ok(request) = request_with_secret(&listener, &secret, forever) {
            match request.accept(&pd, &cq, &cq, &cfg, &region) {
                Ok(qp) => more.push(qp),
                Err(e) => crate::errln!("peer: accepting a further connection: {e}"),
            }
        }
    });
    let mut stdin = BufReader::new(std::io::stdin());
    while let Some(cmd) = read_command(&mut stdin) {
        let mut parts = cmd.split(' ');
        if parts.next() == Some("dump") {
            let off: usize = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0);
            let len: usize = parts.next().and_then(|s| s.parse().ok()).unwrap_or(0);
            let mut buf = vec![0u8; len];
            mr.read_at(off, &mut buf)?;
            let text: String = buf.iter().map(|b| format!("{b:02x}")).collect();
            say(&mut out, format!("dump {text}"))?;
        }
    }
    Ok(())
}

/// Echo servers on loopback TCP and a Unix socket, busy-polled while requests flow (an idle
/// connection sleeps in `poll` after [`SPIN_BEFORE_SLEEP`]).
///
/// Each request is an 8-byte header (request length, response length, little-endian u32)
/// followed by the request bytes; the server answers with response-length bytes.
fn start_echo_servers() -> Result<(String, String)> {
    let tcp =
        TcpListener::bind("127.0.0.1:0").map_err(|e| ToolError::Io("echo listen".into(), e))?;
    let tcp_addr = tcp
        .local_addr()
        .map_err(|e| ToolError::Io("echo addr".into(), e))?;
    // An abstract socket: nothing left on disk however the peer ends.
    let name = format!("rdma-tool-echo-{}", std::process::id());
    let unix = UnixAddr::from_abstract_name(name.as_bytes())
        .and_then(|a| UnixListener::bind_addr(&a))
        .map_err(|e| ToolError::Io("echo listen".into(), e))?;
    std::thread::spawn(move || {
        for s in tcp.incoming().flatten() {
            let _ = s.set_nodelay(true);
            std::thread::spawn(move || echo(s));
        }
    });
    std::thread::spawn(move || {
        for s in unix.incoming().flatten() {
            std::thread::spawn(move || echo(s));
        }
    });
    Ok((tcp_addr.to_string(), name))
}

/// Reads exactly `buf.len()` bytes, spinning on a non-blocking socket.
pub fn spin_read(s: &mut impl Read, buf: &mut [u8]) -> std::io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        match s.read(&mut buf[got..]) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes all of `buf`, spinning on a non-blocking socket.
pub fn spin_write(s: &mut impl Write, buf: &[u8]) -> std::io::Result<()> {
    let mut sent = 0;
    while sent < buf.len() {
        match s.write(&buf[sent..]) {
            Ok(n) => sent += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::hint::spin_loop(),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Sockets the echo server can serve.
pub trait EchoSocket: Read + Write + Send + std::os::fd::AsRawFd {
    /// Switches to non-blocking mode.
    fn nonblocking(&self) -> std::io::Result<()>;
}
impl EchoSocket for TcpStream {
    fn nonblocking(&self) -> std::io::Result<()> {
        self.set_nonblocking(true)
    }
}
impl EchoSocket for UnixStream {
    fn nonblocking(&self) -> std::io::Result<()> {
        self.set_nonblocking(true)
    }
}

/// How long an echo connection spins for its next request before it sleeps in `poll`:
/// long enough to cover the gap between back-to-back requests of a benchmark, so the
/// reference keeps its busy-polled latency, and short enough that an idle connection costs
/// no core.
const SPIN_BEFORE_SLEEP: Duration = Duration::from_micros(200);

/// Waits until `s` is readable: spinning [`SPIN_BEFORE_SLEEP`], then sleeping in `poll`.
fn await_readable(s: &impl EchoSocket) -> std::io::Result<()> {
    let fd = s.as_raw_fd();
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    let start = Instant::now();
    loop {
        let timeout = if start.elapsed() < SPIN_BEFORE_SLEEP {
            0
        } else {
            -1
        };
        // SAFETY: one pollfd over the socket this connection owns, alive for the call.
        let n = unsafe { libc::poll(&mut p, 1, timeout) };
        if n > 0 {
            return Ok(());
        }
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
        std::hint::spin_loop();
    }
}

fn echo(mut s: impl EchoSocket) {
    if s.nonblocking().is_err() {
        return;
    }
    let mut buf = vec![0u8; 4 << 20];
    loop {
        let mut hdr = [0u8; 8];
        if await_readable(&s).is_err() || spin_read(&mut s, &mut hdr).is_err() {
            return;
        }
        let req = u32::from_le_bytes(hdr[..4].try_into().unwrap()) as usize;
        let resp = u32::from_le_bytes(hdr[4..].try_into().unwrap()) as usize;
        if req > buf.len() || resp > buf.len() {
            return;
        }
        if spin_read(&mut s, &mut buf[..req]).is_err() || spin_write(&mut s, &buf[..resp]).is_err()
        {
            return;
        }
    }
}

/// A running peer process and its pipes.
pub struct PeerProcess {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    /// Where its connection manager listens.
    pub cm_addr: SocketAddr,
    /// Echo servers (TCP address, Unix path), when asked for.
    pub echo: Option<(String, String)>,
    /// What a connection request must carry (private data).
    secret: String,
}

impl PeerProcess {
    /// Starts `rdma-tool peer` on the device `device` selects and reads where it listens.
    pub fn spawn_on(device: &DeviceArgs, size: usize, transport: &str, echo: bool) -> Result<Self> {
        let exe = std::env::current_exe().map_err(|e| ToolError::Io("current_exe".into(), e))?;
        let secret = fresh_secret()?;
        let mut cmd = Command::new(exe);
        cmd.env(SECRET_VAR, &secret);
        cmd.args([
            "peer",
            "--size",
            &size.to_string(),
            "--transport",
            transport,
        ]);
        cmd.args(device.to_args());
        if echo {
            cmd.arg("--echo");
        }
        let mut child = cmd
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| ToolError::Io("spawning the peer".into(), e))?;
        let stdin = child.stdin.take().expect("piped");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped"));
        let mut next = |what: &str| {
            read_command(&mut stdout).ok_or_else(|| {
                ToolError::Msg(format!(
                    "peer exited before saying {what} (see its error above)"
                ))
            })
        };
        let first = next("where it listens")?;
        let cm_addr = first
            .strip_prefix("listen ")
            .and_then(|a| a.parse().ok())
            .ok_or_else(|| ToolError::Msg(format!("unexpected line from peer: {first}")))?;
        let echo = if echo {
            let line = next("where its echo servers are")?;
            let mut p = line.split(' ');
            match (p.next(), p.next(), p.next()) {
                (Some("echo"), Some(t), Some(u)) => Some((t.to_string(), u.to_string())),
                _ => return Err(ToolError::Msg(format!("unexpected line from peer: {line}"))),
            }
        } else {
            None
        };
        Ok(Self {
            child,
            stdin,
            stdout,
            cm_addr,
            echo,
            secret,
        })
    }

    /// The child's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Connects a QP to the peer; returns it (in RTS) and the region the peer exported,
    /// whose descriptor arrives as the accept's private data.
    pub fn connect(&self, pd: &Pd, cq: &Cq, cfg: &QpConfig) -> Result<(Qp, RemoteRegion)> {
        let conn = rdmapool::conn::connect(
            Manager::Tcp,
            self.cm_addr,
            &rdmapool::conn::ConnectSpec::new(pd, cq, cfg)
                .private_data(self.secret.as_bytes())
                .timeout(Duration::from_secs(30)),
        )?;
        let region = RemoteRegion::from_bytes(&conn.private_data)?;
        Ok((conn.qp, region))
    }

    /// Asks the peer for `len` bytes at `offset` of its region, as it sees them.
    pub fn dump(&mut self, offset: usize, len: usize) -> Result<Vec<u8>> {
        writeln!(self.stdin, "@dump {offset} {len}")
            .and_then(|_| self.stdin.flush())
            .map_err(|e| ToolError::Io("peer stdin".into(), e))?;
        let line =
            read_command(&mut self.stdout).ok_or_else(|| ToolError::Msg("peer exited".into()))?;
        let text = line.strip_prefix("dump ").unwrap_or("");
        (0..text.len() / 2)
            .map(|i| u8::from_str_radix(&text[2 * i..2 * i + 2], 16))
            .collect::<std::result::Result<_, _>>()
            .map_err(|_| ToolError::Msg(format!("bad dump from peer: {line}")))
    }
}

impl Drop for PeerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
