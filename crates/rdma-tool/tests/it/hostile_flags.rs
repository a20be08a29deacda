//! Hostile values on every numeric argument of every subcommand, and output that cannot
//! be written: rdma-tool answers each with a clean exit code and a message, never a panic
//! or a signal.
//!
//! The arguments come from the binary's own clap definitions (`rdma-tool cli-spec`), so a
//! flag added later is covered without being listed here. Every run fails at parse time
//! (an extra bad argument follows a flag's value; a positional's command lacks a required
//! flag), so the whole file takes seconds.

use serde_json::Value;
use std::process::{Command, Output, Stdio};

const EXE: &str = env!("CARGO_BIN_EXE_rdma-tool");

/// An argument no subcommand has: when a flag's value was accepted, clap stops here.
const BOGUS: &str = "--no-such-flag-hostile-test";

const MAX: &str = "18446744073709551615";

/// Values for each numeric argument: zero, negative, u64::MAX, past u64, garbage, and a
/// duration of over a century.
const HOSTILE: &[&str] = &["0", "-1", MAX, "99999999999999999999", "10Q", "1000000h"];

/// The (command, argument, value) triples that are valid at parse time: everything else
/// in HOSTILE must be refused by the argument's parser, naming it. A placement key, an
/// atomic operand and an offset may be any u64 (an offset is bounds checked against the
/// allocation once connected); a client id is 1 to 2^63 - 1 (so u64::MAX is refused); a sample count may be
/// "forever"; a read may be 0 bytes long; a seed may be any u64.
const ACCEPTED: &[(&str, &str, &str)] = &[
    ("pool alloc", "--key", "0"),
    ("pool alloc", "--key", MAX),
    ("monitor", "--count", MAX),
    ("pool write", "OFFSET", "0"),
    ("pool write", "OFFSET", MAX),
    ("pool read", "OFFSET", "0"),
    ("pool read", "OFFSET", MAX),
    ("pool read", "LEN", "0"),
    ("pool cas", "OFFSET", "0"),
    ("pool cas", "OFFSET", MAX),
    ("pool cas", "COMPARE", "0"),
    ("pool cas", "COMPARE", MAX),
    ("pool cas", "SWAP", "0"),
    ("pool cas", "SWAP", MAX),
    ("pool faa", "OFFSET", "0"),
    ("pool faa", "OFFSET", MAX),
    ("pool faa", "ADD", "0"),
    ("pool faa", "ADD", MAX),
    ("bench ycsb", "--seed", "0"),
    ("bench ycsb", "--seed", MAX),
];

struct Spec {
    command: Vec<String>,
    arg: String,
    positional: bool,
    numeric: bool,
}

fn spec() -> Vec<Spec> {
    let out = Command::new(EXE).arg("cli-spec").output().unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            Spec {
                command: v["command"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|c| c.as_str().unwrap().to_string())
                    .collect(),
                arg: v["arg"].as_str().unwrap().to_string(),
                positional: v["positional"].as_bool().unwrap(),
                numeric: v["numeric"].as_bool().unwrap(),
            }
        })
        .collect()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The command line that puts `value` in `target`: a flag as `--flag=value`, then
/// [`BOGUS`]; a positional after `--`, with harmless values in the other positionals of its
/// command (clap counts positionals before parsing their values, so no extra argument
/// follows: the positionals of `pool` fail on its missing `--servers` when valid).
fn command_line(all: &[Spec], target: &Spec, value: &str) -> Vec<String> {
    let mut args = target.command.clone();
    if target.positional {
        args.push("--".into());
        for p in all
            .iter()
            .filter(|s| s.positional && s.command == target.command)
        {
            args.push(if p.arg == target.arg {
                value.to_string()
            } else if p.arg == "PTR" {
                "1:4096:64".to_string()
            } else if p.numeric {
                "8".to_string()
            } else {
                "x".to_string()
            });
        }
    } else {
        args.push(format!("{}={value}", target.arg));
        args.push(BOGUS.into());
    }
    args
}

#[test]
fn every_numeric_argument_refuses_hostile_values_at_parse_time_naming_itself() {
    let all = spec();
    let numeric: Vec<&Spec> = all.iter().filter(|s| s.numeric).collect();
    // The enumeration itself works: the flags of the issue are among them.
    for (command, arg) in [
        ("bench data", "--iters"),
        ("bench pool", "--iters"),
        ("bench pool", "--clients"),
        ("serve", "--lease"),
        ("serve", "--interval"),
        ("pool alloc", "SIZE"),
    ] {
        assert!(
            numeric
                .iter()
                .any(|s| s.command.join(" ") == command && s.arg == arg),
            "cli-spec lacks {command} {arg}"
        );
    }
    assert!(
        numeric.len() > 40,
        "only {} numeric arguments",
        numeric.len()
    );
    let mut accepted_seen = 0;
    for s in &numeric {
        let command = s.command.join(" ");
        for &value in HOSTILE {
            let args = command_line(&all, s, value);
            let out = Command::new(EXE)
                .args(&args)
                .stdin(Stdio::null())
                .output()
                .unwrap();
            let err = stderr(&out);
            assert!(!err.contains("panicked"), "{args:?}: {err}");
            assert_eq!(out.status.code(), Some(2), "{args:?} (signal?): {err}");
            // clap: "invalid value '0' for '--iters <ITERS>'" or "... for '<SIZE>'".
            let named = if s.positional {
                format!("for '<{}>'", s.arg)
            } else {
                format!("for '{} <", s.arg)
            };
            let refused = err.contains("invalid value") && err.contains(&named);
            if ACCEPTED.contains(&(command.as_str(), s.arg.as_str(), value)) {
                accepted_seen += 1;
                assert!(
                    !err.contains("invalid value"),
                    "{args:?}: should parse: {err}"
                );
            } else {
                assert!(refused, "{args:?}: not refused naming {}: {err}", s.arg);
            }
        }
    }
    assert_eq!(
        accepted_seen,
        ACCEPTED.len(),
        "an ACCEPTED entry names no argument"
    );
}

