# Llama-3.1-70B-Instruct in BF16 on four H100 SXM 80 GB GPUs, tensor parallel 4, under
# vLLM: the engine of llm-d-kv-cache-manager's benchmarking/37-capacity (4 pods at
# 461,376 KV tokens each). The benchmark names the model and the KV capacity; four
# H100s is what that capacity implies (4 x 80 GB x 0.9 less 141 GB of weights leaves
# 147 GB, 461,376 tokens of 320 KiB).
name            Llama-3.1-70B BF16, 4 x H100 80GB, TP 4
# Model shape: meta-llama/Llama-3.1-70B config.json (80 layers, 64 query heads, 8 KV
# heads of 128), 70.6 billion parameters.
params          70.6e9
layers          80
heads           64
kv_heads        8
head_dim        128
bytes_per_param 2
kv_bytes        2
# GPUs: NVIDIA H100 SXM datasheet.
gpus            4
gpu_tflops      989
gpu_tbps        3.35
# Carried over from qwen3-32b-2xh100-tp2 (the one fitted engine): the same share of
# peak FLOP/s and bandwidth; 2 ms of all-reduces per step at TP 4 (assumed).
mfu             0.5975
bw_eff          0.78
step_overhead   2ms
per_request     20us
# benchmarking/37-capacity/README.md: 461,376 KV tokens per pod.
kv_tokens       461376
# vLLM's scheduler defaults for the OpenAI server on a GPU of 70 GiB or more that is not
# an A100 (vllm/engine/arg_utils.py, get_batch_defaults).
max_num_seqs            1024
max_num_batched_tokens  8192
