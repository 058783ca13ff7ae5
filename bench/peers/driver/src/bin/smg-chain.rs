//! SMG's ChainIndex (crates/kv_index/src/chain_index.rs and its modules) under the replay
//! driver: one index, a ChainBlockMap per worker, as the gateway's event lanes keep them.

use smg_chain::{ChainBlockMap, ChainIndex, ContentHash, SequenceHash, StoredBlock};

struct Chain(ChainIndex);

impl peers_driver::Peer for Chain {
    type Map = ChainBlockMap;
    type Block = StoredBlock;
    type Seq = SequenceHash;
    type Hash = ContentHash;

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
    fn block(content: u64, seq: u64) -> StoredBlock {
        StoredBlock {
            seq_hash: SequenceHash(seq),
            content_hash: ContentHash(content),
        }
    }
    fn seq(seq: u64) -> SequenceHash {
        SequenceHash(seq)
    }
    fn hash(content: u64) -> ContentHash {
        ContentHash(content)
    }
    fn new_map(&self) -> ChainBlockMap {
        ChainBlockMap::default()
    }
    fn map_len(map: &ChainBlockMap) -> usize {
        map.len()
    }
    /// None once every worker slot is taken (at most 1,024 workers at once).
    fn intern(&self, name: &str) -> Option<u32> {
        self.0.intern_worker(name).ok()
    }
    fn stored(
        &self,
        wid: u32,
        parent: Option<SequenceHash>,
        blocks: &[StoredBlock],
        map: &mut ChainBlockMap,
    ) -> bool {
        self.0.apply_stored(wid, blocks, parent, map).is_ok()
    }
    fn removed(&self, wid: u32, seqs: &[SequenceHash], map: &mut ChainBlockMap) {
        self.0.apply_removed(wid, seqs, map)
    }
    fn cleared(&self, wid: u32, map: &mut ChainBlockMap) {
        self.0.apply_cleared(wid, map)
    }
    fn remove_worker(&self, wid: u32, map: ChainBlockMap) {
        self.0.remove_worker(wid, map)
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
