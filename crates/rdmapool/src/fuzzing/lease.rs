//! `pool_lease`: taking a pool lease slot (`remote::client::takeover`) against whatever a
//! hostile or broken server's slot words say and whenever the reads come back. The machine
//! must never leave its probe range, and may only end as the words it read justify:
//! `Taken` after a claim that found the slot free, or after watching this id's heartbeat
//! stand still for half a lease and a renewal that replaced exactly that value; `InUse` after
//! the owner word, re-read once the heartbeat moved, still held the id; `Full` after every
//! slot held another id.

use super::input::Input;
use crate::remote::client::takeover::{Step, Takeover};
use std::time::{Duration, Instant};

const ID: u64 = 77;

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
    let mut t = Takeover::new(ID, lease, slots, start);
    // What was read since the last claim, to judge the end by.
    let mut claimed: Option<u64> = None;
    let mut watched: Vec<(u64, Instant)> = Vec::new();
    let mut renewed_from: Option<u64> = None;
    let mut owner_read: Option<u64> = None;
    let mut others = 0u64;
    for _ in 0..4096 {
        match t.step() {
            Step::ReadOwners => {
                let owners: Vec<u64> = (0..slots).map(|_| word(&mut input, 78)).collect();
                t.on_owners(&owners);
            }
            Step::Claim { slot } => {
                assert!(slot < slots, "slot {slot} of {slots}");
                let old = word(&mut input, 0);
                if old != 0 && old != ID {
                    others += 1;
                }
                claimed = Some(old);
                watched.clear();
                renewed_from = None;
                owner_read = None;
                t.on_claim(old, now);
            }
            Step::ReadBeat { slot, at } => {
                assert!(slot < slots);
                now = now.max(at) + Duration::from_millis(u64::from(input.u8()));
                let last = watched.last().map_or(1, |w| w.0);
                let beat = word(&mut input, last);
                watched.push((beat, now));
                t.on_beat(beat, now);
            }
            Step::ReadOwner { slot } => {
                assert!(slot < slots);
                let owner = word(&mut input, ID);
                owner_read = Some(owner);
                t.on_owner(owner);
            }
            Step::Renew { slot } => {
                assert!(slot < slots);
                let usual = watched.last().map_or(0, |w| w.0);
                let old = word(&mut input, usual);
                renewed_from = Some(old);
                t.on_renewed(old);
            }
            Step::Taken { slot, beat } => {
                assert!(slot < slots);
                let old = renewed_from.expect("taken without a renewal");
                assert_eq!(beat, old.wrapping_add(1));
                match claimed {
                    Some(0) => {}
                    Some(ID) => {
                        let (first, last) = (watched.first(), watched.last());
                        let (Some(&(b0, at0)), Some(&(_, at1))) = (first, last) else {
                            panic!("taken over without watching the heartbeat");
                        };
                        assert!(watched.iter().all(|w| w.0 == b0), "taken while it moved");
                        assert!(at1.duration_since(at0) >= lease / 2, "watched too briefly");
                        assert_eq!(old, b0, "taken although the renewal found another value");
                    }
                    other => panic!("taken after a claim that found {other:?}"),
                }
                return;
            }
            Step::InUse => {
                assert_eq!(claimed, Some(ID));
                assert_eq!(owner_read, Some(ID));
                return;
            }
            Step::Full => {
                assert!(
                    others >= slots,
                    "full after {others} other owners of {slots} slots"
                );
                return;
            }
        }
        if input.is_empty() {
            return;
        }
    }
}
