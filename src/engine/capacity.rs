//! A node's delivery capacity (`--node-capacity`): how many tasks it holds at once, over all
//! biz types, from their claim until their outcome is written. It bounds the node's work in
//! progress (and the outcomes waiting to be written: one held longer than its lease would
//! be delivered again). When the biz types due in a turn want more than is free, the free
//! part is shared among them by weighted max-min fairness (docs/design/claim.md, Fair
//! between biz types).

use std::cmp::Ordering as Order;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A task's place in its node's capacity: taken when the task is claimed, given up when
/// its outcome is written (the recorder drops it then), or when its report is lost with
/// the recorder. Counted twice: in its biz type's count (for `share`) and in the node's
/// total, so that a turn reads what the node holds without summing every biz type's.
pub struct Hold {
    biz_type: Arc<AtomicUsize>,
    node: Arc<AtomicUsize>,
}

impl Hold {
    /// Counts one more task held in `biz_type` (its biz type's count on this node) and in
    /// `node` (the node's).
    pub fn take(biz_type: &Arc<AtomicUsize>, node: &Arc<AtomicUsize>) -> Hold {
        biz_type.fetch_add(1, Ordering::Relaxed);
        node.fetch_add(1, Ordering::Relaxed);
        Hold { biz_type: biz_type.clone(), node: node.clone() }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        self.biz_type.fetch_sub(1, Ordering::Relaxed);
        self.node.fetch_sub(1, Ordering::Relaxed);
    }
}

/// A biz type due this turn: what it holds on the node already, its weight, and how many
/// it could claim (its own free slots, at most a claim's batch).
#[derive(Debug, Clone, Copy)]
pub struct Claimant {
    pub held: usize,
    pub weight: u32,
    pub wants: usize,
}

/// How much of `free` each claimant may claim. With enough free for all, each gets what it
/// wants. Otherwise each next task goes to the claimant holding the least per unit of weight
/// (counting what this share gave it), until `free` is spent or every claimant has what it
/// wants: a biz type holding less than its weighted part of the capacity gets the freed
/// places first, and one of weight 3 ends with three times the places of one of weight 1
/// while both want more. Ties go by order from `first` (the caller turns it, so that equals
/// take turns at a single freed place). The cost is a heap step per task given, and only
/// while the claimants want more than is free.
pub fn share(free: usize, claimants: &[Claimant], first: usize) -> Vec<usize> {
    let wanted: usize = claimants.iter().map(|c| c.wants).sum();
    if wanted <= free {
        return claimants.iter().map(|c| c.wants).collect();
    }
    let n = claimants.len();
    let mut given = vec![0; n];
    let mut heap: BinaryHeap<Next> = claimants
        .iter()
        .enumerate()
        .filter(|(_, c)| c.wants > 0)
        .map(|(i, c)| Next { held: c.held as u64, weight: u64::from(c.weight.max(1)), rank: (i + n - first % n.max(1)) % n, index: i })
        .collect();
    for _ in 0..free {
        let Some(mut next) = heap.pop() else { break };
        given[next.index] += 1;
        next.held += 1;
        if given[next.index] < claimants[next.index].wants {
            heap.push(next);
        }
    }
    given
}

/// A claimant in `share`'s heap: the top is the one holding least per unit of weight.
#[derive(PartialEq, Eq)]
struct Next {
    held: u64,
    weight: u64,
    rank: usize,
    index: usize,
}

impl Ord for Next {
    fn cmp(&self, other: &Self) -> Order {
        // held / weight, least first (BinaryHeap's top is the greatest), then rank.
        (other.held * self.weight).cmp(&(self.held * other.weight)).then_with(|| other.rank.cmp(&self.rank))
    }
}

impl PartialOrd for Next {
    fn partial_cmp(&self, other: &Self) -> Option<Order> {
        Some(self.cmp(other))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(held: usize, weight: u32, wants: usize) -> Claimant {
        Claimant { held, weight, wants }
    }

    #[test]
    fn enough_for_all_gives_each_what_it_wants() {
        assert_eq!(share(100, &[c(50, 1, 30), c(0, 1, 70)], 0), vec![30, 70]);
    }

    #[test]
    fn the_freed_places_go_first_to_who_holds_least() {
        // A holds 20 of 20 (its herd); one place frees and B, holding none, wants one.
        assert_eq!(share(1, &[c(19, 1, 200), c(0, 1, 1)], 0), vec![0, 1]);
        // Both hold 10 and want more: 4 free are split.
        assert_eq!(share(4, &[c(10, 1, 200), c(10, 1, 200)], 0), vec![2, 2]);
    }

    #[test]
    fn weights_divide_what_is_short_in_proportion() {
        // Neither holds anything; 20 free: weight 3 gets 15, weight 1 gets 5.
        assert_eq!(share(20, &[c(0, 1, 200), c(0, 3, 200)], 0), vec![5, 15]);
        // What one does not want goes to the others.
        assert_eq!(share(20, &[c(0, 1, 200), c(0, 3, 2)], 0), vec![18, 2]);
    }

    #[test]
    fn equals_take_turns_at_a_single_place() {
        let both = [c(5, 1, 200), c(5, 1, 200)];
        assert_eq!(share(1, &both, 0), vec![1, 0]);
        assert_eq!(share(1, &both, 1), vec![0, 1]);
    }
}
