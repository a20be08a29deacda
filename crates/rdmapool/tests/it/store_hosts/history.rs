//! The history checker of the multi-host store test: every client process logs each of its
//! operations (what, on which key, which value, when it started and ended, how it ended),
//! and this reads the logs and the final reads and says what, if anything, broke a promise
//! of docs/STORE.md.
//!
//! A value names itself: its bytes are [`value_of`] its id (`client.n`), so a get that
//! returns bytes returns an id, or bytes that no put wrote (corrupt).
//!
//! Keys `c<client>/...` are written by one client only, so their history is sequential:
//! after the last acknowledged write (put or remove), a get may answer that write's value,
//! or the value of a write that failed since (a failed put may have landed), nothing else.
//! Keys `shared/...` are written by every client: a get answers nothing, or a value some
//! put of that key had started before the get ended; and never a **stale** answer (issue
//! #40): once a write (put or remove) of the key was acknowledged, a get that starts later
//! answers a write that did not end, acknowledged, before that one started. (A write that
//! failed may have landed at any time after it started: it never counts as over.) The final
//! reads, after every client stopped, are held to the same rule.

use std::collections::{HashMap, HashSet};

/// The bytes of the value whose id is `vid`: the id, `;`, then a pattern of a length fixed
/// by the id (1 to 2000 bytes in all).
pub fn value_of(vid: &str) -> Vec<u8> {
    let h = vid.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
    });
    let len = 16 + (h % 1984) as usize;
    let mut v = format!("{vid};").into_bytes();
    let mut x = h | 1;
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.push(x as u8);
    }
    v
}

/// The id of the value `bytes`, if they are exactly a value's bytes.
pub fn id_of(bytes: &[u8]) -> Option<String> {
    let end = bytes.iter().position(|&b| b == b';')?;
    let vid = std::str::from_utf8(&bytes[..end]).ok()?;
    (value_of(vid) == bytes).then(|| vid.to_string())
}

/// How an operation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// A put or remove acknowledged.
    Ok,
    /// Failed with an error (it may or may not have taken effect).
    Err,
    /// A get's answer: the value with this id.
    Val(String),
    /// A get's answer: no value.
    Nothing,
    /// A get's answer: bytes no put wrote.
    Corrupt,
}

/// One logged operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// `put`, `rm` or `get`.
    pub kind: String,
    pub key: String,
    /// The value's id, for a put.
    pub vid: Option<String>,
    pub start: u128,
    pub end: u128,
    pub outcome: Outcome,
}

impl Op {
    /// One log line: `kind key vid|- start end outcome`.
    pub fn line(&self) -> String {
        let outcome = match &self.outcome {
            Outcome::Ok => "ok".to_string(),
            Outcome::Err => "err".to_string(),
            Outcome::Val(v) => format!("val:{v}"),
            Outcome::Nothing => "none".to_string(),
            Outcome::Corrupt => "corrupt".to_string(),
        };
        let vid = self.vid.as_deref().unwrap_or("-");
        format!(
            "{} {} {vid} {} {} {outcome}",
            self.kind, self.key, self.start, self.end
        )
    }

    /// Parses [`Op::line`]'s output.
    pub fn parse(line: &str) -> Option<Op> {
        let f: Vec<&str> = line.split(' ').collect();
        let [kind, key, vid, start, end, outcome] = f[..] else {
            return None;
        };
        let outcome = match outcome {
            "ok" => Outcome::Ok,
            "err" => Outcome::Err,
            "none" => Outcome::Nothing,
            "corrupt" => Outcome::Corrupt,
            v => Outcome::Val(v.strip_prefix("val:")?.to_string()),
        };
        Some(Op {
            kind: kind.into(),
            key: key.into(),
            vid: (vid != "-").then(|| vid.to_string()),
            start: start.parse().ok()?,
            end: end.parse().ok()?,
            outcome,
        })
    }
}

/// What a single writer's key may answer now: the last acknowledged write's value (`None`:
/// removed or never written), and those of the writes that failed since.
#[derive(Debug, Clone, Default)]
struct Allowed {
    acked: Option<String>,
    failed_since: Vec<Option<String>>,
}

impl Allowed {
    fn admits(&self, got: Option<&str>) -> bool {
        self.acked.as_deref() == got || self.failed_since.iter().any(|f| f.as_deref() == got)
    }
}

