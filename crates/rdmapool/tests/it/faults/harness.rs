//! The parent's side: starting targets and workloads in the namespaces, running rounds,
//! comparing what initiators wrote with what targets hold, resource levels, summaries.

use super::procs::*;
use crate::support::faultnet::{FaultNet, Faults, ADDR_A, ADDR_B};
use std::collections::BTreeMap;

pub const BLOCK: usize = 16 << 10;

/// The relay between fresh namespaces, or None (with the reason) where this cannot run.
pub fn net(tag: &str, seed: u64) -> Option<FaultNet> {
    if crate::support::soft_only("the soft TCP path across a faulty link") {
        return None;
    }
    match FaultNet::new(tag, seed) {
        Ok(n) => Some(n),
        Err(why) if std::env::var("CI").is_err() => {
            eprintln!("skipped: {why}");
            None
        }
        Err(why) => panic!("CI must be able to make namespaces and TUN devices: {why}"),
    }
}

pub struct Target {
    pub p: Proc,
    pub cm: String,
    pub pool: Option<String>,
}

/// A target process on side A (with a memory server if `pool`).
pub fn target(net: &FaultNet, name: &str, pool: bool, env: &[(&str, String)]) -> Target {
    let mut e = env.to_vec();
    e.push(("POOL", if pool { "1" } else { "0" }.into()));
    let mut p = Proc::spawn(&net.ns_a, name, "target", ADDR_A, &e);
    let ready = p.expect("ready");
    let w: Vec<&str> = ready.split_whitespace().collect();
    Target {
        cm: w[0].to_string(),
        pool: (w[1] != "-").then(|| w[1].to_string()),
        p,
    }
}

/// A workload process on side B connecting to `targets` (CM addresses) and `pool`.
pub fn workload(
    net: &FaultNet,
    name: &str,
    targets: &[&str],
    pool: Option<&str>,
    env: &[(&str, String)],
) -> Proc {
    let mut e = env.to_vec();
    e.push(("TARGETS", targets.join(",")));
    e.push(("POOL", pool.unwrap_or("").into()));
    e.push(("BLOCK", BLOCK.to_string()));
    let mut p = Proc::spawn(&net.ns_b, name, "workload", ADDR_B, &e);
    p.expect("started");
    p
}

/// What a run reported.
#[derive(Debug, Default)]
pub struct Done {
    pub attempted: u64,
    pub completed: u64,
    pub failed: u64,
    pub verified: u64,
    pub mismatches: u64,
    pub hangs: u64,
    pub errors: BTreeMap<String, u64>,
}

impl Done {
    fn parse(s: &str) -> Done {
        let f = fields(s);
        let n = |k: &str| f[k].parse::<u64>().unwrap();
        let errors = f["errors"]
            .split(',')
            .filter_map(|kv| kv.split_once(':'))
            .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
            .collect();
        Done {
            attempted: n("attempted"),
            completed: n("completed"),
            failed: n("failed"),
            verified: n("verified"),
            mismatches: n("mismatches"),
            hangs: n("hangs"),
            errors,
        }
    }

    /// Nothing hung, no data was wrong, and every failure was counted under a type.
    fn check(&self, what: &str) {
        assert_eq!(
            self.hangs, 0,
            "{what}: an operation never completed: {self:?}"
        );
        assert_eq!(self.mismatches, 0, "{what}: data damaged: {self:?}");
        assert_eq!(
            self.attempted,
            self.completed + self.failed,
            "{what}: {self:?}"
        );
        assert_eq!(
            self.errors.values().sum::<u64>(),
            self.failed,
            "{what}: {self:?}"
        );
    }

    fn line(&self) -> String {
        format!(
            "ops attempted={} completed={} failed={} errors={:?} bytes verified={}",
            self.attempted, self.completed, self.failed, self.errors, self.verified
        )
    }

    /// Failures whose type contains `kind`.
    pub fn count(&self, kind: &str) -> u64 {
        self.errors
            .iter()
            .filter(|(k, _)| k.contains(kind))
            .map(|(_, v)| v)
            .sum()
    }
}

