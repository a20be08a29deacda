//! The library calls behind `rdma-tool monitor`: a process serves its metrics (JSON on an
//! abstract Unix socket, Prometheus text over loopback HTTP), does some registrations and
//! one-sided operations (the last with a wrong rkey, which fails on its QP), and reads both
//! endpoints back the way `monitor` and a Prometheus
//! scraper do. `rdma-tool monitor --target @NAME` attaches to a process that does this.
//!
//! ```sh
//! cargo run --release -p rdmapool --example metrics_endpoint
//! HOLD=30 cargo run --release -p rdmapool --example metrics_endpoint   # serve 30 s more
//! ```

use rdmapool::fabric::*;
use rdmapool_exporter::{Endpoint, EndpointConfig, UnixName};
use std::io::{Read, Write};
use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let name = format!("@rdmapool-example-{}", std::process::id());
    let endpoint = Endpoint::start(EndpointConfig {
        unix: Some(UnixName::parse(&name)),
        http: Some("127.0.0.1:0".parse()?),
    })?;
    let http = endpoint.http_addr().expect("HTTP was asked for");
    println!("serving on {name} and http://{http}/metrics");

    // Work to measure: registrations, and WRITE/FAA between two QPs of one soft NIC. The
    // endpoint serves the contexts it watches.
    let ctx = Context::open(SoftConfig::from_env()?)?;
    endpoint.watch(ctx.metrics());
    ctx.metrics().sample_op_latency(1); // time every work request (the default is 1 in 64)
    let (pd, cq) = (ctx.alloc_pd()?, ctx.create_cq(16)?);
    let (a, b) = (
        pd.create_qp(&cq, &cq, &QpConfig::default())?,
        pd.create_qp(&cq, &cq, &QpConfig::default())?,
    );
    a.connect(&b.endpoint())?;
    b.connect(&a.endpoint())?;
    let target = pd.alloc_mr(4096, AccessFlags::all_remote())?;
    let local = pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE)?;
    for i in 0..100u64 {
        drop(pd.alloc_mr(64 << 10, AccessFlags::LOCAL_WRITE)?);
        let (op, len) = if i % 2 == 0 {
            let remote = target.remote_at(0)?;
            (WrOp::Write { remote, imm: None }, 64)
        } else {
            let remote = target.remote_at(8)?;
            (WrOp::FetchAdd { remote, add: 1 }, 8)
        };
        a.post_send(&[SendWr {
            wr_id: i,
            op,
            sg_list: &[local.sge(0, len)?],
            signaled: true,
        }])?;
        let done = cq.wait(1, Duration::from_secs(5))?;
        assert_eq!(done[0].status, WcStatus::Success);
    }
    // A WRITE with a wrong rkey: the target refuses it, and the error is counted on QP `a`.
    let mut wrong = target.remote_at(0)?;
    wrong.rkey ^= 1;
    a.post_send(&[SendWr {
        wr_id: 100,
        op: WrOp::Write {
            remote: wrong,
            imm: None,
        },
        sg_list: &[local.sge(0, 64)?],
        signaled: true,
    }])?;
    assert_eq!(
        cq.wait(1, Duration::from_secs(5))?[0].status,
        WcStatus::RemAccessErr
    );

    // What `rdma-tool monitor --target @NAME` reads: one JSON object per connection.
    let mut json = String::new();
    std::os::unix::net::UnixStream::connect_addr(&UnixName::parse(&name).to_addr()?)?
        .read_to_string(&mut json)?;
    let v: serde_json::Value = serde_json::from_str(&json)?;
    println!(
        "JSON: {} registrations, p99 {} us; FAA latency p50 {} us",
        v["registration"]["count"],
        v["registration"]["latency"]["percentiles_us"]["p99"],
        v["op_latency"]["fetch_add"]["latency"]["percentiles_us"]["p50"]
    );

    // What a Prometheus scraper (or `monitor --target http://...`) reads.
    let mut c = std::net::TcpStream::connect(http)?;
    write!(
        c,
        "GET /metrics HTTP/1.1\r\nHost: {http}\r\nConnection: close\r\n\r\n"
    )?;
    let mut text = String::new();
    c.read_to_string(&mut text)?;
    let qp_a = format!("qp=\"{}\"", a.qpn());
    for line in text.lines().filter(|l| {
        l.starts_with("rdmapool_registrations_total")
            || l.starts_with("rdmapool_op_duration_seconds_count")
            || (l.starts_with("rdmapool_qp_completions_total") && l.contains(&qp_a))
    }) {
        println!("Prometheus: {line}");
    }
    if v["op_latency"]["rdma_write"]["count"].as_u64() < Some(50) {
        return Err("the endpoint did not report the 50 WRITEs".into());
    }
    let on_a = v["objects"]["qps"]
        .as_array()
        .and_then(|qps| qps.iter().find(|q| q["qp"] == a.qpn()))
        .ok_or("the endpoint did not list QP a")?;
    println!("JSON: QP {} completions {}", a.qpn(), on_a["completions"]);
    if on_a["completions"]["rem_access_err"] != 1 || on_a["completions"]["success"] != 100 {
        return Err("the endpoint did not count QP a's 100 successes and 1 error".into());
    }
    // HOLD=N: keep serving N seconds more, for `rdma-tool monitor --target` to attach.
    if let Some(secs) = std::env::var("HOLD").ok().and_then(|v| v.parse().ok()) {
        println!("serving {secs} s more");
        std::thread::sleep(Duration::from_secs(secs));
    }
    Ok(())
}