/// What the check counted.
#[derive(Debug, Default)]
pub struct Summary {
    pub ops: usize,
    pub acked_writes: usize,
    pub failed: usize,
    pub gets_checked: usize,
    pub gets_with_value: usize,
    pub finals_checked: usize,
    /// Gets (and final reads) that found nothing where a value was allowed: a cache's
    /// misses (none is allowed of a durable store).
    pub misses: usize,
}

/// Checks `logs` (one per client, in its order) and `finals` (key → the answer of a read
/// after every client stopped and a repair ran). Every broken promise is returned. With
/// `misses_allowed` (a cache, docs/STORE.md section 12), a read that finds nothing is a
/// miss, counted; a value must still be one the promises allow.
pub fn check(
    logs: &[Vec<Op>],
    finals: &HashMap<String, Option<String>>,
    misses_allowed: bool,
) -> Result<Summary, Vec<String>> {
    let mut bad = Vec::new();
    let mut sum = Summary::default();
    let mut single: HashMap<String, Allowed> = HashMap::new();
    // Shared keys: every put's (value id, start).
    let mut shared_puts: HashMap<String, Vec<(String, u128)>> = HashMap::new();
    for ops in logs {
        for op in ops {
            if op.kind == "put" && op.key.starts_with("shared/") {
                if let Some(v) = &op.vid {
                    shared_puts
                        .entry(op.key.clone())
                        .or_default()
                        .push((v.clone(), op.start));
                }
            }
        }
    }
    for ops in logs {
        for op in ops {
            sum.ops += 1;
            let shared = op.key.starts_with("shared/");
            if op.outcome == Outcome::Corrupt {
                bad.push(format!("{}: bytes no put wrote", op.line()));
                continue;
            }
            match (op.kind.as_str(), &op.outcome) {
                (_, Outcome::Err) => sum.failed += 1,
                ("put" | "rm", Outcome::Ok) => sum.acked_writes += 1,
                _ => {}
            }
            if shared {
                if let Outcome::Val(v) = &op.outcome {
                    sum.gets_checked += 1;
                    sum.gets_with_value += 1;
                    let put = shared_puts
                        .get(&op.key)
                        .is_some_and(|p| p.iter().any(|(pv, s)| pv == v && *s < op.end));
                    if !put {
                        bad.push(format!("{}: no put of that value had started", op.line()));
                    }
                } else if op.outcome == Outcome::Nothing {
                    sum.gets_checked += 1;
                }
                continue;
            }
            let a = single.entry(op.key.clone()).or_default();
            match (op.kind.as_str(), &op.outcome) {
                ("put", Outcome::Ok) => {
                    *a = Allowed {
                        acked: op.vid.clone(),
                        failed_since: vec![],
                    }
                }
                ("rm", Outcome::Ok) => *a = Allowed::default(),
                ("put", Outcome::Err) => a.failed_since.push(op.vid.clone()),
                ("rm", Outcome::Err) => a.failed_since.push(None),
                ("get", Outcome::Val(v)) => {
                    sum.gets_checked += 1;
                    sum.gets_with_value += 1;
                    if !a.admits(Some(v)) {
                        bad.push(format!("{}: allowed {a:?}", op.line()));
                    }
                }
                ("get", Outcome::Nothing) => {
                    sum.gets_checked += 1;
                    if !a.admits(None) {
                        if misses_allowed {
                            sum.misses += 1;
                        } else {
                            bad.push(format!("{}: allowed {a:?}", op.line()));
                        }
                    }
                }
                _ => {}
            }
        }
    }
    stale_shared_reads(logs, finals, misses_allowed, &mut bad);
    let shared_ids: HashSet<(String, String)> = shared_puts
        .iter()
        .flat_map(|(k, p)| p.iter().map(move |(v, _)| (k.clone(), v.clone())))
        .collect();
    for (key, got) in finals {
        sum.finals_checked += 1;
        let ok = if got.is_none() && misses_allowed {
            sum.misses += 1;
            true
        } else if key.starts_with("shared/") {
            got.as_ref()
                .is_none_or(|v| shared_ids.contains(&(key.clone(), v.clone())))
        } else {
            single
                .get(key)
                .cloned()
                .unwrap_or_default()
                .admits(got.as_deref())
        };
        if !ok {
            bad.push(format!(
                "final read of {key}: {got:?}, allowed {:?}",
                single.get(key)
            ));
        }
    }
    if bad.is_empty() {
        Ok(sum)
    } else {
        Err(bad)
    }
}