/// `run ROUNDS`; `mid` runs once the workload says it is streaming (a quarter in).
pub fn run_with(w: &mut Proc, rounds: u64, mid: impl FnOnce()) -> Done {
    w.say(&format!("run {rounds}"));
    w.expect("streaming");
    mid();
    let d = Done::parse(&w.expect("done"));
    d.check(&w.name);
    d
}

pub fn run(w: &mut Proc, rounds: u64) -> Done {
    run_with(w, rounds, || {})
}

/// Compares what `w` last wrote on each connection with what its target holds; returns the
/// number of blocks compared. `targets[of_conn[j]]` is the target of connection j (None:
/// not checked).
pub fn cross_check(w: &mut Proc, targets: &mut [&mut Target], of_conn: &[Option<usize>]) -> usize {
    w.say("known");
    let known = w.expect("known");
    let mut compared = 0;
    for (conn, j) in known.split_whitespace().zip(of_conn) {
        let Some(j) = j else { continue };
        let t = &mut targets[*j];
        let (first, sums) = conn.split_once(':').unwrap();
        let sums: Vec<&str> = sums.split(',').collect();
        t.p.say(&format!("sums {BLOCK} {first} {}", sums.len()));
        let theirs = t.p.expect("sums");
        for (i, (ours, theirs)) in sums.iter().zip(theirs.split(',')).enumerate() {
            if *ours != "?" {
                assert_eq!(
                    *ours, theirs,
                    "{}: block {first}+{i} differs at {}",
                    w.name, t.p.name
                );
                compared += 1;
            }
        }
    }
    compared
}

/// Asks for the levels (after `close`/`settle`), asserts they are back to the start.
pub fn levels(p: &mut Proc, cmd: &str) -> String {
    p.say(cmd);
    let l = p.expect("levels");
    let (start, end) = l.split_once(' ').unwrap();
    let (start, end): (Levels, Levels) = (start.parse().unwrap(), end.parse().unwrap());
    assert_eq!(start, end, "{}: resource levels before and after", p.name);
    format!("{}: {end} (as before)", p.name)
}

pub fn summary(scenario: &str, done: &[&Done], net: &FaultNet, extra: &str) {
    for d in done {
        eprintln!("[faults] {scenario}: {}", d.line());
    }
    eprintln!("[faults] {scenario}: {} {extra}", net.counts());
}

pub fn lossy() -> Faults {
    Faults {
        loss_pct: 5.0,
        delay_ms: 2,
        jitter_ms: 2,
        reorder_pct: 5.0,
        duplicate_pct: 3.0,
    }
}

/// Delay, reordering and duplication, no loss: TCP hides all of it.
pub fn mild() -> Faults {
    Faults {
        loss_pct: 0.0,
        delay_ms: 1,
        jitter_ms: 1,
        reorder_pct: 2.0,
        duplicate_pct: 2.0,
    }
}

pub fn forget_and_settle(t: &mut Target) -> String {
    t.p.say("forget");
    t.p.expect("forgot");
    levels(&mut t.p, "settle")
}

/// A QP timeout of one second (targets and initiators alike).
pub fn short() -> (&'static str, String) {
    ("QP_TIMEOUT_MS", "1000".into())
}

/// The end of a one-initiator, one-target scenario: cross-checks the initiator's blocks
/// against the target's memory, closes the initiator and settles the target (both must be
/// back to their starting resource levels), and prints the summary with `note` first.
/// Returns the number of blocks compared.
pub fn wrap_up(
    scenario: &str,
    w: &mut Proc,
    t: &mut Target,
    done: &[&Done],
    net: &FaultNet,
    note: &str,
) -> usize {
    let compared = cross_check(w, &mut [&mut *t], &[Some(0)]);
    let lw = levels(w, "close");
    let lt = forget_and_settle(t);
    let extra = format!("{note}blocks cross-checked={compared}; {lw}; {lt}");
    summary(scenario, done, net, &extra);
    compared
}
