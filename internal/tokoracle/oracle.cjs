// The exactness oracle: transformers.js's tokenizers (the @lenml/tokenizers build) run
// on the same tokenizer.json as the Go package. Invoked by the Go tests as
//   node oracle.cjs NODE_MODULES_PARENT REQUEST.json
// REQUEST: {"models": {"name": "/dir/with/tokenizer.json"}, "jobs": [{"model", "text",
// "special"} or {"model", "messages", "add_generation_prompt", "kwargs"}], "bench":
// {"model", "text", "iters"}}. Prints {"ids": [[...], ...], "texts": [...], "bench_ns":
// ns per encode or 0}.
"use strict";
const fs = require("fs");
const path = require("path");
const { createRequire } = require("module");

const [root, reqPath] = process.argv.slice(2);
const req = JSON.parse(fs.readFileSync(reqPath, "utf8"));
const requireHere = createRequire(path.join(root, "package.json"));
const { TokenizerLoader } = requireHere("@lenml/tokenizers");
const { Template } = requireHere("@huggingface/jinja");

const tokenizers = {};
const templates = {};
for (const [name, dir] of Object.entries(req.models)) {
  const read = (f) => JSON.parse(fs.readFileSync(path.join(dir, f), "utf8"));
  const config = read("tokenizer_config.json");
  tokenizers[name] = TokenizerLoader.fromPreTrained({ tokenizerJSON: read("tokenizer.json"), tokenizerConfig: config });
  const token = (v) => (v && typeof v === "object" ? v.content : v) || undefined;
  if (typeof config.chat_template === "string") {
    templates[name] = { t: new Template(config.chat_template), bos: token(config.bos_token), eos: token(config.eos_token) };
  }
}

// A job with messages is a chat: rendered by the model's template with
// @huggingface/jinja (the Jinja port transformers.js uses) in the context vLLM passes,
// then encoded without adding special tokens, as vLLM does.
const texts = [];
const ids = (req.jobs || []).map((j) => {
  const t = tokenizers[j.model];
  let text = j.text ?? "";
  if (j.messages) {
    const tm = templates[j.model];
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
  const t = tokenizers[req.bench.model];
  for (let i = 0; i < 3; i++) t.encode(req.bench.text, { add_special_tokens: false });
  const start = process.hrtime.bigint();
  for (let i = 0; i < req.bench.iters; i++) t.encode(req.bench.text, { add_special_tokens: false });
  benchNs = Number(process.hrtime.bigint() - start) / req.bench.iters;
}
process.stdout.write(JSON.stringify({ ids, texts, bench_ns: benchNs }));
