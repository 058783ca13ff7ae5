//! The subset of rustc-hash 2's API that the SMG indexes use, built on rustc-hash 1.1.
//!
//! rustc-hash 2 made `FxBuildHasher` a unit struct that is passed by value
//! (`DashMap::with_hasher_and_shard_amount(FxBuildHasher, n)`) and defined `FxHashMap` and
//! `FxHashSet` over it; 1.1 has only `BuildHasherDefault<FxHasher>`. The hasher itself is
//! 1.1's `FxHasher` (2.x changed the mixing function), which the benchmark report notes.

use std::collections::{HashMap, HashSet};
use std::hash::BuildHasher;

pub use fx1::FxHasher;

/// A `BuildHasher` of `FxHasher`s, constructible as a value like rustc-hash 2's.
#[derive(Clone, Copy, Debug, Default)]
pub struct FxBuildHasher;

impl BuildHasher for FxBuildHasher {
    type Hasher = FxHasher;

    #[inline]
    fn build_hasher(&self) -> FxHasher {
        FxHasher::default()
    }
}

/// A `HashMap` with `FxBuildHasher`.
pub type FxHashMap<K, V> = HashMap<K, V, FxBuildHasher>;

/// A `HashSet` with `FxBuildHasher`.
pub type FxHashSet<V> = HashSet<V, FxBuildHasher>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_hasher_builds_maps() {
        let mut m: FxHashMap<u64, u32> = FxHashMap::with_capacity_and_hasher(4, FxBuildHasher);
        m.insert(7, 1);
        let mut s: FxHashSet<u64> = FxHashSet::default();
        s.insert(7);
        assert_eq!(m.get(&7), Some(&1));
        assert!(s.contains(&7));
    }
}
