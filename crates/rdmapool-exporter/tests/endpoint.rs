//! The metrics endpoint, served for real: Prometheus text over loopback HTTP and a JSON
//! snapshot on an abstract Unix socket, after registrations in this process.

use rdmapool::fabric::SoftConfig;
use rdmapool::fabric::{AccessFlags, Context};
use rdmapool_exporter::{Endpoint, EndpointConfig, UnixName};
use std::io::{Read, Write};

/// Two registrations and deregistrations on `ctx`.
fn register_some(ctx: &Context) {
    let pd = ctx.alloc_pd().unwrap();
    for len in [4096, 1 << 20] {
        drop(pd.alloc_mr(len, AccessFlags::LOCAL_WRITE).unwrap());
    }
}

fn soft() -> Context {
    Context::open(SoftConfig::from_env().unwrap()).unwrap()
}

fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut c = std::net::TcpStream::connect(addr).unwrap();
    write!(c, "GET {path} HTTP/1.1\r\nHost: localhost\r\n\r\n").unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    out
}

fn sample(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {name} in\n{text}"))
        .parse()
        .unwrap()
}

#[test]
fn http_metrics_after_registrations() {
    let (ctx, other) = (soft(), soft());
    register_some(&ctx);
    register_some(&other);
    let ep = Endpoint::start(EndpointConfig {
        unix: None,
        http: Some("127.0.0.1:0".parse().unwrap()),
    })
    .unwrap();
    ep.watch(ctx.metrics());
    register_some(&soft()); // a context nobody watches: not served
    let addr = ep.http_addr().unwrap();
    let resp = get(addr, "/metrics");
    let (head, body) = resp.split_once("\r\n\r\n").unwrap();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("text/plain; version=0.0.4"), "{head}");
    assert!(
        body.contains("# TYPE rdmapool_registration_duration_seconds histogram\n"),
        "{body}"
    );
    // Exactly the watched context's two.
    assert_eq!(
        sample(body, "rdmapool_registration_duration_seconds_count"),
        2.0
    );
    assert_eq!(
        sample(body, "rdmapool_deregistration_duration_seconds_count"),
        2.0
    );
    assert_eq!(sample(body, "rdmapool_registrations_total"), 2.0);
    // Watching a second context serves both together.
    ep.watch(other.metrics());
    let resp = get(addr, "/metrics");
    let body = resp.split_once("\r\n\r\n").unwrap().1;
    assert_eq!(sample(body, "rdmapool_registrations_total"), 4.0);
    assert!(get(addr, "/other").starts_with("HTTP/1.1 404"));
    drop(ep);
    // Stopped: nothing listens there any more.
    assert!(std::net::TcpStream::connect(addr).is_err());
}

#[test]
fn unix_socket_sends_one_json_snapshot() {
    let ctx = soft();
    register_some(&ctx);
    let name = UnixName::Abstract(format!("rdmapool-test-{}", std::process::id()));
    let ep = Endpoint::start(EndpointConfig {
        unix: Some(name.clone()),
        http: None,
    })
    .unwrap();
    ep.watch(ctx.metrics());
    let mut counts = Vec::new();
    for _ in 0..2 {
        let mut c = std::os::unix::net::UnixStream::connect_addr(&name.to_addr().unwrap()).unwrap();
        let mut s = String::new();
        c.read_to_string(&mut s).unwrap();
        assert_eq!(s.matches('\n').count(), 1, "{s}");
        let v: serde_json::Value = serde_json::from_str(&s).unwrap();
        assert_eq!(v["pid"], std::process::id());
        counts.push(v["registration"]["count"].as_u64().unwrap());
        register_some(&ctx);
    }
    assert_eq!(counts, [2, 4]);
    assert_eq!(ep.unix_name(), Some(&name));
}

