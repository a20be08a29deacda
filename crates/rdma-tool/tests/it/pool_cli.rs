//! `rdma-tool serve` and `rdma-tool pool ...` end to end on the soft provider: the built
//! binary, one server process and one process per pool command, values read back checked.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Command, Output, Stdio};

const EXE: &str = env!("CARGO_BIN_EXE_rdma-tool");

struct Server {
    child: Child,
    stdout: BufReader<std::process::ChildStdout>,
    addr: String,
}

impl Server {
    fn start(lease_ms: u64) -> Server {
        Self::start_node(lease_ms, 4)
    }

    fn start_node(lease_ms: u64, node: u32) -> Server {
        let mut child = Command::new(EXE)
            .args([
                "serve",
                "--provider",
                "soft",
                "--size",
                "8M",
                "--chunk-size",
            ])
            .args([
                "256K",
                "--node",
                &node.to_string(),
                "--drain",
                "8s",
                "--lease",
            ])
            .arg(format!("{lease_ms}ms"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("serve starts");
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let mut line = String::new();
        stdout.read_line(&mut line).unwrap();
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(words.first(), Some(&"listening"), "first line: {line:?}");
        assert_eq!(
            words[2..4],
            ["node", &node.to_string()],
            "first line: {line:?}"
        );
        Server {
            addr: words[1].to_string(),
            child,
            stdout,
        }
    }

    /// Closes stdin: the server drains and says how many chunks were still owned.
    fn stop(mut self) -> String {
        drop(self.child.stdin.take());
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut self.stdout, &mut rest).unwrap();
        let status = self.child.wait().unwrap();
        assert!(status.success(), "serve failed: {status:?}");
        rest
    }
}

fn pool(server: &Server, id: u64, args: &[&str]) -> Output {
    Command::new(EXE)
        .args([
            "pool",
            "--servers",
            &server.addr,
            "--client-id",
            &id.to_string(),
        ])
        .args(args)
        .output()
        .unwrap()
}

fn ok(server: &Server, id: u64, args: &[&str]) -> String {
    let out = pool(server, id, args);
    assert!(
        out.status.success(),
        "pool {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .trim_end()
        .to_string()
}

fn fails(server: &Server, id: u64, args: &[&str], says: &str) {
    let out = pool(server, id, args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "pool {args:?} should fail");
    assert!(err.contains(says), "pool {args:?}: {err:?} lacks {says:?}");
    assert!(!err.contains("panicked"), "pool {args:?} panicked: {err}");
}

#[test]
fn serve_and_one_shot_pool_commands_round_trip_values() {
    let server = Server::start(3000);
    // Bad input is refused before connecting, with a message and a non-zero exit.
    fails(&server, 9, &["read", "4:zz:8", "0", "4"], "node:offset:len");
    fails(&server, 9, &["alloc", "lots"], "bad size");
    fails(
        &server,
        9,
        &["faa", "4:1000:16", "3", "1"],
        "8-byte aligned",
    );
    fails(
        &server,
        9,
        &["write", "4:1000:16", "0", "xyz", "--hex"],
        "hex",
    );

    // One process per command, all with client id 7: each finds what the last one left.
    let ptr = ok(&server, 7, &["alloc", "100"]);
    let fields: Vec<&str> = ptr.split(':').collect();
    assert!(
        fields.len() == 4 && fields[0] == "4" && fields[2] == "100" && fields[3].starts_with("0x"),
        "node:offset:len:incarnation, got {ptr}"
    );
    assert_eq!(
        ok(&server, 7, &["write", &ptr, "0", "hello pool"]),
        "wrote 10 bytes"
    );
    assert_eq!(ok(&server, 7, &["faa", &ptr, "16", "5"]), "0");
    assert_eq!(ok(&server, 7, &["cas", &ptr, "16", "5", "0x2a"]), "5");
    let stats = ok(&server, 7, &["stats"]);
    // Stats list objects with their size-class length (128 for 100 bytes).
    let at = format!("{}:{}:128:{}", fields[0], fields[1], fields[3]);
    assert!(
        stats.contains("allocations 1") && stats.contains(&at),
        "{stats}"
    );
    // Another client reads it (any client may read, write and free any allocation), in
    // one process so that client 7's lease (not renewed between commands) still holds.
    let mut other = Command::new(EXE)
        .args([
            "pool",
            "--servers",
            &server.addr,
            "--client-id",
            "8",
            "shell",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(
        other.stdin.take().unwrap(),
        "read {ptr} 0 10\nread {ptr} 16 8 --hex\nread {ptr} 96 8\nfree {ptr}\nfree {ptr}"
    )
    .unwrap();
    let out = other.wait_with_output().unwrap();
    assert!(!out.status.success(), "two commands fail");
    let text = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "hello pool");
    assert_eq!(lines[1], "2a00000000000000");
    assert!(lines[2].contains("100-byte remote allocation"), "{text}");
    assert_eq!(lines[3], format!("freed {ptr}"));
    assert!(lines[4].contains("not a live allocation"), "{text}");

    // Many commands on one connection.
    let mut shell = Command::new(EXE)
        .args([
            "pool",
            "--servers",
            &server.addr,
            "--client-id",
            "11",
            "shell",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    writeln!(
        shell.stdin.take().unwrap(),
        "alloc 64\nstats\nwrite 4:0:8 0\nwrite --help"
    )
    .unwrap();
    let out = shell.wait_with_output().unwrap();
    assert!(!out.status.success(), "the bad line counts as failed");
    let text = String::from_utf8(out.stdout).unwrap();
    let p = text.lines().next().unwrap().to_string();
    assert!(text.contains(&format!("allocations 1\n  {p}")), "{text}");
    // A usage error says on its line what is missing and how the command goes; asking for
    // help shows it and is no failure.
    let bad = text.lines().find(|l| l.starts_with("error:")).unwrap();
    assert!(
        bad.contains("<DATA>") && bad.contains("usage: write <PTR> <OFFSET> <DATA>"),
        "{text}"
    );
    assert_eq!(text.matches("error:").count(), 1, "{text}");
    assert!(text.contains("Writes DATA at OFFSET of PTR"), "{text}");

    // Client 11 exited holding an object; its lease runs out within the drain.
    let bye = server.stop();
    assert!(bye.contains("stopped node 4 chunks_still_owned 0"), "{bye}");
}

#[test]
fn a_one_shot_allocation_whose_lease_ran_out_is_refused_not_used() {
    let server = Server::start(300);
    let out = pool(&server, 20, &["alloc", "64"]);
    assert!(out.status.success(), "{out:?}");
    let ptr = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let note = String::from_utf8_lossy(&out.stderr);
    assert!(
        note.contains("one lease later") && note.contains("pool shell"),
        "{note}"
    );
    // Client 20 is gone; another client (whose commands renew only its own lease) watches
    // the object until the server has taken client 20's chunk back.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let refused = loop {
        let out = pool(&server, 21, &["write", &ptr, "0", "late"]);
        if !out.status.success() {
            break out;
        }
        assert!(std::time::Instant::now() < until, "the lease never ran out");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    assert_eq!(refused.status.code(), Some(1));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(
        err.contains("not a live allocation")
            && err.contains("lease")
            && err.contains("pool shell"),
        "{err}"
    );
    // Read, CAS and FAA are refused the same way.
    for args in [
        &["read", &ptr, "0", "4"][..],
        &["cas", &ptr, "0", "0", "1"],
        &["faa", &ptr, "0", "1"],
    ] {
        let out = pool(&server, 21, args);
        assert_eq!(out.status.code(), Some(1), "{args:?}: {out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("not a live allocation"));
    }
    let bye = server.stop();
    assert!(bye.contains("chunks_still_owned 0"), "{bye}");
}

fn store(servers: &[&Server], id: u64, args: &[&str], stdin: Option<&[u8]>) -> Output {
    let list: Vec<&str> = servers.iter().map(|s| s.addr.as_str()).collect();
    let mut child = Command::new(EXE)
        .args([
            "store",
            "--servers",
            &list.join(","),
            "--client-id",
            &id.to_string(),
        ])
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    if let Some(bytes) = stdin {
        input.write_all(bytes).unwrap();
    }
    drop(input);
    child.wait_with_output().unwrap()
}

#[test]
fn store_objects_outlive_the_processes_that_put_them() {
    // A short lease: each process's client id expires soon after it exits, and the
    // objects stay, because they belong to the store.
    let a = Server::start_node(300, 1);
    let b = Server::start_node(300, 2);
    let s = [&a, &b];
    let out = store(&s, 1, &["put", "greeting", "hello, store"], None);
    assert!(out.status.success(), "{out:?}");
    let blob: Vec<u8> = (0..70_000u32).map(|i| (i * 7) as u8).collect();
    let out = store(&s, 2, &["put", "blob", "--file", "-"], Some(&blob));
    assert!(out.status.success(), "{out:?}");
    std::thread::sleep(std::time::Duration::from_millis(900)); // both leases have run out
    let got = store(&s, 3, &["get", "blob"], None);
    assert!(got.status.success(), "{got:?}");
    assert_eq!(got.stdout, blob, "binary value through stdout");
    let got = store(&s, 3, &["--json", "get", "greeting"], None);
    let v: serde_json::Value = serde_json::from_slice(&got.stdout).unwrap();
    assert_eq!(v["value"], "hello, store");
    let ls = store(&s, 4, &["ls"], None);
    assert_eq!(String::from_utf8_lossy(&ls.stdout), "blob\ngreeting\n");
    let rm = store(&s, 4, &["rm", "greeting"], None);
    assert!(rm.status.success(), "{rm:?}");
    let gone = store(&s, 5, &["get", "greeting"], None);
    assert_eq!(gone.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&gone.stderr).contains("no such key"));
    let stats = store(&s, 5, &["--json", "stats"], None);
    let v: serde_json::Value = serde_json::from_slice(&stats.stdout).unwrap();
    assert_eq!(v["keys"], 1);
    // Bad input: a typed refusal, nothing written.
    let long = "k".repeat(256);
    let bad = store(&s, 6, &["put", &long, "v"], None);
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("key length is 256"));
    // A key put with one replica is brought to two by a repair; a second finds nothing.
    let solo = store(&s, 7, &["--replicas", "1", "put", "solo", "one copy"], None);
    assert!(solo.status.success(), "{solo:?}");
    let fixed = store(&s, 8, &["--json", "repair"], None);
    assert!(fixed.status.success(), "{fixed:?}");
    let v: serde_json::Value = serde_json::from_slice(&fixed.stdout).unwrap();
    assert_eq!(
        (v["nodes"].as_u64(), v["keys"].as_u64()),
        (Some(2), Some(3)),
        "{v}"
    );
    assert_eq!(
        (v["copied"].as_u64(), v["failed"].as_u64()),
        (Some(1), Some(0)),
        "{v}"
    );
    let again = store(&s, 8, &["repair"], None);
    let text = String::from_utf8_lossy(&again.stdout);
    assert!(
        text.contains("0 replica(s) copied, 0 slot(s) cleared"),
        "{text}"
    );
    a.stop();
    b.stop();
}

/// Issue #40: one-shot commands run at once without `--client-id` take one-shot ids that no
/// live command holds, so none fails ("client id 1 is held by a live client" before).
#[test]
fn one_shot_store_commands_run_at_once_do_not_collide() {
    let a = Server::start_node(2000, 1);
    let b = Server::start_node(2000, 2);
    let list = format!("{},{}", a.addr, b.addr);
    let outs: Vec<Output> = std::thread::scope(|s| {
        let runs: Vec<_> = (0..4)
            .map(|i| {
                let list = &list;
                s.spawn(move || {
                    Command::new(EXE)
                        .args(["store", "--json", "--servers", list, "put"])
                        .arg(format!("k{i}"))
                        .arg(format!("v{i}"))
                        .stdin(Stdio::piped())
                        .output()
                        .unwrap()
                })
            })
            .collect();
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    // Every one succeeds (two that drew the same id: the second takes the next one, or
    // the same once the first is gone).
    for out in &outs {
        assert!(out.status.success(), "{out:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let w = v["writer"].as_u64().unwrap();
        assert!((1 << 62..(1 << 62) + 64).contains(&w), "{v}");
    }
    for i in 0..4 {
        let got = store(&[&a, &b], 9, &["get", &format!("k{i}")], None);
        assert_eq!(got.stdout, format!("v{i}").into_bytes(), "{got:?}");
    }
}
