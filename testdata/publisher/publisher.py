#!/usr/bin/env python3
"""A test-only KV-event publisher that speaks vLLM's ZMQ protocol (shared/EVENTS.md §2).

It plays one engine with --dp-ranks data-parallel ranks. Each rank has its own
ZmqEventPublisher equivalent: a PUB socket sending [topic, seq (8-byte big-endian, from 0),
payload] and an optional ROUTER replay socket answering [id, b"", start_seq] with every
buffered (seq, payload) at or after start_seq, then the end marker, in either of vLLM's
two reply shapes (--replay-topic: with the topic frame, v0.26.0+; without: older vLLM and
SGLang). Payloads are msgpack EventBatch arrays [ts, events, data_parallel_rank] whose
events are encoded positionally (vLLM <= v0.23) or as maps with "type" first and
omit_defaults (vLLM after PR #42892), chosen per event.

PUB endpoint rules follow vLLM: bind when the endpoint contains '*' or '::' or is ipc://
or inproc://, else connect; --bind forces a bind (tests bind 127.0.0.1 explicitly). The
ROUTER always binds. Ranks use offset_endpoint_port: tcp port + rank (port 0 stays 0:
each rank gets an OS-chosen port), ipc/inproc suffix _dp<rank>. With --dp-ranks > 1 and a
base port of 0 on a tcp endpoint, --consecutive-ports picks a random free base so that
rank r really listens on base + r.

Modes:
  control (default): prints one JSON line {"ready": true, "ranks": [...]} and then reads
    JSON commands from stdin, one per line, answering each with one JSON line:
      {"cmd": "publish", "rank": 0, "events": [EVENT...], "send": true}
          -> {"ok": true, "seq": N}. send=false buffers the batch without sending it
             (a message lost on the wire; replay still has it).
          EVENT: {"type": "BlockStored", "block_hashes": [...], "parent_block_hash": int|null,
                  "token_ids": [...], "block_size": B, "lora_name": str|null, "medium": str|null,
                  "encoding": "array"|"map"}  (encoding defaults to --encoding)
                  with "group_idx": G, "kv_cache_spec_kind": K, "kv_cache_spec_sliding_window": W
                  for a hybrid model's group (extra_keys null, slots [8]-[11] in arrays)
                 {"type": "BlockRemoved", "block_hashes": [...], "medium": ..., "group_idx": G}
                 {"type": "AllBlocksCleared"}
      {"cmd": "raw", "rank": 0, "frames_hex": ["..", ".."]}  send arbitrary frames live
      {"cmd": "resend", "rank": 0, "seq": N}   send a buffered batch again, live
      {"cmd": "disconnect", "rank": 0} / {"cmd": "reconnect", "rank": 0}
          close the PUB socket, dropping every subscriber connection, while batches
          published meanwhile are buffered (not sent) / open it again on the same port
      {"cmd": "restart", "rank": 0}   a new publisher on the same ports: seq back to 0,
          empty replay buffer
      {"cmd": "stats"}, {"cmd": "ping"}, {"cmd": "exit"} (EOF exits too)
  trace: streams a Mooncake trace (--trace) as an engine would: each request is routed
    round-robin to a rank, whose LRU cache of --capacity blocks emits BlockStored for the
    blocks it lacks and BlockRemoved for what it evicts, one batch per request. The first
    --burst requests go unpaced (then a {"burst_done": true, "seqs": [...]} line), the
    rest at --rate requests/s, for at most --duration seconds / --max-requests requests.
    Tokens follow package sim's FromTrace: each hash id repeated 512 times, truncated to
    input_length, cut in --block-size blocks. Prints the ready line (and with --wait-go
    waits for one stdin line, answering replays meanwhile), then a final
    {"done": true, ...} line.

Only python3-zmq and python3-msgpack are needed (Debian packages).
"""

import argparse
import collections
import hashlib
import json
import os
import random
import select
import sys
import time

try:
    import msgpack
    import zmq
except ImportError as e:  # say how to get them, not just what is missing
    sys.exit("publisher.py: %s: it needs pyzmq and msgpack: `make publisher-deps` installs "
             "Debian's python3-zmq and python3-msgpack for /usr/bin/python3 (run this script "
             "with it), or `python3 -m pip install pyzmq msgpack` for another python3" % e)

