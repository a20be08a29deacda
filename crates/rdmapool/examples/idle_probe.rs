//! Measures what idle connections cost a soft NIC: opens N raw TCP connections to its data
//! port (they never say hello, then, once the hello timeout closed them, N more that did
//! not get that far), and reports threads and CPU time of this process while they sit idle.
//!
//! `cargo run --release -p rdmapool --example idle_probe -- 2000`

use rdmapool::fabric::SoftConfig;
use rdmapool::fabric::{Context, QpConfig};
use std::net::TcpStream;
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

fn main() -> rdmapool::Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let pairs: usize = std::env::args()
        .nth(2)
        .and_then(|a| a.parse().ok())
        .unwrap_or(200);
    let (a, b) = (
        Context::open(SoftConfig::from_env()?)?,
        Context::open(SoftConfig::from_env()?)?,
    );
    let (pa, ca) = (a.alloc_pd()?, a.create_cq(4096)?);
    let (pb, cb) = (b.alloc_pd()?, b.create_cq(4096)?);
    let qp = pb.create_qp(&cb, &cb, &QpConfig::default())?;
    let addr = rdmapool::soft::tcp_addr(&qp.endpoint()).expect("a soft endpoint");
    let base = threads();

    // 1. A flood of connections that never say hello.
    let flood: Vec<TcpStream> = (0..n)
        .filter_map(|_| TcpStream::connect(addr).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let peak = threads();
    std::thread::sleep(Duration::from_secs(3)); // past the 2 s hello timeout
    let after = threads();
    println!(
        "flood: {} raw connections that never say hello: threads {base} -> {peak} (at most 256 \
         admitted from one address) -> {after} after the hello timeout",
        flood.len()
    );
    drop(flood);

    // 2. Established, idle QP pairs (two connections each).
    let mut qps = Vec::new();
    for _ in 0..pairs {
        let x = pa.create_qp(&ca, &ca, &QpConfig::default())?;
        let y = pb.create_qp(&cb, &cb, &QpConfig::default())?;
        x.modify_to_init()?;
        y.modify_to_init()?;
        x.modify_to_rtr(&y.endpoint())?;
        y.modify_to_rtr(&x.endpoint())?;
        x.modify_to_rts()?;
        y.modify_to_rts()?;
        qps.push((x, y));
    }
    std::thread::sleep(Duration::from_secs(2));
    println!(
        "idle: {pairs} connected QP pairs ({} connections): threads {}, CPU while idle {:.3} cores",
        2 * pairs,
        threads(),
        idle_cpu(5)
    );
    Ok(())
}
