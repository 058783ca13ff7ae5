//! The measurements (see the crate doc) and the command line.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::alloc;
use crate::oplog::{Event, Step, Workload};

/// One SMG index as the gateway drives it.
pub trait Peer: Sync + Sized {
    /// A worker's block map, owned by the thread that applies the worker's events.
    type Map: Send;
    /// A stored block, a seq (engine hash) and a content hash in the peer's own types.
    type Block: Send + Sync;
    type Seq: Copy + Send + Sync;
    type Hash: Send + Sync;

    /// Shown in the output.
    const NAME: &'static str;

    /// An empty index; workers is how many distinct worker names the op log has (a bound
    /// on the workers interned at once).
    fn new(jump: usize, workers: usize) -> Self;
    fn block(content: u64, seq: u64) -> Self::Block;
    fn seq(seq: u64) -> Self::Seq;
    fn hash(content: u64) -> Self::Hash;

    fn new_map(&self) -> Self::Map;
    fn map_len(map: &Self::Map) -> usize;
    /// The peer's id for a worker name, interning it on first use; None when the peer has
    /// no room for another worker (its stores are then counted as rejected).
    fn intern(&self, name: &str) -> Option<u32>;
    /// Applies a store; false when the peer rejects it.
    fn stored(
        &self,
        wid: u32,
        parent: Option<Self::Seq>,
        blocks: &[Self::Block],
        map: &mut Self::Map,
    ) -> bool;
    fn removed(&self, wid: u32, seqs: &[Self::Seq], map: &mut Self::Map);
    fn cleared(&self, wid: u32, map: &mut Self::Map);
    fn remove_worker(&self, wid: u32, map: Self::Map);
    /// Appends (peer worker id, score, size) for the query's answer to out; entries with
    /// score 0 are ignored by the caller.
    fn query(&self, content: &[Self::Hash], out: &mut Vec<(u32, u32, u64)>);
}

type W<P> = Workload<<P as Peer>::Block, <P as Peer>::Seq, <P as Peer>::Hash>;

/// The per-worker state of one applying thread: the peer's id and block map per worker
/// (None until the worker's first event that needs one).
struct Workers<M> {
    slots: Vec<Option<(u32, M)>>,
}

impl<M> Workers<M> {
    fn new(n: usize) -> Self {
        Workers {
            slots: (0..n).map(|_| None).collect(),
        }
    }
}

/// Applies one event; returns false for a rejected store.
fn apply<P: Peer>(p: &P, w: &W<P>, st: &mut Workers<P::Map>, ev: &Event<P::Block, P::Seq>) -> bool {
    let wi = ev.worker() as usize;
    match ev {
        Event::Stored { parent, blocks, .. } => {
            if blocks.is_empty() {
                return true; // SPEC: nothing happens, the worker does not become known
            }
            if st.slots[wi].is_none() {
                let Some(wid) = p.intern(&w.names[wi]) else {
                    return false;
                };
                st.slots[wi] = Some((wid, p.new_map()));
            }
            let (wid, map) = st.slots[wi].as_mut().expect("interned above");
            p.stored(*wid, *parent, blocks, map)
        }
        Event::Removed { seqs, .. } => {
            if let Some((wid, map)) = st.slots[wi].as_mut() {
                p.removed(*wid, seqs, map);
            }
            true
        }
        Event::Cleared { .. } => {
            if let Some((wid, map)) = st.slots[wi].as_mut() {
                p.cleared(*wid, map);
            }
            true
        }
        Event::RemoveWorker { .. } => {
            if let Some((wid, map)) = st.slots[wi].take() {
                p.remove_worker(wid, map);
            }
            true
        }
    }
}

/// Applies every event in order; returns the rejected stores.
fn apply_all<P: Peer>(p: &P, w: &W<P>, st: &mut Workers<P::Map>) -> u64 {
    let mut rejected = 0;
    for ev in &w.events {
        if !apply(p, w, st, ev) {
            rejected += 1;
        }
    }
    rejected
}

