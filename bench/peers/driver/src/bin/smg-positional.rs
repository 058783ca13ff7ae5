//! SMG's PositionalIndexer (crates/kv_index/src/event_tree.rs) under the replay driver.

use smg_positional::{ContentHash, PositionalIndexer};

struct Positional(PositionalIndexer);

impl peers_driver::Peer for Positional {
    peers_driver::smg_peer_common!(smg_positional, WorkerBlockMap);

    const NAME: &'static str = "smg-positional";

    fn new(jump: usize, _workers: usize) -> Self {
        Positional(PositionalIndexer::new(jump))
    }
    fn query(&self, content: &[ContentHash], out: &mut Vec<(u32, u32, u64)>) {
        let s = self.0.find_matches(content, false);
        for (&w, &score) in &s.scores {
            out.push((w, score, s.tree_sizes.get(&w).copied().unwrap_or(0) as u64));
        }
    }
}

fn main() {
    peers_driver::main_with::<Positional>();
}
