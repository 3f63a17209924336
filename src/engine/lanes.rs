//! Lanes: which part of a biz type's backlog this node claims first (docs/design/claim.md,
//! Lanes). Every task is in one of `LANES` lanes, by its id's last byte (`chime_lane`,
//! migration 0051). While a biz type's claims come back full, each node claims from its own
//! lanes in turn, so that nodes working through one backlog never read and lock the rows
//! another has just claimed at a shared head of the due order. With one node, or once a
//! claim comes back short, the claim reads the whole biz type as before: millisecond
//! lateness is untouched, and a lane whose node is slow or gone is emptied by the others.

/// How many lanes there are: `chime_lane` keeps the low four bits.
pub const LANES: i64 = 16;

/// This node's share of the lanes, from the live delivering nodes (`nodes::delivering_place`).
#[derive(Debug, Clone, Copy)]
pub struct Lanes {
    pub nodes: i64,
    /// This node's place among them, 0 to `nodes - 1`.
    pub place: i64,
}

impl Lanes {
    /// The lane of this node's `turn`-th lane claim in a row: its own lanes (those equal to
    /// its place modulo the node count) one after another. None with one node: no lanes.
    /// Nodes that briefly disagree on the count (one joining or gone) may share a lane for
    /// a turn, which costs what a shared head did and loses nothing.
    pub fn lane(self, turn: u32) -> Option<i32> {
        if self.nodes <= 1 {
            return None;
        }
        let first = self.place.rem_euclid(self.nodes.min(LANES));
        let own = (LANES - first + self.nodes - 1) / self.nodes;
        Some((first + self.nodes * (i64::from(turn) % own.max(1))) as i32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn own(nodes: i64, place: i64) -> BTreeSet<i32> {
        (0..64).filter_map(|turn| Lanes { nodes, place }.lane(turn)).collect()
    }

    #[test]
    fn one_node_claims_the_whole_biz_type() {
        assert_eq!(Lanes { nodes: 1, place: 0 }.lane(3), None);
    }

    #[test]
    fn each_node_takes_its_own_lanes_in_turn_and_together_they_cover_all() {
        for nodes in 2..=16 {
            let mut seen = BTreeSet::new();
            for place in 0..nodes {
                let mine = own(nodes, place);
                assert!(!mine.is_empty(), "{nodes} nodes: place {place} has no lane");
                assert!(mine.is_disjoint(&seen), "{nodes} nodes: place {place} shares a lane");
                seen.extend(mine);
            }
            assert_eq!(seen, (0..LANES as i32).collect(), "{nodes} nodes leave a lane to nobody");
        }
        assert_eq!(own(2, 1), [1, 3, 5, 7, 9, 11, 13, 15].into());
        assert_eq!((0..3).map(|t| Lanes { nodes: 3, place: 2 }.lane(t).unwrap()).collect::<Vec<_>>(), [2, 5, 8]);
    }

    #[test]
    fn more_nodes_than_lanes_share_lanes() {
        assert_eq!(own(20, 17), [1].into());
        assert_eq!(own(20, 3), [3].into());
    }
}
