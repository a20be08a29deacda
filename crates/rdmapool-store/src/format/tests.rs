use super::*;
use proptest::prelude::*;

fn v(seq: u64, writer: u64) -> Version {
    Version { seq, writer }
}

#[test]
fn a_block_decodes_to_what_was_encoded_and_a_longer_read_does_not_matter() {
    let block = encode_block(b"user:42", b"hello", v(3, 9), Kind::Value).unwrap();
    assert_eq!(block.len() as u64, block_len(b"user:42", 5));
    let mut read = block.clone();
    read.extend_from_slice(&[0xAB; 100]); // a READ of the slot's bound runs past the end
    let got = decode_block(&read, b"user:42").unwrap();
    assert_eq!(got.version, v(3, 9));
    assert!(!got.tombstone);
    assert_eq!(&read[got.value], b"hello");
    assert_eq!(decode_block(&block, b"user:43"), Err(Reject::OtherKey));
    assert_eq!(decode_block(&block, b"user:4"), Err(Reject::OtherKey));
    assert_eq!(
        decode_block(&block[..block.len() - 1], b"user:42"),
        Err(Reject::Short)
    );
    assert_eq!(decode_block(&block[..10], b"user:42"), Err(Reject::Short));
    assert_eq!(decode_block(&[0; 200], b"user:42"), Err(Reject::NotABlock));
}

#[test]
fn a_peek_reads_the_key_and_version_without_the_value() {
    let block = encode_block(b"user:42", b"hello", v(3, 9), Kind::Value).unwrap();
    let p = peek(&block[..HEADER_LEN + 7]).unwrap();
    assert_eq!(
        (p.key.as_slice(), p.version, p.tombstone),
        (&b"user:42"[..], v(3, 9), false)
    );
    assert_eq!(peek(&block[..HEADER_LEN + 3]), None, "the key cut short");
    assert_eq!(peek(&[0; 100]), None);
    let gone = encode_block(b"k", b"", v(4, 1), Kind::Tombstone).unwrap();
    assert!(peek(&gone).unwrap().tombstone);
}

#[test]
fn a_tombstone_has_no_value_and_decodes_as_one() {
    let block = encode_block(b"k", b"", v(2, 1), Kind::Tombstone).unwrap();
    let got = decode_block(&block, b"k").unwrap();
    assert!(got.tombstone);
    assert!(got.value.is_empty());
    assert!(encode_block(b"k", b"x", v(2, 1), Kind::Tombstone).is_err());
}

#[test]
fn sizes_outside_the_limits_are_typed_errors() {
    let long = [b'k'; MAX_KEY_LEN + 1];
    for (key, len, what) in [
        (&b""[..], 1, "key length"),
        (&long[..], 1, "key length"),
        (&b"k"[..], 0, "value length"),
        (&b"k"[..], MAX_VALUE_LEN + 1, "value length"),
    ] {
        match check_sizes(key, len) {
            Err(rdmapool_pool::Error::Core(CoreError::OutOfLimits { what: w, .. })) => {
                assert_eq!(w, what)
            }
            other => panic!("{what}: {other:?}"),
        }
    }
    assert!(check_sizes(&long[..MAX_KEY_LEN], MAX_VALUE_LEN).is_ok());
    assert!(encode_block(b"", b"v", v(1, 1), Kind::Value).is_err());
    assert!(Slot::new(KeyHash(1), MAX_OFFSET + 1, 64).is_err());
}

#[test]
fn an_empty_slot_and_a_slot_without_fingerprint_are_not_slots() {
    assert_eq!(Slot::from_word(0), None);
    assert_eq!(Slot::from_word(0x00ff_ffff_ffff_ffff), None);
    assert_eq!(
        KeyHash(0).fingerprint(),
        1,
        "fingerprint 0 is kept for empty slots"
    );
}

