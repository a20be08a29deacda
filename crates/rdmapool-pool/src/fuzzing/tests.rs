//! The corpus on stable Rust: the seeds are committed and every committed input replays;
//! and the seed programs do what they are named for (so the targets are not vacuous).

use super::{run, seeds, TARGETS};
use std::path::PathBuf;

fn corpus(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

/// Every seed runs, and is in the committed corpus as `seed-<name>` (regenerate with
/// `RDMAPOOL_WRITE_SEEDS=1 cargo test -p rdmapool --features fuzzing --lib fuzzing`).
#[test]
fn seeds_run_and_are_committed() {
    let write = std::env::var_os("RDMAPOOL_WRITE_SEEDS").is_some();
    for t in TARGETS {
        let seeds = seeds(t);
        assert!(seeds.len() >= 4, "{t}: {} seeds", seeds.len());
        for (name, bytes) in seeds {
            assert!(run(t, &bytes));
            let path = corpus(t).join(format!("seed-{name}"));
            if write {
                std::fs::create_dir_all(corpus(t)).unwrap();
                std::fs::write(&path, &bytes).unwrap();
            }
            let committed = std::fs::read(&path).unwrap_or_default();
            assert_eq!(committed, bytes, "{} is stale", path.display());
        }
    }
}

/// The whole committed corpus (seeds and what the fuzzer kept) runs without a panic.
#[test]
fn committed_corpus_replays() {
    for t in TARGETS {
        let mut n = 0;
        for entry in std::fs::read_dir(corpus(t)).unwrap() {
            let bytes = std::fs::read(entry.unwrap().path()).unwrap();
            assert!(run(t, &bytes));
            n += 1;
        }
        assert!(n > 0, "{t}: empty corpus");
    }
}

fn seed(target: &str, name: &str) -> Vec<u8> {
    let all = seeds(target);
    all.into_iter().find(|(n, _)| *n == name).expect("a seed").1
}

mod responder_seeds {
    use super::super::arena::{with_arena, Arena};
    use super::super::responder::{execute, Run};
    use super::seed;
    use crate::fabric::{WcOpcode, WcStatus};
    use crate::soft::proto::wire::Response;

    fn replies(name: &str) -> Vec<Response> {
        with_arena(|a| execute(a, &seed("soft_responder", name)).replies)
    }

    fn nak(seq: u64, status: WcStatus) -> Response {
        Response::Nak { seq, status }
    }

    /// The receive completions: (status, opcode, bytes).
    fn receives(run: &Run<'_>) -> Vec<(WcStatus, WcOpcode, u32)> {
        let done = run.target.completions.lock();
        done.iter()
            .map(|c| (c.status, c.opcode, c.byte_len))
            .collect()
    }

    fn bytes(a: &Arena, off: usize, len: usize) -> Vec<u8> {
        a.read(a.at(off), len)
    }

    #[test]
    fn a_write_lands_and_a_read_returns_it() {
        with_arena(|a| {
            let run = execute(a, &seed("soft_responder", "write-read"));
            let len = 64;
            assert_eq!(
                run.replies,
                [Response::Ack { seq: 1 }, Response::ReadData { seq: 2, len }]
            );
            let sent: Vec<u8> = (0..len).map(|i| i as u8 ^ 0x5a).collect();
            assert_eq!(bytes(a, 1024, len as usize), sent);
        });
        with_arena(|a| {
            let run = execute(a, &seed("soft_responder", "in-place"));
            assert_eq!(run.replies, [Response::Ack { seq: 1 }]);
            assert_eq!(bytes(a, 1024, 200), [9; 200]);
        });
    }

    #[test]
    fn sends_consume_receives() {
        with_arena(|a| {
            let run = execute(a, &seed("soft_responder", "send"));
            assert_eq!(run.replies, [Response::Ack { seq: 1 }]);
            assert_eq!(receives(&run), [(WcStatus::Success, WcOpcode::Recv, 300)]);
            let rnr = execute(a, &seed("soft_responder", "rnr-wait"));
            assert_eq!(rnr.replies, [Response::Ack { seq: 1 }]);
            let long = execute(a, &seed("soft_responder", "send-too-long"));
            assert_eq!(long.replies, [nak(1, WcStatus::RemOpErr)]);
            assert_eq!(receives(&long), [(WcStatus::LocQpOpErr, WcOpcode::Recv, 0)]);
        });
    }

    #[test]
    fn bad_keys_and_vanished_regions_are_refused() {
        let refused = nak(1, WcStatus::RemAccessErr);
        assert_eq!(
            replies("bad-keys"),
            [
                refused,
                nak(2, WcStatus::RemAccessErr),
                nak(3, WcStatus::RemAccessErr)
            ]
        );
        assert_eq!(replies("deregistered-mid-payload"), [refused]);
        assert_eq!(
            replies("read-only")[0],
            Response::ReadData { seq: 1, len: 100 }
        );
        assert_eq!(replies("read-only")[1], nak(2, WcStatus::RemAccessErr));
        assert_eq!(replies("atomics")[2], nak(3, WcStatus::RemInvReqErr));
        assert!(replies("garbage").is_empty());
    }
}

mod requester_seeds {
    use super::super::arena::with_arena;
    use super::super::requester::execute;
    use super::seed;
    use crate::fabric::WcStatus::{self, *};

    fn done(name: &str) -> Vec<(u64, WcStatus)> {
        with_arena(|a| execute(a, &seed("soft_requester", name)).done)
    }

    #[test]
    fn right_answers_complete_in_order() {
        let ok: Vec<_> = (0..4).map(|i| (i, Success)).collect();
        assert_eq!(done("write-read-atomics"), ok);
        assert_eq!(done("read-one-byte-pieces"), [(0, Success)]);
        with_arena(|a| {
            let run = execute(a, &seed("soft_requester", "read-in-place"));
            assert_eq!(run.done, [(0, Success)]);
            assert_eq!(a.read(a.at(1024 + 64), 200), [3; 200]);
        });
    }

    #[test]
    fn errors_follow_the_rc_rules() {
        assert_eq!(done("timeout"), [(0, RetryExcErr), (1, WrFlushErr)]);
        assert_eq!(done("nak"), [(0, RemAccessErr), (1, WrFlushErr)]);
        assert_eq!(done("wrong-seq"), [(0, BadRespErr)]);
        assert_eq!(done("deregistered-read"), [(0, LocProtErr)]);
        assert_eq!(
            done("local-ops"),
            [(0, WrFlushErr), (1, Success), (2, RetryExcErr)]
        );
    }
}

mod chunk_seeds {
    use super::super::chunks::execute;
    use super::seed;

    #[test]
    fn a_fresh_node_allocates_and_frees() {
        let s = execute(&seed("pool_chunks", "fresh-node"));
        assert_eq!(s.recovered, 0);
        assert!(s.allocated >= 5 && s.freed >= 1 && s.gave_up == 0, "{s:?}");
    }

    #[test]
    fn a_restart_finds_its_chunks_and_allocates_past_the_full_words() {
        let s = execute(&seed("pool_chunks", "restart"));
        assert_eq!(s.recovered, 2, "{s:?}");
        assert!(s.allocated >= 5 && s.gave_up == 0, "{s:?}");
    }

    #[test]
    fn hostile_headers_are_not_recovered() {
        let s = execute(&seed("pool_chunks", "hostile-headers"));
        assert_eq!(s.recovered, 0, "{s:?}");
    }

    #[test]
    fn a_lying_server_is_survived() {
        let s = execute(&seed("pool_chunks", "liar"));
        assert!(s.allocated + s.gave_up > 0, "{s:?}");
    }
}

mod hello_seeds {
    use super::seed;
    use crate::remote::hello::HelloGate;

    /// The proven hello seed passes a gate with the fuzzer's cluster key (so the target
    /// reaches the path after the MAC), once: its replay is refused.
    #[test]
    fn the_proven_seed_is_admitted_once() {
        let b = seed("descriptors", "client-proven");
        let key = crate::fabric::PreSharedKey::new(&[3; 32]).unwrap();
        let mut gate = HelloGate::new(Some(key));
        assert!(gate.admit(&b[1..], 1_800_000_000).is_ok());
        assert!(gate.admit(&b[1..], 1_800_000_000).is_err());
    }
}
