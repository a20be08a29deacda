//! The YCSB core workloads, generated here: each client draws its operations and keys from
//! a stream of its own, seeded from `--seed` and the client's number, so the same seed gives
//! the same sequence of (operation, key) against every system measured.
//!
//! The definitions are YCSB's `workloads/workload{a,b,c,d,f}` (request distribution Zipfian
//! with constant 0.99, or "latest" for D). Workload E (short range scans) needs an ordered
//! index, which neither the store nor memcached has: it is left out.
//!
//! - **Keys.** Record number `k` is the key `user<h>`, `h` the FNV-1a hash of `k` in decimal
//!   (YCSB's hashed key names). A Zipfian draw picks a popularity rank `r` in
//!   `0..records` (rank 0 the hottest); the record is `fnv(r) mod records`, YCSB's
//!   scrambled Zipfian, so the hot records are spread over the key space rather than being
//!   the first ones loaded.
//! - **D's inserts and "latest" reads.** Client `i` of `n` numbers its `j`-th insert
//!   `records + (j mod cap) * n + i` (`cap` = `records / n`, at least 1: the inserts of all
//!   clients add at most `records` keys, and past that an insert writes over the client's
//!   oldest insert again). A read draws a Zipfian rank over the records the client knows:
//!   rank 0 is its newest insert, then its older inserts, then the loaded records from the
//!   last loaded down (YCSB's skewed-latest: `latest - zipf`). A client reads only keys that
//!   exist: the loaded ones and its own inserts, whatever the other clients have done.

use rand::rngs::StdRng;
use rand::{RngExt, SeedableRng};
use rand_distr::{Distribution, Zipf};

/// YCSB's Zipfian constant.
pub const ZIPF_CONSTANT: f64 = 0.99;

/// One of the YCSB core workloads built here.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Workload {
    /// 50% reads, 50% updates (update heavy).
    A,
    /// 95% reads, 5% updates (read mostly).
    B,
    /// 100% reads (read only).
    C,
    /// 95% reads, 5% inserts, the reads skewed to the latest inserts (read latest).
    D,
    /// 50% reads, 50% read-modify-writes.
    F,
}

impl Workload {
    /// Every workload built, in YCSB's recommended order of running (D last, as its inserts
    /// add records).
    #[cfg(test)]
    pub const ALL: [Workload; 5] = [
        Workload::A,
        Workload::B,
        Workload::C,
        Workload::F,
        Workload::D,
    ];

    /// Parses `a`..`f` (or `ycsb-a`), case-insensitive; `e` is refused, saying why.
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase();
        let t = t.strip_prefix("ycsb-").unwrap_or(&t);
        match t {
            "a" => Ok(Workload::A),
            "b" => Ok(Workload::B),
            "c" => Ok(Workload::C),
            "d" => Ok(Workload::D),
            "f" => Ok(Workload::F),
            "e" => Err(
                "workload E (short range scans) needs an ordered index, which neither the store \
                 nor memcached has: it is left out (use a, b, c, d or f)"
                    .into(),
            ),
            _ => Err(format!("{s:?}: want a YCSB workload a, b, c, d or f")),
        }
    }

    /// The name its rows carry: `ycsb-a` ... `ycsb-f`.
    pub fn name(self) -> &'static str {
        match self {
            Workload::A => "ycsb-a",
            Workload::B => "ycsb-b",
            Workload::C => "ycsb-c",
            Workload::D => "ycsb-d",
            Workload::F => "ycsb-f",
        }
    }

    /// The share of reads; the rest is this workload's other operation
    /// ([`Workload::other`]).
    pub fn read_share(self) -> f64 {
        match self {
            Workload::A | Workload::F => 0.5,
            Workload::B | Workload::D => 0.95,
            Workload::C => 1.0,
        }
    }

    /// The operation that is not a read.
    pub fn other(self) -> Op {
        match self {
            Workload::A | Workload::B | Workload::C => Op::Update,
            Workload::D => Op::Insert,
            Workload::F => Op::ReadModifyWrite,
        }
    }
}

/// A generated operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    /// Read the whole record (it must exist).
    Read,
    /// Write the whole record anew (the store keeps one value per key: YCSB's update of one
    /// field becomes a put of the record).
    Update,
    /// Write a new record.
    Insert,
    /// Read the record, change it, write it back.
    ReadModifyWrite,
}

