//! Finding a key on its replicas, the first half of every get, put and remove (docs/STORE.md
//! sections 5 and 6): READ the key's bucket on every replica at once, then READ every
//! candidate block at once, then verify. Without I/O: the caller performs the reads.

use super::decide::{candidates, newest, verify, Found, SLOTS_PER_BUCKET};
use super::format::{decode_block, KeyHash, Reject, Slot, Version};
use super::root::Index;
use rdmapool_pool::remote::layout::Layout;
use rdmapool_pool::remote::step::{Answer, Io, Op};

/// The largest block read early, beside the buckets ([`Lookup::hinted`]): for larger
/// ones the round saved is small beside the transfer, and a stale hint would cost a
/// transfer for nothing.
const EARLY_MAX: u64 = 16 << 10;

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

impl Read {
    /// The read as an operation of the pool's step vocabulary.
    pub(crate) fn op(&self) -> Op {
        Op {
            node: self.node,
            io: Io::Read {
                at: self.at,
                len: self.len,
            },
        }
    }
}

/// These reads as one step's operations.
pub(crate) fn read_ops(reads: &[Read]) -> Vec<Op> {
    reads.iter().map(Read::op).collect()
}

/// The bytes of each read's answer (`None` for one that failed).
pub(crate) fn replies(answers: &[Answer]) -> Vec<Option<&[u8]>> {
    answers.iter().map(Answer::bytes).collect()
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

/// Where the bytes of a block a lookup verified are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Src {
    /// In the reply to this block read (of [`Lookup::on_buckets`]'s reads).
    Read(usize),
    /// Read early, beside the buckets ([`Lookup::hinted`]): [`Lookup::early`] has them.
    Early(usize),
}

/// What a lookup found.
#[derive(Debug, Clone, Default)]
pub(crate) struct Looked {
    /// Per replica, in the order given.
    pub(crate) held: Vec<Held>,
    /// Every verified block of the key, on any replica.
    pub(crate) found: Vec<Found>,
    /// Where the bytes of each of `found` are.
    pub(crate) found_at: Vec<Src>,
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
    /// Per candidate block: the replica's position, the slot's, its word, and where its
    /// bytes come from.
    plan: Vec<(usize, usize, u64, Src)>,
    /// Blocks to read beside the buckets, where the key was last seen: node and slot word.
    hints: Vec<(u32, u64)>,
    /// Those reads, once answered: node, slot word, bytes.
    early: Vec<(u32, u64, Vec<u8>)>,
}

fn words(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|w| u64::from_le_bytes(w.try_into().unwrap_or([0; 8])))
        .collect()
}

impl Lookup {
    /// The key looked up.
    pub(crate) fn key(&self) -> &[u8] {
        &self.key
    }

    /// A lookup of `key` on `replicas`.
    pub(crate) fn new(key: &[u8], replicas: &[Replica]) -> Self {
        Self {
            key: key.to_vec(),
            h: KeyHash::of(key),
            replicas: replicas.to_vec(),
            held: Vec::new(),
            plan: Vec::new(),
            hints: Vec::new(),
            early: Vec::new(),
        }
    }

    /// The same lookup, also reading, beside the buckets, the blocks the key's slots named
    /// when last seen (`(node, slot word)`, on nodes among the replicas): where a bucket
    /// still holds that word, the block's bytes are already there and the lookup takes one
    /// round of reads instead of two. (Read at once with the bucket, the block is as
    /// current as one read after it: reuse of its memory waits out the grace period.)
    pub(crate) fn hinted(mut self, hints: &[(u32, u64)]) -> Self {
        self.hints = hints
            .iter()
            .copied()
            .filter(|&(node, w)| {
                let r = self.replicas.iter().find(|r| r.node == node);
                r.zip(Slot::from_word(w)).is_some_and(|(r, s)| {
                    r.layout.chunk_of(s.offset).is_some() && s.read_len() <= EARLY_MAX
                })
            })
            .collect();
        self
    }

    /// The READ of the block a slot word names on replica `r`: its length bound, clipped to
    /// its chunk; `None` outside the data area.
    pub(crate) fn block_read(r: &Replica, word: u64) -> Option<Read> {
        let s = Slot::from_word(word)?;
        let chunk = r.layout.chunk_of(s.offset)?;
        let chunk_end = r.layout.chunk(chunk) + r.layout.chunk_size;
        Some(Read {
            node: r.node,
            at: s.offset,
            len: s.read_len().min(chunk_end - s.offset),
        })
    }