#[test]
fn path_socket_is_removed_on_drop() {
    let dir = std::env::temp_dir().join(format!("rdmapool-metrics-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("m.sock");
    let ep = Endpoint::start(EndpointConfig {
        unix: Some(UnixName::Path(path.clone())),
        http: None,
    })
    .unwrap();
    assert!(path.exists());
    drop(ep);
    assert!(!path.exists());
    let _ = std::fs::remove_dir(&dir);
}

#[test]
fn completions_are_counted_by_status() {
    use rdmapool::fabric::{QpConfig, RegisteredMemory, SendWr, WrOp};
    let ctx = Context::open(SoftConfig::from_env().unwrap()).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(64).unwrap();
    let target = pd.alloc_mr(4096, AccessFlags::all_remote()).unwrap();
    let local = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let a = pd.create_qp(&cq, &cq, &QpConfig::default()).unwrap();
    let b = pd.create_qp(&cq, &cq, &QpConfig::default()).unwrap();
    a.connect(&b.endpoint()).unwrap();
    b.connect(&a.endpoint()).unwrap();
    let success = |s: &rdmapool::metrics::Snapshot| {
        s.completions
            .iter()
            .find(|(st, _)| *st == rdmapool::fabric::WcStatus::Success)
            .map_or(0, |&(_, n)| n)
    };
    let m = ctx.metrics();
    assert_eq!(success(&m.snapshot()), 0);
    let sge = [local.sge(0, 8).unwrap()];
    let wr = SendWr {
        wr_id: 1,
        op: WrOp::Write {
            remote: target.remote_at(0).unwrap(),
            imm: None,
        },
        sg_list: &sge,
        signaled: true,
    };
    a.post_send(&[wr]).unwrap();
    let done = cq.wait(1, std::time::Duration::from_secs(10)).unwrap();
    assert!(done[0].is_ok());
    assert_eq!(success(&m.snapshot()), 1);
    let text = m.snapshot().to_prometheus();
    assert!(
        text.contains("rdmapool_completions_total{status=\"success\"} 1\n"),
        "{text}"
    );
}

/// Issue #22, finding 4: idle and trickling clients delay no scrape. Ten connections that
/// say nothing and one that sends a byte every 1.5 s are open; three scrapes, each with a
/// 5 s read timeout, are answered. Before: connections were answered one at a time, each
/// idle one holding the endpoint 2 s (20 s in all) and the trickling one for ever.
#[test]
fn idle_and_trickling_clients_delay_no_scrape() {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;
    use std::time::Duration;
    let ep = Endpoint::start(EndpointConfig {
        unix: None,
        http: Some("127.0.0.1:0".parse().unwrap()),
    })
    .unwrap();
    let addr = ep.http_addr().unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let trickle = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            for b in b"GET /metrics HTTP/1.1\r\n".iter().cycle() {
                if stop.load(Ordering::Relaxed) || c.write_all(&[*b]).is_err() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(1500));
            }
        })
    };
    let idle: Vec<_> = (0..10)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(100)); // the endpoint has taken them in
    let scrapes: Vec<std::io::Result<String>> = (0..3)
        .map(|_| {
            let mut c = std::net::TcpStream::connect(addr)?;
            c.set_read_timeout(Some(Duration::from_secs(5)))?;
            write!(c, "GET /metrics HTTP/1.1\r\nHost: localhost\r\n\r\n")?;
            let mut out = String::new();
            c.read_to_string(&mut out).map(|_| out)
        })
        .collect();
    // The attackers leave before any assertion, so a failure is a failure, not a hang.
    stop.store(true, Ordering::Relaxed);
    drop(idle);
    trickle.join().unwrap();
    for (i, r) in scrapes.into_iter().enumerate() {
        let out = r.unwrap_or_else(|e| panic!("scrape {i} behind idle clients: {e}"));
        assert!(out.starts_with("HTTP/1.1 200"), "{out}");
    }
}

/// The child side of the next test (this test binary run again as another user): connects
/// to the abstract socket named in the environment and prints how many bytes it read. An
/// ordinary run does nothing.
#[test]
fn other_user_child_entry() {
    let Ok(name) = std::env::var("RDMAPOOL_TEST_METRICS_SOCKET") else {
        return;
    };
    let name = UnixName::parse(&name);
    let mut c = std::os::unix::net::UnixStream::connect_addr(&name.to_addr().unwrap()).unwrap();
    let mut got = Vec::new();
    let _ = c.read_to_end(&mut got);
    println!("@read {}", got.len());
}

/// Issue #41, finding 7: the abstract socket has no file permissions, so another local
/// user could connect and read the snapshot (904 bytes). Only this user and root are
/// answered now; another user's connection is closed unanswered.
#[test]
fn another_user_reads_nothing_from_the_unix_socket() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: switching to another user needs root");
        return;
    }
    let ctx = soft();
    register_some(&ctx);
    let name = UnixName::Abstract(format!("rdmapool-test-other-{}", std::process::id()));
    let ep = Endpoint::start(EndpointConfig {
        unix: Some(name.clone()),
        http: None,
    })
    .unwrap();
    ep.watch(ctx.metrics());
    let read_as = |uid: Option<u32>| -> String {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new(std::env::current_exe().unwrap());
        cmd.args(["--exact", "other_user_child_entry", "--nocapture"])
            .env(
                "RDMAPOOL_TEST_METRICS_SOCKET",
                "@rdmapool-test-other-".to_string() + &std::process::id().to_string(),
            );
        if let Some(uid) = uid {
            cmd.uid(uid).gid(uid);
        }
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        text.lines()
            .find_map(|l| l.strip_prefix("@read ").map(str::to_string))
            .unwrap_or_else(|| {
                panic!(
                    "the child said nothing: {text} {}",
                    String::from_utf8_lossy(&out.stderr)
                )
            })
    };
    let mine: usize = read_as(None).parse().unwrap();
    assert!(mine > 100, "this user reads the snapshot ({mine} bytes)");
    let theirs = read_as(Some(65534));
    assert_eq!(theirs, "0", "another user read {theirs} bytes");
    drop(ep);
}