proptest! {
    #[test]
    fn the_length_bound_covers_the_length_closely(len in 1u64..(1 << 34)) {
        let bound = length_bound(length_code(len));
        prop_assert!(bound >= len);
        prop_assert!(len <= 8 || (bound - len) * 15 < len * 2, "{len} -> {bound}");
    }

    #[test]
    fn slot_words_round_trip(offset in 0..=MAX_OFFSET, len in 64u64..(1 << 30), h: u64) {
        let slot = Slot::new(KeyHash(h), offset, len).unwrap();
        prop_assert_ne!(slot.word(), 0);
        prop_assert_eq!(Slot::from_word(slot.word()), Some(slot));
        prop_assert!(slot.read_len() >= len);
    }

    /// CRC-32 catches every change confined to one byte, and every other field is checked
    /// or covered: no single damaged byte lets a wrong value through.
    #[test]
    fn any_damaged_byte_is_rejected(
        key in proptest::collection::vec(any::<u8>(), 1..=MAX_KEY_LEN),
        value in proptest::collection::vec(any::<u8>(), 1..300),
        seq in 1u64..,
        writer: u64,
        at: proptest::sample::Index,
        flip in 1u8..,
    ) {
        let mut block = encode_block(&key, &value, v(seq, writer), Kind::Value).unwrap();
        let i = at.index(block.len());
        block[i] ^= flip;
        match decode_block(&block, &key) {
            // The access bytes (48..64) are outside the checksum: the value is unchanged.
            Ok(b) if (48..64).contains(&i) => prop_assert_eq!(&block[b.value], &value[..]),
            got => prop_assert!(got.is_err(), "byte {i} changed by {flip:#x}"),
        }
    }

    #[test]
    fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400), key in proptest::collection::vec(any::<u8>(), 0..10)) {
        let _ = decode_block(&bytes, &key);
    }
}

/// docs/STORE.md states the formats; it must say what the code does.
#[test]
fn the_store_document_states_these_formats() {
    let doc = include_str!("../../../../docs/STORE.md");
    let magic = format!("magic `\"{}\"`", String::from_utf8_lossy(&BLOCK_MAGIC));
    let key_len = format!("key length `k`: 1 to {MAX_KEY_LEN}");
    let value_len = format!("up to {} MiB", MAX_VALUE_LEN >> 20);
    for says in [
        magic.as_str(),
        "| 64 | `k` | the key |",
        key_len.as_str(),
        value_len.as_str(),
        "| 0..48 | the block's offset in the region |",
    ] {
        assert!(doc.contains(says), "docs/STORE.md does not say {says:?}");
    }
    assert_eq!(HEADER_LEN, 64);
    assert_eq!(MAX_OFFSET, (1 << 48) - 1);
}

#[test]
fn every_kind_round_trips_and_other_flags_are_not_blocks() {
    for kind in [Kind::Value, Kind::Manifest, Kind::Part] {
        let block = encode_block(b"k", b"bytes", v(1, 1), kind).unwrap();
        let got = decode_block(&block, b"k").unwrap();
        assert_eq!((got.kind, got.tombstone), (kind, false));
        assert_eq!(peek(&block).unwrap().kind, kind);
        assert_eq!(Kind::from_flags(kind.flags()), Some(kind));
    }
    let gone = encode_block(b"k", b"", v(1, 1), Kind::Tombstone).unwrap();
    assert_eq!(decode_block(&gone, b"k").unwrap().kind, Kind::Tombstone);
    // Only a tombstone is empty.
    assert!(encode_block(b"k", b"", v(1, 1), Kind::Manifest).is_err());
    for flags in [3u8, 5, 6, 8, 0x80] {
        assert_eq!(Kind::from_flags(flags), None);
        let mut b = encode_block(b"k", b"bytes", v(1, 1), Kind::Value).unwrap();
        b[33] = flags;
        assert_eq!(
            decode_block(&b, b"k"),
            Err(Reject::NotABlock),
            "flags {flags}"
        );
        assert_eq!(peek(&b), None);
    }
}

#[test]
fn a_block_read_in_two_pieces_verifies_as_one() {
    let block = encode_block(b"key", b"the value", v(2, 5), Kind::Value).unwrap();
    let (head, value) = block.split_at(HEADER_LEN + 3);
    let mut d = ValueDigest::new();
    d.update(&value[..4]);
    d.update(&value[4..]);
    assert_eq!(d.crc(), crc32fast::hash(value));
    let b = decode_split(head, b"key", &d).unwrap();
    assert_eq!((b.version, b.kind, b.value), (v(2, 5), Kind::Value, 0..9));
    assert_eq!(value_len(head), Some(9));
    let mut torn = ValueDigest::new();
    torn.update(b"the valuE");
    assert_eq!(decode_split(head, b"key", &torn), Err(Reject::Checksum));
    assert_eq!(
        decode_split(head, b"key", &ValueDigest::of(b"short")),
        Err(Reject::Short)
    );
    assert_eq!(decode_split(head, b"kex", &d), Err(Reject::OtherKey));
    assert_eq!(decode_split(&head[..10], b"key", &d), Err(Reject::Short));
}

