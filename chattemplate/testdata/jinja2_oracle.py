# Renders chat-template cases with Python's jinja2 configured as transformers configures it
# (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, generation, tojson,
# raise_exception, strftime_now): the engine vLLM runs. Same input and output as
# hfjinja.cjs; when the input has "probes" instead, each is [name, template, context];
# with "bench", the same bench mode as hfjinja.cjs.
import json, sys, time
from datetime import datetime
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.exceptions import TemplateError

class AssistantTracker(Extension):
    # transformers' {% generation %} block; it renders its body unchanged.
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render", []), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()

def raise_exception(message):
    raise TemplateError(message)

def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

def strftime_now(fmt):
    return datetime.now().strftime(fmt)

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols", AssistantTracker])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now

def render(tpl, ctx):
    try:
        return {"ok": tpl.render(**ctx)}
    except Exception as e:
        return {"err": type(e).__name__ + ": " + str(e)}

def context(inp, name, c):
    """vLLM's template context for a case."""
    ctx = {"messages": c["messages"], "tools": c["tools"], "documents": None,
           "add_generation_prompt": c["add_generation_prompt"]}
    sp = inp["specials"].get(name, {})
    for k in ("bos_token", "eos_token"):
        if sp.get(k):
            ctx[k] = sp[k]
    if c.get("enable_thinking"):
        ctx["enable_thinking"] = c["enable_thinking"] == "true"
    return ctx

inp = json.load(sys.stdin)
out = []
if "probes" in inp:
    for name, src, ctx in inp["probes"]:
        try:
            tpl = env.from_string(src)
        except Exception as e:
            out.append({"err": type(e).__name__ + ": " + str(e)})
            continue
        out.append(render(tpl, ctx))
elif "bench" in inp:
    # Bench mode: render one case `iterations` times, report nanoseconds per render.
    b = inp["bench"]
    tpl = env.from_string(inp["templates"][b["template"]])
    ctx = context(inp, b["template"], b["case"])
    tpl.render(**ctx)
    t0, c0 = time.perf_counter_ns(), time.process_time_ns()
    for _ in range(b["iterations"]):
        tpl.render(**ctx)
    out = {"ns_per_render": (time.perf_counter_ns() - t0) / b["iterations"],
           "cpu_ns_per_render": (time.process_time_ns() - c0) / b["iterations"]}
else:
    compiled = {k: env.from_string(v) for k, v in inp["templates"].items()}
    for item in inp["cases"]:
        out.append(render(compiled[item["template"]], context(inp, item["template"], item["case"])))
json.dump(out, sys.stdout, ensure_ascii=False)