fn memberships<M, P: Peer<Map = M>>(st: &Workers<M>) -> u64 {
    st.slots
        .iter()
        .flatten()
        .map(|(_, m)| P::map_len(m) as u64)
        .sum()
}

/// As kvindex's replay.Percentile: nearest rank.
fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let i = (q * sorted.len() as f64 + 0.5) as isize - 1;
    sorted[i.clamp(0, sorted.len() as isize - 1) as usize]
}

struct Opts {
    ops: String,
    jump: usize,
    budget: Duration,
    queriers: usize,
    max_passes: usize,
    max_loops: usize,
    verify: bool,
    coalesce: bool,
}

fn parse_args() -> Result<Opts, String> {
    let mut o = Opts {
        ops: String::new(),
        jump: 64,
        budget: Duration::from_millis(400),
        queriers: 2,
        max_passes: 15,
        max_loops: 50,
        verify: true,
        coalesce: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = |name: &str| args.next().ok_or_else(|| format!("{name}: want a value"));
        let num = |s: String, name: &str| {
            s.parse::<u64>()
                .map_err(|_| format!("{name} {s:?}: want an integer"))
        };
        match a.as_str() {
            "--ops" => o.ops = val("--ops")?,
            "--jump" => o.jump = num(val("--jump")?, "--jump")? as usize,
            "--duration-ms" => {
                o.budget = Duration::from_millis(num(val("--duration-ms")?, "--duration-ms")?)
            }
            "--queriers" => o.queriers = num(val("--queriers")?, "--queriers")? as usize,
            "--max-passes" => o.max_passes = num(val("--max-passes")?, "--max-passes")? as usize,
            "--max-loops" => o.max_loops = num(val("--max-loops")?, "--max-loops")? as usize,
            "--no-verify" => o.verify = false,
            "--coalesce" => o.coalesce = true,
            _ => return Err(format!("unknown argument {a:?}")),
        }
    }
    if o.ops.is_empty() {
        return Err("--ops FILE is required".into());
    }
    if o.jump == 0 || o.queriers == 0 || o.max_passes == 0 || o.budget.is_zero() {
        return Err("--jump, --queriers, --max-passes and --duration-ms must be >= 1".into());
    }
    Ok(o)
}

/// Reads the op log named on the command line, runs every measurement on peer P and
/// prints the JSON result. Exit status 2 for a bad command line, 1 for an unreadable log.
pub fn main_with<P: Peer>() {
    let o = match parse_args() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{}: {e}\nusage: {} --ops FILE [--jump N] [--duration-ms N] [--queriers N] [--max-passes N] [--max-loops N] [--no-verify] [--coalesce]", P::NAME, P::NAME);
            std::process::exit(2);
        }
    };
    let read = |coalesce| match Workload::read(&o.ops, coalesce, P::block, P::seq, P::hash) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("{}: {e}", P::NAME);
            std::process::exit(1);
        }
    };
    let w: W<P> = read(false);
    let wc: Option<W<P>> = o.coalesce.then(|| read(true));
    let out = measure::<P>(&w, wc.as_ref(), &o);
    println!("{out}");
}

