//! Where new allocations go: a pluggable policy over the nodes a client knows.

/// What a placement policy knows of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeLoad {
    /// The node's id.
    pub node: u32,
    /// Bytes of chunks it has.
    pub capacity: u64,
    /// Bytes this client has allocated there (its own view).
    pub used: u64,
    /// The server is draining: no new allocations go there.
    pub draining: bool,
}

/// A placement policy: the nodes to try for one allocation, best first (the client moves
/// on to the next when one is full or down).
pub trait Placement: Send {
    /// The order to try `nodes` in; `key` is the caller's placement key, if any.
    fn order(&mut self, nodes: &[NodeLoad], key: Option<u64>) -> Vec<u32>;
}

fn live(nodes: &[NodeLoad]) -> impl Iterator<Item = &NodeLoad> {
    nodes.iter().filter(|n| !n.draining)
}

/// Each allocation starts one node further than the last.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: usize,
}

impl Placement for RoundRobin {
    fn order(&mut self, nodes: &[NodeLoad], _key: Option<u64>) -> Vec<u32> {
        let ids: Vec<u32> = live(nodes).map(|n| n.node).collect();
        if ids.is_empty() {
            return ids;
        }
        let start = self.next % ids.len();
        self.next = self.next.wrapping_add(1);
        ids[start..].iter().chain(&ids[..start]).copied().collect()
    }
}

/// The node with the smallest share of its capacity used first.
#[derive(Debug, Default)]
pub struct LeastUsed;

impl Placement for LeastUsed {
    fn order(&mut self, nodes: &[NodeLoad], _key: Option<u64>) -> Vec<u32> {
        let mut v: Vec<&NodeLoad> = live(nodes).collect();
        v.sort_by(|a, b| {
            let fa = a.used as f64 / a.capacity.max(1) as f64;
            let fb = b.used as f64 / b.capacity.max(1) as f64;
            fa.total_cmp(&fb).then(a.node.cmp(&b.node))
        });
        v.into_iter().map(|n| n.node).collect()
    }
}

/// The same key always starts at the same node (rendezvous hashing, so a node joining or
/// leaving moves only its own share of keys); allocations without a key go round-robin.
#[derive(Debug, Default)]
pub struct KeyHash {
    fallback: RoundRobin,
}

impl Placement for KeyHash {
    fn order(&mut self, nodes: &[NodeLoad], key: Option<u64>) -> Vec<u32> {
        let Some(key) = key else {
            return self.fallback.order(nodes, None);
        };
        let score = |node: u32| {
            let mut x = key ^ (node as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            x = (x ^ (x >> 33)).wrapping_mul(0xff51_afd7_ed55_8ccd);
            x ^ (x >> 33)
        };
        let mut v: Vec<u32> = live(nodes).map(|n| n.node).collect();
        v.sort_by_key(|&n| std::cmp::Reverse(score(n)));
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nodes() -> Vec<NodeLoad> {
        (1..=3)
            .map(|i| NodeLoad {
                node: i,
                capacity: 100,
                used: 40 - 10 * i as u64,
                draining: i == 2,
            })
            .collect()
    }

    #[test]
    fn policies_skip_draining_nodes_and_order_as_they_say() {
        let n = nodes();
        let mut rr = RoundRobin::default();
        assert_eq!(rr.order(&n, None), [1, 3]);
        assert_eq!(rr.order(&n, None), [3, 1]);
        assert_eq!(LeastUsed.order(&n, None), [3, 1]);
        let mut h = KeyHash::default();
        let a = h.order(&n, Some(42));
        assert_eq!(a, h.order(&n, Some(42)), "a key sticks to its node");
        assert_eq!(a.len(), 2);
        assert!(!a.contains(&2));
    }
}
