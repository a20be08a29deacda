//! `rdma-tool stress` run for real: the seed command (fewer rounds), both memory modes, the
//! JSON schema, a limit that cannot change (RLIMIT_MEMLOCK) stopping the run at once, and
//! SIGINT/SIGTERM ending a run with the summary of what it did.

use std::os::unix::process::CommandExt;
use std::process::Command;

const EXE: &str = env!("CARGO_BIN_EXE_rdma-tool");

fn stress_json(args: &[&str]) -> serde_json::Value {
    let out = Command::new(EXE)
        .arg("stress")
        .args(args)
        .arg("--json")
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn the_seed_command_measures_pooled_registration_on_huge_pages() {
    let v = stress_json(&["--size=1G", "--count=20", "--threads=16"]);
    assert_eq!(v["memory"], "pooled");
    assert_eq!(v["hugepages"], true, "64 MiB regions take 2 MiB pages");
    assert_eq!(v["rounds_done"], 20);
    assert_eq!(v["registered_bytes"], 20u64 << 30);
    assert_eq!(v["failures"], 0);
    assert_eq!(v["registration_us"]["samples"], 320);
    assert_eq!(v["deregistration_us"]["samples"], 320);
    assert_eq!(
        v["allocation_us"]["samples"], 16,
        "allocated once per thread"
    );
    assert!(v["registered_gbytes_per_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn fresh_memory_is_allocated_every_round_and_timed_apart() {
    let v = stress_json(&[
        "--size=8M",
        "--count=3",
        "--threads=2",
        "--memory=fresh",
        "--small-pages",
    ]);
    assert_eq!(
        (v["memory"].as_str(), v["hugepages"].as_bool()),
        (Some("fresh"), Some(false))
    );
    assert_eq!(v["allocation_us"]["samples"], 6);
    assert_eq!(v["registration_us"]["samples"], 6);
    for k in ["p50", "p90", "p99", "max"] {
        assert!(v["registration_us"][k].as_f64().unwrap() > 0.0, "{k}");
    }
}

#[test]
fn text_output_in_a_log_says_what_it_measured() {
    let out = Command::new(EXE)
        .args(["stress", "--size=4M", "--count=2", "--threads=2"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    for want in [
        "allocated once",
        "registration (submit to ready): p50",
        "deregistration: p50",
    ] {
        assert!(text.contains(want), "{want:?} missing in {text}");
    }
}

/// Whether the tests run as root (needed to start the tool as another user); says so if not.
fn root() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("skipped: needs root to run the tool as another user with a small limit");
    }
    root
}

/// Runs `cmd` as user nobody under a 1 MiB RLIMIT_MEMLOCK (no CAP_IPC_LOCK to lift it).
fn as_nobody_with_1m_memlock(cmd: &mut Command) -> std::process::Output {
    // SAFETY: setrlimit between fork and exec touches only the child's own limits.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: 1 << 20,
                rlim_max: 1 << 20,
            };
            if libc::setrlimit(libc::RLIMIT_MEMLOCK, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd.uid(65534).gid(65534).output().unwrap()
}

#[test]
fn a_memlock_limit_that_cannot_fit_a_region_stops_the_run_without_fake_figures() {
    if !root() {
        return;
    }
    let mut cmd = Command::new(EXE);
    cmd.args([
        "stress",
        "--size=16M",
        "--count=50",
        "--threads=1",
        "--small-pages",
    ]);
    let out = as_nobody_with_1m_memlock(&mut cmd);
    let (text, err) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(!out.status.success());
    assert!(err.contains("stopped after round 1"), "{err}");
    assert!(err.contains("RLIMIT_MEMLOCK"), "{err}");
    assert!(text.contains("retries 0"), "not retried: {text}");
    assert!(!text.contains("GB/s"), "no throughput from nothing: {text}");
    assert!(
        text.contains("registration (submit to ready): not measured"),
        "{text}"
    );
}

#[test]
fn the_plot_is_an_svg_with_one_labelled_series_per_measurement() {
    let path = std::env::temp_dir().join(format!("stress-plot-{}.svg", std::process::id()));
    let out = Command::new(EXE)
        .args(["stress", "--size=8M", "--count=5", "--threads=2", "--plot"])
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let svg = std::fs::read_to_string(&path).unwrap();
    let _ = std::fs::remove_file(&path);
    assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
    for want in [
        "latency (µs, log scale)",
        "registration (p50",
        "deregistration (p50",
        "allocation and touch (p50",
    ] {
        assert!(svg.contains(want), "{want:?} missing");
    }
    assert!(svg.matches("<polyline").count() >= 3, "one line per series");
    let bad = Command::new(EXE)
        .args(["stress", "--size=8M", "--count=1", "--plot", "x.pdf"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(1), "{bad:?}");
    assert!(String::from_utf8_lossy(&bad.stderr).contains("*.svg or *.png"));
}

#[test]
fn a_mixed_run_reports_each_kind_apart_with_no_failures() {
    let v = stress_json(&[
        "--mix=reg,cache,pool",
        "--size=4M",
        "--count=40",
        "--threads=2",
        "--small-pages",
        "--cache-miss-every=4",
    ]);
    assert_eq!(v["mix"], serde_json::json!(["reg", "cache", "pool"]));
    assert_eq!(v["failures"], 0, "{v}");
    for kind in ["reg", "cache", "pool"] {
        let k = &v["kinds"][kind];
        assert_eq!(k["ops"], 80, "{kind}: 40 rounds x 2 threads: {v}");
        assert_eq!(k["failures"], 0, "{kind}: {v}");
        assert_eq!(k["latency_us"]["samples"], 80, "{kind}");
        for q in ["p50", "p99", "p999", "max"] {
            assert!(k["latency_us"][q].as_f64().unwrap() > 0.0, "{kind} {q}");
        }
        assert!(k["ops_per_s"].as_f64().unwrap() > 0.0);
    }
    // One lookup in 4 is on a new buffer: at least those miss, and the rest can hit.
    let cache = &v["kinds"]["cache"];
    let (hits, misses) = (
        cache["hits"].as_u64().unwrap(),
        cache["misses"].as_u64().unwrap(),
    );
    assert_eq!(hits + misses, 80);
    assert!(misses >= 20 && hits > 0, "{cache}");
    assert_eq!(
        cache["new_buffer_us"]["samples"], 20,
        "one lookup in 4 of 80"
    );
    assert_eq!(v["kinds"]["reg"]["deregistration_us"]["samples"], 80);
    // Only the kinds asked for.
    let only = stress_json(&["--mix=pool", "--size=1M", "--count=5", "--threads=1"]);
    assert_eq!(only["kinds"].as_object().unwrap().len(), 1, "{only}");
}

#[test]
fn a_mix_that_cannot_fit_the_memlock_limit_is_refused_before_it_runs() {
    if !root() {
        return;
    }
    let mut cmd = Command::new(EXE);
    cmd.args([
        "stress",
        "--mix=reg,pool",
        "--size=8M",
        "--count=5",
        "--threads=2",
    ]);
    let out = as_nobody_with_1m_memlock(&mut cmd);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("RLIMIT_MEMLOCK is 1M"), "{err}");
    assert!(out.stdout.is_empty(), "nothing ran");
}

/// The stress child's own metrics snapshot over its abstract socket, once it answers.
fn snapshot(name: &str) -> Option<serde_json::Value> {
    use std::io::Read;
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name).ok()?;
    let mut c = std::os::unix::net::UnixStream::connect_addr(&addr).ok()?;
    let mut s = String::new();
    c.read_to_string(&mut s).ok()?;
    serde_json::from_str(&s).ok()
}

/// Starts a run far too long to finish, waits until it has registered something, sends
/// `signal`, and returns its exit code and JSON summary.
fn interrupt(signal: i32, args: &[&str]) -> (Option<i32>, serde_json::Value, String) {
    let name = format!("rdma-tool-test-interrupt-{}-{signal}", std::process::id());
    let mut child = Command::new(EXE)
        .arg("stress")
        .args(args)
        .args(["--count=100000000", "--json", "--metrics-socket"])
        .arg(format!("@{name}"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while snapshot(&name).is_none_or(|v| v["registration"]["count"].as_u64() == Some(0)) {
        assert!(std::time::Instant::now() < deadline, "nothing registered");
        assert!(child.try_wait().unwrap().is_none(), "stress exited early");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // SAFETY: a signal to our own child, which is still running (not yet waited for).
    unsafe { libc::kill(child.id() as i32, signal) };
    // Bounded: a run that ignored the signal would be killed here and fail below.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = child.kill();
    let out = child.wait_with_output().unwrap();
    let v = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("no JSON summary ({e}): {out:?}"));
    (
        out.status.code(),
        v,
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn ctrl_c_or_sigterm_ends_a_run_with_the_summary_of_the_rounds_done() {
    let (code, v, err) = interrupt(libc::SIGINT, &["--size=2M", "--threads=2"]);
    assert_eq!(code, Some(1), "an interrupted run is not a success: {err}");
    assert!(err.contains("interrupted after round"), "{err}");
    assert_eq!(v["interrupted"], true, "{v}");
    let done = v["rounds_done"].as_u64().unwrap();
    assert!((1..100_000_000).contains(&done), "{v}");
    assert_eq!(v["failures"], 0, "{v}");
    // The figures are those of the rounds done: two registrations and two deregistrations
    // each, all measured.
    assert_eq!(v["registration_us"]["samples"], done * 2, "{v}");
    assert_eq!(v["deregistration_us"]["samples"], done * 2, "{v}");
    assert_eq!(v["registered_bytes"], done * 2 * (1 << 20), "{v}");

    let (code, v, err) = interrupt(
        libc::SIGTERM,
        &["--mix=reg,pool", "--size=2M", "--threads=2"],
    );
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("interrupted after round"), "{err}");
    let done = v["interrupted_after_round"].as_u64().expect("set");
    assert!((1..100_000_000).contains(&done), "{v}");
    for kind in ["reg", "pool"] {
        let ops = v["kinds"][kind]["ops"].as_u64().unwrap();
        assert!(ops >= 1 && ops <= done * 2, "{kind}: {v}");
    }
    assert_eq!(v["failures"], 0, "{v}");
}
