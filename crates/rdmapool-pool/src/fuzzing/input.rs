//! Reading a fuzz program out of the fuzzer's bytes, and writing one (for the seeds).
//!
//! Reads past the end give zeros, so every input is a valid program; the loops stop when
//! the input is used up.

/// The fuzzer's bytes, read front to back.
pub(super) struct Input<'a>(&'a [u8]);

impl<'a> Input<'a> {
    pub(super) fn new(data: &'a [u8]) -> Self {
        Self(data)
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Up to `n` bytes (fewer at the end).
    pub(super) fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (head, rest) = self.0.split_at(n.min(self.0.len()));
        self.0 = rest;
        head
    }

    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut b = [0u8; N];
        let got = self.bytes(N);
        b[..got.len()].copy_from_slice(got);
        b
    }

    pub(super) fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }

    pub(super) fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    pub(super) fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }

    pub(super) fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    pub(super) fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }
}

/// Writes a program the way [`Input`] reads it.
#[derive(Default)]
pub(super) struct Program(pub(super) Vec<u8>);

impl Program {
    pub(super) fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }

    pub(super) fn bool(&mut self, v: bool) -> &mut Self {
        self.u8(v as u8)
    }

    pub(super) fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub(super) fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub(super) fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub(super) fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.0.extend_from_slice(v);
        self
    }
}

/// The bytes on their way to a state machine: appended at the back, taken from the front
/// (without moving what is left, so feeding a long payload a byte at a time stays linear).
#[derive(Default)]
pub(super) struct Link {
    buf: Vec<u8>,
    at: usize,
}

impl Link {
    pub(super) fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// `len` payload bytes derived from `seed`.
    pub(super) fn push_payload(&mut self, len: usize, seed: u8) {
        self.buf.extend((0..len).map(|i| i as u8 ^ seed));
    }

    /// What has not been taken yet.
    pub(super) fn pending(&self) -> &[u8] {
        &self.buf[self.at..]
    }

    /// Takes `n` bytes from the front.
    pub(super) fn consume(&mut self, n: usize) {
        assert!(n <= self.pending().len());
        self.at += n;
        if self.at == self.buf.len() {
            self.buf.clear();
            self.at = 0;
        }
    }
}
