//! Finding a key on its replicas, the first half of every get, put and remove (docs/STORE.md
//! sections 5 and 6): READ the key's bucket on every replica at once, then READ every
//! candidate block at once, then verify. Without I/O: the caller performs the reads.

use super::decide::{candidates, newest, verify, Found, SLOTS_PER_BUCKET};
use super::format::{decode_block, KeyHash, Reject, Version};
use super::root::Index;
use crate::remote::layout::Layout;

/// A replica as a store operation sees it: its node, layout and index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Replica {
    pub(crate) node: u32,
    /// The node's incarnation when the replica was chosen (operations are refused if it
    /// restarted since).
    pub(crate) incarnation: u64,
    pub(crate) layout: Layout,
    pub(crate) index: Index,
}

impl Replica {
    /// Region offset of the bucket of the key hashed `h`.
    pub(crate) fn bucket_at(&self, h: KeyHash) -> u64 {
        self.index.bucket(h.bucket(self.index.buckets))
    }
}

/// A READ of `len` bytes at region offset `at` of `node`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Read {
    pub(crate) node: u32,
    pub(crate) at: u64,
    pub(crate) len: u64,
}

/// What one replica holds for the key, as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Held {
    /// Its bucket was read (false: the replica did not answer).
    pub(crate) answered: bool,
    /// The bucket's words.
    pub(crate) bucket: Vec<u64>,
    /// The slot with the newest verified block of the key there: position, word, version.
    pub(crate) current: Option<(usize, u64, Version)>,
}

/// What a lookup found.
#[derive(Debug, Clone, Default)]
pub(crate) struct Looked {
    /// Per replica, in the order given.
    pub(crate) held: Vec<Held>,
    /// Every verified block of the key, on any replica.
    pub(crate) found: Vec<Found>,
    /// The position among the block reads of each of `found`.
    pub(crate) found_at: Vec<usize>,
    /// A candidate block could not be read.
    pub(crate) unread: bool,
    /// A candidate was the key's block but failed its checksum.
    pub(crate) damaged: bool,
}

impl Looked {
    /// The newest version found, anywhere.
    pub(crate) fn newest(&self) -> Option<Version> {
        newest(&self.found).map(|f| f.block.version)
    }
}

/// One lookup of a key (see the module's text).
#[derive(Debug, Clone)]
pub(crate) struct Lookup {
    key: Vec<u8>,
    h: KeyHash,
    replicas: Vec<Replica>,
    held: Vec<Held>,
    /// Per block read: the replica's position and the slot's.
    plan: Vec<(usize, usize, u64)>,
}

fn words(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8])))
        .collect()
}

impl Lookup {
    /// A lookup of `key` on `replicas`.
    pub(crate) fn new(key: &[u8], replicas: &[Replica]) -> Self {
        Self {
            key: key.to_vec(),
            h: KeyHash::of(key),
            replicas: replicas.to_vec(),
            held: Vec::new(),
            plan: Vec::new(),
        }
    }

    /// The first reads: every replica's bucket.
    pub(crate) fn bucket_reads(&self) -> Vec<Read> {
        self.replicas
            .iter()
            .map(|r| Read {
                node: r.node,
                at: r.bucket_at(self.h),
                len: SLOTS_PER_BUCKET as u64 * 8,
            })
            .collect()
    }

    /// From the buckets' bytes (`None`: that read failed), the block reads: every slot whose
    /// fingerprint is the key's, clipped to its chunk. A slot naming memory outside the data
    /// area is damage and is skipped.
    pub(crate) fn on_buckets(&mut self, replies: &[Option<&[u8]>]) -> Vec<Read> {
        self.held.clear();
        self.plan.clear();
        let mut reads = Vec::new();
        for (i, r) in self.replicas.iter().enumerate() {
            let Some(bytes) = replies.get(i).copied().flatten() else {
                self.held.push(Held::default());
                continue;
            };
            let bucket = words(bytes);
            for (slot, s) in candidates(self.h, &bucket) {
                let Some(chunk) = r.layout.chunk_of(s.offset) else {
                    continue;
                };
                let chunk_end = r.layout.chunk(chunk) + r.layout.chunk_size;
                self.plan.push((i, slot, s.word()));
                reads.push(Read {
                    node: r.node,
                    at: s.offset,
                    len: s.read_len().min(chunk_end - s.offset),
                });
            }
            self.held.push(Held {
                answered: true,
                bucket,
                current: None,
            });
        }
        reads
    }

    /// From the blocks' bytes, in the order of [`Lookup::on_buckets`]'s reads: what each
    /// replica holds.
    pub(crate) fn on_blocks(&self, replies: &[Option<&[u8]>]) -> Looked {
        let mut looked = Looked {
            held: self.held.clone(),
            ..Looked::default()
        };
        for (k, &(i, slot, word)) in self.plan.iter().enumerate() {
            let Some(bytes) = replies.get(k).copied().flatten() else {
                looked.unread = true;
                continue;
            };
            if decode_block(bytes, &self.key) == Err(Reject::Checksum) {
                looked.damaged = true;
            }
            let node = self.replicas[i].node;
            for f in verify(&self.key, [(node, slot, word, bytes)]) {
                let v = f.block.version;
                let held = &mut looked.held[i];
                if held.current.is_none_or(|(_, _, c)| c < v) {
                    held.current = Some((slot, word, v));
                }
                looked.found.push(f);
                looked.found_at.push(k);
            }
        }
        looked
    }
}
