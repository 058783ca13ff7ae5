//! SMG's ChainIndex (crates/kv_index/src/chain_index.rs and its modules) under the replay
//! driver: one index, a ChainBlockMap per worker, as the gateway's event lanes keep them.

use smg_chain::{ChainIndex, ContentHash};

struct Chain(ChainIndex);

impl peers_driver::Peer for Chain {
    peers_driver::smg_peer_common!(smg_chain, ChainBlockMap);

    const NAME: &'static str = "smg-chain";

    /// ChainIndex has no jump size. Its default is 256 worker slots (coverage is one bit per
    /// slot per run); a log naming more workers gets up to its 1,024.
    fn new(_jump: usize, workers: usize) -> Self {
        if workers <= 256 {
            Chain(ChainIndex::new())
        } else {
            Chain(ChainIndex::with_max_workers(workers.min(1024)))
        }
    }
    /// The lookup, then each matched worker's block count (the gateway reads it beside the
    /// scores; ChainIndex does not collect it per lookup).
    fn query(&self, content: &[ContentHash], out: &mut Vec<(u32, u32, u64)>) {
        let s = self.0.find_matches(content, false);
        for (&w, &score) in &s.scores {
            out.push((w, score, self.0.worker_block_count(w) as u64));
        }
    }
}

fn main() {
    peers_driver::main_with::<Chain>();
}