/// Runs the measurements of the crate doc on w and, when wc (w coalesced) is given, the
/// events measurement and the verification on it too (replay_coalesced,
/// verify_coalesced).
fn measure<P: Peer>(w: &W<P>, wc: Option<&W<P>>, o: &Opts) -> serde_json::Value {
    // 1. Memory, first, in a fresh process.
    let live0 = alloc::live_bytes();
    let p = P::new(o.jump, w.names.len());
    let mut st = Workers::new(w.names.len());
    let rss_empty = alloc::rss_bytes();
    let rejected = apply_all(&p, w, &mut st);
    let members = memberships::<_, P>(&st);
    let live = alloc::live_bytes() - live0;
    let rss = alloc::rss_bytes() as i64 - rss_empty as i64;
    drop(st);
    drop(p);
    alloc::stop_counting();
    let per = |b: i64| {
        if members > 0 {
            b as f64 / members as f64
        } else {
            0.0
        }
    };

    // 2. Verify.
    let checked = |w: &W<P>| {
        if o.verify {
            verify::<P>(w, o)
        } else {
            json!({"ran": false, "passed": 0, "failed": 0, "scores_passed": 0, "first": ""})
        }
    };
    let verified = checked(w);

    // 3. Events: one thread, log order, fresh index per pass; coalesced too if asked.
    let replayed = replay::<P>(w, o);
    let coalesced = wc.map(|wc| (replay::<P>(wc, o), checked(wc)));

    // 4. Queries at rest.
    let rest = {
        let p = P::new(o.jump, w.names.len());
        let mut st = Workers::new(w.names.len());
        apply_all(&p, w, &mut st);
        let stop = AtomicBool::new(false);
        query_loop(&p, w, 0, 1, o.budget, &stop)
    };

    // 5. Queries under events.
    let (load, load_secs, load_events, loops) = under_events::<P>(w, o);
    let qs = |lats: &mut Vec<u64>, secs: f64| {
        lats.sort_unstable();
        json!({
            "queries": lats.len(),
            "seconds": secs,
            "p50_ns": percentile(lats, 0.50),
            "p99_ns": percentile(lats, 0.99),
            "p999_ns": percentile(lats, 0.999),
        })
    };
    let (mut rest_lats, rest_secs) = rest;
    let mut load_lats = load;
    let mut load_json = qs(&mut load_lats, load_secs);
    load_json["events"] = json!(load_events);
    load_json["events_per_sec"] = json!(if load_secs > 0.0 {
        load_events as f64 / load_secs
    } else {
        0.0
    });
    load_json["loops"] = json!(loops);
    let mut out = json!({
        "impl": P::NAME,
        "ops_file": o.ops,
        "jump": o.jump,
        "workers": w.names.len(),
        "events": w.events.len(),
        "block_ops": w.block_ops,
        "queries": w.queries.len(),
        "rejected": rejected,
        "verify": verified,
        "replay": replayed,
        "rest": qs(&mut rest_lats, rest_secs),
        "load": load_json,
        "memory": {
            "memberships": members,
            "alloc_bytes": live,
            "alloc_bytes_per_membership": per(live as i64),
            "rss_bytes": rss,
            "rss_bytes_per_membership": per(rss),
        },
    });
    if let Some((replayed, verified)) = coalesced {
        out["replay_coalesced"] = replayed;
        out["verify_coalesced"] = verified;
    }
    out
}

/// Replays w sequentially and checks every query with an expected answer; returns the
/// verify object of the output.
fn verify<P: Peer>(w: &W<P>, o: &Opts) -> serde_json::Value {
    let (mut passed, mut failed, mut first) = (0u64, 0u64, String::new());
    let mut scores_passed = 0u64; // scores equal, sizes aside
    {
        let p = P::new(o.jump, w.names.len());
        let mut st = Workers::new(w.names.len());
        let mut rev: Vec<u32> = Vec::new(); // peer id -> worker index
        let mut got = Vec::new();
        let mut ans = Vec::new();
        for s in &w.steps {
            match s {
                Step::Event(i) => {
                    apply(&p, w, &mut st, &w.events[*i]);
                    if let Some((wid, _)) = st.slots[w.events[*i].worker() as usize] {
                        if rev.len() <= wid as usize {
                            rev.resize(wid as usize + 1, u32::MAX);
                        }
                        rev[wid as usize] = w.events[*i].worker();
                    }
                }
                Step::Check(c) => {
                    let c = &w.checks[*c];
                    got.clear();
                    p.query(&c.content, &mut got);
                    ans.clear();
                    ans.extend(got.iter().filter(|g| g.1 >= 1).map(|&(wid, sc, sz)| {
                        (rev.get(wid as usize).copied().unwrap_or(u32::MAX), sc, sz)
                    }));
                    ans.sort_unstable();
                    if ans.len() == c.expect.len()
                        && ans
                            .iter()
                            .zip(&c.expect)
                            .all(|(a, e)| a.0 == e.0 && a.1 == e.1)
                    {
                        scores_passed += 1;
                    }
                    if ans == c.expect {
                        passed += 1;
                    } else {
                        failed += 1;
                        if first.is_empty() {
                            let show = |v: &[(u32, u32, u64)]| {
                                let parts: Vec<String> = v
                                    .iter()
                                    .map(|&(wi, sc, sz)| {
                                        let n =
                                            w.names.get(wi as usize).map_or("?", |s| s.as_str());
                                        format!("{n:?}: score {sc} size {sz}")
                                    })
                                    .collect();
                                format!("{{{}}}", parts.join(", "))
                            };
                            first = format!(
                                "line {}: query of {} blocks\n  want: {}\n  got:  {}",
                                c.line,
                                c.content.len(),
                                show(&c.expect),
                                show(&ans)
                            );
                        }
                    }
                }
            }
        }
    }
    json!({"ran": true, "passed": passed, "failed": failed, "scores_passed": scores_passed, "first": first})
}

