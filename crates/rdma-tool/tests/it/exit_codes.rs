//! The exit codes `rdma-tool --help` documents, from real runs: 0 success, 1 the command
//! failed (with a message that names the fix), 2 bad usage; and `--provider`/`--device` on
//! every subcommand that opens a device.

use std::process::{Command, Output};

const EXE: &str = env!("CARGO_BIN_EXE_rdma-tool");

/// Each subcommand that opens a device, with the arguments it needs to get that far: the
/// device flags go between the two parts.
const OPENS_A_DEVICE: &[(&[&str], &[&str])] = &[
    (&["devices"], &[]),
    (&["demo"], &[]),
    (&["stress", "--size", "1M", "--count", "1"], &[]),
    (&["monitor", "--count", "1"], &[]),
    (&["serve"], &[]),
    (&["pool", "--servers", "127.0.0.1:9"], &["stats"]),
    (&["bench", "data", "--size", "8", "--iters", "10"], &[]),
    (&["bench", "reg"], &[]),
    (&["bench", "pool", "--clients", "1"], &[]),
    (
        &[
            "bench",
            "ycsb",
            "--records",
            "10",
            "--no-redis",
            "--no-memcached",
        ],
        &[],
    ),
    (&["peer", "--size", "4096"], &[]),
];

fn with_flags(
    prefix: &[&'static str],
    flags: &[&'static str],
    suffix: &[&'static str],
) -> Vec<&'static str> {
    [prefix, flags, suffix].concat()
}

/// Runs rdma-tool with stdin a pipe closed at once (`serve` and `peer` stop when it
/// closes: a server whose stdin is /dev/null runs until a signal).
fn run(args: &[&str]) -> Output {
    Command::new(EXE)
        .args(args)
        .stdin(std::process::Stdio::piped())
        .output()
        .expect("rdma-tool runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn success_is_0() {
    for args in [
        &["devices"][..],
        &["devices", "--provider", "soft"][..],
        &["--help"][..],
    ] {
        let out = run(args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
    }
    let help = String::from_utf8(run(&["--help"]).stdout).unwrap();
    assert!(help.contains("Exit codes: 0"), "{help}");
}

#[test]
fn a_bad_provider_is_usage_error_2_listing_the_choices_everywhere() {
    for (prefix, suffix) in OPENS_A_DEVICE {
        let args = with_flags(prefix, &["--provider", "nic"], suffix);
        let out = run(&args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("soft") && err.contains("verbs"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn an_unknown_device_is_failure_1_naming_the_devices_there_are_everywhere() {
    for (prefix, suffix) in OPENS_A_DEVICE {
        let args = with_flags(prefix, &["--provider", "soft", "--device", "nic9"], suffix);
        let out = Command::new(EXE)
            .args(&args)
            // The peer stops for its missing secret only after opening its device.
            .env("RDMA_TOOL_PEER_SECRET", "00")
            .output()
            .unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("nic9") && err.contains("soft0") && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn verbs_where_it_is_unavailable_says_why_and_what_to_use() {
    let out = run(&["devices", "--provider", "verbs", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    if v[0]["available"] == true {
        eprintln!("verbs is available here: nothing to check");
        return;
    }
    for args in [
        &["demo", "--provider", "verbs"][..],
        &["bench", "reg", "--provider", "verbs"],
    ] {
        let out = run(args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("not available") && err.contains("--provider soft"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn bad_sizes_durations_and_paths_are_usage_errors_2_that_say_what_is_wanted() {
    for (args, says) in [
        (&["stress", "--size", "lots"][..], "512M"),
        (&["serve", "--lease", "5d"][..], "unit"),
        (&["serve", "--drain", "soon"][..], "500ms"),
        (&["bench", "pool", "--duration", "0s"][..], "positive"),
        (&["bench", "data", "--size", "8,x"][..], "bad size"),
        (&["monitor", "--interval", "fast"][..], "10s"),
        (&["demo", "--transport", "udp"][..], "auto, tcp or local"),
        (
            &["bench", "data", "--transport", "local,udp"][..],
            "auto, tcp or local",
        ),
        (
            &["serve", "--lease", "2s", "--lease-ms", "2000"][..],
            "cannot be used",
        ),
        (&["bench", "ycsb", "--workload", "a,e"][..], "range scans"),
        (&["bench", "ycsb", "--record-size", "2M"][..], "at most 1M"),
        (
            &["bench", "ycsb", "--trace", "t.csv", "--workload", "a"][..],
            "cannot be used",
        ),
        (
            &["bench", "ycsb", "--ops", "100", "--duration", "1s"][..],
            "cannot be used",
        ),
        (
            &["bench", "ycsb", "--hit-rate", "--cache-sizes", "1,0"][..],
            "more than 0 and at most 100",
        ),
        (
            &["bench", "ycsb", "--hit-rate", "--cache-sizes", "101%"][..],
            "more than 0 and at most 100",
        ),
        (
            &["bench", "ycsb", "--hit-rate", "--cache-sizes=-5"][..],
            "more than 0 and at most 100",
        ),
        (&["bench", "ycsb", "--cache-sizes", "5"][..], "--hit-rate"),
        (
            &["bench", "ycsb", "--hit-rate", "--trace", "t.csv"][..],
            "cannot be used",
        ),
        (
            &["bench", "ycsb", "--hit-rate", "--record-size", "128K"][..],
            "at most 64K",
        ),
    ] {
        let out = run(args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err:?} lacks {says:?}");
    }
}

#[test]
fn deprecated_millisecond_flags_still_work() {
    // Bad values of the old flags are usage errors (2) naming the flag (and, for --secs,
    // the new one); good ones are taken (see the serve unit test and tests/pool_cli.rs for
    // their effect).
    let out = run(&["bench", "pool", "--secs", "0", "--clients", "1"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--duration"), "{}", stderr(&out));
    let out = run(&["serve", "--lease-ms", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--lease-ms"), "{}", stderr(&out));
}

#[test]
fn the_device_heading_in_help_holds_only_the_device_flags() {
    for (prefix, _) in OPENS_A_DEVICE {
        if prefix[0] == "peer" {
            continue; // hidden, started by demo and bench data
        }
        // The subcommand's words, without its own arguments (`bench data`, not its --size).
        let words: Vec<&str> = prefix
            .iter()
            .take_while(|w| !w.starts_with('-'))
            .copied()
            .collect();
        let args = [&words[..], &["-h"]].concat();
        let out = run(&args);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {}", stderr(&out));
        let help = String::from_utf8(out.stdout).unwrap();
        let section: Vec<&str> = help
            .lines()
            .skip_while(|l| *l != "Device:")
            .skip(1)
            .take_while(|l| !l.is_empty() && !l.ends_with(':'))
            .filter_map(|l| l.trim_start().strip_prefix("--"))
            .map(|l| l.split_whitespace().next().unwrap_or(""))
            .collect();
        assert_eq!(section, ["provider", "device"], "{args:?}:\n{help}");
    }
}

/// Issue #41, finding 7: `bench data --perftest-ip` is checked before the benchmark runs
/// (a bogus address ran the whole benchmark before).
#[test]
fn a_bogus_perftest_ip_is_a_usage_error_before_anything_runs() {
    let out = run(&["bench", "data", "--perftest-ip", "bogus"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("--perftest-ip"), "{}", stderr(&out));
}

#[test]
fn a_bad_trace_line_is_failure_1_naming_the_file_and_the_line() {
    let path = std::env::temp_dir().join(format!("rdma-tool-bad-trace-{}.csv", std::process::id()));
    std::fs::write(&path, "timestamp,key,size,op\n1,a,10,get\n2,b,10,put\n").unwrap();
    let name = path.to_str().unwrap();
    let out = run(&[
        "bench",
        "ycsb",
        "--trace",
        name,
        "--no-redis",
        "--no-memcached",
    ]);
    let _ = std::fs::remove_file(&path);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("{name} line 3")) && err.contains("want get, set or delete"),
        "{err}"
    );
    assert!(!err.contains("panicked") && out.stdout.is_empty(), "{err}");
    let out = run(&["bench", "ycsb", "--trace", "/nonexistent/t.csv"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("/nonexistent/t.csv"),
        "{}",
        stderr(&out)
    );
}