#[test]
fn limits_are_named_in_the_refusal() {
    for (args, says) in [
        (&["bench", "pool", "--clients=100000"][..], "1..=256"),
        (&["bench", "data", "--iters=0"][..], "1..="),
        (&["serve", "--lease=1000000h"][..], "at most 8760h"),
        (&["serve", "--lease-ms=18446744073709551615"][..], "at most"),
        (&["stress", "--threads=100000"][..], "1..=1024"),
        (&["serve", "--size=2T"][..], "at most 1T"),
        (
            &["pool", "--servers", "127.0.0.1:9", "alloc", "0"][..],
            "size must be at least 1 byte",
        ),
        (
            &["pool", "--servers", "127.0.0.1:9", "alloc", "10Q"][..],
            "<SIZE>",
        ),
        (
            &[
                "pool",
                "--servers",
                "127.0.0.1:9",
                "cas",
                "1:4096:64",
                "4",
                "0",
                "1",
            ][..],
            "8-byte aligned",
        ),
    ] {
        let out = Command::new(EXE).args(args).output().unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(says), "{args:?}: {err:?} lacks {says:?}");
    }
}

#[test]
fn a_server_larger_than_the_machine_is_refused_before_touching_memory() {
    // The region is touched page by page: this must fail up front, not in the OOM killer.
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
    let kib: u64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap();
    let gib = (kib >> 20) * 2 + 2;
    if gib > 1023 {
        eprintln!("{gib}G would pass the 1T bound: nothing to check here");
        return;
    }
    let size = format!("{gib}G");
    let out = Command::new(EXE)
        .args(["serve", "--size", &size, "--chunk-size", "1G"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("more than this machine's memory"), "{err}");
}

#[test]
fn a_servers_file_is_read_up_to_a_bound() {
    let out = Command::new(EXE)
        .args(["pool", "--servers-file=/dev/zero", "stats"])
        .output()
        .unwrap();
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--servers-file") && err.contains("larger than 1M"),
        "{err}"
    );
}

/// etcd secrets: an etcd user without a password, and a TLS key or password file others
/// can read, are refused before anything is sent, saying what to do.
#[test]
fn etcd_secrets_that_are_missing_or_readable_by_others_are_refused() {
    use std::os::unix::fs::PermissionsExt;
    let run = |extra: &[&str]| {
        let out = Command::new(EXE)
            .args(["pool", "--etcd=https://127.0.0.1:9"])
            .args(extra)
            .arg("stats")
            .env_remove("RDMAPOOL_ETCD_PASSWORD")
            .output()
            .unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{extra:?}: {err}");
        err
    };
    let err = run(&["--etcd-user=root"]);
    assert!(
        err.contains("--etcd-password-file") && err.contains("RDMAPOOL_ETCD_PASSWORD"),
        "{err}"
    );
    let dir = std::env::temp_dir().join(format!("rdma-tool-etcd-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let open = dir.join("open");
    std::fs::write(&open, "secret\n").unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
    let open = open.to_str().unwrap();
    let err = run(&["--etcd-user=root", &format!("--etcd-password-file={open}")]);
    assert!(err.contains("chmod 600"), "{err}");
    let err = run(&[
        &format!("--etcd-cert={open}"),
        &format!("--etcd-key={open}"),
    ]);
    assert!(err.contains("chmod 600"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_full_disk_on_stdout_is_an_error_exit_1_not_a_panic() {
    for args in [&["devices"][..], &["completions", "bash"], &["man"]] {
        let out = Command::new(EXE)
            .args(args)
            .stdout(std::fs::File::create("/dev/full").unwrap())
            .output()
            .unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
        assert!(
            err.contains("No space left") && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
}

#[test]
fn a_full_disk_on_stderr_loses_the_message_but_not_the_exit_code() {
    // A failure (1) and a success that warns (0): no panic (101) either way.
    for (args, code) in [
        (&["pool", "--servers", "127.0.0.1:1", "stats"][..], 1),
        (
            &[
                "serve",
                "--size",
                "4M",
                "--listen",
                "0.0.0.0:0",
                "--allow-unauthenticated",
            ][..],
            0,
        ),
    ] {
        let out = Command::new(EXE)
            .args(args)
            .env_remove("RDMAPOOL_SOFT_BIND")
            .stdin(Stdio::piped()) // closed at once by `output`: `serve` stops
            .stderr(std::fs::File::create("/dev/full").unwrap())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(code), "{args:?}");
    }
}

#[test]
fn a_closed_pipe_on_stdout_ends_the_command_quietly_with_0() {
    for args in [
        &["devices"][..],
        &["devices", "--json"],
        &["completions", "bash"],
        &["man"],
        &["cli-spec"],
    ] {
        // The reading end is closed before the command starts: its first write fails.
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let out = Command::new(EXE)
            .args(args)
            .stdout(writer)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
            .wait_with_output()
            .unwrap();
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {err}");
        assert!(err.is_empty(), "{args:?}: {err}");
    }
}
