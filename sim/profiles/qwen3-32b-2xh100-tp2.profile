# Qwen3-32B in BF16 on two H100 SXM 80 GB GPUs, tensor parallel 2, under vLLM: the
# engine of llm-d's well-lit-path guides (llm-d/llm-d guides/precise-prefix-cache-routing
# and guides/optimized-baseline, 8 such engines) and of its bottleneck-aware
# scheduling blog (2026-08-17).
name            Qwen3-32B BF16, 2 x H100 80GB, TP 2
# Model shape: Qwen/Qwen3-32B config.json (64 layers, 64 query heads, 8 KV heads of
# 128), 32.8 billion parameters.
params          32.8e9
layers          64
heads           64
kv_heads        8
head_dim        128
bytes_per_param 2
kv_bytes        2
# GPUs: NVIDIA H100 SXM datasheet, 989 dense BF16 TFLOP/s and 3.35 TB/s each.
gpus            2
gpu_tflops      989
gpu_tbps        3.35
# Fitted: an 8,192-token prefill alone takes 8,192 / 15,928 s = 0.514 s, llm-d's
# calibration of this engine (peakPrefillThroughput 15,928 tokens/s; llm-d blog
# 2026-08-17, llm-d/llm-d PR #1651). Everything else on this page is a datasheet
# figure or an assumption.
mfu             0.5975
# Assumed: 78% of the bandwidth on weight and KV reads; 1.45 ms per step of
# all-reduces (two per layer) and launches; 20 µs per request per step (scheduling,
# sampling, detokenising).
bw_eff          0.78
step_overhead   1.45ms
per_request     20us
# llm-d's benchmark reports 307,328 KV tokens per engine (vLLM's startup log).
kv_tokens       307328
# vLLM's scheduler defaults for the OpenAI server on a GPU of 70 GiB or more that is not
# an A100 (vllm/engine/arg_utils.py, get_batch_defaults).
max_num_seqs            1024
max_num_batched_tokens  8192
