//! How many keys the bounded observation map evicted.
//!
//! `observations` is an LRU hash: when it is full, inserting a key evicts
//! the least recently used one, and that key's count is gone before any
//! drain reads it. The kernel has no eviction counter, and the program
//! cannot tell whether an update will evict, so the count is derived from
//! two cumulative counters that see every key:
//!
//! - `inserted` ([`super::Stats::observe_inserted`]): keys the program
//!   created;
//! - `taken` ([`super::EgressFilter::observations_taken`]): keys the drains
//!   removed.
//!
//! A key created since the baseline is eventually taken, evicted, or still
//! in the map. Reading `inserted` *before* a drain and `taken` after it,
//! `inserted - taken` (less the baseline) counts every evicted key, minus
//! the keys created between the `inserted` read and the drain's snapshot
//! (taken, but not in that `inserted` yet). So the estimate can run short
//! for one drain, and catches up at the next one; it never counts a key
//! that was not evicted. The reported total only grows: a short estimate
//! holds it until the next drain passes it.
//!
//! What is not counted: keys evicted before the baseline (a restarted
//! daemon cannot know what the map lost while none ran), and increments
//! lost between reading and removing a key on kernels before 5.14 (see
//! [`super::EgressFilter::drain_observations`]), which evict nothing.

/// The running count; see the [module docs](self).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evictions {
    /// `inserted - present - taken` at the baseline.
    base: i128,
    /// Evictions reported so far.
    reported: u64,
}

impl Evictions {
    /// The baseline: `present` keys were in the map, then `inserted` and
    /// `taken` were read (in that order: a key created between the two
    /// reads is then counted at most once).
    pub fn new(present: u64, inserted: u64, taken: u64) -> Self {
        Evictions {
            base: i128::from(inserted) - i128::from(present) - i128::from(taken),
            reported: 0,
        }
    }

    /// Given `inserted` read before a drain and `taken` after it, the keys
    /// evicted since the previous call.
    pub fn update(&mut self, inserted: u64, taken: u64) -> u64 {
        let estimate = i128::from(inserted) - i128::from(taken) - self.base;
        let total = u64::try_from(estimate.max(0)).unwrap_or(u64::MAX);
        let new = total.saturating_sub(self.reported);
        self.reported = self.reported.max(total);
        new
    }

    /// Evictions reported since the baseline.
    pub fn total(&self) -> u64 {
        self.reported
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A model of the LRU map: keys in insertion (recency) order, the
    /// program's `inserted` counter and the drains' `taken` counter.
    struct Lru {
        capacity: usize,
        keys: std::collections::VecDeque<u64>,
        inserted: u64,
        taken: u64,
        evicted: u64,
    }

    impl Lru {
        fn new(capacity: usize) -> Self {
            Lru {
                capacity,
                keys: Default::default(),
                inserted: 0,
                taken: 0,
                evicted: 0,
            }
        }

        fn insert(&mut self, key: u64) {
            if self.keys.len() == self.capacity {
                self.keys.pop_front();
                self.evicted += 1;
            }
            self.keys.push_back(key);
            self.inserted += 1;
        }

        fn drain(&mut self) {
            self.taken += self.keys.len() as u64;
            self.keys.clear();
        }
    }

    #[test]
    fn counts_exactly_what_the_map_evicted() {
        let mut map = Lru::new(4);
        // A previous daemon left two keys and had inserted 10.
        map.insert(100);
        map.insert(101);
        map.inserted = 10;
        let mut e = Evictions::new(map.keys.len() as u64, map.inserted, map.taken);
        let mut next = 0;
        for burst in [3, 9, 0, 4, 17, 1] {
            for _ in 0..burst {
                map.insert(next);
                next += 1;
            }
            let inserted = map.inserted;
            map.drain();
            e.update(inserted, map.taken);
            assert_eq!(e.total(), map.evicted, "after a burst of {burst}");
        }
        assert_eq!(map.evicted, 1 + 5 + 13);
    }

    #[test]
    fn a_key_created_during_a_drain_is_caught_up_with_never_overcounted() {
        let mut map = Lru::new(2);
        let mut e = Evictions::new(0, 0, 0);
        for k in 0..3 {
            map.insert(k);
        }
        // `inserted` is read, then two more keys arrive before the
        // snapshot, each evicting an older one; the drain takes them.
        let inserted = map.inserted;
        map.insert(3);
        map.insert(4);
        map.drain();
        let first = e.update(inserted, map.taken);
        assert!(first <= map.evicted, "{first} > {}", map.evicted);
        // The next drain sees every insert: exact again.
        let inserted = map.inserted;
        map.drain();
        e.update(inserted, map.taken);
        assert_eq!(e.total(), map.evicted);
        assert_eq!(map.evicted, 3);
    }

    #[test]
    fn the_total_never_goes_down_and_never_overflows() {
        let mut e = Evictions::new(0, 10, 0);
        assert_eq!(e.update(20, 5), 5);
        // A short estimate (taken ran ahead): nothing new, nothing undone.
        assert_eq!(e.update(20, 10), 0);
        assert_eq!(e.total(), 5);
        assert_eq!(e.update(30, 10), 5);
        let mut huge = Evictions::new(u64::MAX, 0, u64::MAX);
        assert_eq!(huge.update(u64::MAX, 0), u64::MAX);
        assert_eq!(huge.update(u64::MAX, 0), 0);
    }
}