END_SEQ = (-1).to_bytes(8, "big", signed=True)

STORED_FIELDS = ["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                 "medium", "lora_name"]
REMOVED_FIELDS = ["block_hashes", "medium"]
HYBRID_STORED_FIELDS = ["extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"]
REQUIRED = {"BlockStored": set(STORED_FIELDS), "BlockRemoved": {"block_hashes", "medium"},
            "AllBlocksCleared": set()}


def bind_retry(sock, endpoint, retry):
    """Bind, retrying for up to 5 s when retry is set: libzmq releases a closed socket's
    listener asynchronously, so a restart on the same port may find it still taken."""
    deadline = time.monotonic() + (5 if retry else 0)
    while True:
        try:
            sock.bind(endpoint)
            return
        except zmq.ZMQError as e:
            if e.errno != zmq.EADDRINUSE or time.monotonic() > deadline or endpoint.endswith(":0"):
                raise
            time.sleep(0.01)


def should_bind(endpoint):
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def offset_endpoint(endpoint, rank):
    if not endpoint or rank == 0:
        return endpoint
    if endpoint.startswith(("inproc://", "ipc://")):
        return f"{endpoint}_dp{rank}"
    if endpoint.startswith("tcp://"):
        host, port = endpoint.rsplit(":", 1)
        if int(port) == 0:
            return endpoint
        return f"{host}:{int(port) + rank}"
    raise ValueError(endpoint)


def encode_event(ev, default_encoding):
    """Encode one event as msgspec would (EVENTS.md §3.1)."""
    typ = ev["type"]
    enc = ev.get("encoding") or default_encoding
    if enc == "mixed":
        enc = random.choice(["array", "map"])
    if typ == "BlockStored":
        vals = {
            "block_hashes": [hash_value(h) for h in ev.get("block_hashes", [])],
            "parent_block_hash": (None if ev.get("parent_block_hash") is None
                                  else hash_value(ev["parent_block_hash"])),
            "token_ids": ev.get("token_ids", []),
            "block_size": ev.get("block_size"),
            "lora_id": None,
            "medium": ev.get("medium", "GPU"),
            "lora_name": ev.get("lora_name"),
        }
        fields = STORED_FIELDS
        if "group_idx" in ev:  # a hybrid model's group (vLLM PR #40984: slots [8]-[11])
            vals.update({"extra_keys": None, "group_idx": ev["group_idx"],
                         "kv_cache_spec_kind": ev.get("kv_cache_spec_kind"),
                         "kv_cache_spec_sliding_window": ev.get("kv_cache_spec_sliding_window")})
            fields = STORED_FIELDS + HYBRID_STORED_FIELDS
    elif typ == "BlockRemoved":
        vals = {"block_hashes": [hash_value(h) for h in ev.get("block_hashes", [])],
                "medium": ev.get("medium", "GPU")}
        fields = REMOVED_FIELDS
        if "group_idx" in ev:
            vals["group_idx"] = ev["group_idx"]
            fields = REMOVED_FIELDS + ["group_idx"]
    elif typ == "AllBlocksCleared":
        vals, fields = {}, []
    else:
        raise ValueError(f"unknown event type {typ!r}")
    if enc == "array":
        return [typ] + [vals[f] for f in fields]
    out = {"type": typ}
    for f in fields:  # omit_defaults: optional fields equal to None are left out
        if vals[f] is None and f not in REQUIRED[typ]:
            continue
        out[f] = vals[f]
    return out


HASH_FORM = "int"


def hash_value(h):
    if HASH_FORM == "bytes":  # VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0: a 32-byte digest
        return bytes(24) + int(h).to_bytes(8, "big")
    return int(h)


def pack_batch(events, rank, default_encoding):
    batch = [time.time(), [encode_event(e, default_encoding) for e in events], rank]
    return msgpack.packb(batch, use_bin_type=True)


class Rank:
    """One rank's ZmqEventPublisher: PUB + ROUTER replay + replay buffer."""

    def __init__(self, ctx, args, rank, endpoint, replay_endpoint):
        self.ctx, self.args, self.rank = ctx, args, rank
        self.endpoint, self.replay_endpoint = endpoint, replay_endpoint
        self.topic = args.topic.encode("utf-8")
        self.pub = self.router = None
        self.bound_pub = None
        self.reopening = False
        self.open()
        self.reopening = True

    def open(self):
        self.seq = 0
        self.buffer = collections.deque(maxlen=self.args.buffer_steps)
        self.pub = self.ctx.socket(zmq.PUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.set_hwm(self.args.hwm)
        self.bind_pub()
        self.router = None
        if self.replay_endpoint:
            self.router = self.ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            bind_retry(self.router, self.replay_endpoint, self.reopening)
            self.replay_endpoint = self.router.getsockopt(zmq.LAST_ENDPOINT).decode()

    def bind_pub(self):
        if self.args.bind or should_bind(self.endpoint):
            bind_retry(self.pub, self.endpoint, self.reopening)
            self.endpoint = self.pub.getsockopt(zmq.LAST_ENDPOINT).decode()
            self.bound_pub = self.endpoint
        else:
            self.pub.connect(self.endpoint)
            self.bound_pub = None

    def disconnect(self):
        """Close the PUB socket (every subscriber sees its connection drop); the sequence
        counter and the replay buffer are kept, so this is a network cut, not a restart.
        (zmq_unbind would not do: libzmq keeps accepted connections open.)"""
        if self.pub is not None:
            self.pub.close(linger=0)
            self.pub = None

    def reconnect(self):
        if self.pub is None:
            self.pub = self.ctx.socket(zmq.PUB)
            self.pub.setsockopt(zmq.LINGER, 0)
            self.pub.set_hwm(self.args.hwm)
            self.bind_pub()

    def close(self):
        for s in (self.pub, self.router):
            if s is not None:
                s.close(linger=0)
        self.pub = self.router = None

    def restart(self):
        self.close()
        self.open()

    def publish(self, payload, send=True):
        seq = self.seq
        self.seq += 1
        if send and self.pub is not None:
            self.pub.send_multipart((self.topic, seq.to_bytes(8, "big"), payload))
        self.buffer.append((seq, payload))
        return seq

    def resend(self, seq):
        for s, payload in self.buffer:
            if s == seq:
                self.pub.send_multipart((self.topic, s.to_bytes(8, "big"), payload))
                return True
        return False

    def service_replay(self):
        """Answer every pending replay request (vLLM's _service_replay)."""
        if self.router is None:
            return
        while True:
            try:
                frame = self.router.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frame) != 3:
                continue  # "Invalid replay request"
            client_id, _, start_seq_bytes = frame
            start_seq = int.from_bytes(start_seq_bytes, "big")
            for seq, buf in self.buffer:
                if seq >= start_seq:
                    if self.args.replay_topic:
                        self.router.send_multipart((client_id, b"", self.topic, seq.to_bytes(8, "big"), buf))
                    else:
                        self.router.send_multipart((client_id, b"", seq.to_bytes(8, "big"), buf))
            if self.args.replay_topic:
                self.router.send_multipart((client_id, b"", b"", END_SEQ, b""))
            else:
                self.router.send_multipart((client_id, b"", END_SEQ, b""))


def make_ranks(ctx, args):
    n = max(1, args.dp_ranks)
    for attempt in range(64):
        base, rbase = args.endpoint, args.replay_endpoint
        if n > 1 and args.consecutive_ports:
            # rank r must listen on base + r: pick a random free range.
            p = random.randrange(20000, 60000 - 2 * n)
            host = base.rsplit(":", 1)[0]
            base = f"{host}:{p}"
            if rbase:
                rbase = f"{rbase.rsplit(':', 1)[0]}:{p + n}"
        ranks = []
        try:
            for r in range(n):
                ranks.append(Rank(ctx, args, r, offset_endpoint(base, r), offset_endpoint(rbase, r)))
            return ranks
        except zmq.ZMQError:
            for rk in ranks:
                rk.close()
            if not (n > 1 and args.consecutive_ports):
                raise
    raise SystemExit("publisher: no free consecutive ports")


def ready_line(ranks):
    return {"ready": True, "pid": os.getpid(), "ranks": [
        {"rank": r.rank, "endpoint": r.endpoint, "replay_endpoint": r.replay_endpoint or ""} for r in ranks]}


def emit(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def control(args, ctx, ranks):
    poller = zmq.Poller()
    stdin = sys.stdin.fileno()
    poller.register(stdin, zmq.POLLIN)

    def register_routers():
        for r in ranks:
            if r.router is not None:
                poller.register(r.router, zmq.POLLIN)

    register_routers()
    emit(ready_line(ranks))
    buf = b""
    while True:
        events = dict(poller.poll(1000))
        for r in ranks:
            r.service_replay()
        if stdin not in events:
            continue
        chunk = os.read(stdin, 1 << 20)
        if not chunk:
            return
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            if not line.strip():
                continue
            cmd = json.loads(line)
            c = cmd.get("cmd")
            try:
                if c == "exit":
                    emit({"ok": True})
                    return
                if c == "ping":
                    emit({"ok": True})
                elif c == "stats":
                    emit({"ok": True, "seqs": [r.seq for r in ranks]})
                elif c == "publish":
                    rk = ranks[cmd.get("rank", 0)]
                    payload = pack_batch(cmd.get("events", []), rk.rank, args.encoding)
                    seq = rk.publish(payload, cmd.get("send", True))
                    emit({"ok": True, "seq": seq})
                elif c == "raw":
                    rk = ranks[cmd.get("rank", 0)]
                    rk.pub.send_multipart([bytes.fromhex(h) for h in cmd["frames_hex"]])
                    emit({"ok": True})
                elif c == "resend":
                    rk = ranks[cmd.get("rank", 0)]
                    emit({"ok": rk.resend(cmd["seq"])})
                elif c == "disconnect":
                    ranks[cmd.get("rank", 0)].disconnect()
                    emit({"ok": True})
                elif c == "reconnect":
                    ranks[cmd.get("rank", 0)].reconnect()
                    emit({"ok": True})
                elif c == "restart":
                    rk = ranks[cmd.get("rank", 0)]
                    if rk.router is not None:
                        poller.unregister(rk.router)
                    rk.restart()
                    if rk.router is not None:
                        poller.register(rk.router, zmq.POLLIN)
                    emit({"ok": True, "endpoint": rk.endpoint, "replay_endpoint": rk.replay_endpoint or ""})
                else:
                    emit({"ok": False, "error": f"unknown command {c!r}"})
            except Exception as e:  # report, keep serving
                emit({"ok": False, "error": f"{type(e).__name__}: {e}"})
        for r in ranks:
            r.service_replay()


def trace_tokens(rec, block_size):
    toks = []
    for hid in rec["hash_ids"]:
        if len(toks) >= rec["input_length"]:
            break
        toks.extend([hid & 0xFFFFFFFF] * 512)
    toks = toks[:rec["input_length"]]
    n = len(toks) // block_size
    return [toks[i * block_size:(i + 1) * block_size] for i in range(n)]


def block_seq(parent, block):
    h = hashlib.sha256((parent or 0).to_bytes(8, "big") + b"".join(t.to_bytes(4, "little") for t in block))
    return int.from_bytes(h.digest()[-8:], "big")


def trace(args, ctx, ranks):
    caches = [collections.OrderedDict() for _ in ranks]
    poller = zmq.Poller()
    for r in ranks:
        if r.router is not None:
            poller.register(r.router, zmq.POLLIN)
    stdin = sys.stdin.fileno()
    poller.register(stdin, zmq.POLLIN)
    emit(ready_line(ranks))
    while args.wait_go:  # serve replays (subscribers' first catch-up) until the go line
        ev = dict(poller.poll(200))
        for r in ranks:
            r.service_replay()
        if stdin in ev:
            os.read(stdin, 4096)
            break
    start = burst_end = time.monotonic()
    sent = stored = removed = batches = 0
    memo = {}
    nrec = 0
    with open(args.trace) as f:
        for line in f:
            if args.max_requests and nrec >= args.max_requests:
                break
            if args.duration and time.monotonic() - start >= args.duration:
                break
            line = line.strip()
            if not line:
                continue
            rec = json.loads(line)
            nrec += 1
            if nrec <= args.skip:
                continue
            rk_i = sent % len(ranks)
            rk, cache = ranks[rk_i], caches[rk_i]
            blocks = trace_tokens(rec, args.block_size)
            seqs, parent = [], None
            for b in blocks:
                key = (parent, b[0], len(b))
                s = memo.get(key)
                if s is None:
                    s = block_seq(parent, b)
                    if len(memo) < 1 << 20:
                        memo[key] = s
                seqs.append(s)
                parent = s
            first_new = len(seqs)
            for i, s in enumerate(seqs):
                if s in cache:
                    cache.move_to_end(s)
                elif first_new == len(seqs):
                    first_new = i
            events = []
            if first_new < len(seqs):
                new = seqs[first_new:]
                toks = [t for b in blocks[first_new:] for t in b]
                events.append({"type": "BlockStored", "block_hashes": new,
                               "parent_block_hash": seqs[first_new - 1] if first_new > 0 else None,
                               "token_ids": toks, "block_size": args.block_size})
                for s in new:
                    cache[s] = True
                    cache.move_to_end(s)
                stored += len(new)
            evicted = []
            while len(cache) > args.capacity:
                s, _ = cache.popitem(last=False)
                evicted.append(s)
            if evicted:
                events.append({"type": "BlockRemoved", "block_hashes": evicted})
                removed += len(evicted)
            if events:
                rk.publish(pack_batch(events, rk.rank, args.encoding))
                batches += 1
            sent += 1
            if sent == args.burst:
                burst_end = time.monotonic()
                emit({"burst_done": True, "requests": sent, "batches": batches, "seqs": [r.seq for r in ranks]})
            # pace (after the burst), serving replay requests while waiting
            due = 0
            if sent > args.burst and args.rate > 0:
                due = burst_end + (sent - args.burst) / args.rate
            while True:
                wait = due - time.monotonic()
                ev = dict(poller.poll(max(0, int(wait * 1000)) if wait > 0 else 0))
                for r in ranks:
                    r.service_replay()
                if stdin in ev and not os.read(stdin, 4096):
                    args.duration = 1e-9  # stdin closed: stop
                if wait <= 0:
                    break
    emit({"done": True, "requests": sent, "batches": batches, "stored_blocks": stored,
          "removed_blocks": removed, "seconds": time.monotonic() - start,
          "seqs": [r.seq for r in ranks]})
    # keep answering replays until stdin closes (bounded)
    deadline = time.monotonic() + args.linger
    while time.monotonic() < deadline:
        ev = dict(poller.poll(200))
        for r in ranks:
            r.service_replay()
        if stdin in ev and not os.read(stdin, 4096):
            break


def main():
    global HASH_FORM
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--endpoint", default="tcp://127.0.0.1:0")
    ap.add_argument("--replay-endpoint", default="tcp://127.0.0.1:0", help="'' for none")
    ap.add_argument("--bind", action="store_true", help="bind the PUB socket whatever the endpoint")
    ap.add_argument("--topic", default="")
    ap.add_argument("--dp-ranks", type=int, default=1)
    ap.add_argument("--consecutive-ports", action="store_true")
    ap.add_argument("--buffer-steps", type=int, default=10000)
    ap.add_argument("--hwm", type=int, default=100000)
    ap.add_argument("--encoding", choices=["array", "map", "mixed"], default="mixed")
    ap.add_argument("--replay-topic", type=int, default=1, help="1: reply [topic, seq, payload] (v0.26+); 0: [seq, payload]")
    ap.add_argument("--hash-form", choices=["int", "bytes"], default="int")
    ap.add_argument("--mode", choices=["control", "trace"], default="control")
    ap.add_argument("--trace")
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--capacity", type=int, default=50000, help="blocks per rank (trace mode)")
    ap.add_argument("--rate", type=float, default=200.0, help="requests/s (trace mode; 0 = unpaced)")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds at most (trace mode)")
    ap.add_argument("--max-requests", type=int, default=0)
    ap.add_argument("--skip", type=int, default=0, help="trace records to skip")
    ap.add_argument("--burst", type=int, default=0, help="trace mode: stream this many requests unpaced first, then print a burst_done line")
    ap.add_argument("--linger", type=float, default=30.0, help="seconds to keep serving replays after the trace")
    ap.add_argument("--wait-go", action="store_true", help="trace mode: start streaming after one stdin line")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    random.seed(args.seed)
    HASH_FORM = args.hash_form
    ctx = zmq.Context()
    ranks = make_ranks(ctx, args)
    try:
        if args.mode == "trace":
            trace(args, ctx, ranks)
        else:
            control(args, ctx, ranks)
    finally:
        for r in ranks:
            r.close()
        ctx.term()


if __name__ == "__main__":
    main()
