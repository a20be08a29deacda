//! `rdma-tool bench reg`: what registration costs and what the registrar, cache and pools
//! save, each result next to its reference from the same run.

use crate::device_args::DeviceArgs;
use crate::progress::Steps;
use crate::units::{show, size_arg};
use crate::{Result, ToolError};
use rdmapool::buf::{BufferPool, PoolConfig};
use rdmapool::fabric::*;
use rdmapool::mr::{
    CacheConfig, HugeOptions, HugeRegion, RegCache, Registrar, RegistrarConfig, HUGE_PAGE,
};
use serde::Serialize;
use std::time::{Duration, Instant};

/// Arguments of `bench reg`.
#[derive(clap::Args)]
pub struct Args {
    /// Region size for the caller-blocking benchmark.
    #[arg(long, default_value = "512M", value_parser = size_arg)]
    async_size: usize,
    /// Region size for the page-size benchmark.
    #[arg(long, default_value = "1G", value_parser = size_arg)]
    page_size_region: usize,
    /// Region size for the parallel-registration benchmark.
    #[arg(long, default_value = "4G", value_parser = size_arg)]
    parallel_size: usize,
    #[command(flatten)]
    device: DeviceArgs,
    /// Print JSON lines instead of a table.
    #[arg(long)]
    json: bool,
    /// Also draw each result as a ratio to its reference, as bars (`.svg` or `.png`).
    #[arg(long)]
    plot: Option<std::path::PathBuf>,
}

