// The exactness oracle: transformers.js's tokenizers (the @lenml/tokenizers build) run
// on the same tokenizer.json as the Go package. Invoked by the Go tests as
//   node oracle.cjs NODE_MODULES_PARENT REQUEST.json
// REQUEST: {"models": {"name": "/dir/with/tokenizer.json"}, "jobs": [{"model", "text",
// "special"}], "bench": {"model", "text", "iters"}}. Prints {"ids": [[...], ...],
// "bench_ns": ns per encode or 0}.
"use strict";
const fs = require("fs");
const path = require("path");
const { createRequire } = require("module");

const [root, reqPath] = process.argv.slice(2);
const req = JSON.parse(fs.readFileSync(reqPath, "utf8"));
const { TokenizerLoader } = createRequire(path.join(root, "package.json"))("@lenml/tokenizers");

const tokenizers = {};
for (const [name, dir] of Object.entries(req.models)) {
  const read = (f) => JSON.parse(fs.readFileSync(path.join(dir, f), "utf8"));
  tokenizers[name] = TokenizerLoader.fromPreTrained({
    tokenizerJSON: read("tokenizer.json"),
    tokenizerConfig: read("tokenizer_config.json"),
  });
}

const ids = (req.jobs || []).map((j) =>
  Array.from(tokenizers[j.model].encode(j.text, { add_special_tokens: j.special })),
);

let benchNs = 0;
if (req.bench) {
  const t = tokenizers[req.bench.model];
  for (let i = 0; i < 3; i++) t.encode(req.bench.text, { add_special_tokens: false });
  const start = process.hrtime.bigint();
  for (let i = 0; i < req.bench.iters; i++) t.encode(req.bench.text, { add_special_tokens: false });
  benchNs = Number(process.hrtime.bigint() - start) / req.bench.iters;
}
process.stdout.write(JSON.stringify({ ids, bench_ns: benchNs }));