/// One write of a shared key: the value it leaves (`None`: removed), when it started, and
/// when it ended if it was acknowledged.
struct Write {
    leaves: Option<String>,
    start: u128,
    acked_end: Option<u128>,
}

/// Adds to `bad` every read of a shared key (a get, or a final read) that answers a write
/// that had ended, acknowledged, before another acknowledged write started, which itself
/// ended before the read started: the newer write was overtaken.
/// With `misses_allowed` (a cache), a read that found nothing is a miss, not stale.
fn stale_shared_reads(
    logs: &[Vec<Op>],
    finals: &HashMap<String, Option<String>>,
    misses_allowed: bool,
    bad: &mut Vec<String>,
) {
    let mut writes: HashMap<&str, Vec<Write>> = HashMap::new();
    for op in logs.iter().flatten() {
        if !op.key.starts_with("shared/") || !matches!(op.kind.as_str(), "put" | "rm") {
            continue;
        }
        writes.entry(&op.key).or_default().push(Write {
            leaves: if op.kind == "put" {
                op.vid.clone()
            } else {
                None
            },
            start: op.start,
            acked_end: (op.outcome == Outcome::Ok).then_some(op.end),
        });
    }
    // Whether an answer `got` of `key`, read from `start` on, is stale.
    let stale = |key: &str, got: Option<&str>, start: u128| -> Option<String> {
        if got.is_none() && misses_allowed {
            return None;
        }
        let ws = writes.get(key)?;
        // The writes that leave this answer; "nothing" is also the key's first state,
        // which ended before any write started.
        let sources: Vec<(u128, Option<u128>)> = ws
            .iter()
            .filter(|w| w.leaves.as_deref() == got)
            .map(|w| (w.start, w.acked_end))
            .chain(got.is_none().then_some((0, Some(0))))
            .collect();
        let newer = ws.iter().find(|w| {
            w.acked_end.is_some_and(|end| end < start)
                && w.leaves.as_deref() != got
                && sources.iter().all(|&(_, e)| e.is_some_and(|e| e < w.start))
        })?;
        Some(format!(
            "overtaken: the write leaving {:?}, acknowledged at {}, had started at {}",
            newer.leaves,
            newer.acked_end.unwrap_or(0),
            newer.start
        ))
    };
    for op in logs.iter().flatten() {
        if !op.key.starts_with("shared/") || op.kind != "get" {
            continue;
        }
        let got = match &op.outcome {
            Outcome::Val(v) => Some(v.as_str()),
            Outcome::Nothing => None,
            _ => continue,
        };
        if let Some(why) = stale(&op.key, got, op.start) {
            bad.push(format!("{}: {why}", op.line()));
        }
    }
    for (key, got) in finals.iter().filter(|(k, _)| k.starts_with("shared/")) {
        if let Some(why) = stale(key, got.as_deref(), u128::MAX) {
            bad.push(format!("final read of {key}: {got:?}: {why}"));
        }
    }
}

#[test]
fn the_checker_catches_a_shared_write_overtaken_by_an_older_one() {
    let op = |kind: &str, vid: Option<&str>, t: u128, outcome: Outcome| Op {
        kind: kind.into(),
        key: "shared/s".into(),
        vid: vid.map(Into::into),
        start: t,
        end: t + 1,
        outcome,
    };
    let val = |v: &str| Outcome::Val(v.into());
    // Issue #40's case: 102's put acknowledged, then 101's, then a get answers 102's.
    let c102 = vec![op("put", Some("102.1"), 10, Outcome::Ok)];
    let c101 = vec![
        op("put", Some("101.1"), 20, Outcome::Ok),
        op("get", None, 30, val("102.1")),
    ];
    let none = HashMap::new();
    let bad = check(&[c102.clone(), c101.clone()], &none, false).unwrap_err();
    assert!(bad[0].contains("overtaken"), "{bad:?}");
    // Concurrent puts: either answer is fine.
    let c102 = vec![op("put", Some("102.1"), 20, Outcome::Ok)];
    assert!(check(&[c102, c101.clone()], &none, false).is_ok());
    // A put that failed may land late: its value is never stale.
    let c102 = vec![op("put", Some("102.1"), 10, Outcome::Err)];
    assert!(check(&[c102, c101.clone()], &none, false).is_ok());
    // "Nothing" after an acknowledged put with no remove since: stale; after an
    // acknowledged remove that followed it: fine.
    let c101 = vec![
        op("put", Some("101.1"), 20, Outcome::Ok),
        op("get", None, 30, Outcome::Nothing),
    ];
    assert!(check(std::slice::from_ref(&c101), &none, false).is_err());
    let c102 = vec![op("rm", None, 25, Outcome::Ok)];
    assert!(check(&[c102, c101], &none, false).is_ok());
    // The final read is held to the same rule.
    let c101 = vec![
        op("put", Some("101.1"), 20, Outcome::Ok),
        op("put", Some("101.2"), 30, Outcome::Ok),
    ];
    let finals: HashMap<String, Option<String>> =
        [("shared/s".to_string(), Some("101.1".to_string()))].into();
    assert!(check(std::slice::from_ref(&c101), &finals, false).is_err());
    let finals: HashMap<String, Option<String>> =
        [("shared/s".to_string(), Some("101.2".to_string()))].into();
    assert!(check(&[c101], &finals, false).is_ok());
}

