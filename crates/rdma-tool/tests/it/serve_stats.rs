//! What an operator sees of a running memory server, from real runs of the built binary on
//! loopback: `serve`'s `stats` lines and metrics endpoint, `pool stats` read one-sided from
//! the servers' regions,
//! unreachable servers named, dropped connections logged at a bounded rate, and the
//! cross-host warnings (RDMAPOOL_SOFT_BIND, the pre-shared key) said once, without colour.

use serde_json::Value;
use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, ChildStdout, Command, Output, Stdio};

const EXE: &str = env!("CARGO_BIN_EXE_rdma-tool");

/// A stand-in for a server that is down: nothing listens on port 1 of loopback.
const DOWN: &str = "127.0.0.1:1";

struct Serve {
    child: Child,
    stdout: BufReader<ChildStdout>,
    addr: String,
}

impl Serve {
    /// `serve --json` on the soft provider with `extra` flags; reads its `listening` line.
    fn start(extra: &[&str]) -> Serve {
        Self::start_with(extra, &[])
    }

    /// The same, with `env` set.
    fn start_with(extra: &[&str], env: &[(&str, &str)]) -> Serve {
        let mut child = Command::new(EXE)
            .args(["serve", "--json", "--provider", "soft", "--size", "8M"])
            .args(["--chunk-size", "256K", "--node", "6", "--drain", "2s"])
            .args(extra)
            .envs(env.iter().copied())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = BufReader::new(child.stdout.take().unwrap());
        let first = next_json(&mut stdout);
        let addr = first["listening"].as_str().expect("listening").to_string();
        Serve {
            child,
            stdout,
            addr,
        }
    }

    /// Closes stdin; returns the rest of stdout and all of stderr once it exited.
    fn stop(mut self) -> (String, String) {
        drop(self.child.stdin.take());
        let mut out = String::new();
        self.stdout.read_to_string(&mut out).unwrap();
        let mut err = String::new();
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(self.child.wait().unwrap().success(), "{err}");
        (out, err)
    }
}

fn next_json(r: &mut impl BufRead) -> Value {
    let mut line = String::new();
    assert!(r.read_line(&mut line).unwrap() > 0, "stdout ended");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line:?}: {e}"))
}

/// `serve --size 4M` with `args`, `set` and `unset` in its environment, stdin a pipe that
/// `output` closes at once (it stops as soon as it starts): what it printed and how it
/// ended.
fn serve_once(args: &[&str], set: &[(&str, &str)], unset: &[&str]) -> Output {
    let mut cmd = Command::new(EXE);
    cmd.args(["serve", "--size", "4M"]).args(args);
    for (k, v) in set {
        cmd.env(k, v);
    }
    for k in unset {
        cmd.env_remove(k);
    }
    cmd.stdin(Stdio::piped()).output().unwrap()
}

fn pool(servers: &str, id: &str, args: &[&str]) -> Output {
    Command::new(EXE)
        .args(["pool", "--servers", servers, "--client-id", id])
        .args(args)
        .output()
        .unwrap()
}

