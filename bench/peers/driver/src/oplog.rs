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
    pub fn read(
        path: &str,
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
            let ev = match op {
                "stored" => {
                    let parent = match v.get("parent") {
                        None | Some(Value::Null) => None,
                        Some(p) => Some(seq(p
                            .as_u64()
                            .ok_or_else(|| format!("line {line}: parent: want an integer"))?)),
                    };
                    let Some(raw) = v.get("blocks").and_then(Value::as_array) else {
                        return Err(format!("{path}: line {line}: blocks: want an array"));
                    };
                    let mut blocks = Vec::with_capacity(raw.len());
                    for b in raw {
                        let pair = u64s(Some(b), line, "blocks")?;
                        if pair.len() != 2 {
                            return Err(format!(
                                "{path}: line {line}: blocks: want [content, seq] pairs"
                            ));
                        }
                        blocks.push(block(pair[0], pair[1]));
                    }
                    w.block_ops += blocks.len() as u64;
                    Event::Stored {
                        worker,
                        parent,
                        blocks,
                    }
                }
                "removed" => {
                    let seqs: Vec<S> = u64s(v.get("seqs"), line, "seqs")?
                        .into_iter()
                        .map(&seq)
                        .collect();
                    w.block_ops += seqs.len() as u64;
                    Event::Removed { worker, seqs }
                }
                "cleared" => Event::Cleared { worker },
                "remove_worker" => Event::RemoveWorker { worker },
                other => return Err(format!("{path}: line {line}: unknown op {other:?}")),
            };
            w.steps.push(Step::Event(w.events.len()));
            w.events.push(ev);
        }
        Ok(w)
    }
}
