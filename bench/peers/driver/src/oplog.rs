//! The op log (kvindex SPEC.md, "Op log"), parsed once, before anything is timed, into the
//! peer's own block and hash types.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufRead, BufReader};

use serde_json::Value;

/// One non-query op. Workers are indexes into [`Workload::names`].
pub enum Event<B, S> {
    Stored {
        worker: u32,
        parent: Option<S>,
        blocks: Vec<B>,
    },
    Removed {
        worker: u32,
        seqs: Vec<S>,
    },
    Cleared {
        worker: u32,
    },
    RemoveWorker {
        worker: u32,
    },
}

impl<B, S> Event<B, S> {
    pub fn worker(&self) -> u32 {
        match self {
            Event::Stored { worker, .. }
            | Event::Removed { worker, .. }
            | Event::Cleared { worker }
            | Event::RemoveWorker { worker } => *worker,
        }
    }
}

/// A query with its expected answer: (worker, score, size) for every worker with score
/// >= 1, sorted by worker.
pub struct Check<H> {
    pub line: usize,
    pub content: Vec<H>,
    pub expect: Vec<(u32, u32, u64)>,
}

/// Replay order for the verification: an event or a check.
pub enum Step {
    Event(usize),
    Check(usize),
}

/// The longest coalesced event, in blocks or seqs (kvindex's bench package uses the same
/// bound, maxCoalesced).
const MAX_COALESCED: usize = 4096;

/// What coalescing remembers of the last event it kept: enough to tell whether the next
/// one joins it (see [`Workload::read`]).
struct Last {
    stored: bool,
    worker: u32,
    /// The op's medium, group and namespace fields as written (absent: None).
    scope: [Option<Value>; 3],
    parent: Option<u64>,
    /// The stored blocks' seqs or the removed seqs.
    seqs: Vec<u64>,
}

impl Last {
    /// Whether an op of this kind, worker and scope, with this parent (stores) and these
    /// seqs, joins the event this remembers.
    fn joins(
        &self,
        stored: bool,
        worker: u32,
        scope: &[Option<Value>; 3],
        parent: Option<u64>,
        seqs: &[u64],
    ) -> bool {
        if self.stored != stored
            || self.worker != worker
            || &self.scope != scope
            || self.seqs.len() + seqs.len() > MAX_COALESCED
        {
            return false;
        }
        if !stored {
            return true;
        }
        parent.is_some()
            && parent == self.seqs.last().copied()
            && !seqs
                .iter()
                .any(|s| Some(*s) == self.parent || self.seqs.contains(s))
    }
}

/// An op log prepared for measurement.
pub struct Workload<B, S, H> {
    pub names: Vec<String>,
    pub events: Vec<Event<B, S>>,
    /// The non-empty queries' contents, in order.
    pub queries: Vec<Vec<H>>,
    pub checks: Vec<Check<H>>,
    pub steps: Vec<Step>,
    /// Blocks of stored events plus seqs of removed events.
    pub block_ops: u64,
}

fn u64s(v: Option<&Value>, line: usize, what: &str) -> Result<Vec<u64>, String> {
    let Some(a) = v.and_then(Value::as_array) else {
        return Err(format!("line {line}: {what}: want an array"));
    };
    a.iter()
        .map(|x| {
            x.as_u64()
                .ok_or_else(|| format!("line {line}: {what}: want unsigned 64-bit integers"))
        })
        .collect()
}