/// One generated request: an operation on record number `record`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// What to do.
    pub op: Op,
    /// The record's number; its key is [`key`]`(record)`.
    pub record: u64,
}

/// FNV-1a, 64 bits, of `x`'s eight little-endian bytes (YCSB hashes with FNV too).
pub fn fnv1a64(x: u64) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in x.to_le_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The key of record number `record`: `user` and a hash of the number, as YCSB names
/// records.
pub fn key(record: u64) -> String {
    format!("user{}", fnv1a64(record))
}

/// One client's stream of requests.
pub struct Generator {
    workload: Workload,
    rng: StdRng,
    records: u64,
    /// Zipfian over the loaded records' ranks.
    zipf: Zipf<f64>,
    client: u64,
    clients: u64,
    /// D: inserts this client has made.
    inserted: u64,
    /// D: inserts after which this client's insert keys come round again.
    cap: u64,
}

impl Generator {
    /// The stream of client `client` of `clients` running `workload` over `records` loaded
    /// records, from `seed`. `records` and `clients` are at least 1 and `client <
    /// clients`.
    pub fn new(workload: Workload, seed: u64, records: u64, client: u64, clients: u64) -> Self {
        let records = records.max(1);
        let clients = clients.max(1);
        // A stream per (seed, workload, client): distinct for each client, the same for
        // the same three.
        let stream = fnv1a64(seed ^ fnv1a64((client.wrapping_add(1) << 8) | workload as u64));
        Self {
            workload,
            rng: StdRng::seed_from_u64(stream),
            records,
            zipf: zipf(records),
            client,
            clients,
            inserted: 0,
            cap: (records / clients).max(1),
        }
    }

    /// The next request.
    pub fn next_request(&mut self) -> Request {
        let read = self.workload.read_share() >= 1.0
            || self.rng.random::<f64>() < self.workload.read_share();
        let op = if read {
            Op::Read
        } else {
            self.workload.other()
        };
        let record = match (self.workload, op) {
            (_, Op::Insert) => {
                let r = self.insert_key(self.inserted);
                self.inserted += 1;
                r
            }
            (Workload::D, _) => self.latest(),
            _ => self.scrambled(),
        };
        Request { op, record }
    }

    /// A Zipfian rank over `0..records`, scrambled to a record.
    fn scrambled(&mut self) -> u64 {
        let rank = rank(&self.zipf, &mut self.rng, self.records);
        fnv1a64(rank) % self.records
    }

    /// The record of this client's `j`-th insert.
    fn insert_key(&self, j: u64) -> u64 {
        self.records + (j % self.cap) * self.clients + self.client
    }

    /// A record this client knows, skewed to its latest inserts.
    fn latest(&mut self) -> u64 {
        let known = self.records + self.inserted;
        let r = if self.inserted == 0 {
            rank(&self.zipf, &mut self.rng, self.records)
        } else {
            rank(&zipf(known), &mut self.rng, known)
        };
        if r < self.inserted {
            self.insert_key(self.inserted - 1 - r)
        } else {
            self.records - 1 - (r - self.inserted).min(self.records - 1)
        }
    }
}

/// A stream of record numbers drawn as the workloads draw their keys (scrambled Zipfian,
/// constant [`ZIPF_CONSTANT`], over `0..records`), from a seed of its own; with the
/// uniform draws the hit-rate runs' scans start from (`hit.rs`).
pub struct ZipfKeys {
    rng: StdRng,
    zipf: Zipf<f64>,
    records: u64,
}

impl ZipfKeys {
    /// The stream over `records` (at least 1) records from `seed`.
    pub fn new(seed: u64, records: u64) -> Self {
        let records = records.max(1);
        Self {
            rng: StdRng::seed_from_u64(fnv1a64(seed)),
            zipf: zipf(records),
            records,
        }
    }

    /// The next record: a Zipfian rank, scrambled to a record.
    pub fn next_record(&mut self) -> u64 {
        let r = rank(&self.zipf, &mut self.rng, self.records);
        fnv1a64(r) % self.records
    }

    /// A record drawn uniformly (from the same generator).
    pub fn uniform(&mut self) -> u64 {
        self.rng.random_range(0..self.records)
    }
}

/// Zipf over `n` (at least 1) items with [`ZIPF_CONSTANT`].
fn zipf(n: u64) -> Zipf<f64> {
    // n >= 1 and s = 0.99 are in Zipf's domain; the fallback is never taken.
    Zipf::new(n.max(1) as f64, ZIPF_CONSTANT)
        .or_else(|_| Zipf::new(1.0, 0.0))
        .unwrap_or_else(|_| unreachable!("Zipf(1, 0) is uniform over one item"))
}

