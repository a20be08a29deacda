//! Rendering of a known snapshot: Prometheus text and JSON.

use super::ObjectCompletions;
use super::{LatencySummary, Snapshot, BUCKETS_SECONDS, PERCENTILES};
use crate::fabric::{WcOpcode, WcStatus};

fn known() -> Snapshot {
    let mut buckets = [0u64; BUCKETS_SECONDS.len()];
    // Two values of ~30 µs and one of ~2 ms.
    for (b, &le) in buckets.iter_mut().zip(BUCKETS_SECONDS.iter()) {
        *b = if le >= 2.5e-3 {
            3
        } else if le >= 50e-6 {
            2
        } else {
            0
        };
    }
    let lat = LatencySummary {
        count: 3,
        sum_seconds: 0.00206,
        percentiles_us: [30.0, 30.0, 2000.0, 2000.0, 2000.0, 2000.0, 2000.0, 2001.0],
        buckets,
    };
    Snapshot {
        pid: 42,
        uptime_seconds: 1.5,
        registrations: 3,
        registration_errors: 1,
        registration_latency: lat.clone(),
        op_latency: vec![(WcOpcode::RdmaWrite, lat.clone())],
        op_sample_every: 64,
        deregistrations: 3,
        deregistration_latency: lat,
        registered_bytes: 4096,
        pinned_bytes: 8192,
        retries: 2,
        timeouts: 0,
        cancellations: 0,
        cache_hits: 7,
        cache_misses: 3,
        cache_evictions: 0,
        cache_invalidations: 0,
        sends_posted: 12,
        pool_allocations: 5,
        pool_in_use: 1,
        pool_empty: 0,
        pool_chunks: 1,
        completions: vec![(WcStatus::Success, 10), (WcStatus::RemAccessErr, 2)],
        connections_active: 1,
        connections_passive: 2,
        connection_errors: 3,
        objects_tracked: true,
        cqs: vec![ObjectCompletions {
            device: "soft0".into(),
            id: 1,
            completions: vec![(WcStatus::Success, 10), (WcStatus::RemAccessErr, 2)],
        }],
        cqs_live: 1,
        qps: vec![
            ObjectCompletions {
                device: "soft0".into(),
                id: 7,
                completions: vec![(WcStatus::Success, 10)],
            },
            ObjectCompletions {
                device: "so\"ft\\0".into(),
                id: 8,
                completions: vec![(WcStatus::Success, 0), (WcStatus::RemAccessErr, 2)],
            },
        ],
        qps_live: 2,
        sections: vec![crate::metrics::ServerStats {
            chunks: 31,
            chunks_owned: 4,
            clients: 2,
            lease_slots: 256,
            connections: 5,
            connected: 2,
            reclaimed_chunks: 1,
            expired_clients: 1,
            requests_handled: 0,
        }
        .section(3)],
    }
}

#[test]
fn prometheus_text() {
    let t = known().to_prometheus();
    for needle in [
        "# TYPE rdmapool_registration_duration_seconds histogram\n",
        "rdmapool_registration_duration_seconds_bucket{le=\"0.00005\"} 2\n",
        "rdmapool_registration_duration_seconds_bucket{le=\"+Inf\"} 3\n",
        "rdmapool_registration_duration_seconds_count 3\n",
        "rdmapool_registration_duration_seconds_sum 0.00206\n",
        "# TYPE rdmapool_deregistration_duration_seconds histogram\n",
        "# TYPE rdmapool_pinned_bytes gauge\nrdmapool_pinned_bytes 8192\n",
        "rdmapool_registration_errors_total 1\n",
        "rdmapool_cache_hits_total 7\n",
        "# TYPE rdmapool_completions_total counter\n",
        "rdmapool_completions_total{status=\"success\"} 10\n",
        "rdmapool_completions_total{status=\"rem_access_err\"} 2\n",
        "rdmapool_connections_total{side=\"passive\"} 2\n",
        "rdmapool_connection_errors_total 3\n",
        "# TYPE rdmapool_op_duration_seconds histogram\n",
        "rdmapool_op_duration_seconds_bucket{opcode=\"rdma_write\",le=\"0.00005\"} 2\n",
        "rdmapool_op_duration_seconds_bucket{opcode=\"rdma_write\",le=\"+Inf\"} 3\n",
        "rdmapool_op_duration_seconds_count{opcode=\"rdma_write\"} 3\n",
        "rdmapool_op_sample_every 64\n",
        "# TYPE rdmapool_cq_completions_total counter\n",
        "rdmapool_cq_completions_total{device=\"soft0\",cq=\"1\",status=\"rem_access_err\"} 2\n",
        "rdmapool_qp_completions_total{device=\"soft0\",qp=\"7\",status=\"success\"} 10\n",
        "rdmapool_qp_completions_total{device=\"so\\\"ft\\\\0\",qp=\"8\",status=\"rem_access_err\"} 2\n",
        "rdmapool_qps_live 2\n",
        "# TYPE rdmapool_pool_server_leases gauge\nrdmapool_pool_server_leases{node=\"3\"} 2\n",
        "rdmapool_pool_server_chunks_owned{node=\"3\"} 4\n",
        "rdmapool_pool_server_connected{node=\"3\"} 2\n",
        "# TYPE rdmapool_pool_server_connections_total counter\n",
        "rdmapool_pool_server_reclaimed_chunks_total{node=\"3\"} 1\n",
    ] {
        assert!(t.contains(needle), "missing {needle:?} in\n{t}");
    }
    // Every sample line names a metric announced by a TYPE line before it, and buckets are
    // cumulative.
    let mut typed = Vec::new();
    let mut last_bucket = 0u64;
    for line in t.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            typed.push(rest.split(' ').next().unwrap().to_string());
            last_bucket = 0;
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let name = line.split(['{', ' ']).next().unwrap();
        assert!(typed.iter().any(|m| name.starts_with(m.as_str())), "{line}");
        if name.ends_with("_bucket") {
            let v: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
            assert!(v >= last_bucket, "{line}");
            last_bucket = v;
        }
    }
}