#[test]
fn the_checker_catches_stale_lost_and_invented_answers() {
    let op = |kind: &str, key: &str, vid: Option<&str>, t: u128, outcome: Outcome| Op {
        kind: kind.into(),
        key: key.into(),
        vid: vid.map(Into::into),
        start: t,
        end: t + 1,
        outcome,
    };
    let val = |v: &str| Outcome::Val(v.into());
    let good = vec![
        op("put", "c1/a", Some("1.1"), 1, Outcome::Ok),
        op("put", "c1/a", Some("1.2"), 3, Outcome::Err),
        op("get", "c1/a", None, 5, val("1.2")), // the failed put landed: allowed
        op("get", "c1/a", None, 6, val("1.1")), // or not
        op("rm", "c1/a", None, 7, Outcome::Ok),
        op("get", "c1/a", None, 9, Outcome::Nothing),
        op("put", "shared/s", Some("1.3"), 10, Outcome::Err),
        op("get", "shared/s", None, 12, val("1.3")),
    ];
    let finals: HashMap<String, Option<String>> = [("c1/a".to_string(), None)].into();
    let s = check(std::slice::from_ref(&good), &finals, false).unwrap();
    assert_eq!((s.ops, s.gets_checked, s.acked_writes), (8, 4, 2));
    // An older acknowledged value after a newer one was acknowledged.
    let mut stale = good.clone();
    stale.push(op("put", "c1/a", Some("1.4"), 20, Outcome::Ok));
    stale.push(op("get", "c1/a", None, 22, val("1.1")));
    // A cache (misses allowed) holds every answer to the same rules but "nothing".
    for cache in [false, true] {
        assert!(check(&[stale.clone()], &HashMap::new(), cache).is_err());
    }
    // An acknowledged put lost by the end: a durable store's broken promise, a cache's
    // miss (an evicted key), counted.
    let mut lost = good.clone();
    lost.push(op("put", "c1/a", Some("1.5"), 20, Outcome::Ok));
    lost.push(op("get", "c1/a", None, 22, Outcome::Nothing));
    assert!(check(std::slice::from_ref(&lost), &finals, false).is_err());
    assert_eq!(check(&[lost], &finals, true).unwrap().misses, 2);
    // A shared value nobody put, and corrupt bytes.
    let mut invented = good.clone();
    invented.push(op("get", "shared/s", None, 30, val("2.9")));
    let mut corrupt = good;
    corrupt.push(op("get", "c1/a", None, 30, Outcome::Corrupt));
    for cache in [false, true] {
        assert!(check(&[invented.clone()], &HashMap::new(), cache).is_err());
        assert!(check(&[corrupt.clone()], &HashMap::new(), cache).is_err());
    }
    // Values name themselves; a flipped byte names nothing.
    let mut v = value_of("3.7");
    assert_eq!(id_of(&v).as_deref(), Some("3.7"));
    let last = v.len() - 1;
    v[last] ^= 1;
    assert_eq!(id_of(&v), None);
    let line = op("get", "c1/a", None, 5, val("1.2")).line();
    assert_eq!(Op::parse(&line).unwrap().line(), line);
}
