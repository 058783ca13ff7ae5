//! Replay drivers for SMG's KV indexes, written for kvindex's benchmark harness.
//!
//! Nothing here is SMG code: the SMG sources are compiled from a folder the user supplies
//! (see ../README.md), and this crate drives them the way SMG's gateway does: one index,
//! one block map per worker owned by the thread that applies that worker's events, the
//! engine hash (`seq`) passed through as the peer's `SequenceHash`, the content hash as its
//! `ContentHash`.
//!
//! A binary (one per peer) implements [`Peer`] and calls [`main_with`], which reads an op
//! log (kvindex SPEC.md, JSON Lines), measures and prints one JSON object on stdout:
//!
//! 1. memory: every event applied to a fresh index on one thread; live bytes (counted by
//!    this crate's global allocator) and RSS growth over the empty index, divided by the
//!    memberships held at the end (the sum of the block maps' lengths, i.e. the distinct
//!    seqs each worker holds). Measured first, in a fresh process, so RSS means something.
//! 2. verify (unless `--no-verify`): a sequential replay; every query with an expected
//!    answer is compared with it (workers with score >= 1, their scores and sizes).
//! 3. events: every event on a fresh index, one thread, in log order; passes until the
//!    time budget is spent (at least one, at most `--max-passes`); the median pass.
//! 4. queries at rest: one thread issuing the log's queries cyclically on the index a full
//!    pass left, for the time budget.
//! 5. queries under events: one streamer thread looping over the events (a remove_worker
//!    for every worker before each loop after the first, whose untimed first loop fills
//!    the index) while `--queriers` threads query, for the time budget or `--max-loops`
//!    loops.
//!
//! These are the measurements of kvindex's Go `bench` package, so the two sides of a table
//! mean the same thing.

pub mod alloc;
pub mod oplog;
pub mod run;

pub use run::{main_with, Peer};

/// The [`Peer`] methods SMG's two indexes share word for word: both crates export
/// `StoredBlock`, `SequenceHash` and `ContentHash` and the same `intern_worker` /
/// `apply_*` / `remove_worker` calls on the index in field `.0`. Invoked inside an
/// `impl Peer for X` block with the path of the peer crate and its block map type;
/// the binary writes the rest (`NAME`, `new`, `query`), where the two differ.
#[macro_export]
macro_rules! smg_peer_common {
    ($krate:ident, $map:ident) => {
        type Map = $krate::$map;
        type Block = $krate::StoredBlock;
        type Seq = $krate::SequenceHash;
        type Hash = $krate::ContentHash;

        fn block(content: u64, seq: u64) -> Self::Block {
            $krate::StoredBlock {
                seq_hash: $krate::SequenceHash(seq),
                content_hash: $krate::ContentHash(content),
            }
        }
        fn seq(seq: u64) -> Self::Seq {
            $krate::SequenceHash(seq)
        }
        fn hash(content: u64) -> Self::Hash {
            $krate::ContentHash(content)
        }
        fn new_map(&self) -> Self::Map {
            <$krate::$map>::default()
        }
        fn map_len(map: &Self::Map) -> usize {
            map.len()
        }
        /// None once every worker slot is taken.
        fn intern(&self, name: &str) -> Option<u32> {
            self.0.intern_worker(name).ok()
        }
        fn stored(
            &self,
            wid: u32,
            parent: Option<Self::Seq>,
            blocks: &[Self::Block],
            map: &mut Self::Map,
        ) -> bool {
            self.0.apply_stored(wid, blocks, parent, map).is_ok()
        }
        fn removed(&self, wid: u32, seqs: &[Self::Seq], map: &mut Self::Map) {
            self.0.apply_removed(wid, seqs, map)
        }
        fn cleared(&self, wid: u32, map: &mut Self::Map) {
            self.0.apply_cleared(wid, map)
        }
        fn remove_worker(&self, wid: u32, map: Self::Map) {
            self.0.remove_worker(wid, map)
        }
    };
}
