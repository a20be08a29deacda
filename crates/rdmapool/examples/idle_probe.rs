//! Measures what connections cost a soft NIC while they sit idle: threads and CPU time of
//! this process.
//!
//! 1. A flood: N raw TCP connections to a NIC's data port that never say hello (the hello
//!    timeout closes them).
//! 2. Established QPs, added in steps up to the largest count asked for, each connected to
//!    a QP of a peer NIC in a child process; after each step, the threads of this process
//!    and the CPU it burns while they sit idle. Each QP is two data connections of this
//!    NIC: its own to the peer, and the peer's into it.
//!
//! `cargo run --release -p rdmapool --example idle_probe -- 2000 1,10,100,1000,5000`
//!
//! The NICs' connection limits are raised for the run (the defaults are 1024 per NIC, 256
//! per user), and so is the descriptor limit as far as it goes (a QP holds three
//! descriptors in each process; the peer lives in a child so that each process holds half).

use rdmapool::fabric::{Admission, Context, Endpoint, Qp, QpConfig, SoftConfig};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn threads() -> usize {
    std::fs::read_dir("/proc/self/task").map_or(0, |d| d.count())
}

fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; RUSAGE_SELF is always valid.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let t = |v: libc::timeval| v.tv_sec as f64 + v.tv_usec as f64 / 1e6;
    t(u.ru_utime) + t(u.ru_stime)
}

fn idle_cpu(secs: u64) -> f64 {
    let (c0, t0) = (cpu_seconds(), Instant::now());
    std::thread::sleep(Duration::from_secs(secs));
    (cpu_seconds() - c0) / t0.elapsed().as_secs_f64()
}

/// Raises the soft descriptor limit as far as the hard one allows (further, as root).
fn raise_fd_limit(want: u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct we pass.
    unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) };
    let raised = libc::rlimit {
        rlim_cur: want.max(r.rlim_cur),
        rlim_max: want.max(r.rlim_max),
    };
    // SAFETY: setrlimit reads the struct we pass; if it refuses (not root), keep the hard limit.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        let soft = libc::rlimit {
            rlim_cur: r.rlim_max,
            rlim_max: r.rlim_max,
        };
        // SAFETY: as above.
        unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &soft) };
    }
}

/// A soft NIC whose connection limits take `qps` QPs.
fn open_roomy(qps: usize) -> rdmapool::Result<Context> {
    let cfg = SoftConfig::from_env()?;
    Ok(Context::open(SoftConfig {
        admission: Admission {
            max_connections: (2 * qps).max(1024),
            max_connections_per_peer: (2 * qps).max(256),
            ..cfg.admission
        },
        ..cfg
    })?)
}

/// Connects `x` (initialised) to the peer at `peer`.
fn connect(x: &Qp, peer: &str) -> rdmapool::Result<()> {
    x.modify_to_rtr(&Endpoint::from_hex(peer.trim())?)?;
    Ok(x.modify_to_rts()?)
}

fn bad_peer(what: &str) -> rdmapool::Error {
    rdmapool::CoreError::Connection {
        peer: "idle_probe's peer process".into(),
        reason: what.into(),
    }
    .into()
}

/// The child: a NIC whose QPs connect to the parent's. Reads a count, then that many
/// endpoints; answers with as many endpoints of its own, then `ok` once they are connected.
fn peer(most: usize) -> rdmapool::Result<()> {
    let ctx = open_roomy(most)?;
    let (pd, cq) = (ctx.alloc_pd()?, ctx.create_cq(4096)?);
    let mut lines = std::io::stdin().lock().lines().map_while(Result::ok);
    let mut out = std::io::stdout().lock();
    let mut qps = Vec::new();
    while let Some(count) = lines.next() {
        let count: usize = count.trim().parse().map_err(|_| bad_peer("got no count"))?;
        let theirs: Vec<String> = lines.by_ref().take(count).collect();
        let start = qps.len();
        for _ in 0..count {
            let y = pd.create_qp(&cq, &cq, &QpConfig::default())?;
            y.modify_to_init()?;
            let _ = writeln!(out, "{}", y.endpoint().to_hex());
            qps.push(y);
        }
        let _ = out.flush();
        for (y, ep) in qps[start..].iter().zip(&theirs) {
            connect(y, ep)?;
        }
        let _ = writeln!(out, "ok");
        let _ = out.flush();
    }
    Ok(())
}

