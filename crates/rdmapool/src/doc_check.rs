//! Tests that hold docs/PROTOCOL.md to the code: the document is read at compile time, and
//! the versions and size limits it states must equal the constants they describe, so the
//! two cannot drift apart. (The TCP connection manager's own constants are private to
//! `conn/tcp.rs`, whose tests check section 4 with these helpers.)

use crate::conn::{MAX_ACCEPT_PRIVATE_DATA, MAX_CONNECT_PRIVATE_DATA, MAX_REJECT_PRIVATE_DATA};
use crate::fabric::Endpoint;
use crate::soft::proto::wire;

/// docs/PROTOCOL.md as this build was compiled with.
pub(crate) const PROTOCOL: &str = include_str!("../../../docs/PROTOCOL.md");

/// The text of section `n`: from its heading (`## n. `) to the next `## ` heading.
pub(crate) fn section(doc: &str, n: u32) -> &str {
    let head = format!("\n## {n}. ");
    let start = doc
        .find(&head)
        .unwrap_or_else(|| panic!("docs/PROTOCOL.md has no section {n}"))
        + 1;
    let end = doc[start + head.len()..]
        .find("\n## ")
        .map_or(doc.len(), |e| start + head.len() + e);
    &doc[start..end]
}

/// Every number written right after `prefix` in `text`, in order (a prefix followed by no
/// digit is skipped).
pub(crate) fn numbers_after(text: &str, prefix: &str) -> Vec<u64> {
    text.match_indices(prefix)
        .filter_map(|(at, _)| {
            let rest = &text[at + prefix.len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

/// Asserts that `prefix` appears in `text` followed by a number at least once, and that
/// every such number is `want`.
pub(crate) fn all_say(text: &str, prefix: &str, want: u64, what: &str) {
    let found = numbers_after(text, prefix);
    assert!(
        !found.is_empty(),
        "docs/PROTOCOL.md no longer says `{prefix}N` ({what}); update this test with it"
    );
    assert!(
        found.iter().all(|&n| n == want),
        "docs/PROTOCOL.md says {what} is {found:?} (`{prefix}N`); the code says {want}"
    );
}

#[test]
fn the_soft_wire_version_is_the_one_the_code_speaks() {
    let v = u64::from(wire::VERSION);
    // Section 1's table, and every frame of sections 5 and 6 (version at byte 4).
    let s1 = section(PROTOCOL, 1);
    let row = s1
        .lines()
        .find(|l| l.contains("| Soft data connection"))
        .expect("section 1 has a row for the soft data connection");
    all_say(row, "Must equal ", v, "the soft data connection's version");
    all_say(s1, "connection's is\n  currently **", v, "the soft version");
    let s5 = section(PROTOCOL, 5);
    all_say(
        s5,
        "| 4 | 1 | u8 | version = ",
        v,
        "the soft frames' version",
    );
    all_say(s5, "Wire version ", v, "the soft wire version");
    all_say(s5, "carries version **", v, "the soft wire version");
    // The hello acknowledgement example: magic, then the version byte.
    all_say(s5, "52 44 48 41 0", v, "the version byte of the example");
    // Section 6 sends the same frames; it must not state another version for them.
    let s6 = section(PROTOCOL, 6);
    assert!(
        numbers_after(s6, "version = ").is_empty(),
        "section 6 states a frame version; check it against the code"
    );
}

#[test]
fn the_private_data_limits_are_the_codes() {
    let s3 = section(PROTOCOL, 3);
    for (name, value) in [
        ("MAX_CONNECT_PRIVATE_DATA", MAX_CONNECT_PRIVATE_DATA),
        ("MAX_ACCEPT_PRIVATE_DATA", MAX_ACCEPT_PRIVATE_DATA),
        ("MAX_REJECT_PRIVATE_DATA", MAX_REJECT_PRIVATE_DATA),
    ] {
        all_say(s3, &format!("`{name}` = "), value as u64, name);
    }
    // RDMA CM's sizes are the limits plus the two-byte frame.
    for (message, value) in [
        ("connect request", MAX_CONNECT_PRIVATE_DATA),
        ("accept", MAX_ACCEPT_PRIVATE_DATA),
        ("reject", MAX_REJECT_PRIVATE_DATA),
    ] {
        all_say(
            s3,
            &format!("| {message} | "),
            value as u64 + 2,
            "what RDMA CM carries",
        );
    }
}

#[test]
fn the_endpoint_limit_is_the_codes() {
    let s5 = section(PROTOCOL, 5);
    all_say(
        s5,
        "must be 10..=",
        Endpoint::MAX_LEN as u64,
        "Endpoint::MAX_LEN",
    );
}

#[cfg(not(loom))] // the pool is not built under loom
#[test]
fn the_pool_messages_have_the_codes_sizes_and_limits() {
    use crate::remote::descriptor::PROOF_LEN;
    use crate::remote::layout::{MAX_CLIENT_SLOTS, MAX_LEASE};
    use crate::remote::{DESCRIPTOR_LEN, HELLO_LEN};
    let s7 = section(PROTOCOL, 7);
    all_say(s7, "### 7.1 Client hello (", HELLO_LEN as u64, "HELLO_LEN");
    all_say(
        s7,
        "### 7.2 Pool descriptor (",
        DESCRIPTOR_LEN as u64,
        "DESCRIPTOR_LEN",
    );
    all_say(
        s7,
        "accept; ",
        (DESCRIPTOR_LEN + PROOF_LEN) as u64,
        "the accept with its proof",
    );
    all_say(
        s7,
        "a proof follows at offset ",
        DESCRIPTOR_LEN as u64,
        "where the proof starts",
    );
    all_say(
        s7,
        "| 2 | 1 | u8 | version = ",
        u64::from(crate::remote::layout::LAYOUT_VERSION),
        "the pool messages' version",
    );
    all_say(s7, "at most ", MAX_CLIENT_SLOTS, "MAX_CLIENT_SLOTS");
    all_say(
        s7,
        "**Control messages**: ",
        crate::remote::isolation::CONTROL_LEN as u64,
        "CONTROL_LEN",
    );
    use crate::remote::{MAX_CLOCK_SKEW, MAX_REMEMBERED_HELLOS, PROVEN_HELLO_LEN};
    all_say(
        s7,
        "connection request; ",
        PROVEN_HELLO_LEN as u64,
        "PROVEN_HELLO_LEN",
    );
    all_say(
        s7,
        "clock skew allowed, either way: ",
        MAX_CLOCK_SKEW.as_secs(),
        "MAX_CLOCK_SKEW",
    );
    all_say(
        s7,
        "nonces remembered: ",
        MAX_REMEMBERED_HELLOS as u64,
        "MAX_REMEMBERED_HELLOS",
    );
    use crate::remote::{MAX_CONNECTIONS_PER_CLIENT, MAX_HANDSHAKES, MAX_HANDSHAKES_PER_PEER};
    all_say(
        s7,
        "Handshakes at once:\n",
        MAX_HANDSHAKES as u64,
        "MAX_HANDSHAKES",
    );
    all_say(
        s7,
        "of them from one address: ",
        MAX_HANDSHAKES_PER_PEER as u64,
        "MAX_HANDSHAKES_PER_PEER",
    );
    all_say(
        s7,
        "Connections per client id: ",
        MAX_CONNECTIONS_PER_CLIENT as u64,
        "MAX_CONNECTIONS_PER_CLIENT",
    );
    all_say(
        s7,
        "lease period in ms, from 10 to ",
        MAX_LEASE.as_millis() as u64,
        "MAX_LEASE",
    );
    // The accept with its proof fits what either connection manager carries.
    const {
        assert!(DESCRIPTOR_LEN + PROOF_LEN <= MAX_ACCEPT_PRIVATE_DATA);
        assert!(HELLO_LEN <= MAX_CONNECT_PRIVATE_DATA);
    }
}

#[test]
fn the_helpers_find_what_they_look_for() {
    let doc = "x\n## 1. One\nversion = 1, version = 12\n## 2. Two\nversion = 2\n";
    assert_eq!(numbers_after(section(doc, 1), "version = "), [1, 12]);
    assert_eq!(numbers_after(section(doc, 2), "version = "), [2]);
    assert!(std::panic::catch_unwind(|| all_say(doc, "version = ", 1, "v")).is_err());
    assert!(std::panic::catch_unwind(|| all_say(doc, "absent ", 1, "v")).is_err());
}