/// Applies every event of w on one thread, in log order, on a fresh index per pass,
/// until the budget is spent (at least one pass, at most o.max_passes); returns the
/// replay object of the output: the median pass in wall time and in the process's CPU
/// time (cpu_seconds, the median of the passes' CPU times).
fn replay<P: Peer>(w: &W<P>, o: &Opts) -> serde_json::Value {
    let mut secs = Vec::new();
    let mut cpus = Vec::new();
    let mut total = Duration::ZERO;
    while secs.len() < o.max_passes && (secs.is_empty() || total < o.budget) {
        let p = P::new(o.jump, w.names.len());
        let mut st = Workers::new(w.names.len());
        let c0 = cpu_seconds();
        let t0 = Instant::now();
        apply_all(&p, w, &mut st);
        let d = t0.elapsed();
        cpus.push(cpu_seconds() - c0);
        drop(st);
        drop(p);
        total += d;
        secs.push(d.as_secs_f64());
    }
    let n = secs.len();
    let wall = median(&mut secs);
    let cpu = median(&mut cpus);
    json!({"events": w.events.len(), "passes": n, "seconds": wall, "cpu_seconds": cpu,
        "block_ops_per_sec": w.block_ops as f64 / wall, "events_per_sec": w.events.len() as f64 / wall})
}

/// The median of xs (the mean of the middle two for an even count); sorts xs.
fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let n = xs.len();
    if n == 0 {
        return 0.0;
    }
    if n % 2 == 1 {
        xs[n / 2]
    } else {
        (xs[n / 2 - 1] + xs[n / 2]) / 2.0
    }
}

/// The CPU time, user and system, that every thread of the process has used so far, in
/// seconds: what kvindex's bench package measures for its side (processCPU).
fn cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given and nothing else.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0.0;
    }
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// Issues queries g, g+step, ... cyclically until budget has passed or stop is set (at
/// least one); returns the latencies and the seconds it ran.
fn query_loop<P: Peer>(
    p: &P,
    w: &W<P>,
    g: usize,
    step: usize,
    budget: Duration,
    stop: &AtomicBool,
) -> (Vec<u64>, f64) {
    let mut lats = Vec::with_capacity(1 << 14);
    let mut out = Vec::new();
    if w.queries.is_empty() {
        return (lats, 0.0);
    }
    let t0 = Instant::now();
    let mut k = g;
    loop {
        let q = &w.queries[k % w.queries.len()];
        let t = Instant::now();
        out.clear();
        p.query(q, &mut out);
        let d = t.elapsed();
        lats.push(d.as_nanos() as u64);
        std::hint::black_box(&out);
        if t0.elapsed() >= budget || stop.load(Ordering::Relaxed) {
            break;
        }
        k += step;
    }
    (lats, t0.elapsed().as_secs_f64())
}