fn main() -> rdmapool::Result<()> {
    let mut args = std::env::args().skip(1);
    let first = args.next().unwrap_or_default();
    if first == "--peer" {
        let most = args.next().and_then(|a| a.parse().ok()).unwrap_or(1024);
        raise_fd_limit(4 * most as u64 + 1024);
        return peer(most);
    }
    let n: usize = first.parse().unwrap_or(2000);
    let steps: Vec<usize> = args
        .next()
        .unwrap_or_else(|| "1,10,100,1000".into())
        .split(',')
        .filter_map(|s| s.trim().parse().ok())
        .collect();
    let most = steps.iter().copied().max().unwrap_or(0);
    raise_fd_limit(4 * most as u64 + n as u64 + 1024);
    let a = open_roomy(most)?;
    let (pa, ca) = (a.alloc_pd()?, a.create_cq(4096)?);
    let qp = pa.create_qp(&ca, &ca, &QpConfig::default())?;
    let addr = rdmapool::soft::tcp_addr(&qp.endpoint()).expect("a soft endpoint");
    let base = threads();

    // 1. A flood of connections that never say hello.
    let flood: Vec<TcpStream> = (0..n)
        .filter_map(|_| TcpStream::connect(addr).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let peak = threads();
    let flood_cpu = idle_cpu(1);
    std::thread::sleep(Duration::from_secs(2)); // past the 2 s hello timeout
    let after = threads();
    println!(
        "flood: {} raw connections that never say hello: threads {base} -> {peak} -> {after} \
         after the hello timeout; CPU while they wait {flood_cpu:.3} cores",
        flood.len()
    );
    drop(flood);

    // 2. Established, idle QPs, in steps, each connected to a QP in the child.
    let exe = std::env::current_exe().map_err(|e| bad_peer(&format!("cannot start: {e}")))?;
    let mut child = Command::new(exe)
        .args(["--peer", &most.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .map_err(|e| bad_peer(&format!("cannot start: {e}")))?;
    let mut to_peer = child.stdin.take().ok_or_else(|| bad_peer("has no stdin"))?;
    let mut from_peer = BufReader::new(
        child
            .stdout
            .take()
            .ok_or_else(|| bad_peer("has no stdout"))?,
    )
    .lines()
    .map_while(Result::ok);
    println!("QPs  connections  threads  idle CPU (cores)");
    let mut qps = Vec::new();
    for &step in &steps {
        let count = step.saturating_sub(qps.len());
        let start = qps.len();
        let mut request = format!("{count}\n");
        for _ in 0..count {
            let x = pa.create_qp(&ca, &ca, &QpConfig::default())?;
            x.modify_to_init()?;
            request += &format!("{}\n", x.endpoint().to_hex());
            qps.push(x);
        }
        to_peer
            .write_all(request.as_bytes())
            .map_err(|_| bad_peer("went away"))?;
        let theirs: Vec<String> = from_peer.by_ref().take(count).collect();
        for (x, ep) in qps[start..].iter().zip(&theirs) {
            connect(x, ep)?;
        }
        if from_peer.next().as_deref() != Some("ok") {
            return Err(bad_peer("did not connect"));
        }
        std::thread::sleep(Duration::from_secs(1));
        println!(
            "{step:>5}  {:>11}  {:>7}  {:>16.4}",
            2 * step,
            threads(),
            idle_cpu(5)
        );
    }
    drop(to_peer);
    let _ = child.wait();
    Ok(())
}
