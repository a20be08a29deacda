//! `rdma-tool bench copy`: the intra-host path's copy ([`copy_bytes`]) at every relative
//! alignment 0..63 of source and destination, against the C library's `memcpy` of the same
//! size with both sides 64-byte aligned, measured back to back in the same run. The C
//! library's own copy at the same misalignments is printed beside it, which shows the cliff
//! the routine avoids.

use super::report::{print_json, print_table, Row};
use crate::units::{message_size_arg, show};
use crate::{Result, ToolError};
use rdmapool::mr::copy_bytes;
use std::time::Instant;

/// Arguments of `bench copy`.
#[derive(clap::Args)]
pub struct Args {
    /// Copy sizes, comma-separated (each from 4K to 64M).
    #[arg(long, value_delimiter = ',', value_parser = message_size_arg,
          default_value = "4K,16K,64K,256K,1M,4M")]
    size: Vec<usize>,
    /// Bytes copied per measurement, from 64K to 1G (more: steadier figures, longer run).
    #[arg(long, default_value = "32M", value_parser = message_size_arg)]
    volume: usize,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    json: bool,
}

/// Measurements per figure; the best one counts (the least disturbed by the other core).
const BEST_OF: usize = 5;

/// A buffer whose start is 4 KiB aligned, with 128 spare bytes for the offsets.
struct Buf {
    bytes: Vec<u8>,
    start: usize,
}

impl Buf {
    fn new(len: usize) -> Self {
        let bytes = vec![1u8; len + 4096 + 128];
        let start = bytes.as_ptr().align_offset(4096);
        Self { bytes, start }
    }

    fn at(&mut self, offset: usize) -> *mut u8 {
        self.bytes[self.start + offset..].as_mut_ptr()
    }
}

/// Which copy to time.
#[derive(Clone, Copy)]
enum Method {
    Ours,
    Libc,
}

/// GB/s of `method` copying `size` bytes from `src + s` to `dst + d`, best of [`BEST_OF`].
fn gbps(
    method: Method,
    src: &mut Buf,
    dst: &mut Buf,
    s: usize,
    d: usize,
    size: usize,
    volume: usize,
) -> f64 {
    let reps = (volume / size).max(1);
    let (from, to) = (src.at(s) as *const u8, dst.at(d));
    let mut best = f64::MAX;
    for _ in 0..BEST_OF {
        let t = Instant::now();
        for _ in 0..reps {
            // SAFETY: both buffers have size + 128 bytes past their aligned start and the
            // offsets are below 128; they are distinct allocations.
            unsafe {
                match method {
                    Method::Ours => copy_bytes(to, from, size),
                    Method::Libc => std::ptr::copy_nonoverlapping(from, to, size),
                }
            }
            std::hint::black_box(to);
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    (reps * size) as f64 / best / 1e9
}

/// Runs the benchmark and prints the table or JSON.
pub fn run(args: Args) -> Result<()> {
    if let Some(&bad) = args.size.iter().find(|&&s| !(4096..=64 << 20).contains(&s)) {
        return Err(ToolError::Msg(format!(
            "--size {}: from 4K to 64M",
            show(bad)
        )));
    }
    if !(64 << 10..=1 << 30).contains(&args.volume) {
        return Err(ToolError::Msg(format!(
            "--volume {}: from 64K to 1G",
            show(args.volume)
        )));
    }
    let mut rows = Vec::new();
    for &size in &args.size {
        let volume = args.volume.max(size);
        let (mut src, mut dst) = (Buf::new(size), Buf::new(size));
        // The reference first, once, to warm both buffers.
        gbps(Method::Libc, &mut src, &mut dst, 0, 0, size, volume);
        let mut worst_ours = (f64::MAX, (0, 0), 0.0);
        let mut worst_libc = (f64::MAX, (0, 0), 0.0);
        for (s, d) in (0..64).map(|o| (o, 0)).chain((1..64).map(|o| (0, o))) {
            // The reference is measured next to each figure, so a burst of load on the
            // other core hits both.
            let aligned = gbps(Method::Libc, &mut src, &mut dst, 0, 0, size, volume);
            let ours = gbps(Method::Ours, &mut src, &mut dst, s, d, size, volume);
            let libc = gbps(Method::Libc, &mut src, &mut dst, s, d, size, volume);
            if ours / aligned < worst_ours.0 {
                worst_ours = (ours / aligned, (s, d), aligned);
            }
            if libc / aligned < worst_libc.0 {
                worst_libc = (libc / aligned, (s, d), aligned);
            }
        }
        for (name, (ratio, offset, aligned)) in
            [("copy_bytes", worst_ours), ("libc memcpy", worst_libc)]
        {
            rows.push(Row {
                provider: "soft".into(),
                transport: "local".into(),
                op: format!("{name} {}/{}", offset.0, offset.1),
                metric: "bandwidth".into(),
                size,
                iters: (volume / size) as u64,
                median_ns: 0.0,
                p99_ns: 0.0,
                gbps: ratio * aligned,
                mops: 0.0,
                reference: "memcpy, both 64 B aligned".into(),
                reference_value: aligned,
                ratio,
            });
        }
    }
    if args.json {
        print_json(&rows);
    } else {
        print_table(&rows);
        let worst = rows
            .iter()
            .filter(|r| r.op.starts_with("copy_bytes"))
            .map(|r| r.ratio)
            .fold(f64::MAX, f64::min);
        crate::outln!(
            "\ncopy_bytes at its worst relative alignment (0..63), every size: {worst:.2}x the aligned memcpy (goal >= 0.8)"
        );
    }
    Ok(())
}
