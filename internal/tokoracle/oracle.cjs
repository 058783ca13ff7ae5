// The exactness oracle: transformers.js's tokenizers (the @lenml/tokenizers build) run
// on the same tokenizer.json as the Go package. Started by the Go tests as
//   node oracle.cjs NODE_MODULES_PARENT
// it reads one REQUEST.json path per line on stdin and writes one answer line per
// request on stdout, until stdin ends. Each model is loaded once.
// REQUEST: {"models": {"name": "/dir/with/tokenizer.json"}, "jobs": [{"model", "text",
// "special"} or {"model", "messages", "add_generation_prompt", "kwargs"}], "bench":
// {"model", "text", "iters"}}. Answer: {"ids": [[...], ...], "texts": [...],
// "bench_ns": ns per encode or 0}.
"use strict";
const fs = require("fs");
const path = require("path");
const readline = require("readline");
const { createRequire } = require("module");

const [root] = process.argv.slice(2);
const requireHere = createRequire(path.join(root, "package.json"));
const { TokenizerLoader } = requireHere("@lenml/tokenizers");
const { Template } = requireHere("@huggingface/jinja");

const tokenizers = {}; // "name\0dir" -> tokenizer
const templates = {};

function load(name, dir) {
  const key = name + "\0" + dir;
  if (tokenizers[key]) return key;
  const read = (f) => JSON.parse(fs.readFileSync(path.join(dir, f), "utf8"));
  const config = read("tokenizer_config.json");
  tokenizers[key] = TokenizerLoader.fromPreTrained({ tokenizerJSON: read("tokenizer.json"), tokenizerConfig: config });
  const token = (v) => (v && typeof v === "object" ? v.content : v) || undefined;
  if (typeof config.chat_template === "string") {
    templates[key] = { t: new Template(config.chat_template), bos: token(config.bos_token), eos: token(config.eos_token) };
  }
  return key;
}

// answer runs one request. A job with messages is a chat: rendered by the model's
// template with @huggingface/jinja (the Jinja port transformers.js uses) in the context
// vLLM passes, then encoded without adding special tokens, as vLLM does.
function answer(req) {
  const keys = {};
  for (const [name, dir] of Object.entries(req.models)) keys[name] = load(name, dir);
  const texts = [];
  const ids = (req.jobs || []).map((j) => {
    const t = tokenizers[keys[j.model]];
    let text = j.text ?? "";
    if (j.messages) {
      const tm = templates[keys[j.model]];
      const ctx = { messages: j.messages, add_generation_prompt: !!j.add_generation_prompt, tools: null, documents: null };
      if (tm.bos) ctx.bos_token = tm.bos;
      if (tm.eos) ctx.eos_token = tm.eos;
      text = tm.t.render({ ...ctx, ...(j.kwargs || {}) });
    }
    texts.push(text);
    return Array.from(t.encode(text, { add_special_tokens: !j.messages && j.special === true }));
  });

  let benchNs = 0;
  if (req.bench) {
    const t = tokenizers[keys[req.bench.model]];
    for (let i = 0; i < 3; i++) t.encode(req.bench.text, { add_special_tokens: false });
    const start = process.hrtime.bigint();
    for (let i = 0; i < req.bench.iters; i++) t.encode(req.bench.text, { add_special_tokens: false });
    benchNs = Number(process.hrtime.bigint() - start) / req.bench.iters;
  }
  return JSON.stringify({ ids, texts, bench_ns: benchNs });
}

const lines = readline.createInterface({ input: process.stdin, terminal: false });
lines.on("line", (reqPath) => {
  process.stdout.write(answer(JSON.parse(fs.readFileSync(reqPath, "utf8"))) + "\n");
});
lines.on("close", () => process.exit(0));
