//! Raw references measured in the same run: memcpy, a busy-polled shared-memory ping-pong
//! between two threads, and busy-polled TCP / Unix-socket ping-pong and stream against the
//! peer process's echo servers.

use super::Stats;
use crate::peer::{spin_read, spin_write, EchoSocket};
use crate::{Result, ToolError};
use std::net::TcpStream;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr as UnixAddr, UnixStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

/// Single-thread memcpy bandwidth for `size`-byte copies, GB/s.
///
/// Source and destination both start on a page boundary, as registered regions do. Where
/// the heap happened to put them matters: on this AMD EPYC (FSRM) with Debian's glibc 2.36,
/// `rep movsb` copies 64 KiB at ~48 GB/s when the two addresses are congruent modulo 64,
/// and at ~2.9 GB/s when they differ by 16, so two plain `Vec`s made the reference swing by
/// 15x from one run to the next.
pub fn memcpy_gbps(size: usize, total_bytes: usize) -> f64 {
    const PAGE: usize = 4096;
    let mut src_buf = vec![0x5au8; size + PAGE];
    let mut dst_buf = vec![0u8; size + PAGE];
    let at = |b: &[u8]| b.as_ptr().align_offset(PAGE).min(PAGE);
    let (s, d) = (at(&src_buf), at(&dst_buf));
    let src = &mut src_buf[s..s + size];
    let dst = &mut dst_buf[d..d + size];
    let reps = (total_bytes / size).max(8);
    dst.copy_from_slice(src); // fault the pages in first
    let t = Instant::now();
    for i in 0..reps {
        dst.copy_from_slice(src);
        std::hint::black_box(&mut dst[i % size]);
    }
    (reps * size) as f64 / t.elapsed().as_nanos() as f64
}

/// Round trip of a busy-polled ping-pong through one shared cache line (two threads).
pub fn shm_pingpong(iters: u64) -> Stats {
    let flag = AtomicU64::new(0);
    let mut samples = Vec::with_capacity(iters as usize);
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..iters {
                while flag.load(Ordering::Acquire) != 2 * i + 1 {
                    std::hint::spin_loop();
                }
                flag.store(2 * i + 2, Ordering::Release);
            }
        });
        for i in 0..iters {
            let t = Instant::now();
            flag.store(2 * i + 1, Ordering::Release);
            while flag.load(Ordering::Acquire) != 2 * i + 2 {
                std::hint::spin_loop();
            }
            samples.push(t.elapsed().as_nanos() as u64);
        }
    });
    Stats::from_samples(&samples)
}

/// Which echo server to talk to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sock {
    /// Loopback TCP (Nagle off).
    Tcp,
    /// Unix stream socket.
    Unix,
}

fn connect(kind: Sock, echo: &(String, String)) -> Result<Box<dyn EchoSocket>> {
    let io = |e| ToolError::Io(format!("connecting to the {kind:?} echo server"), e);
    let s: Box<dyn EchoSocket> = match kind {
        Sock::Tcp => {
            let s = TcpStream::connect(&echo.0).map_err(io)?;
            s.set_nodelay(true).map_err(io)?;
            Box::new(s)
        }
        Sock::Unix => {
            let addr = UnixAddr::from_abstract_name(echo.1.as_bytes()).map_err(io)?;
            Box::new(UnixStream::connect_addr(&addr).map_err(io)?)
        }
    };
    s.nonblocking().map_err(io)?;
    Ok(s)
}

fn header(req: usize, resp: usize) -> [u8; 8] {
    let mut h = [0u8; 8];
    h[..4].copy_from_slice(&(req as u32).to_le_bytes());
    h[4..].copy_from_slice(&(resp as u32).to_le_bytes());
    h
}

/// Busy-polled ping-pong: send `req` bytes, receive `resp` bytes, per iteration.
pub fn pingpong(
    kind: Sock,
    echo: &(String, String),
    req: usize,
    resp: usize,
    iters: u64,
) -> Result<Stats> {
    let mut s = connect(kind, echo)?;
    let mut out = header(req, resp).to_vec();
    out.resize(8 + req, 0x33);
    let mut inbuf = vec![0u8; resp];
    let io = |e| ToolError::Io(format!("{kind:?} ping-pong"), e);
    let warm = (iters / 10).max(10);
    let mut samples = Vec::with_capacity(iters as usize);
    for i in 0..warm + iters {
        let t = Instant::now();
        spin_write(&mut s, &out).map_err(io)?;
        spin_read(&mut s, &mut inbuf).map_err(io)?;
        if i >= warm {
            samples.push(t.elapsed().as_nanos() as u64);
        }
    }
    Ok(Stats::from_samples(&samples))
}

/// Busy-polled one-way stream of `size`-byte messages, GB/s (payload bytes only).
pub fn stream_gbps(kind: Sock, echo: &(String, String), size: usize, count: u64) -> Result<f64> {
    let mut s = connect(kind, echo)?;
    let mut msg = header(size, 0).to_vec();
    msg.resize(8 + size, 0x44);
    let io = |e| ToolError::Io(format!("{kind:?} stream"), e);
    let t = Instant::now();
    for _ in 0..count {
        spin_write(&mut s, &msg).map_err(io)?;
    }
    spin_write(&mut s, &header(0, 8)).map_err(io)?;
    spin_read(&mut s, &mut [0u8; 8]).map_err(io)?;
    Ok((size as u64 * count) as f64 / t.elapsed().as_nanos() as f64)
}
