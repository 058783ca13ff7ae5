#!/usr/bin/env python3
"""Writes vectors.json: golden vectors for vLLM's sha256_cbor block hashes and for
kvindex's content hashes of blocks with extra keys, computed independently of the Go code.

vLLM's definition (read in vllm/v1/core/kv_cache_utils.py and vllm/utils/hashing.py,
restated here, not imported):
    sha256_cbor(x) = sha256(cbor2.dumps(x, canonical=True))
    sha256(x)      = sha256(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL))   (vLLM's default)
    NONE_HASH      = sha256_cbor(os.environ["PYTHONHASHSEED"])
    block hash     = sha256_cbor((parent or NONE_HASH, tuple(token_ids), extra_keys))
    published hash = int.from_bytes(digest, "big") & (2**64 - 1)   (the default), or the digest
kvindex's content hash (hash.Content / hash.ContentExtra):
    Content(t)          = xxh3_64(b"".join(LE32(x) for x in t), seed=1337)
    ContentExtra(t, k)  = xxh3_64(LE64(Content(t)) + cbor2.dumps(list(k), canonical=True), seed=1337)
where k is the block's extra keys less a first element equal to the event's lora_name.
Each chain also carries its BlockStored batch as msgpack (msgspec's positional shape),
with int hashes and with bin hashes, for the decoder.

Needs python3-cbor2, python3-xxhash and python3-msgpack (Debian). Run from the repo root:
    /usr/bin/python3 testdata/vllmhash/gen.py > testdata/vllmhash/vectors.json
"""

import hashlib
import json
import pickle
import struct

import cbor2
import msgpack
import xxhash


def sha256_cbor(x):
    return hashlib.sha256(cbor2.dumps(x, canonical=True)).digest()


def sha256_pickle(x):
    """vLLM's default algorithm, "sha256"."""
    return hashlib.sha256(pickle.dumps(x, protocol=pickle.HIGHEST_PROTOCOL)).digest()


def py(v):
    """JSON value -> the Python value vLLM would hash: lists become tuples,
    {"bytes": hex} becomes bytes."""
    if isinstance(v, dict):
        return bytes.fromhex(v["bytes"])
    if isinstance(v, list):
        return tuple(py(x) for x in v)
    return v


def content(tokens):
    return xxhash.xxh3_64_intdigest(b"".join(struct.pack("<I", t) for t in tokens), seed=1337)


def content_extra(tokens, key):
    if not key:
        return content(tokens)
    b = struct.pack("<Q", content(tokens)) + cbor2.dumps(list(key), canonical=True)
    return xxhash.xxh3_64_intdigest(b, seed=1337)


def event_payload(hashes, tokens, block_size, lora_name, extras):
    ev = ["BlockStored", hashes, None, tokens, block_size, None, "GPU", lora_name, extras, 0,
          "full_attention"]
    return msgpack.packb([1750000000.25, [ev], 0], use_bin_type=True)


def chain(name, seed, block_size, tokens, extras=None, lora_name=None):
    none_hash = sha256_cbor(seed)
    parent = none_hash
    pparent = sha256_pickle(seed)
    pdigests = []
    digests, keys = [], []
    n = len(tokens) // block_size
    for i in range(n):
        x = py(extras[i]) if extras is not None else None
        blk = tuple(tokens[i * block_size:(i + 1) * block_size])
        d = sha256_cbor((parent, blk, x))
        digests.append(d)
        parent = d
        pd = sha256_pickle((pparent, blk, x))
        pdigests.append(pd)
        pparent = pd
        k = list(x) if x is not None else []
        if k and lora_name and k[0] == lora_name:
            k = k[1:]
        keys.append(k)
    low = [int.from_bytes(d, "big") & ((1 << 64) - 1) for d in digests]
    wire_extras = [py(e) if e is not None else None for e in extras] if extras is not None else None
    return {
        "name": name,
        "seed": seed,
        "block_size": block_size,
        "tokens": tokens,
        "lora_name": lora_name,
        "extra_keys": extras,
        "digests": [d.hex() for d in digests],
        "digests_sha256": [d.hex() for d in pdigests],
        "low64": [str(v) for v in low],
        "contents": [str(content_extra(tokens[i * block_size:(i + 1) * block_size], keys[i]))
                     for i in range(n)],
        "payload_int": event_payload(low, tokens, block_size, lora_name, wire_extras).hex(),
        "payload_bin": event_payload(digests, tokens, block_size, lora_name, wire_extras).hex(),
    }


MM_A = "8f3d1b2c" * 8  # stand-ins for vLLM's mm_hash hex digests (64 chars)
MM_B = "0badc0de" * 8
PH = 151655            # an image placeholder token: identical for every image

toks = [151644, 872, 198, 9064, 374, 279, 6722, 315, 9625, 30, 151645, 198]
vision = [151644, 872, 198, PH, PH, PH, PH, PH, PH, PH, 151645, 198]

out = {
    "roots": [{"seed": s, "digest": sha256_cbor(s).hex(), "digest_sha256": sha256_pickle(s).hex()}
              for s in ["0", "42", "kvindex"]],
    "chains": [
        chain("plain", "0", 4, toks),
        chain("plain-seed42", "42", 4, toks),
        chain("lora", "0", 4, toks, extras=[["sql-lora"]] * 3, lora_name="sql-lora"),
        chain("image-a", "0", 4, vision, extras=[[MM_A], [MM_A], None]),
        chain("image-b", "0", 4, vision, extras=[[MM_B], [MM_B], None]),
        chain("image-offset-pairs", "0", 4, vision, extras=[[[MM_A, 3]], [[MM_A, 3]], None]),
        chain("salt", "0", 4, toks, extras=[["tenant-a"], None, None]),
        chain("lora-image-salt", "0", 4, vision,
              extras=[["sql-lora", MM_A, "tenant-a"], ["sql-lora", MM_A], ["sql-lora"]],
              lora_name="sql-lora"),
        chain("prompt-embeds", "0", 4, toks,
              extras=[[{"bytes": "00" * 31 + "01"}], [{"bytes": "ff" * 32}], None]),
        chain("large-tokens", "0", 2, [0, 23, 24, 255, 256, 65535, 65536, 4294967295]),
        chain("int-keys", "0", 2, [1, 2, 3, 4, 5, 6],
              extras=[[-1, -300, 2147483647], [-2147483648, -2147483649, 4294967296], [True, False, []]]),
        chain("long-block", "0", 64, list(range(100000, 100128))),
    ],
}
print(json.dumps(out, indent=1))
