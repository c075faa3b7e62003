//! Per key, the writes of a history as time intervals, to find the writes a read overlapped.
//!
//! # Contract
//! [`OverlapIndex::visit`] calls its visitor once for every write of a key whose interval
//! `[start_ns, end_ns]` intersects the query's (closed intervals: touching counts), and for no
//! other write, until the visitor returns false (then it stops and returns false). The intervals are sorted by start and seen as an implicit balanced binary tree
//! (the middle of a range is its root), each node holding the latest end in its subtree, so a
//! query visits O(log n) nodes plus O(log n) per write it reports: a long-running write (a
//! failed one can last seconds) costs a query nothing unless it overlaps.

/// One write of one key.
#[derive(Debug, Clone, Copy)]
pub(super) struct Interval {
    pub(super) start_ns: u64,
    pub(super) end_ns: u64,
    /// The write's position in the checker's write list.
    pub(super) writer: usize,
}

/// A node of the implicit tree: an interval and the latest end in its subtree, side by side so
/// that visiting a node touches one cache line (the index of a large history does not fit in
/// cache, and a query costs what it misses).
#[derive(Debug, Clone, Copy)]
struct Node {
    interval: Interval,
    subtree_end_max: u64,
}

/// Every key's write intervals, flattened: key `k` owns `nodes[offsets[k]..offsets[k + 1]]`,
/// sorted by start.
#[derive(Debug, Default)]
pub(super) struct OverlapIndex {
    nodes: Vec<Node>,
    offsets: Vec<usize>,
}

impl OverlapIndex {
    /// Builds the index from each key's intervals (`by_key[k]`, any order).
    pub(super) fn build(by_key: Vec<Vec<Interval>>) -> Self {
        let total = by_key.iter().map(Vec::len).sum();
        let mut index = Self { nodes: Vec::with_capacity(total), offsets: Vec::with_capacity(by_key.len() + 1) };
        index.offsets.push(0);
        for mut intervals in by_key {
            intervals.sort_unstable_by_key(|interval| (interval.start_ns, interval.end_ns));
            let first = index.nodes.len();
            index.nodes.extend(intervals.into_iter().map(|interval| Node { interval, subtree_end_max: 0 }));
            fill_subtree_end_max(&mut index.nodes[first..]);
            index.offsets.push(index.nodes.len());
        }
        index
    }

    /// Calls `visitor` for every write of `key_id` whose interval meets `[start_ns, end_ns]`, in
    /// start order, while it returns true. Returns false if the visitor stopped the walk.
    pub(super) fn visit(
        &self,
        key_id: usize,
        start_ns: u64,
        end_ns: u64,
        visitor: &mut impl FnMut(&Interval) -> bool,
    ) -> bool {
        let nodes = &self.nodes[self.offsets[key_id]..self.offsets[key_id + 1]];
        Query { nodes, start_ns, end_ns }.visit(0, nodes.len(), visitor)
    }
}

/// Fills `subtree_end_max` of every node of the implicit tree over `nodes` (the middle of a
/// range is its root); returns the latest end of the whole range (0 when empty).
fn fill_subtree_end_max(nodes: &mut [Node]) -> u64 {
    if nodes.is_empty() {
        return 0;
    }
    let middle = nodes.len() / 2;
    let (left, rest) = nodes.split_at_mut(middle);
    let (root, right) = rest.split_at_mut(1);
    let end_max = root[0].interval.end_ns.max(fill_subtree_end_max(left)).max(fill_subtree_end_max(right));
    root[0].subtree_end_max = end_max;
    end_max
}

struct Query<'a> {
    nodes: &'a [Node],
    start_ns: u64,
    end_ns: u64,
}