/// One snapshot from a metrics endpoint on the abstract Unix socket `name`.
fn metrics(name: &str) -> Value {
    use std::os::linux::net::SocketAddrExt;
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name).unwrap();
    let mut s = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{body:?}: {e}"))
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn serve_reports_its_counters_and_pool_stats_reads_them_one_sided() {
    let socket = format!("@rdma-tool-serve-stats-{}", std::process::id());
    let mut serve = Serve::start(&[
        "--lease",
        "5s",
        "--interval",
        "100ms",
        "--metrics-socket",
        &socket,
    ]);
    // A client that holds a lease and one chunk while we look: a pool shell.
    let mut shell = Command::new(EXE)
        .args([
            "pool",
            "--servers",
            &serve.addr,
            "--client-id",
            "9",
            "shell",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut shell_in = shell.stdin.take().unwrap();
    let mut shell_out = BufReader::new(shell.stdout.take().unwrap());
    writeln!(shell_in, "alloc 64").unwrap();
    let mut ptr = String::new();
    shell_out.read_line(&mut ptr).unwrap();
    assert!(ptr.starts_with("6:"), "{ptr:?}");

    // serve's stats lines, one per interval, until one shows the shell's lease and chunk
    // (bounded by a number of lines, not by a time).
    let mut seen = None;
    for _ in 0..2000 {
        let v = next_json(&mut serve.stdout);
        assert_eq!(v["stats"], 6, "{v}");
        if v["leases"] == 1 && v["chunks_owned"] == 1 {
            seen = Some(v);
            break;
        }
    }
    let st = seen.expect("no stats line showed the shell's lease and chunk");
    assert_eq!(st["chunks"], 31, "{st}");
    assert_eq!(st["chunks_free"], 30, "{st}");
    assert_eq!(st["connections"], 1, "{st}");
    assert_eq!(st["connected"], 1, "{st}");
    assert_eq!(st["requests_handled"], 0, "one-sided: {st}");
    assert_eq!(st["lease_slots"], 256, "{st}");

    // The metrics endpoint lists the server with the same counters.
    let m = metrics(&socket[1..]);
    let ps = &m["pool_servers"][0];
    assert_eq!(ps["node"], 6, "{m}");
    assert_eq!(ps["leases"], 1, "{m}");
    assert_eq!(ps["chunks_owned"], 1, "{m}");
    assert_eq!(ps["chunks"], 31, "{m}");
    assert_eq!(ps["connected"], 1, "{m}");

    // pool stats reads the same from the server's region, with a server that is down
    // in the list: a warning, a field, and the command goes on.
    let servers = format!("{},{DOWN}", serve.addr);
    let out = pool(&servers, "10", &["--json", "stats"]);
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("warning") && err.contains(DOWN) && err.contains("unreachable"),
        "{err}"
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let node = &v["nodes"][0];
    assert_eq!(node["node"], 6, "{v}");
    assert_eq!(node["leases"], 2, "the shell's and this command's: {v}");
    assert_eq!(node["lease_slots"], 256, "{v}");
    assert_eq!(node["chunks_owned"], 1, "{v}");
    assert_eq!(node["chunks_free"], 30, "{v}");
    assert_eq!(v["unreachable"][0]["server"], DOWN, "{v}");
    assert!(
        v["unreachable"][0]["error"].as_str().unwrap().len() > 3,
        "{v}"
    );
    // Other operations carry the field too when a server was unreachable.
    let out = pool(&servers, "11", &["--json", "free", ptr.trim()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["unreachable"][0]["server"], DOWN, "{v}");

    // The text table says the same.
    let out = pool(&servers, "12", &["stats"]);
    let table = text(&out.stdout);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        table.contains("leases") && table.contains("/256") && table.contains("unreachable"),
        "{table}"
    );

    drop(shell_in);
    shell.wait().unwrap();
    let (rest, err) = serve.stop();
    let last = rest.lines().last().unwrap();
    assert!(last.contains("\"stopped\":6"), "{rest}");
    assert!(
        !err.contains('\x1b'),
        "colour codes on a stderr that is a pipe: {err:?}"
    );
}

#[test]
fn dropped_connections_are_logged_at_a_bounded_rate() {
    let serve = Serve::start(&[]);
    const DROPS: usize = 40;
    for _ in 0..DROPS {
        drop(std::net::TcpStream::connect(&serve.addr).unwrap());
    }
    // A real client after them: the server has looked at every connection before it
    // (they queued first).
    let out = pool(&serve.addr, "3", &["stats"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let (_, err) = serve.stop();
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("dropping a connection request"))
        .collect();
    assert!(!lines.is_empty(), "no drop logged: {err}");
    assert!(
        lines.len() < DROPS / 2,
        "{} lines for {DROPS} drops: {err}",
        lines.len()
    );
    if lines.len() > 1 {
        assert!(
            lines[1..].iter().any(|l| l.contains("more dropped")),
            "{err}"
        );
    }
    assert!(!err.contains('\x1b'), "{err:?}");
}

#[test]
fn cross_host_warnings_name_the_variable_and_print_once_without_colour() {
    // Listening beyond loopback without a cluster key: refused, saying how to set one and
    // how to opt out (issue #22, secure by default).
    let out = serve_once(
        &["--listen", "0.0.0.0:0"],
        &[],
        &[
            "RDMAPOOL_SOFT_BIND",
            "RDMAPOOL_POOL_KEY_FILE",
            "RDMAPOOL_ALLOW_UNAUTHENTICATED",
        ],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    for says in [
        "refusing to listen on 0.0.0.0:0 for the pool server without a key",
        "RDMAPOOL_POOL_KEY_FILE",
        "chmod 600",
        "RDMAPOOL_ALLOW_UNAUTHENTICATED=1",
    ] {
        assert!(err.contains(says), "should say {says:?}: {err}");
    }
    // Opted in, and listening beyond loopback while the soft NIC is on loopback: clients of
    // other hosts would connect and then fail: serve says why and names RDMAPOOL_SOFT_BIND.
    let out = serve_once(
        &["--listen", "0.0.0.0:0", "--allow-unauthenticated"],
        &[],
        &["RDMAPOOL_SOFT_BIND"],
    );
    let err = text(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains("warning") && err.contains("RDMAPOOL_SOFT_BIND"),
        "{err}"
    );

    // The soft NIC beyond loopback without a key: refused unless opted in.
    let out = serve_once(
        &[],
        &[("RDMAPOOL_SOFT_BIND", "0.0.0.0:0")],
        &["RDMAPOOL_SOFT_PSK_FILE", "RDMAPOOL_ALLOW_UNAUTHENTICATED"],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("for the soft NIC without a key") && err.contains("RDMAPOOL_SOFT_PSK_FILE"),
        "{err}"
    );
    // Opted in (the variable): the exposure warning, once, plain, with the default log
    // filter and with RDMAPOOL_LOG asking for warnings.
    for log in ["", "warn"] {
        let out = serve_once(
            &[],
            &[
                ("RDMAPOOL_ALLOW_UNAUTHENTICATED", "1"),
                ("RDMAPOOL_SOFT_BIND", "0.0.0.0:0"),
                ("RDMAPOOL_LOG", log),
            ],
            &["RDMAPOOL_SOFT_PSK_FILE"],
        );
        let err = text(&out.stderr);
        assert!(out.status.success(), "{err}");
        assert_eq!(
            err.matches("without a pre-shared key").count(),
            1,
            "{log:?}: {err}"
        );
        assert!(!err.contains('\x1b'), "{err:?}");
    }

    // A client that cannot reach a server off loopback while its own soft NIC is on
    // loopback is told about RDMAPOOL_SOFT_BIND (0.0.0.0 is this host: nothing leaves it).
    let out = pool("0.0.0.0:1", "1", &["stats"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("RDMAPOOL_SOFT_BIND"), "{err}");
}

/// Client authentication from the command line: a `serve` with the cluster key admits a
/// `pool` command that holds only the key `client-key` made for its id, and refuses the same
/// key under another id, or no key, naming the refusal (issue #22).
#[test]
fn a_client_key_proves_its_own_id_and_no_other() {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("rdma-tool-client-key-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let cluster = dir.join("cluster.key");
    std::fs::write(&cluster, [0x5a; 32]).unwrap();
    std::fs::set_permissions(&cluster, std::fs::Permissions::from_mode(0o600)).unwrap();
    let cluster = cluster.to_str().unwrap();
    let tenant = dir.join("tenant5.key");
    let made = Command::new(EXE)
        .args([
            "client-key",
            "--client-id",
            "5",
            "--out",
            tenant.to_str().unwrap(),
        ])
        .env("RDMAPOOL_POOL_KEY_FILE", cluster)
        .output()
        .unwrap();
    assert!(made.status.success(), "{}", text(&made.stderr));
    let mode = std::fs::metadata(&tenant).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the key file is its owner's only");
    assert_eq!(std::fs::read_to_string(&tenant).unwrap().trim().len(), 64);
    let serve = Serve::start_with(&[], &[("RDMAPOOL_POOL_KEY_FILE", cluster)]);
    let as_tenant = |id: &str| {
        Command::new(EXE)
            .args(["pool", "--servers", &serve.addr, "--client-id", id, "stats"])
            .env("RDMAPOOL_POOL_CLIENT_KEY_FILE", &tenant)
            .env_remove("RDMAPOOL_POOL_KEY_FILE")
            .output()
            .unwrap()
    };
    let ok = as_tenant("5");
    assert!(ok.status.success(), "{}", text(&ok.stderr));
    for refused in [as_tenant("6"), pool(&serve.addr, "5", &["stats"])] {
        let err = text(&refused.stderr);
        assert_eq!(refused.status.code(), Some(1), "{err}");
        assert!(err.contains("not authenticated"), "{err}");
    }
    serve.stop();
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Issue #40: a daemon started with stdin at /dev/null (systemd, `nohup`, `serve &` in a
/// script) serves until a signal; before, it stopped as soon as it started. SIGTERM then
/// drains it and it exits 0.
#[test]
fn a_server_with_stdin_at_dev_null_runs_until_a_signal() {
    let mut child = Command::new(EXE)
        .args(["serve", "--size", "4M", "--provider", "soft"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    assert!(line.starts_with("listening "), "{line:?}");
    // Time for a server that watched /dev/null to see its end of file (it looks every
    // 50 ms) and stop: it must still run.
    std::thread::sleep(std::time::Duration::from_millis(500));
    assert!(
        child.try_wait().unwrap().is_none(),
        "the server stopped with stdin at /dev/null"
    );
    // SAFETY: signalling our own child by its pid.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(0), "after SIGTERM: {status:?}");
}
