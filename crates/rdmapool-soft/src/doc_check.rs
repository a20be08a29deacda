//! Tests that hold docs/PROTOCOL.md to the soft wire's code: the versions it states must be
//! the one the code speaks.

use crate::proto::wire;
use rdmapool_core::util::doc_text::{all_say, numbers_after, section};

/// docs/PROTOCOL.md as this build was compiled with.
const PROTOCOL: &str = include_str!("../../../docs/PROTOCOL.md");

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
