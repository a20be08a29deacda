//! `pool_lease`: taking a pool lease slot (`remote::client::takeover`) against whatever a
//! hostile or broken server's slot words say and whenever the reads come back. The machine
//! must never leave its probe range, and may only end as the words it read justify:
//! `Taken` after a claim that found the slot free, or after watching this id's heartbeat
//! stand still (not at 0) for half a lease and a renewal that swapped exactly that value; `InUse` after
//! the owner word, re-read once the heartbeat moved, still held the id; `Full` after every
//! slot was seen (by the owner scan or a claim) holding another id.

use super::input::Input;
use crate::remote::client::takeover::{next_beat, Pending, Takeover};
use std::time::{Duration, Instant};

const ID: u64 = 77;
/// The heartbeat a slot claimed afresh starts at.
const BASE: u64 = 1000;

/// A word the server might answer with: free, this id, another id, or anything.
fn word(input: &mut Input<'_>, usual: u64) -> u64 {
    match input.u8() % 5 {
        0 => 0,
        1 => ID,
        2 => 78,
        3 => usual,
        _ => input.u64(),
    }
}

/// Runs one program (see the module docs).
pub(super) fn run(data: &[u8]) {
    let mut input = Input::new(data);
    let lease = Duration::from_millis(10 + u64::from(input.u16() % 5000));
    let slots = 1 + u64::from(input.u8() % 8);
    let start = u64::from(input.u8()) % slots;
    let t0 = Instant::now();
    let mut now = t0;
    let mut t = Takeover::new(ID, lease, slots, start, BASE);
    // What was read since the last claim, to judge the end by.
    let mut claimed: Option<u64> = None;
    let mut watched: Vec<(u64, Instant)> = Vec::new();
    let mut renewed_from: Option<(u64, u64, u64)> = None;
    let mut owner_read: Option<u64> = None;
    // Slots seen (by the scan or a claim) held by another id.
    let mut others_at = std::collections::HashSet::new();
    for _ in 0..4096 {
        match t.pending() {
            Pending::ReadOwners => {
                let owners: Vec<u64> = (0..slots).map(|_| word(&mut input, 78)).collect();
                for (s, &o) in owners.iter().enumerate() {
                    if o != 0 && o != ID {
                        others_at.insert(s as u64);
                    }
                }
                t.on_owners(&owners);
            }
            Pending::Claim { slot } => {
                assert!(slot < slots, "slot {slot} of {slots}");
                let old = word(&mut input, 0);
                if old != 0 && old != ID {
                    others_at.insert(slot);
                }
                claimed = Some(old);
                watched.clear();
                renewed_from = None;
                owner_read = None;
                t.on_claim(old, now);
            }
            Pending::ReadBeat { slot, at } => {
                assert!(slot < slots);
                now = now.max(at) + Duration::from_millis(u64::from(input.u8()));
                let last = watched.last().map_or(1, |w| w.0);
                let beat = word(&mut input, last);
                watched.push((beat, now));
                t.on_beat(beat, now);
            }
            Pending::ReadOwner { slot } => {
                assert!(slot < slots);
                let owner = word(&mut input, ID);
                owner_read = Some(owner);
                t.on_owner(owner);
            }
            Pending::Renew {
                slot,
                expected,
                new,
            } => {
                assert!(slot < slots);
                assert!(
                    new == next_beat(expected) || (expected == 0 && new == BASE),
                    "a renewal from {expected} to {new}"
                );
                let old = word(&mut input, expected);
                renewed_from = Some((expected, new, old));
                t.on_renewed(old);
            }
            Pending::Taken { slot, beat } => {
                assert!(slot < slots);
                let (expected, new, old) = renewed_from.expect("taken without a renewal");
                assert_eq!(old, expected, "taken although the swap found another value");
                assert_eq!(beat, new);
                match claimed {
                    Some(0) => assert_eq!((expected, new), (0, BASE)),
                    Some(ID) => {
                        let (first, last) = (watched.first(), watched.last());
                        let (Some(&(b0, at0)), Some(&(_, at1))) = (first, last) else {
                            panic!("taken over without watching the heartbeat");
                        };
                        assert!(watched.iter().all(|w| w.0 == b0), "taken while it moved");
                        assert!(at1.duration_since(at0) >= lease / 2, "watched too briefly");
                        assert_ne!(b0, 0, "a heartbeat standing at 0 is an expiry in progress");
                        assert_eq!(expected, b0, "swapped from another value than watched");
                    }
                    other => panic!("taken after a claim that found {other:?}"),
                }
                return;
            }
            Pending::InUse => {
                assert_eq!(claimed, Some(ID));
                assert_eq!(owner_read, Some(ID));
                return;
            }
            Pending::Full => {
                assert_eq!(
                    others_at.len() as u64,
                    slots,
                    "full after seeing {others_at:?} held by others, of {slots} slots"
                );
                return;
            }
        }
        if input.is_empty() {
            return;
        }
    }
}
