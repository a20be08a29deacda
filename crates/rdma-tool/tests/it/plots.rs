//! `--plot` run for real: the files parse (SVG as XML, PNG decoded) and carry the series the
//! run measured; a format other than SVG or PNG is refused before anything runs. Times are
//! never asserted.

use std::path::PathBuf;
use std::process::Command;

const EXE: &str = env!("CARGO_BIN_EXE_rdma-tool");

fn temp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rdma-tool-plot-{}-{name}", std::process::id()))
}

/// Runs the tool; the plot file's bytes (removed after reading).
fn plotted(args: &[&str], name: &str) -> Vec<u8> {
    let path = temp(name);
    let out = Command::new(EXE)
        .args(args)
        .arg("--plot")
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let bytes = std::fs::read(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    bytes
}

/// Every text of the SVG (titles, axis descriptions, legend entries), after parsing it.
fn svg_texts(bytes: &[u8]) -> Vec<String> {
    let text = std::str::from_utf8(bytes).unwrap();
    let doc = roxmltree::Document::parse(text).expect("the plot parses as XML");
    assert_eq!(doc.root_element().tag_name().name(), "svg");
    doc.descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| n.text().unwrap_or("").trim().to_string())
        .collect()
}

fn lines(bytes: &[u8]) -> usize {
    let text = std::str::from_utf8(bytes).unwrap();
    let doc = roxmltree::Document::parse(text).unwrap();
    doc.descendants()
        .filter(|n| n.has_tag_name("polyline"))
        .count()
}

#[test]
fn bench_data_plots_ours_next_to_each_reference_by_size() {
    let svg = plotted(
        &[
            "bench", "data", "--op", "write", "--size", "64,4K", "--iters", "50", "--no-ucx",
            "--json",
        ],
        "data.svg",
    );
    let texts = svg_texts(&svg);
    for want in [
        "write: latency by message size",
        "write: bandwidth by message size",
        "message size (bytes, log scale)",
        "median round trip (µs, log scale)",
        "throughput (GB/s, log scale)",
        "rdmapool soft local",
        "memcpy (1 thread)",
        "unix ping-pong (busy-poll)",
        "unix stream (busy-poll)",
    ] {
        assert!(texts.iter().any(|t| t == want), "{want:?} not in {texts:?}");
    }
    // Ours in both panels, and a line per reference with more than one size.
    assert!(lines(&svg) >= 4, "{} lines", lines(&svg));
}

#[test]
fn bench_data_engine_modes_plot_as_labelled_bar_pairs() {
    let svg = plotted(
        &[
            "bench", "data", "--async", "--batch", "4", "--count", "2000", "--iters", "200",
            "--json",
        ],
        "engine.svg",
    );
    let texts = svg_texts(&svg);
    for want in [
        "latency of write async: each next to its reference",
        "median 8 B WRITE round trip (µs)",
        "message rate (Mop/s)",
        "reference: raw post + busy-poll",
        "caller-driven",
        "write raw list 4",
        "write async batch 4",
        "read raw list 4",
        "faa raw list 4",
    ] {
        assert!(texts.iter().any(|t| t == want), "{want:?} not in {texts:?}");
    }
}

#[test]
fn bench_ycsb_plots_throughput_by_client_count_per_workload() {
    let svg = plotted(
        &[
            "bench",
            "ycsb",
            "--workload",
            "c,a",
            "--records",
            "100",
            "--duration",
            "100ms",
            "--clients",
            "1,2",
            "--transport",
            "local",
            "--no-redis",
            "--no-memcached",
            "--json",
        ],
        "ycsb.svg",
    );
    let texts = svg_texts(&svg);
    for want in [
        "rdma-tool bench ycsb on soft: ours next to Redis and memcached",
        "ycsb-c: throughput by client count",
        "ycsb-a: throughput by client count",
        "clients",
        "operations per second (Mop/s, log scale)",
        "rdmapool soft local",
    ] {
        assert!(texts.iter().any(|t| t == want), "{want:?} not in {texts:?}");
    }
    // Ours in both panels, a line of two points each.
    assert!(lines(&svg) >= 2, "{} lines", lines(&svg));
}

