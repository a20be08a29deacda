//! Bounds on handshakes in progress at a server: in total and per peer address, so that
//! peers who start handshakes and never finish them (a request whose endpoint leads to a
//! listener that never answers, a requester that never sends its RTU) hold a few slots of
//! their own and never the ones other peers need.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;

/// The handshakes in progress and their bounds.
#[doc(hidden)]
pub struct InFlight {
    max_total: usize,
    max_per_peer: usize,
    /// Per peer address (`None`: the transport gave none), and their sum.
    held: Mutex<(HashMap<Option<IpAddr>, usize>, usize)>,
}

/// One handshake in progress; its slot comes back when this is dropped.
#[doc(hidden)]
pub struct Ticket {
    owner: Arc<InFlight>,
    peer: Option<IpAddr>,
}

impl InFlight {
    /// At most `max_total` handshakes at once, `max_per_peer` of them from one address.
    #[doc(hidden)]
    pub fn new(max_total: usize, max_per_peer: usize) -> Arc<Self> {
        Arc::new(Self {
            max_total,
            max_per_peer,
            held: Mutex::new((HashMap::new(), 0)),
        })
    }

    /// A slot for a handshake with `peer`, or `None` when either bound is reached.
    #[doc(hidden)]
    pub fn try_begin(self: &Arc<Self>, peer: Option<IpAddr>) -> Option<Ticket> {
        let mut held = self.held.lock();
        let (per_peer, total) = &mut *held;
        let mine = per_peer.entry(peer).or_insert(0);
        if *total >= self.max_total || *mine >= self.max_per_peer {
            if *mine == 0 {
                per_peer.remove(&peer);
            }
            return None;
        }
        *mine += 1;
        *total += 1;
        Some(Ticket {
            owner: self.clone(),
            peer,
        })
    }

    /// Handshakes in progress now.
    #[cfg(test)]
    fn in_progress(&self) -> usize {
        self.held.lock().1
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        let mut held = self.owner.held.lock();
        let (per_peer, total) = &mut *held;
        *total -= 1;
        if let Some(n) = per_peer.get_mut(&self.peer) {
            *n -= 1;
            if *n == 0 {
                per_peer.remove(&self.peer);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(last: u8) -> Option<IpAddr> {
        Some(IpAddr::from([10, 0, 0, last]))
    }

    #[test]
    fn a_peer_gets_its_share_and_others_still_get_theirs() {
        let f = InFlight::new(5, 2);
        let a: Vec<Ticket> = (0..2).map(|_| f.try_begin(ip(1)).unwrap()).collect();
        assert!(
            f.try_begin(ip(1)).is_none(),
            "a third from the same address"
        );
        let b = f.try_begin(ip(2)).unwrap();
        let none = f.try_begin(None).unwrap();
        let c = f.try_begin(ip(3)).unwrap();
        assert_eq!(f.in_progress(), 5);
        assert!(f.try_begin(ip(4)).is_none(), "the total is reached");
        drop(a);
        assert_eq!(f.in_progress(), 3);
        let again: Vec<Ticket> = (0..2).map(|_| f.try_begin(ip(1)).unwrap()).collect();
        drop((b, none, c, again));
        assert_eq!(f.in_progress(), 0);
        assert!(f.held.lock().0.is_empty(), "no entry is left behind");
    }
}