impl<B, S, H> Workload<B, S, H> {
    /// Reads the log at path, converting blocks, seqs and content hashes with the peer's
    /// constructors.
    ///
    /// With coalesce, events are merged the way kvindex's `Workload.Coalesced` merges
    /// them (bench/coalesce.go), so that both sides of a coalesced row make the same calls:
    /// a removal joins the event before it when that is a removal of the same worker with
    /// the same medium, group and namespace fields; a store joins the store before it of
    /// the same worker and fields when its parent is that store's last block and none of
    /// its seqs is in that store or is its parent. Never across a query, and never past
    /// MAX_COALESCED blocks or seqs.
    pub fn read(
        path: &str,
        coalesce: bool,
        block: impl Fn(u64, u64) -> B,
        seq: impl Fn(u64) -> S,
        hash: impl Fn(u64) -> H,
    ) -> Result<Self, String> {
        let f = File::open(path).map_err(|e| format!("{path}: {e}"))?;
        let mut w = Workload {
            names: Vec::new(),
            events: Vec::new(),
            queries: Vec::new(),
            checks: Vec::new(),
            steps: Vec::new(),
            block_ops: 0,
        };
        let mut ids: HashMap<String, u32> = HashMap::new();
        let mut intern = |name: &str, names: &mut Vec<String>| -> u32 {
            if let Some(&id) = ids.get(name) {
                return id;
            }
            let id = names.len() as u32;
            ids.insert(name.to_string(), id);
            names.push(name.to_string());
            id
        };
        let mut last: Option<Last> = None;
        for (i, text) in BufReader::new(f).lines().enumerate() {
            let line = i + 1;
            let text = text.map_err(|e| format!("{path}: line {line}: {e}"))?;
            if text.trim().is_empty() {
                continue;
            }
            let v: Value =
                serde_json::from_str(&text).map_err(|e| format!("{path}: line {line}: {e}"))?;
            let op = v.get("op").and_then(Value::as_str).unwrap_or("");
            if op == "query" {
                last = None; // a query cuts
                let raw = u64s(v.get("content"), line, "content")?;
                if let Some(exp) = v.get("expect").and_then(Value::as_object) {
                    let sizes = v.get("sizes").and_then(Value::as_object);
                    let mut expect = Vec::with_capacity(exp.len());
                    for (name, score) in exp {
                        let score = score
                            .as_u64()
                            .ok_or_else(|| format!("line {line}: expect: want integers"))?;
                        let size = sizes
                            .and_then(|s| s.get(name))
                            .and_then(Value::as_u64)
                            .unwrap_or(u64::MAX);
                        expect.push((intern(name, &mut w.names), score as u32, size));
                    }
                    expect.sort_unstable();
                    w.steps.push(Step::Check(w.checks.len()));
                    w.checks.push(Check {
                        line,
                        content: raw.iter().copied().map(&hash).collect(),
                        expect,
                    });
                }
                if !raw.is_empty() {
                    w.queries.push(raw.into_iter().map(&hash).collect());
                }
                continue;
            }
            let Some(name) = v.get("worker").and_then(Value::as_str) else {
                return Err(format!("{path}: line {line}: want a worker"));
            };
            let worker = intern(name, &mut w.names);
            let scope = ["medium", "group", "namespace"].map(|k| v.get(k).cloned());
            let ev = match op {
                "stored" => {
                    let parent = match v.get("parent") {
                        None | Some(Value::Null) => None,
                        Some(p) => Some(
                            p.as_u64()
                                .ok_or_else(|| format!("line {line}: parent: want an integer"))?,
                        ),
                    };
                    let Some(raw) = v.get("blocks").and_then(Value::as_array) else {
                        return Err(format!("{path}: line {line}: blocks: want an array"));
                    };
                    let mut pairs = Vec::with_capacity(raw.len());
                    for b in raw {
                        let pair = u64s(Some(b), line, "blocks")?;
                        if pair.len() != 2 {
                            return Err(format!(
                                "{path}: line {line}: blocks: want [content, seq] pairs"
                            ));
                        }
                        pairs.push((pair[0], pair[1]));
                    }
                    w.block_ops += pairs.len() as u64;
                    let seqs: Vec<u64> = pairs.iter().map(|p| p.1).collect();
                    let blocks = pairs.iter().map(|&(c, s)| block(c, s));
                    match last.as_mut() {
                        Some(l) if coalesce && l.joins(true, worker, &scope, parent, &seqs) => {
                            if let Some(Event::Stored { blocks: prev, .. }) = w.events.last_mut() {
                                prev.extend(blocks);
                            }
                            l.seqs.extend_from_slice(&seqs);
                            continue;
                        }
                        _ => {}
                    }
                    let ev = Event::Stored {
                        worker,
                        parent: parent.map(&seq),
                        blocks: blocks.collect(),
                    };
                    last = Some(Last {
                        stored: true,
                        worker,
                        scope,
                        parent,
                        seqs,
                    });
                    ev
                }
                "removed" => {
                    let raw = u64s(v.get("seqs"), line, "seqs")?;
                    w.block_ops += raw.len() as u64;
                    match last.as_mut() {
                        Some(l) if coalesce && l.joins(false, worker, &scope, None, &raw) => {
                            if let Some(Event::Removed { seqs, .. }) = w.events.last_mut() {
                                seqs.extend(raw.iter().map(|&s| seq(s)));
                            }
                            l.seqs.extend_from_slice(&raw);
                            continue;
                        }
                        _ => {}
                    }
                    let ev = Event::Removed {
                        worker,
                        seqs: raw.iter().map(|&s| seq(s)).collect(),
                    };
                    last = Some(Last {
                        stored: false,
                        worker,
                        scope,
                        parent: None,
                        seqs: raw,
                    });
                    ev
                }
                "cleared" => {
                    last = None;
                    Event::Cleared { worker }
                }
                "remove_worker" => {
                    last = None;
                    Event::RemoveWorker { worker }
                }
                other => return Err(format!("{path}: line {line}: unknown op {other:?}")),
            };
            w.steps.push(Step::Event(w.events.len()));
            w.events.push(ev);
        }
        Ok(w)
    }
}