/// `--hit-rate` with a workload: the throughput panel and, beside it, a hit-rate panel per
/// stream, ours and the exact LRU by cache size.
#[test]
fn bench_ycsb_plots_hit_rate_beside_throughput() {
    let svg = plotted(
        &[
            "bench",
            "ycsb",
            "--hit-rate",
            "--cache-sizes",
            "10,50",
            "--hit-gets",
            "1000",
            "--workload",
            "c",
            "--records",
            "200",
            "--duration",
            "100ms",
            "--clients",
            "1",
            "--transport",
            "local",
            "--no-redis",
            "--no-memcached",
            "--json",
        ],
        "ycsb-hit.svg",
    );
    let texts = svg_texts(&svg);
    for want in [
        "rdma-tool bench ycsb on soft: ours next to Redis, memcached and exact LRU",
        "ycsb-c: throughput by client count",
        "hit-zipf: hit rate by cache size",
        "hit-scan: hit rate by cache size",
        "cache size (% of the working set, log scale)",
        "hit rate (hits / gets)",
        "rdmapool soft local",
        "exact-lru",
    ] {
        assert!(texts.iter().any(|t| t == want), "{want:?} not in {texts:?}");
    }
    // Ours and the exact LRU in both hit-rate panels, two cache sizes each.
    assert!(lines(&svg) >= 4, "{} lines", lines(&svg));
}

#[test]
fn monitor_plots_each_percentile_over_time() {
    let svg = plotted(
        &[
            "monitor",
            "--count",
            "3",
            "--interval",
            "200ms",
            "--percentile",
            "50,99",
            "--json",
        ],
        "monitor.svg",
    );
    let texts = svg_texts(&svg);
    for want in [
        "rdma-tool monitor reg_latency of the probe workload",
        "latency (µs)",
        "time since the monitor started (s)",
        "p50",
        "p99",
    ] {
        assert!(texts.iter().any(|t| t == want), "{want:?} not in {texts:?}");
    }
    assert!(!texts.iter().any(|t| t == "p99.9"), "only what was asked");
}

#[test]
fn a_png_plot_decodes_at_its_size_with_more_than_one_colour() {
    let bytes = plotted(
        &[
            "stress",
            "--size=4M",
            "--count=3",
            "--threads=2",
            "--small-pages",
        ],
        "stress.png",
    );
    let decoder = png::Decoder::new(std::io::Cursor::new(bytes));
    let mut reader = decoder.read_info().expect("a PNG header");
    let mut buf = vec![0; reader.output_buffer_size()];
    let info = reader.next_frame(&mut buf).expect("a PNG frame");
    // 900 x 540 for the chart, and the legend under it: 16 px and 22 a series (three here).
    assert_eq!((info.width, info.height), (900, 540 + 16 + 22 * 3));
    let px = info.color_type.samples();
    let pixels = &buf[..info.buffer_size()];
    let first = &pixels[..px];
    let mut colours = std::collections::HashSet::new();
    for p in pixels.chunks(px) {
        colours.insert(p.to_vec());
    }
    assert!(
        colours.len() > 3,
        "{} colours: a blank or one-colour image",
        colours.len()
    );
    // White background, and some pixels of the series colours (not only greys of text).
    assert_eq!(first, &[255, 255, 255][..px.min(3)]);
    assert!(colours
        .iter()
        .any(|c| c.len() >= 3 && (c[0] != c[1] || c[1] != c[2])));
}

#[test]
fn another_extension_is_refused_before_the_run_naming_the_two_that_work() {
    for args in [
        &[
            "bench", "data", "--op", "write", "--size", "8", "--plot", "out.jpg",
        ][..],
        &["monitor", "--count", "1", "--plot", "out.gif"][..],
        &["stress", "--mix", "pool", "--count", "1", "--plot", "out"][..],
        &["bench", "reg", "--plot", "out.pdf"][..],
    ] {
        let out = Command::new(EXE).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(err.contains("*.svg or *.png"), "{args:?}: {err}");
        assert!(out.stdout.is_empty(), "nothing ran: {args:?}");
    }
}

#[test]
fn sigterm_ends_the_monitor_cleanly_with_its_plot_written() {
    use std::io::{BufRead, BufReader};
    let path = temp("sigterm.svg");
    let mut child = Command::new(EXE)
        .args(["monitor", "--interval", "200ms", "--json", "--plot"])
        .arg(&path)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Two samples printed: it is in its loop (no --count: it would run until stopped).
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    for _ in 0..2 {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "monitor ended early");
    }
    // SAFETY: kill with a pid of our own child and a valid signal number.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "a clean exit, not death by signal");
    let svg = std::fs::read(&path).expect("the plot was written on SIGTERM");
    let _ = std::fs::remove_file(&path);
    let texts = svg_texts(&svg);
    assert!(texts.iter().any(|t| t == "p50"), "{texts:?}");
}
