//! Measures what idle connections cost a soft NIC: opens N raw TCP connections to its data
//! port (they never say hello, then, once the hello timeout closed them, N more that did
//! not get that far), and reports threads and CPU time of this process while they sit idle.
//!
//! `cargo run --release -p rdmapool --example idle_probe -- 2000`

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

fn main() -> rdmapool::Result<()> {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(2000);
    let ctx = Context::open_soft()?;
    let (pd, cq) = (ctx.alloc_pd()?, ctx.create_cq(16)?);
    let qp = pd.create_qp(&cq, &cq, &QpConfig::default())?;
    let addr = rdmapool::soft::tcp_addr(&qp.endpoint()).expect("a soft endpoint");
    let before = threads();
    let conns: Vec<TcpStream> = (0..n)
        .filter_map(|_| TcpStream::connect(addr).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let during = threads();
    let (c0, t0) = (cpu_seconds(), Instant::now());
    std::thread::sleep(Duration::from_secs(5));
    let idle_cpu = (cpu_seconds() - c0) / t0.elapsed().as_secs_f64();
    println!(
        "{n} idle connections: {} connected, threads {before} -> {during}, CPU while idle {idle_cpu:.3} cores",
        conns.len()
    );
    Ok(())
}
