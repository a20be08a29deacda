//! `descriptors`: the remote pool's pool descriptor (accept private data) and client hello
//! (request private data), and remote pointers as text. Whatever decodes must describe a
//! layout that fits its region and encode back to the same bytes.

use super::input::Input;
use crate::remote::{ClientHello, PoolDescriptor, RemotePtr, DESCRIPTOR_LEN, HELLO_LEN};

/// Every decoder on the input.
pub(super) fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let mode = input.u8();
    let rest = input.bytes(usize::MAX);
    match mode % 3 {
        // Exactly one descriptor or hello, with any prefix fixed so the checks are reached.
        0 => {
            let mut b = rest.to_vec();
            b.resize(DESCRIPTOR_LEN, 0);
            b[..2].copy_from_slice(b"RP");
            pool_descriptor(&b);
            let mut b = rest.to_vec();
            b.resize(HELLO_LEN, 0);
            b[..2].copy_from_slice(b"RC");
            client_hello(&b);
        }
        1 => {
            pool_descriptor(rest);
            client_hello(rest);
            accept(rest);
        }
        _ => {
            if let Ok(s) = std::str::from_utf8(rest) {
                remote_ptr(s);
            }
        }
    }
}

/// A pool descriptor: its layout fits the region, and it re-encodes to the same bytes.
pub(super) fn pool_descriptor(b: &[u8]) {
    let Ok(d) = PoolDescriptor::decode(b) else {
        return;
    };
    assert_eq!(d.layout.len, d.region.len);
    d.layout.check().expect("a decoded layout checks");
    assert!(d.region.addr.checked_add(d.region.len).is_some());
    let l = &d.layout;
    // Everything the layout places lies inside the region.
    let end = l
        .chunk_count
        .checked_mul(l.chunk_size)
        .and_then(|n| n.checked_add(l.data_offset));
    assert!(
        end.is_some_and(|e| e <= d.region.len),
        "{d:?}: chunks past the end"
    );
    assert!(
        l.table_offset <= l.data_offset,
        "{d:?}: table after the data"
    );
    assert!(d.lease.as_millis() >= 10);
    assert_eq!(d.encode().as_slice(), b, "{d:?} re-encodes differently");
}

/// A server's accept to a client that holds a cluster key: whatever the bytes, it decodes
/// only when it carries a proof made with that key for that hello (which a fuzzer cannot
/// make), and never panics.
pub(super) fn accept(b: &[u8]) {
    use crate::fabric::PreSharedKey;
    use crate::remote::descriptor::decode_accept;
    let key = PreSharedKey::new(&[3; 32]).expect("a key");
    let hello = [7u8; HELLO_LEN];
    if let Ok(d) = decode_accept(b, &hello, Some(&key), "fuzz") {
        // Only if the fuzzer found the MAC: then it re-encodes to the same bytes.
        let again = crate::remote::descriptor::encode_accept(&d, &hello, Some(&key));
        assert_eq!(again.as_slice(), b);
    }
    let _ = decode_accept(b, &hello, None, "fuzz");
}

/// A client hello: a non-zero id; one without a proof re-encodes to the same bytes. A
/// server's gate (with and without the cluster key) answers any bytes without panicking,
/// and admits a proven one only if the fuzzer found the MAC.
pub(super) fn client_hello(b: &[u8]) {
    if let Ok(h) = ClientHello::decode(b) {
        assert_ne!(h.client_id, 0);
        if b.len() == HELLO_LEN {
            assert_eq!(h.encode().as_slice(), b, "{h:?} re-encodes differently");
        }
    }
    let cluster = crate::fabric::PreSharedKey::new(&[3; 32]).expect("a key");
    let now = 1_800_000_000;
    if let Ok(h) = crate::remote::hello::HelloGate::new(Some(cluster.clone())).admit(b, now) {
        let key = crate::remote::client_key(&cluster, h.client_id);
        let time = u32::from_le_bytes([b[4], b[5], b[6], b[7]]) as u64;
        assert_eq!(h.encode_proven(&key, time).as_slice(), b);
    }
    let _ = crate::remote::hello::HelloGate::new(None).admit(b, now);
}

/// A remote pointer as text: what parses prints and parses back to itself.
fn remote_ptr(s: &str) {
    if let Ok(p) = s.parse::<RemotePtr>() {
        assert_eq!(p.to_string().parse::<RemotePtr>().unwrap(), p);
    }
}