#[test]
fn json_snapshot() {
    let j: serde_json::Value = serde_json::from_str(&known().to_json()).unwrap();
    assert_eq!(j["schema"], 1);
    assert_eq!(j["pid"], 42);
    assert_eq!(j["registration"]["count"], 3);
    assert_eq!(j["registration"]["errors"], 1);
    let p = &j["registration"]["latency"]["percentiles_us"];
    for key in ["p50", "p75", "p90", "p95", "p99", "p99.9", "p99.99", "max"] {
        assert!(p[key].is_number(), "{key} in {p}");
    }
    assert_eq!(p.as_object().unwrap().len(), PERCENTILES.len());
    assert_eq!(p["p99"], 2000.0);
    assert_eq!(j["cache"]["hits"], 7);
    assert_eq!(j["pool"]["in_use"], 1);
    assert_eq!(j["completions"]["success"], 10);
    assert_eq!(j["completions"]["rem_access_err"], 2);
    assert_eq!(j["pinned_bytes"], 8192);
    assert_eq!(j["connections"]["active"], 1);
    assert_eq!(j["connections"]["errors"], 3);
    assert_eq!(j["op_sample_every"], 64);
    assert_eq!(j["op_latency"]["rdma_write"]["count"], 3);
    assert_eq!(
        j["op_latency"]["rdma_write"]["latency"]["percentiles_us"]["p99"],
        2000.0
    );
    let o = &j["objects"];
    assert_eq!(o["tracked"], true);
    assert_eq!(o["cqs_live"], 1);
    assert_eq!(o["cqs"][0]["cq"], 1);
    assert_eq!(o["cqs"][0]["completions"]["rem_access_err"], 2);
    assert_eq!(o["qps"][0]["qp"], 7);
    assert_eq!(o["qps"][1]["device"], "so\"ft\\0");
    assert_eq!(o["qps"][1]["completions"]["success"], 0);
    let s = &j["pool_servers"][0];
    assert_eq!(s["node"], 3);
    assert_eq!(s["leases"], 2);
    assert_eq!(s["lease_slots"], 256);
    assert_eq!(s["chunks"], 31);
    assert_eq!(s["chunks_owned"], 4);
    assert_eq!(s["connected"], 2);
    assert_eq!(s["requests_handled"], 0);
    assert_eq!(s["expired_leases"], 1);
}

#[test]
fn untracked_objects_have_no_series() {
    let mut s = known();
    s.objects_tracked = false;
    let t = s.to_prometheus();
    assert!(!t.contains("rdmapool_qp_completions_total"), "{t}");
    assert!(!t.contains("rdmapool_qps_live"), "{t}");
}

#[test]
fn each_context_counts_its_own_registrations_and_several_add_up() {
    use crate::fabric::{AccessFlags, Context, SoftConfig};
    let (a, b) = (
        Context::open(SoftConfig::default()).unwrap(),
        Context::open(SoftConfig::default()).unwrap(),
    );
    let (pa, pb) = (a.alloc_pd().unwrap(), b.alloc_pd().unwrap());
    for _ in 0..3 {
        drop(pa.alloc_mr(1 << 16, AccessFlags::LOCAL_WRITE).unwrap());
    }
    let kept = pb.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap();
    let (sa, sb) = (a.metrics().snapshot(), b.metrics().snapshot());
    assert_eq!((sa.registrations, sa.deregistrations), (3, 3));
    assert_eq!(sa.registered_bytes, 0);
    assert_eq!((sb.registrations, sb.deregistrations), (1, 0));
    assert_eq!(sb.registered_bytes, 4096);
    assert_eq!(sa.registration_latency.count, 3);
    let both = super::snapshot_of([&a.metrics(), &b.metrics()]);
    assert_eq!(both.registrations, 4);
    assert_eq!(both.registration_latency.count, 4);
    assert_eq!(both.registered_bytes, 4096);
    let j: serde_json::Value = serde_json::from_str(&both.to_json()).unwrap();
    assert_eq!(j["registration"]["latency"]["count"].as_u64(), Some(4));
    drop(kept);
    assert_eq!(b.metrics().snapshot().registered_bytes, 0);
}
