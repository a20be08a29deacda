use super::super::format::{block_len, encode_block, Slot, Version};
use super::*;
use std::collections::HashMap;

fn layout() -> Layout {
    Layout::new(4 << 20, 1 << 20, 16).unwrap()
}

/// Two nodes' regions as bytes, each with its index in chunk 0.
struct Cluster {
    regions: HashMap<u32, Vec<u8>>,
    replicas: Vec<Replica>,
    next_block: u64,
}

impl Cluster {
    fn new(nodes: &[u32]) -> Self {
        let l = layout();
        let index = Index {
            chunk: 0,
            start: l.chunk(0) + 64,
            buckets: ((1 << 20) - 64) / 64,
        };
        Self {
            regions: nodes
                .iter()
                .map(|&n| (n, vec![0; l.len as usize]))
                .collect(),
            replicas: nodes
                .iter()
                .map(|&node| Replica {
                    node,
                    layout: l,
                    index,
                })
                .collect(),
            next_block: l.chunk(1),
        }
    }

    /// Writes a block for `key` on `node` and points a free slot of its bucket at it.
    fn put(&mut self, node: u32, key: &[u8], value: &[u8], version: Version) -> u64 {
        let block = encode_block(key, value, version, false).unwrap();
        let at = self.next_block;
        self.next_block += block.len().next_multiple_of(64) as u64;
        let r = self.replicas.iter().find(|r| r.node == node).unwrap();
        let h = KeyHash::of(key);
        let bucket = r.index.bucket(h.bucket(r.index.buckets)) as usize;
        let region = self.regions.get_mut(&node).unwrap();
        region[at as usize..at as usize + block.len()].copy_from_slice(&block);
        let word = Slot::new(h, at, block_len(key, value.len() as u64))
            .unwrap()
            .word();
        let free = (0..8)
            .find(|i| region[bucket + i * 8..bucket + i * 8 + 8] == [0; 8])
            .unwrap();
        region[bucket + free * 8..bucket + free * 8 + 8].copy_from_slice(&word.to_le_bytes());
        at
    }

    /// Runs a get; `down` nodes fail every read.
    fn get(&self, key: &[u8], down: &[u32]) -> Result<Option<Vec<u8>>> {
        let mut g = Get::new(key, self.replicas.clone());
        let mut bytes: Vec<Option<Vec<u8>>> = Vec::new();
        loop {
            let replies: Vec<Option<&[u8]>> = bytes.iter().map(Option::as_deref).collect();
            match g.advance(&replies)? {
                GetStep::Read(reads) => {
                    bytes = reads
                        .iter()
                        .map(|r| {
                            (!down.contains(&r.node)).then(|| {
                                self.regions[&r.node][r.at as usize..(r.at + r.len) as usize]
                                    .to_vec()
                            })
                        })
                        .collect();
                }
                GetStep::Done(None) => return Ok(None),
                GetStep::Done(Some((i, f))) => {
                    let b = bytes[i].as_ref().unwrap();
                    return Ok(Some(b[f.block.value].to_vec()));
                }
            }
        }
    }
}

fn v(seq: u64, writer: u64) -> Version {
    Version { seq, writer }
}

#[test]
fn a_get_answers_the_newest_version_on_any_replica() {
    let mut c = Cluster::new(&[1, 2]);
    c.put(1, b"k", b"first", v(1, 7));
    c.put(2, b"k", b"second", v(2, 7));
    c.put(1, b"other", b"x", v(5, 7));
    assert_eq!(c.get(b"k", &[]).unwrap().unwrap(), b"second");
    assert_eq!(c.get(b"missing", &[]).unwrap(), None);
}

#[test]
fn a_get_falls_over_to_a_replica_that_answers() {
    let mut c = Cluster::new(&[1, 2]);
    c.put(1, b"k", b"v", v(1, 7));
    c.put(2, b"k", b"v", v(1, 7));
    assert_eq!(c.get(b"k", &[1]).unwrap().unwrap(), b"v");
    assert_eq!(c.get(b"k", &[2]).unwrap().unwrap(), b"v");
    assert!(matches!(c.get(b"k", &[1, 2]), Err(Error::NodeDown { .. })));
}

#[test]
fn a_damaged_block_is_skipped_for_a_replica_that_verifies() {
    let mut c = Cluster::new(&[1, 2]);
    let at = c.put(1, b"k", b"value", v(3, 7));
    c.put(2, b"k", b"value", v(3, 7));
    // Flip a byte of the value in node 1's memory.
    let region = c.regions.get_mut(&1).unwrap();
    region[at as usize + 64 + 1 + 2] ^= 0x40;
    assert_eq!(c.get(b"k", &[]).unwrap().unwrap(), b"value");
    // With the good replica down, the damaged copy is no answer and no "not found".
    assert!(matches!(c.get(b"k", &[2]), Err(Error::NodeDown { .. })));
}

#[test]
fn a_slot_naming_memory_outside_the_data_area_is_skipped() {
    let mut c = Cluster::new(&[1]);
    let h = KeyHash::of(b"k");
    let r = c.replicas[0];
    let bucket = r.index.bucket(h.bucket(r.index.buckets)) as usize;
    let bad = Slot::new(h, 8, 100).unwrap().word(); // in the region header
    c.regions.get_mut(&1).unwrap()[bucket..bucket + 8].copy_from_slice(&bad.to_le_bytes());
    assert_eq!(c.get(b"k", &[]).unwrap(), None);
    c.put(1, b"k", b"real", v(1, 1));
    assert_eq!(c.get(b"k", &[]).unwrap().unwrap(), b"real");
}