impl Query<'_> {
    /// Visits the overlapping intervals of the subtree over `[low, high)`, in start order, while
    /// the visitor returns true; false once it stopped. Recursion depth is the tree's height,
    /// at most 64.
    fn visit(&self, low: usize, high: usize, visitor: &mut impl FnMut(&Interval) -> bool) -> bool {
        if low >= high {
            return true;
        }
        let middle = low + (high - low) / 2;
        let node = &self.nodes[middle];
        if node.subtree_end_max < self.start_ns {
            return true; // everything here ended before the query started
        }
        if !self.visit(low, middle, visitor) {
            return false;
        }
        if node.interval.start_ns > self.end_ns {
            return true; // this one and everything to its right started after the query ended
        }
        if node.interval.end_ns >= self.start_ns && !visitor(&node.interval) {
            return false;
        }
        self.visit(middle + 1, high, visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::SplitMix;

    fn interval(start_ns: u64, end_ns: u64, writer: usize) -> Interval {
        Interval { start_ns, end_ns, writer }
    }

    fn visited(index: &OverlapIndex, key_id: usize, start_ns: u64, end_ns: u64) -> Vec<usize> {
        let mut writers = Vec::new();
        let finished = index.visit(key_id, start_ns, end_ns, &mut |interval| {
            writers.push(interval.writer);
            true
        });
        assert!(finished);
        writers.sort_unstable();
        writers
    }

    #[test]
    fn touching_intervals_overlap_and_disjoint_ones_do_not() {
        let index = OverlapIndex::build(vec![vec![interval(10, 20, 0), interval(30, 40, 1)], Vec::new()]);
        assert_eq!(visited(&index, 0, 20, 30), [0, 1], "ends and starts are inclusive");
        assert_eq!(visited(&index, 0, 21, 29), Vec::<usize>::new());
        assert_eq!(visited(&index, 0, 0, 9), Vec::<usize>::new());
        assert_eq!(visited(&index, 0, 41, 50), Vec::<usize>::new());
        assert_eq!(visited(&index, 0, 12, 13), [0], "a read inside a write");
        assert_eq!(visited(&index, 0, 0, 100), [0, 1], "a read around both");
        assert_eq!(visited(&index, 1, 0, 100), Vec::<usize>::new(), "a key without writes");
    }

    #[test]
    fn a_visitor_that_returns_false_stops_the_walk() {
        let index = OverlapIndex::build(vec![(0..100).map(|writer| interval(0, 10, writer)).collect()]);
        let mut seen = 0;
        let finished = index.visit(0, 5, 5, &mut |_| {
            seen += 1;
            seen < 3
        });
        assert!(!finished);
        assert_eq!(seen, 3);
    }

    #[test]
    fn a_long_write_is_found_from_anywhere_inside_it() {
        let mut intervals: Vec<Interval> =
            (0..1000).map(|step| interval(step * 10, step * 10 + 5, step as usize)).collect();
        intervals.push(interval(3, 1_000_000, 5000));
        let index = OverlapIndex::build(vec![intervals]);
        assert_eq!(visited(&index, 0, 5006, 5007), [5000]);
        assert_eq!(visited(&index, 0, 5000, 5000), [500, 5000]);
    }

    #[test]
    fn queries_match_a_linear_scan() {
        let seed = 0x0e7a_9001;
        println!("seed {seed:#x}");
        let mut random = SplitMix(seed);
        for round in 0..200 {
            let count = random.below(40) as usize;
            let intervals: Vec<Interval> = (0..count)
                .map(|writer| {
                    let start = random.below(1000);
                    let length = if random.below(10) == 0 { random.below(1000) } else { random.below(30) };
                    interval(start, start + length, writer)
                })
                .collect();
            let index = OverlapIndex::build(vec![Vec::new(), intervals.clone()]);
            for _ in 0..20 {
                let start = random.below(1100);
                let end = start + random.below(60);
                let mut expected: Vec<usize> = intervals
                    .iter()
                    .filter(|interval| interval.start_ns <= end && interval.end_ns >= start)
                    .map(|interval| interval.writer)
                    .collect();
                expected.sort_unstable();
                assert_eq!(visited(&index, 1, start, end), expected, "seed {seed:#x}, round {round}, [{start}, {end}]");
            }
        }
    }
}