    /// The first reads: every replica's bucket, then the hinted blocks.
    pub(crate) fn bucket_reads(&self) -> Vec<Read> {
        let buckets = self.replicas.iter().map(|r| Read {
            node: r.node,
            at: r.bucket_at(self.h),
            len: SLOTS_PER_BUCKET as u64 * 8,
        });
        let hinted = self.hints.iter().filter_map(|&(node, w)| {
            let r = self.replicas.iter().find(|r| r.node == node)?;
            Self::block_read(r, w)
        });
        buckets.chain(hinted).collect()
    }

    /// The bytes of a block the lookup verified, from the last replies or its early reads.
    pub(crate) fn bytes<'a>(&'a self, src: Src, replies: &[Option<&'a [u8]>]) -> Option<&'a [u8]> {
        match src {
            Src::Read(k) => replies.get(k).copied().flatten(),
            Src::Early(e) => self.early.get(e).map(|(_, _, b)| b.as_slice()),
        }
    }

    /// Takes the bytes of an early read out (for an answer that needs them owned).
    pub(crate) fn take_early(&mut self, e: usize) -> Vec<u8> {
        self.early
            .get_mut(e)
            .map(|(_, _, b)| std::mem::take(b))
            .unwrap_or_default()
    }

    /// The slot (position in its bucket, and word) that named the block of read `k` of the
    /// last [`Lookup::on_buckets`].
    pub(crate) fn read_slot(&self, k: usize) -> Option<(usize, u64)> {
        self.plan
            .iter()
            .find(|&&(_, _, _, src)| src == Src::Read(k))
            .map(|&(_, slot, word, _)| (slot, word))
    }

    /// From the buckets' bytes (`None`: that read failed), followed by the hinted blocks'
    /// (as [`Lookup::bucket_reads`] asked), the block reads: every slot whose fingerprint is
    /// the key's, clipped to its chunk, unless a hinted read already holds it. A slot
    /// naming memory outside the data area is damage and is skipped.
    pub(crate) fn on_buckets(&mut self, replies: &[Option<&[u8]>]) -> Vec<Read> {
        self.held.clear();
        self.plan.clear();
        let n = self.replicas.len();
        let hinted: Vec<(u32, u64)> = self
            .hints
            .iter()
            .copied()
            .filter(|&(node, w)| {
                let r = self.replicas.iter().find(|r| r.node == node);
                r.is_some_and(|r| Self::block_read(r, w).is_some())
            })
            .collect();
        self.early = hinted
            .iter()
            .zip(replies.iter().skip(n))
            .filter_map(|(&(node, w), b)| b.map(|b| (node, w, b.to_vec())))
            .collect();
        let mut reads = Vec::new();
        for (i, r) in self.replicas.iter().enumerate() {
            let Some(bytes) = replies.get(i).copied().flatten() else {
                self.held.push(Held::default());
                continue;
            };
            let bucket = words(bytes);
            for (slot, s) in candidates(self.h, &bucket) {
                let Some(read) = Self::block_read(r, s.word()) else {
                    continue;
                };
                let early = self.early.iter().position(|&(node, w, ref b)| {
                    node == r.node && w == s.word() && b.len() as u64 >= read.len
                });
                let src = match early {
                    Some(e) => Src::Early(e),
                    None => {
                        reads.push(read);
                        Src::Read(reads.len() - 1)
                    }
                };
                self.plan.push((i, slot, s.word(), src));
            }
            self.held.push(Held {
                answered: true,
                bucket,
                current: None,
            });
        }
        reads
    }

    /// How many replicas the lookup reads (its first replies are their buckets).
    pub(crate) fn replica_count(&self) -> usize {
        self.replicas.len()
    }

    /// From the blocks' bytes, in the order of [`Lookup::on_buckets`]'s reads: what each
    /// replica holds.
    pub(crate) fn on_blocks(&self, replies: &[Option<&[u8]>]) -> Looked {
        let mut looked = Looked {
            held: self.held.clone(),
            ..Looked::default()
        };
        for &(i, slot, word, src) in &self.plan {
            let Some(bytes) = self.bytes(src, replies) else {
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
                looked.found_at.push(src);
            }
        }
        looked
    }
}
