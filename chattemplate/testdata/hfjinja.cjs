// Renders chat-template cases with @huggingface/jinja, the oracle of oracle_test.go.
// Usage: node hfjinja.cjs NODE_MODULES_PARENT < cases.json > results.json
// Input: {"templates": {name: source}, "specials": {name: {bos_token, eos_token}},
//         "cases": [{"template": name, "case": {messages, tools, add_generation_prompt, enable_thinking}}]}
// Output: [{"ok": text} | {"err": message}], one per case.
// With {"bench": {template, case, iterations}} instead of cases: {"ns_per_render": n, "cpu_ns_per_render": n}
// (wall and CPU time per render).
"use strict";
const path = require("path");
const { Template } = require(path.join(process.argv[2], "node_modules", "@huggingface", "jinja"));
const input = JSON.parse(require("fs").readFileSync(0, "utf8"));
const compiled = {};
for (const [name, src] of Object.entries(input.templates)) compiled[name] = new Template(src);
// vLLM's template context for a case.
function context(template, c) {
  const ctx = { messages: c.messages, tools: c.tools, documents: null, add_generation_prompt: c.add_generation_prompt };
  const sp = input.specials[template] || {};
  if (sp.bos_token) ctx.bos_token = sp.bos_token;
  if (sp.eos_token) ctx.eos_token = sp.eos_token;
  if (c.enable_thinking) ctx.enable_thinking = c.enable_thinking === "true";
  return ctx;
}
if (input.bench) {
  // Bench mode: render one case `iterations` times, report nanoseconds per render.
  const { template, case: c, iterations } = input.bench;
  const ctx = context(template, c);
  compiled[template].render(ctx);
  const t0 = process.hrtime.bigint();
  const c0 = process.cpuUsage();
  for (let i = 0; i < iterations; i++) compiled[template].render(ctx);
  const ns = Number(process.hrtime.bigint() - t0) / iterations;
  const c1 = process.cpuUsage(c0);
  const cpu = ((c1.user + c1.system) * 1000) / iterations;
  process.stdout.write(JSON.stringify({ ns_per_render: ns, cpu_ns_per_render: cpu }));
  process.exit(0);
}
const out = input.cases.map(({ template, case: c }) => {
  try {
    return { ok: compiled[template].render(context(template, c)) };
  } catch (e) {
    return { err: String(e && e.message) };
  }
});
process.stdout.write(JSON.stringify(out));
