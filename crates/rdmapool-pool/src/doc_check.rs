//! Tests that hold docs/PROTOCOL.md to the code: the document is read at compile time, and
//! the versions and size limits it states must equal the constants they describe, so the
//! two cannot drift apart. (The TCP connection manager's own constants are private to
//! `conn/tcp.rs`, whose tests check section 4 with these helpers; the soft wire's are checked
//! in rdmapool-soft's `doc_check.rs`.)

use crate::conn::{MAX_ACCEPT_PRIVATE_DATA, MAX_CONNECT_PRIVATE_DATA, MAX_REJECT_PRIVATE_DATA};
use crate::fabric::Endpoint;
pub(crate) use rdmapool_core::util::doc_text::{all_say, section};

/// docs/PROTOCOL.md as this build was compiled with.
pub(crate) const PROTOCOL: &str = include_str!("../../../docs/PROTOCOL.md");

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
