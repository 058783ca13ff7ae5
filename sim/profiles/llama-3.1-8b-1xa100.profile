# Llama-3.1-8B-Instruct in BF16 on one A100 SXM 80 GB GPU: the engine of SGLang's
# cache-aware router benchmark (lm-sys blog 2024-12-04, sgl-project/sglang PR #2170:
# 8 such workers, data parallel).
name            Llama-3.1-8B BF16, 1 x A100 80GB
# Model shape: meta-llama/Llama-3.1-8B config.json (32 layers, 32 query heads, 8 KV
# heads of 128), 8.03 billion parameters.
params          8.03e9
layers          32
heads           32
kv_heads        8
head_dim        128
bytes_per_param 2
kv_bytes        2
# GPU: NVIDIA A100 SXM 80 GB datasheet, 312 dense BF16 TFLOP/s, 2.039 TB/s.
gpus            1
gpu_tflops      312
gpu_tbps        2.039
# Carried over from qwen3-32b-2xh100-tp2; no all-reduce on one GPU, 0.5 ms of launches
# per step (assumed).
mfu             0.5975
bw_eff          0.78
step_overhead   0.5ms
per_request     20us
# Assumed: SGLang's default memory fraction (0.88) of 80 GB less 16 GB of weights and
# 4 GB of activations, at 128 KiB of KV per token: about 380,000 tokens.
kv_tokens       380000
# Assumed: SGLang's chunked prefill of 8,192 tokens on an 80 GB GPU and 256 running
# requests at most (its own default is sized from memory).
max_num_seqs            256
max_num_batched_tokens  8192