/// One result.
#[derive(Debug, Serialize)]
struct Row {
    name: String,
    value: f64,
    unit: String,
    reference: String,
    reference_value: f64,
    ratio: f64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn pct(mut v: Vec<f64>, q: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// An anonymous mapping, optionally 2 MiB aligned, with THP forbidden (4 KiB pages).
struct Plain {
    ptr: *mut u8,
    len: usize,
    span: (*mut libc::c_void, usize),
}

impl Plain {
    fn new(len: usize, aligned: bool) -> Result<Self> {
        let span = len + if aligned { HUGE_PAGE } else { 0 };
        // SAFETY: a fresh anonymous mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                span,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(ToolError::Msg("mmap failed".into()));
        }
        let start = if aligned {
            (p as usize + HUGE_PAGE - 1) & !(HUGE_PAGE - 1)
        } else {
            p as usize
        };
        // SAFETY: advice on our own mapping.
        unsafe { libc::madvise(p, span, libc::MADV_NOHUGEPAGE) };
        Ok(Self {
            ptr: start as *mut u8,
            len,
            span: (p, span),
        })
    }
}

impl Drop for Plain {
    fn drop(&mut self) {
        // SAFETY: the whole mapping we made.
        unsafe { libc::munmap(self.span.0, self.span.1) };
    }
}

/// Writes one byte per 4 KiB page, so registration measures pinning, not first-touch faults
/// (the kernel zeroing fresh pages).
fn touch(ptr: *mut u8, len: usize) {
    for off in (0..len).step_by(4096) {
        // SAFETY: inside the caller's live mapping.
        unsafe { std::ptr::write_volatile(ptr.add(off), 1) };
    }
}

/// Registers `len` bytes at `ptr` once and returns how long it took.
fn time_register(pd: &Pd, ptr: *mut u8, len: usize) -> Result<Duration> {
    let t = Instant::now();
    // SAFETY: the caller's mapping outlives the registration dropped right here.
    let mr = unsafe { pd.register_raw(ptr, len, AccessFlags::all_remote())? };
    let d = t.elapsed();
    let t = Instant::now();
    drop(mr);
    tracing::info!(
        "registered {len} bytes in {d:?}, deregistered in {:?}",
        t.elapsed()
    );
    Ok(d)
}

/// Runs the benchmarks and prints them.
pub fn run(args: Args) -> Result<()> {
    if let Some(p) = &args.plot {
        crate::plot::check_path(p)?;
    }
    crate::units::fits_in_memory("--async-size", args.async_size)?;
    crate::units::fits_in_memory("--page-size-region", args.page_size_region)?;
    crate::units::fits_in_memory("--parallel-size", args.parallel_size)?;
    let open = || args.device.open(Transport::Auto);
    let ctx = open()?;
    let pd = ctx.alloc_pd()?;
    let mut rows = Vec::new();
    let mut bar = Steps::new("bench reg", 5, args.json);
    bar.set_message("caller-blocking time, async vs sync".into());

    // 1. Caller-blocking time of an asynchronous registration vs a synchronous one.
    let size = args.async_size;
    let reg = Registrar::new(pd.clone(), RegistrarConfig::default())?;
    let mut blocked = Vec::new();
    for _ in 0..40 {
        let t = Instant::now();
        let h = reg.submit(size, AccessFlags::all_remote());
        blocked.push(t.elapsed().as_secs_f64() * 1e6);
        drop(h.wait()?);
    }
    let mut sync = Vec::new();
    for _ in 0..5 {
        let t = Instant::now();
        let mr = pd.alloc_mr(size, AccessFlags::all_remote())?;
        sync.push(t.elapsed().as_secs_f64() * 1e6);
        drop(mr);
    }
    let (p99, sync_med) = (pct(blocked.clone(), 0.99), pct(sync, 0.5));
    rows.push(Row {
        name: format!(
            "async registration of {}: caller blocked, p99",
            show(args.async_size)
        ),
        value: p99,
        unit: "us".into(),
        reference: "synchronous registration, median".into(),
        reference_value: sync_med,
        ratio: sync_med / p99,
    });

    bar.inc();
    bar.set_message("cache hit vs miss".into());

    // 2. Cache hit vs miss.
    let cache = RegCache::new(pd.clone(), CacheConfig::default())?;
    let buf = vec![0u8; 1 << 20];
    // SAFETY: `buf` outlives every handle below.
    drop(unsafe { cache.get(buf.as_ptr(), buf.len())? });
    let mut hits = Vec::new();
    for _ in 0..200 {
        let t = Instant::now();
        for _ in 0..1000 {
            // SAFETY: as above.
            std::hint::black_box(unsafe { cache.get(buf[64..].as_ptr(), 4096)? });
        }
        hits.push(t.elapsed().as_nanos() as f64 / 1000.0);
    }
    let mut misses = Vec::new();
    for _ in 0..200 {
        cache.invalidate(buf.as_ptr(), buf.len());
        let t = Instant::now();
        // SAFETY: as above.
        drop(unsafe { cache.get(buf.as_ptr(), 4096)? });
        misses.push(t.elapsed().as_nanos() as f64);
    }
    let (hit, miss) = (pct(hits, 0.5), pct(misses, 0.5));
    let note = if cache.monitoring().is_ok() {
        ""
    } else {
        " (no monitor: uncached!)"
    };
    rows.push(Row {
        name: format!("cache hit, median{note}"),
        value: hit,
        unit: "ns".into(),
        reference: "cache miss (registers 4 KiB), median".into(),
        reference_value: miss,
        ratio: miss / hit,
    });

    bar.inc();
    bar.set_message("pooled buffers vs per-transfer registration".into());

    // 3. The seeds' pattern A vs B: 4 KiB transfers from pooled buffers vs registering per
    //    transfer (register, WRITE, deregister).
    let peer = open()?;
    let (ppd, pcq, cq) = (peer.alloc_pd()?, peer.create_cq(64)?, ctx.create_cq(64)?);
    let cfg = QpConfig::default();
    let (qa, qb) = (
        pd.create_qp(&cq, &cq, &cfg)?,
        ppd.create_qp(&pcq, &pcq, &cfg)?,
    );
    qa.connect(&qb.endpoint())?;
    qb.connect(&qa.endpoint())?;
    let target = ppd.alloc_mr(1 << 20, AccessFlags::all_remote())?;
    let pool = BufferPool::new(pd.clone(), PoolConfig::default())?;
    let write = |sge: Sge| -> Result<()> {
        qa.post_send(&[SendWr {
            wr_id: 0,
            op: WrOp::Write {
                remote: target.remote_at(0)?,
                imm: None,
            },
            sg_list: &[sge],
            signaled: true,
        }])?;
        let c = cq.wait(1, Duration::from_secs(10))?;
        if c.first().is_none_or(|c| !c.is_ok()) {
            return Err(ToolError::Msg("a benchmark WRITE failed".into()));
        }
        Ok(())
    };
    let n = 20_000;
    let t = Instant::now();
    for _ in 0..n {
        let b = pool.alloc(4096)?;
        write(b.sge(0, 4096)?)?;
    }
    let pooled = n as f64 / t.elapsed().as_secs_f64();
    let m = 2_000;
    let t = Instant::now();
    for _ in 0..m {
        let mr = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
        write(mr.sge(0, 4096)?)?;
    }
    let per_transfer = m as f64 / t.elapsed().as_secs_f64();
    rows.push(Row {
        name: "4 KiB transfers, pooled pre-registered buffers (pattern B)".into(),
        value: pooled,
        unit: "ops/s".into(),
        reference: "register + deregister per transfer (pattern A)".into(),
        reference_value: per_transfer,
        ratio: pooled / per_transfer,
    });

    bar.inc();
    bar.set_message(format!("page size, {}", show(args.page_size_region)));

    // 4. Page size and alignment.
    let len = args.page_size_region.div_ceil(HUGE_PAGE) * HUGE_PAGE;
    let huge = HugeRegion::alloc(
        len,
        HugeOptions {
            try_hugetlb: true,
            pretouch_threads: 0,
        },
    )?;
    touch(huge.as_ptr(), len);
    let t_huge = time_register(&pd, huge.as_ptr(), len)?;
    let backing = format!(
        "{:?}, {} MiB of THP",
        huge.backing(),
        huge.thp_bytes() >> 20
    );
    drop(huge);
    let small = Plain::new(len, false)?;
    touch(small.ptr, len);
    let t_small = time_register(&pd, small.ptr, small.len)?;
    drop(small);
    let aligned = Plain::new(len, true)?;
    touch(aligned.ptr, len);
    let t_aligned = time_register(&pd, aligned.ptr, aligned.len)?;
    drop(aligned);
    rows.push(Row {
        name: format!(
            "register {} on 2 MiB pages ({backing})",
            show(args.page_size_region)
        ),
        value: ms(t_huge),
        unit: "ms".into(),
        reference: "4 KiB pages".into(),
        reference_value: ms(t_small),
        ratio: ms(t_small) / ms(t_huge),
    });
    rows.push(Row {
        name: format!(
            "register {} on 2 MiB-aligned 4 KiB pages",
            show(args.page_size_region)
        ),
        value: ms(t_aligned),
        unit: "ms".into(),
        reference: "4 KiB pages, unaligned".into(),
        reference_value: ms(t_small),
        ratio: ms(t_small) / ms(t_aligned),
    });

    bar.inc();
    bar.set_message(format!(
        "parallel registration, {}",
        show(args.parallel_size)
    ));

    // 5. A large region: parallel chunked registration vs one call.
    let len = args.parallel_size.div_ceil(HUGE_PAGE) * HUGE_PAGE;
    let region = Plain::new(len, true)?;
    touch(region.ptr, len);
    let t = Instant::now();
    // SAFETY: `region` outlives the registration, dropped right after.
    drop(unsafe { pd.register_raw(region.ptr, len, AccessFlags::all_remote())? });
    let one = t.elapsed();
    drop(region);
    let region = Plain::new(len, true)?;
    touch(region.ptr, len);
    let chunks = 8;
    let chunk = len / chunks;
    let par = Registrar::new(
        pd.clone(),
        RegistrarConfig {
            workers: 2,
            ..RegistrarConfig::default()
        },
    )?;
    let t = Instant::now();
    // SAFETY: `region` outlives the chunked registration, dropped below.
    let mrs = unsafe { par.register_chunked(region.ptr, len, chunk, ctx.device().max_mr_size)? };
    let parallel = t.elapsed();
    drop(mrs);
    drop(region);
    let gbps = |d: Duration| len as f64 / d.as_secs_f64() / 1e9;
    rows.push(Row {
        name: format!(
            "register {} in {chunks} chunks on 2 workers",
            show(args.parallel_size)
        ),
        value: gbps(parallel),
        unit: "GB/s".into(),
        reference: "one registration call".into(),
        reference_value: gbps(one),
        ratio: gbps(parallel) / gbps(one),
    });
    bar.inc();
    bar.finish();

    if let Some(path) = &args.plot {
        let pairs: Vec<crate::plot::BarPair> = rows
            .iter()
            .enumerate()
            .map(|(i, r)| crate::plot::BarPair {
                label: format!("#{}", i + 1),
                ours: r.ratio,
                reference: 1.0,
            })
            .collect();
        crate::plot::bars(
            path,
            &format!(
                "bench reg on {}: each result / its reference",
                args.device.kind()
            ),
            "ratio to the reference (1 = equal)",
            "reference",
            &pairs,
        )?;
    }
    if args.json {
        for r in &rows {
            crate::outln!(
                "{}",
                serde_json::to_string(r).expect("JSON of plain values")
            );
        }
    } else {
        crate::outln!(
            "{:<66} {:>12} {:<6} {:<40} {:>12} {:>8}",
            "benchmark",
            "value",
            "unit",
            "reference",
            "ref value",
            "ratio"
        );
        for r in &rows {
            crate::outln!(
                "{:<66} {:>12.2} {:<6} {:<40} {:>12.2} {:>8.2}",
                r.name,
                r.value,
                r.unit,
                r.reference,
                r.reference_value,
                r.ratio
            );
        }
    }
    Ok(())
}