#[test]
fn an_expiry_is_in_the_header_under_the_checksum_and_only_on_values_and_manifests() {
    let digest = ValueDigest::of(b"hello");
    let mut header = [0u8; HEADER_LEN];
    let at = Expiry(1_700_000_000_123);
    encode_header_for(
        &mut header,
        b"k",
        &digest,
        v(3, 9),
        Kind::Value,
        (at, Pin::None),
    )
    .unwrap();
    let mut block = header.to_vec();
    block.extend_from_slice(b"k");
    block.extend_from_slice(b"hello");
    assert_eq!(decode_block(&block, b"k").unwrap().expiry, at);
    assert_eq!(peek(&block).unwrap().expiry, at);
    assert_eq!(
        decode_split(&block[..HEADER_LEN + 1], b"k", &digest)
            .unwrap()
            .expiry,
        at
    );
    // A changed expiry fails the checksum (a flipped bit never makes a value live longer).
    let mut later = block.clone();
    later[41] ^= 1;
    assert_eq!(decode_block(&later, b"k"), Err(Reject::Checksum));
    // Byte 35 stays zero; the access bytes (48..64) are outside the checksum and may hold
    // anything (a cache's readers write them).
    let mut odd = block.clone();
    odd[35] = 1;
    assert_eq!(decode_block(&odd, b"k"), Err(Reject::NotABlock));
    let mut touched = block.clone();
    touched[48..64].copy_from_slice(&[0xAB; 16]);
    let p = peek(&touched).unwrap();
    assert_eq!(
        (p.accessed_us, p.accesses),
        (0xABAB_ABAB_ABAB_ABAB, 0xABAB_ABAB_ABAB_ABAB)
    );
    assert!(decode_block(&touched, b"k").is_ok());
    // Tombstones and parts never expire, in encoding or decoding.
    for kind in [Kind::Tombstone, Kind::Part] {
        let d = ValueDigest::of(if kind == Kind::Tombstone { b"" } else { b"x" });
        let mut h = [0u8; HEADER_LEN];
        assert!(encode_header_for(&mut h, b"k", &d, v(1, 1), kind, (at, Pin::None)).is_err());
        let none = Expiry::NEVER;
        assert!(encode_header_for(&mut h, b"k", &d, v(1, 1), kind, (none, Pin::Hard)).is_err());
    }
    let mut gone = encode_block(b"k", b"", v(4, 1), Kind::Tombstone).unwrap();
    gone[40] = 1;
    assert_eq!(decode_block(&gone, b"k"), Err(Reject::NotABlock));
    assert!(Expiry(5).is_past(5) && !Expiry(5).is_past(4) && !Expiry::NEVER.is_past(u64::MAX));
}

#[test]
fn a_pin_is_in_the_header_under_the_checksum() {
    let digest = ValueDigest::of(b"hello");
    for pin in [Pin::None, Pin::Hard, Pin::Soft] {
        let mut header = [0u8; HEADER_LEN];
        let meta = (Expiry::NEVER, pin);
        encode_header_for(&mut header, b"k", &digest, v(3, 9), Kind::Value, meta).unwrap();
        let mut block = header.to_vec();
        block.extend_from_slice(b"khello");
        assert_eq!(decode_block(&block, b"k").unwrap().pin, pin);
        // A changed pin fails the checksum; an unknown one is no block.
        let mut other = block.clone();
        other[34] = Pin::from_byte((pin.byte() + 1) % 3).unwrap().byte();
        assert_eq!(decode_block(&other, b"k"), Err(Reject::Checksum));
        other[34] = 3;
        assert_eq!(decode_block(&other, b"k"), Err(Reject::NotABlock));
    }
}

#[test]
fn a_block_without_expiry_has_the_checksum_it_had_before_expiries() {
    // The CRC over bytes 0..36, the key and the value, as blocks written before expiries
    // existed carry it: those still verify.
    let block = encode_block(b"user:42", b"hello", v(3, 9), Kind::Value).unwrap();
    assert!(block[40..64].iter().all(|&b| b == 0));
    let mut h = crc32fast::Hasher::new();
    h.update(&block[..36]);
    h.update(b"user:42");
    h.update(b"hello");
    assert_eq!(block[36..40], h.finalize().to_le_bytes());
}
