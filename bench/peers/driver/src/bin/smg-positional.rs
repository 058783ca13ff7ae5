//! SMG's PositionalIndexer (crates/kv_index/src/event_tree.rs) under the replay driver.

use smg_positional::{ContentHash, PositionalIndexer, SequenceHash, StoredBlock, WorkerBlockMap};

struct Positional(PositionalIndexer);

impl peers_driver::Peer for Positional {
    type Map = WorkerBlockMap;
    type Block = StoredBlock;
    type Seq = SequenceHash;
    type Hash = ContentHash;

    const NAME: &'static str = "smg-positional";

    fn new(jump: usize, _workers: usize) -> Self {
        Positional(PositionalIndexer::new(jump))
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
    fn new_map(&self) -> WorkerBlockMap {
        WorkerBlockMap::default()
    }
    fn map_len(map: &WorkerBlockMap) -> usize {
        map.len()
    }
    fn intern(&self, name: &str) -> Option<u32> {
        self.0.intern_worker(name).ok()
    }
    fn stored(
        &self,
        wid: u32,
        parent: Option<SequenceHash>,
        blocks: &[StoredBlock],
        map: &mut WorkerBlockMap,
    ) -> bool {
        self.0.apply_stored(wid, blocks, parent, map).is_ok()
    }
    fn removed(&self, wid: u32, seqs: &[SequenceHash], map: &mut WorkerBlockMap) {
        self.0.apply_removed(wid, seqs, map)
    }
    fn cleared(&self, wid: u32, map: &mut WorkerBlockMap) {
        self.0.apply_cleared(wid, map)
    }
    fn remove_worker(&self, wid: u32, map: WorkerBlockMap) {
        self.0.remove_worker(wid, map)
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
