//! Property test: random sequences of one-sided operations (some out of bounds), posted in
//! random batches, against a shadow model of the target's memory.

use crate::support::*;
use proptest::prelude::*;
use rdmapool::fabric::*;

const TARGET: usize = 8192;
const ALL: AccessFlags = AccessFlags::all_remote();

#[derive(Debug, Clone)]
enum Op {
    Write { off: usize, len: usize, seed: u8 },
    Read { off: usize, len: usize },
    Cas { word: usize, hit: bool, swap: u64 },
    Faa { word: usize, add: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    // Offsets may run up to 64 bytes past the end: those are out of bounds.
    prop_oneof![
        (0..TARGET + 64, 1..600usize, any::<u8>()).prop_map(|(off, len, seed)| Op::Write {
            off,
            len,
            seed
        }),
        (0..TARGET + 64, 1..600usize).prop_map(|(off, len)| Op::Read { off, len }),
        (0..TARGET / 8 + 4, any::<bool>(), any::<u64>()).prop_map(|(word, hit, swap)| Op::Cas {
            word,
            hit,
            swap
        }),
        (0..TARGET / 8 + 4, any::<u64>()).prop_map(|(word, add)| Op::Faa { word, add }),
    ]
}

fn run(ops: &[Op], batch: usize, t: Transport) -> Result<(), TestCaseError> {
    let (a, b) = (node_on(t), node_on(t));
    let (qa, _qb) = pair(&a, &b, &config());
    let target = b.pd.alloc_mr(TARGET, ALL).unwrap();
    let mut shadow = pattern(TARGET, 77);
    target.write_at(0, &shadow).unwrap();
    // One local slot per op so a batch never reuses a buffer while it is in flight.
    let slot = 1024;
    let local = a.pd.alloc_mr(slot * ops.len().max(1), ALL).unwrap();
    let mut failed = false;
    for (chunk_no, chunk) in ops.chunks(batch).enumerate() {
        let base = chunk_no * batch;
        let mut sges = Vec::new();
        let mut wrs_ops = Vec::new();
        let mut compares = Vec::new();
        for (i, op) in chunk.iter().enumerate() {
            let at = (base + i) * slot;
            let (wop, len) = match *op {
                Op::Write { off, len, seed } => {
                    local.write_at(at, &pattern(len, seed)).unwrap();
                    (
                        WrOp::Write {
                            remote: RemoteAddr {
                                addr: target.addr() + off as u64,
                                rkey: target.rkey(),
                            },
                            imm: None,
                        },
                        len,
                    )
                }
                Op::Read { off, len } => (
                    WrOp::Read {
                        remote: RemoteAddr {
                            addr: target.addr() + off as u64,
                            rkey: target.rkey(),
                        },
                    },
                    len,
                ),
                Op::Cas { word, hit, swap } => {
                    let current = shadow
                        .get(word * 8..word * 8 + 8)
                        .map(|b| u64::from_ne_bytes(b.try_into().unwrap()))
                        .unwrap_or(0);
                    // Built from the model before this batch runs, so earlier ops in the batch
                    // may make a "hit" miss or the other way round; the check below decides
                    // from the model state at execution time.
                    let compare = if hit { current } else { current ^ 1 };
                    compares.push(compare);
                    (
                        WrOp::CompareSwap {
                            remote: RemoteAddr {
                                addr: target.addr() + word as u64 * 8,
                                rkey: target.rkey(),
                            },
                            compare,
                            swap,
                        },
                        8,
                    )
                }
                Op::Faa { word, add } => (
                    WrOp::FetchAdd {
                        remote: RemoteAddr {
                            addr: target.addr() + word as u64 * 8,
                            rkey: target.rkey(),
                        },
                        add,
                    },
                    8,
                ),
            };
            sges.push([local.sge(at, len as u32).unwrap()]);
            wrs_ops.push(wop);
        }
        let wrs: Vec<SendWr> = wrs_ops
            .iter()
            .zip(&sges)
            .enumerate()
            .map(|(i, (op, sg))| SendWr {
                wr_id: (base + i) as u64,
                op: *op,
                sg_list: sg,
                signaled: true,
            })
            .collect();
        qa.post_send(&wrs).unwrap();
        let got = a.cq.wait(wrs.len(), WAIT).unwrap();
        prop_assert_eq!(got.len(), wrs.len());
        // Apply the model in order and compare each completion.
        let mut compares = compares.into_iter();
        for (i, (op, c)) in chunk.iter().zip(&got).enumerate() {
            prop_assert_eq!(c.wr_id, (base + i) as u64);
            let at = (base + i) * slot;
            let in_bounds = |off: usize, len: usize| off + len <= TARGET;
            let expected = if failed {
                WcStatus::WrFlushErr
            } else {
                match *op {
                    Op::Write { off, len, seed } if in_bounds(off, len) => {
                        shadow[off..off + len].copy_from_slice(&pattern(len, seed));
                        WcStatus::Success
                    }
                    Op::Read { off, len } if in_bounds(off, len) => {
                        let mut got = vec![0u8; len];
                        local.read_at(at, &mut got).unwrap();
                        prop_assert_eq!(&got[..], &shadow[off..off + len], "read {}+{}", off, len);
                        WcStatus::Success
                    }
                    Op::Cas { word, swap, .. } if in_bounds(word * 8, 8) => {
                        let compare = compares.next().unwrap();
                        let cur =
                            u64::from_ne_bytes(shadow[word * 8..word * 8 + 8].try_into().unwrap());
                        prop_assert_eq!(local.read_u64(at).unwrap(), cur);
                        if compare == cur {
                            shadow[word * 8..word * 8 + 8].copy_from_slice(&swap.to_ne_bytes());
                        }
                        WcStatus::Success
                    }
                    Op::Faa { word, add } if in_bounds(word * 8, 8) => {
                        let cur =
                            u64::from_ne_bytes(shadow[word * 8..word * 8 + 8].try_into().unwrap());
                        prop_assert_eq!(local.read_u64(at).unwrap(), cur);
                        shadow[word * 8..word * 8 + 8]
                            .copy_from_slice(&cur.wrapping_add(add).to_ne_bytes());
                        WcStatus::Success
                    }
                    Op::Cas { .. } => {
                        compares.next();
                        WcStatus::RemAccessErr
                    }
                    _ => WcStatus::RemAccessErr,
                }
            };
            prop_assert_eq!(c.status, expected, "op {} {:?}", base + i, op);
            if expected != WcStatus::Success {
                failed = true;
            }
        }
        let now = contents(&target);
        let first_diff = now.iter().zip(&shadow).position(|(x, y)| x != y);
        prop_assert_eq!(
            first_diff,
            None,
            "target differs from the model after batch {}",
            chunk_no
        );
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_operations_match_the_shadow_model(
        ops in prop::collection::vec(op(), 1..40),
        batch in 1..8usize,
        tcp in any::<bool>(),
    ) {
        run(&ops, batch, if tcp { Transport::Tcp } else { Transport::Local })?;
    }
}
