"""llama.cpp's side of the SmolLM2 generation benchmark (scripts/bench/smollm2.sh), through
llama-cpp-python's low-level API (the C API of llama.h, as llama.cpp's own `llama-batched`
example uses it).

    python scripts/bench/smollm2_llamacpp.py SPEC.json

SPEC is the suite's generate spec (scripts/bench/suite.py) with one more key, `gguf`: the
F32/F16 GGUF that scripts/bench/smollm2_gguf.py wrote from the same Q4_1 file the Hugging Face
directory was imported from. The inputs file is the one Cairn and transformers read: B prompts
of token ids, `max_new_tokens`, `temperature` (must be 0: greedy).

One call generates for all B prompts at once, the way llama.cpp batches independent
sequences: one `llama_decode` of every prompt token (sequence ids 0..B-1, logits only at each
prompt's last token), then one `llama_decode` per step with B tokens, one per sequence, and
the argmax of each sequence's logits (numpy over the `n_vocab` floats llama.cpp returns) as
its next token. No stop ids: every sequence gets exactly `max_new_tokens` tokens, as on the
other two sides. The KV cache is cleared before every call; it holds f32 K and V (Cairn's and
transformers' cache type; llama.cpp's default would be f16), one slot range per sequence
(`kv_unified` false), flash attention at llama.cpp's default (auto). Threads: `n_threads` and
`n_threads_batch` = the spec's thread count.

Prints one JSON line like `cairn-bench run` and reference.py (`emit`), with the generated ids
in `check.ids` and llama.cpp's own prompt/generation timings (`llama_perf_context`) in
`llamacpp_perf`.
"""

import ctypes
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference  # noqa: E402  (emit, timed, rss_kb: the suite's common result format)


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    with open(spec["inputs"]) as f:
        inputs = json.load(f)
    if inputs["temperature"] != 0.0:
        sys.exit("smollm2_llamacpp: only greedy decoding (temperature 0) is implemented")
    import numpy as np
    import llama_cpp as L

    threads = int(spec["threads"])
    prompts = inputs["prompts"]
    new = int(inputs["max_new_tokens"])
    b = len(prompts)
    longest = max(len(p) for p in prompts)

    quiet = L.llama_log_callback(lambda level, text, user: None)
    L.llama_log_set(quiet, ctypes.c_void_p())
    L.llama_backend_init()
    mparams = L.llama_model_default_params()
    model = L.llama_model_load_from_file(spec["gguf"].encode(), mparams)
    if not model:
        sys.exit(f"smollm2_llamacpp: llama.cpp could not load {spec['gguf']}")
    cparams = L.llama_context_default_params()
    per_seq = -(-(longest + new) // 256) * 256
    cparams.n_ctx = per_seq * b
    cparams.n_seq_max = b
    prefill = sum(len(p) for p in prompts)
    cparams.n_batch = max(prefill, b, 512)
    cparams.n_threads = threads
    cparams.n_threads_batch = threads
    cparams.type_k = L.GGML_TYPE_F32
    cparams.type_v = L.GGML_TYPE_F32
    cparams.kv_unified = False
    cparams.no_perf = False
    ctx = L.llama_init_from_model(model, cparams)
    if not ctx:
        sys.exit("smollm2_llamacpp: llama_init_from_model failed")
    vocab = L.llama_model_get_vocab(model)
    n_vocab = L.llama_vocab_n_tokens(vocab)
    batch = L.llama_batch_init(max(prefill, b), 0, 1)
    setup_rss = reference.rss_kb()[0]

    def put(i, token, pos, seq, logits):
        batch.token[i] = token
        batch.pos[i] = pos
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = seq
        batch.logits[i] = 1 if logits else 0

    def argmax_at(index):
        row = np.ctypeslib.as_array(L.llama_get_logits_ith(ctx, index), shape=(n_vocab,))
        return int(row.argmax())

    def once():
        L.llama_memory_clear(L.llama_get_memory(ctx), True)
        n = 0
        last = []
        for s, p in enumerate(prompts):
            for j, tok in enumerate(p):
                put(n, tok, j, s, j == len(p) - 1)
                n += 1
            last.append(n - 1)
        batch.n_tokens = n
        if L.llama_decode(ctx, batch) != 0:
            raise RuntimeError("llama_decode failed on the prompts")
        out = [[] for _ in prompts]
        for step in range(new):
            for s in range(b):
                out[s].append(argmax_at(last[s]))
            if step == new - 1:
                break
            for s in range(b):
                put(s, out[s][-1], len(prompts[s]) + step, s, True)
            batch.n_tokens = b
            last = list(range(b))
            if L.llama_decode(ctx, batch) != 0:
                raise RuntimeError(f"llama_decode failed at step {step}")
        L.llama_synchronize(ctx)
        return out

    L.llama_perf_context_reset(ctx)
    times, ids = reference.timed(once, spec["warmup"], spec["reps"], lambda: None)
    perf = L.llama_perf_context(ctx)
    calls = spec["warmup"] + spec["reps"]
    llama_perf = {"prompt_ms_per_call": perf.t_p_eval_ms / calls, "eval_ms_per_call": perf.t_eval_ms / calls,
                  "prompt_tokens_per_call": perf.n_p_eval / calls, "eval_calls_per_call": perf.n_eval / calls}
    tokens = sum(len(x) for x in ids)
    reference.emit(spec, times, {"new_tokens": tokens}, setup_rss, check={"ids": ids},
                   extra={"llamacpp_perf": llama_perf,
                          "llamacpp_system": L.llama_print_system_info().decode(errors="replace")})
    L.llama_batch_free(batch)
    L.llama_free(ctx)
    L.llama_model_free(model)


if __name__ == "__main__":
    main()