/// One streamer thread loops over the events while o.queriers threads query (see the
/// crate doc); returns the merged latencies, the window's seconds, the events applied in
/// it and the streamer's loops after the first.
fn under_events<P: Peer>(w: &W<P>, o: &Opts) -> (Vec<u64>, f64, u64, u64) {
    if w.queries.is_empty() {
        return (Vec::new(), 0.0, 0, 0);
    }
    let p = P::new(o.jump, w.names.len());
    let warm = Barrier::new(o.queriers + 1);
    let (stop, done) = (AtomicBool::new(false), AtomicBool::new(false));
    let events = AtomicU64::new(0);
    let mut loops = 0u64;
    let mut lats = Vec::new();
    let mut window = 0.0;
    std::thread::scope(|s| {
        let streamer = s.spawn(|| {
            let mut st = Workers::new(w.names.len());
            let mut n = 0u64;
            let mut loops = 0u64;
            'outer: for lp in 0..=o.max_loops {
                if lp > 0 {
                    for slot in st.slots.iter_mut() {
                        if let Some((wid, map)) = slot.take() {
                            p.remove_worker(wid, map);
                            n += 1;
                        }
                    }
                }
                for ev in &w.events {
                    if stop.load(Ordering::Relaxed) {
                        break 'outer;
                    }
                    apply(&p, w, &mut st, ev);
                    n += 1;
                }
                if lp == 0 {
                    warm.wait();
                    n = 0;
                } else {
                    loops += 1;
                }
            }
            events.store(n, Ordering::Relaxed);
            done.store(true, Ordering::Relaxed);
            loops
        });
        let qs: Vec<_> = (0..o.queriers)
            .map(|g| {
                let (p, w, warm, done) = (&p, w, &warm, &done);
                s.spawn(move || {
                    warm.wait();
                    query_loop(p, w, g, o.queriers, o.budget, done)
                })
            })
            .collect();
        for q in qs {
            let (l, secs) = q.join().unwrap();
            lats.extend(l);
            window = f64::max(window, secs);
        }
        stop.store(true, Ordering::Relaxed);
        loops = streamer.join().unwrap();
    });
    (lats, window, events.load(Ordering::Relaxed), loops)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use super::*;

    /// A toy peer: each worker holds one chain (a store without a parent restarts it, a
    /// store under the chain's last seq extends it, any other parent is rejected); a query
    /// scores each worker by its chain's common prefix with the content.
    struct Toy {
        chains: Mutex<HashMap<u32, Vec<(u64, u64)>>>,
        names: Mutex<Vec<String>>,
    }

    impl Peer for Toy {
        type Map = usize; // blocks held, as the driver sees them
        type Block = (u64, u64);
        type Seq = u64;
        type Hash = u64;
        const NAME: &'static str = "toy";

        fn new(_jump: usize, _workers: usize) -> Self {
            Toy {
                chains: Mutex::new(HashMap::new()),
                names: Mutex::new(Vec::new()),
            }
        }
        fn block(content: u64, seq: u64) -> (u64, u64) {
            (content, seq)
        }
        fn seq(seq: u64) -> u64 {
            seq
        }
        fn hash(content: u64) -> u64 {
            content
        }
        fn new_map(&self) -> usize {
            0
        }
        fn map_len(map: &usize) -> usize {
            *map
        }
        fn intern(&self, name: &str) -> Option<u32> {
            let mut names = self.names.lock().unwrap();
            match names.iter().position(|n| n == name) {
                Some(i) => Some(i as u32),
                None if names.len() < 2 => {
                    names.push(name.to_string());
                    Some(names.len() as u32 - 1)
                }
                None => None, // room for two workers only
            }
        }
        fn stored(
            &self,
            wid: u32,
            parent: Option<u64>,
            blocks: &[(u64, u64)],
            map: &mut usize,
        ) -> bool {
            let mut chains = self.chains.lock().unwrap();
            let chain = chains.entry(wid).or_default();
            match parent {
                None => chain.clear(),
                Some(p) if chain.last().map(|b| b.1) == Some(p) => {}
                Some(_) => return false,
            }
            chain.extend_from_slice(blocks);
            *map = chain.len();
            true
        }
        fn removed(&self, wid: u32, seqs: &[u64], map: &mut usize) {
            let mut chains = self.chains.lock().unwrap();
            let chain = chains.entry(wid).or_default();
            chain.retain(|b| !seqs.contains(&b.1));
            *map = chain.len();
        }
        fn cleared(&self, wid: u32, map: &mut usize) {
            self.chains.lock().unwrap().remove(&wid);
            *map = 0;
        }
        fn remove_worker(&self, wid: u32, _map: usize) {
            self.chains.lock().unwrap().remove(&wid);
        }
        fn query(&self, content: &[u64], out: &mut Vec<(u32, u32, u64)>) {
            for (&wid, chain) in self.chains.lock().unwrap().iter() {
                let score = chain
                    .iter()
                    .zip(content)
                    .take_while(|(b, c)| b.0 == **c)
                    .count();
                out.push((wid, score as u32, chain.len() as u64));
            }
        }
    }

    /// Writes text to a file of its own (the tests run in parallel) and returns its path.
    fn log(text: &str) -> String {
        static NEXT: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!("peers-driver-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("ops{}.jsonl", NEXT.fetch_add(1, Ordering::Relaxed)));
        std::fs::write(&path, text).unwrap();
        path.to_string_lossy().into_owned()
    }

    const OPS: &str = r#"{"op":"stored","worker":"a","blocks":[[1,11],[2,12],[3,13]]}
{"op":"stored","worker":"b","blocks":[[1,21]]}
{"op":"stored","worker":"b","parent":99,"blocks":[[5,22]]}
{"op":"query","content":[1,2,9],"expect":{"a":2,"b":1},"sizes":{"a":3,"b":1}}
{"op":"stored","worker":"c","blocks":[[1,31]]}
{"op":"removed","worker":"a","seqs":[13,77]}
{"op":"query","content":[1,2,3],"expect":{"a":2,"b":1},"sizes":{"a":2,"b":1}}
{"op":"query","content":[1],"expect":{"a":1},"sizes":{"a":2}}
{"op":"query","content":[]}
{"op":"cleared","worker":"b"}
{"op":"remove_worker","worker":"a"}
"#;

    fn opts(path: String, verify: bool) -> Opts {
        Opts {
            ops: path,
            jump: 64,
            budget: Duration::from_millis(5),
            queriers: 2,
            max_passes: 3,
            max_loops: 2,
            verify,
            coalesce: false,
        }
    }

    #[test]
    fn parses_the_op_log() {
        let w: W<Toy> = Workload::read(&log(OPS), false, Toy::block, Toy::seq, Toy::hash).unwrap();
        assert_eq!(w.names, ["a", "b", "c"]);
        assert_eq!(w.events.len(), 7);
        assert_eq!(w.block_ops, 3 + 1 + 1 + 1 + 2);
        assert_eq!(w.queries.len(), 3, "the empty query is not timed");
        assert_eq!(w.checks.len(), 3);
        assert_eq!(w.checks[0].expect, [(0, 2, 3), (1, 1, 1)]);
        assert!(matches!(
            w.events[2],
            Event::Stored {
                parent: Some(99),
                ..
            }
        ));
    }

    #[test]
    fn rejects_malformed_lines() {
        for bad in [
            "{\"op\":\"stored\",\"worker\":\"a\",\"blocks\":[[1]]}\n",
            "{\"op\":\"stored\",\"blocks\":[]}\n",
            "{\"op\":\"bogus\",\"worker\":\"a\"}\n",
            "{\"op\":\"query\",\"content\":[-1]}\n",
            "not json\n",
        ] {
            let r: Result<W<Toy>, String> =
                Workload::read(&log(bad), false, Toy::block, Toy::seq, Toy::hash);
            assert!(r.is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn measures_and_verifies() {
        let path = log(OPS);
        let w: W<Toy> = Workload::read(&path, false, Toy::block, Toy::seq, Toy::hash).unwrap();
        let out = measure::<Toy>(&w, None, &opts(path.clone(), true));
        // The toy scores "b" 1 on the second and third query too, where b's chain is still
        // [1]; the third query's expectation leaves b out, so it fails on b's presence.
        assert_eq!(out["verify"]["passed"], 2, "{out}");
        assert_eq!(out["verify"]["failed"], 1, "{out}");
        assert!(
            out["verify"]["first"]
                .as_str()
                .unwrap()
                .starts_with("line 8:"),
            "{out}"
        );
        // "c" found no room in the toy (two workers), and b's store under 99 was rejected.
        assert_eq!(out["rejected"], 2, "{out}");
        assert_eq!(
            out["memory"]["memberships"], 0,
            "everyone removed or cleared at the end"
        );
        assert!(out["replay"]["passes"].as_u64().unwrap() >= 1);
        assert!(out["rest"]["queries"].as_u64().unwrap() >= 1);
        assert!(
            out["load"]["queries"].as_u64().unwrap() >= 2,
            "each querier issues one at least"
        );
        let quiet = measure::<Toy>(&w, None, &opts(path, false));
        assert_eq!(quiet["verify"]["ran"], false);
        assert_eq!(quiet["verify"]["passed"], 0);
    }

    const RUNS: &str = r#"{"op":"stored","worker":"a","blocks":[[1,11],[2,12]]}
{"op":"stored","worker":"a","parent":12,"blocks":[[3,13]]}
{"op":"stored","worker":"a","parent":13,"blocks":[[4,14]]}
{"op":"stored","worker":"a","parent":14,"blocks":[[5,11]]}
{"op":"stored","worker":"b","blocks":[[1,21]]}
{"op":"removed","worker":"a","seqs":[14]}
{"op":"removed","worker":"a","seqs":[13]}
{"op":"removed","worker":"a","seqs":[99],"medium":"cpu"}
{"op":"query","content":[1,2,3],"expect":{"a":2,"b":1},"sizes":{"a":2,"b":1}}
{"op":"removed","worker":"a","seqs":[12]}
{"op":"removed","worker":"b","seqs":[21]}
{"op":"removed","worker":"b","seqs":[77]}
{"op":"query","content":[1,2,3],"expect":{"a":1},"sizes":{"a":1}}
"#;

    #[test]
    fn coalesces_as_the_go_side_does() {
        let path = log(RUNS);
        let w: W<Toy> = Workload::read(&path, true, Toy::block, Toy::seq, Toy::hash).unwrap();
        let shape: Vec<(u32, Vec<u64>)> = w
            .events
            .iter()
            .map(|e| match e {
                Event::Stored { worker, blocks, .. } => {
                    (*worker, blocks.iter().map(|b| b.1).collect())
                }
                Event::Removed { worker, seqs } => (*worker, seqs.clone()),
                _ => (u32::MAX, Vec::new()),
            })
            .collect();
        // The chain 11..14 in one store; 11 again is a seq of that store: its own event;
        // the removals of 14 and 13 merge, the one with another medium does not, the query
        // cuts before 12, and b's two removals merge.
        assert_eq!(
            shape,
            [
                (0, vec![11, 12, 13, 14]),
                (0, vec![11]),
                (1, vec![21]),
                (0, vec![14, 13]),
                (0, vec![99]),
                (0, vec![12]),
                (1, vec![21, 77]),
            ]
        );
        assert_eq!(w.block_ops, 5 + 1 + 1 + 1 + 1 + 1 + 2);
        let plain: W<Toy> = Workload::read(&path, false, Toy::block, Toy::seq, Toy::hash).unwrap();
        assert_eq!(plain.events.len(), 11);
        assert_eq!(plain.block_ops, w.block_ops);
        let out = measure::<Toy>(&plain, Some(&w), &opts(path, true));
        assert_eq!(
            out["verify_coalesced"]["passed"], out["verify"]["passed"],
            "{out}"
        );
        assert_eq!(out["replay_coalesced"]["events"], 7, "{out}");
        assert!(
            out["replay_coalesced"]["cpu_seconds"].as_f64().unwrap() >= 0.0,
            "{out}"
        );
    }

    #[test]
    fn percentile_is_nearest_rank() {
        let xs: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&xs, 0.50), 50);
        assert_eq!(percentile(&xs, 0.99), 99);
        assert_eq!(percentile(&[7], 0.99), 7);
        assert_eq!(percentile(&[], 0.5), 0);
    }
}