/// A 0-based rank from `z` (over `n` items), clamped to `0..n`.
fn rank(z: &Zipf<f64>, rng: &mut StdRng, n: u64) -> u64 {
    let x = z.sample(rng);
    (x.max(1.0) as u64 - 1).min(n - 1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn draw(w: Workload, seed: u64, client: u64, clients: u64, n: usize) -> Vec<Request> {
        let mut g = Generator::new(w, seed, 10_000, client, clients);
        (0..n).map(|_| g.next_request()).collect()
    }

    #[test]
    fn each_workload_has_its_mix_within_a_percent() {
        let n = 200_000;
        for w in Workload::ALL {
            let reqs = draw(w, 7, 0, 1, n);
            let reads = reqs.iter().filter(|r| r.op == Op::Read).count() as f64 / n as f64;
            assert!(
                (reads - w.read_share()).abs() < 0.01,
                "{}: {reads} reads, want {}",
                w.name(),
                w.read_share()
            );
            // The rest is the workload's other operation, and only that.
            assert!(
                reqs.iter().all(|r| r.op == Op::Read || r.op == w.other()),
                "{}",
                w.name()
            );
        }
    }

    #[test]
    fn the_same_seed_gives_the_same_stream_and_clients_differ() {
        for w in Workload::ALL {
            assert_eq!(draw(w, 42, 1, 2, 5000), draw(w, 42, 1, 2, 5000));
            assert_ne!(draw(w, 42, 0, 2, 5000), draw(w, 42, 1, 2, 5000));
            assert_ne!(draw(w, 42, 0, 2, 5000), draw(w, 43, 0, 2, 5000));
        }
    }

    #[test]
    fn zipf_makes_the_hottest_key_much_hotter_than_the_median() {
        let reqs = draw(Workload::C, 1, 0, 1, 500_000);
        let mut counts: HashMap<u64, usize> = HashMap::new();
        for r in &reqs {
            assert!(r.record < 10_000);
            *counts.entry(r.record).or_default() += 1;
        }
        let mut all: Vec<usize> = (0..10_000u64)
            .map(|k| counts.get(&k).copied().unwrap_or(0))
            .collect();
        all.sort_unstable();
        let (hottest, median) = (all[all.len() - 1], all[all.len() / 2]);
        assert!(median > 0, "the median record was never read");
        assert!(
            hottest > 100 * median,
            "hottest {hottest}, median {median}: not skewed"
        );
        // Scrambled: the hottest record is not simply record 0 of the load.
        let top = counts.iter().max_by_key(|(_, c)| **c).map(|(k, _)| *k);
        assert_eq!(top, Some(fnv1a64(0) % 10_000));
    }

    #[test]
    fn d_inserts_new_keys_and_reads_mostly_the_latest() {
        let (clients, records) = (2u64, 10_000u64);
        for client in 0..clients {
            let mut g = Generator::new(Workload::D, 3, records, client, clients);
            let mut inserted = std::collections::HashSet::new();
            let (mut reads, mut recent) = (0, 0);
            for _ in 0..200_000 {
                let r = g.next_request();
                match r.op {
                    Op::Insert => {
                        assert!(r.record >= records && r.record % clients == client % clients);
                        inserted.insert(r.record);
                    }
                    Op::Read => {
                        // Only keys that exist: loaded, or inserted by this client.
                        assert!(r.record < records || inserted.contains(&r.record), "{r:?}");
                        reads += 1;
                        recent += usize::from(r.record >= records);
                    }
                    op => panic!("{op:?} in D"),
                }
            }
            // Up to its cap of records / clients inserts, then the same keys again.
            assert_eq!(inserted.len() as u64, records / clients);
            assert!(recent * 2 > reads, "{recent} of {reads} reads of inserts");
        }
    }

    #[test]
    fn workload_names_parse_and_e_is_refused_saying_why() {
        assert_eq!(Workload::parse("A"), Ok(Workload::A));
        assert_eq!(Workload::parse("ycsb-f"), Ok(Workload::F));
        assert!(Workload::parse("e").unwrap_err().contains("range scans"));
        assert!(Workload::parse("z").is_err());
        assert_eq!(key(0), format!("user{}", fnv1a64(0)));
    }
}
