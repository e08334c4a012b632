"""Decoding at batch 1, same precision: Cairn's bf16 decode step against llama.cpp on a BF16 GGUF
of the same weights, in alternated rounds.

    python scripts/bench/batch1.py [--model DIR] [--steps 32] [--rounds 3] [--threads 2]

- Cairn: `target/release/examples/decode_step MODEL bf16 1 STEPS 1 THREADS` (build it with
  `cargo build --release -p cairn-torch --example decode_step`): a 38-token prompt, then STEPS
  greedy decode steps through `CausalLm::decode_row`, the one-row step written out in Rust
  (the path a bf16 generation pass on the CPU takes while one row is left), their mean time;
  the libtorch steps of the same process, with packed (oneDNN) and plain (`F.linear`)
  projections, are reported too.
- llama.cpp (llama-cpp-python 0.3.36, scripts/bench/requirements.txt): the BF16 GGUF that
  scripts/bench/smollm2_gguf.py writes from the Q4_1 file the model directory was imported from
  (both round the same f32 values to nearest even), a 38-token prompt, then STEPS decode calls
  of one token, each followed by the argmax of its logits; the mean time of those calls.
  `n_threads` = THREADS, K/V cache in f32 (llama.cpp's default would be f16).

Both sides: one row, the LM head over the whole vocabulary and a greedy pick per step, the
prefill excluded. Reports each round and the median per-token time, and the ratio per round
(llama.cpp over Cairn: above 1, Cairn is faster) and its median.
"""

import argparse
import ctypes
import os
import random
import re
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def cairn_step_ms(model, steps, threads):
    """(row, packed, plain) mean decode step of one decode_step run, in ms (packed: NaN where
    libtorch's oneDNN has no bf16 kernels for this CPU and nothing is packed)."""
    binary = os.path.join(ROOT, "target", "release", "examples", "decode_step")
    if not os.path.isfile(binary):
        sys.exit("batch1: build it first: cargo build --release -p cairn-torch --example decode_step")
    out = subprocess.run([binary, model, "bf16", "1", str(steps), "1", str(threads)],
                         capture_output=True, text=True, check=True).stdout
    found = dict(re.findall(r"round 0 +(\w+): prefill [\d.]+ ms, decode step ([\d.]+) ms", out))
    if "row" not in found:
        sys.exit(f"batch1: no one-row step on this machine (decode_step said: {out.strip()})")
    return float(found["row"]), float(found.get("packed", "nan")), float(found["plain"])


class LlamaCpp:
    def __init__(self, gguf, threads, steps):
        import llama_cpp as L

        self.L = L
        quiet = L.llama_log_callback(lambda level, text, user: None)
        L.llama_log_set(quiet, ctypes.c_void_p())
        L.llama_backend_init()
        self.model = L.llama_model_load_from_file(gguf.encode(), L.llama_model_default_params())
        if not self.model:
            sys.exit(f"batch1: llama.cpp could not load {gguf}")
        c = L.llama_context_default_params()
        c.n_ctx = 512
        c.n_batch = 512
        c.n_threads = c.n_threads_batch = threads
        c.type_k = c.type_v = L.GGML_TYPE_F32
        self.ctx = L.llama_init_from_model(self.model, c)
        self.n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(self.model))
        self.batch = L.llama_batch_init(64, 0, 1)
        self.steps = steps
        rng = random.Random(0)
        self.prompt = [rng.randrange(100, 32000) for _ in range(38)]

    def _decode(self, tokens, start):
        b = self.batch
        for i, tok in enumerate(tokens):
            b.token[i], b.pos[i], b.n_seq_id[i] = tok, start + i, 1
            b.seq_id[i][0] = 0
            b.logits[i] = 1 if i == len(tokens) - 1 else 0
        b.n_tokens = len(tokens)
        if self.L.llama_decode(self.ctx, b) != 0:
            raise RuntimeError("llama_decode failed")

    def step_ms(self):
        """Mean time of one decode call of one token plus its argmax, after a 38-token prefill."""
        import numpy as np

        L = self.L
        L.llama_memory_clear(L.llama_get_memory(self.ctx), True)
        self._decode(self.prompt, 0)
        argmax = lambda: int(np.ctypeslib.as_array(L.llama_get_logits_ith(self.ctx, -1),
                                                   shape=(self.n_vocab,)).argmax())
        token = argmax()
        start = time.perf_counter()
        for s in range(self.steps):
            self._decode([token], len(self.prompt) + s)
            token = argmax()
        L.llama_synchronize(self.ctx)
        return (time.perf_counter() - start) / self.steps * 1e3


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=os.path.join(ROOT, ".cache/models/smollm2-135m-instruct"))
    p.add_argument("--src", default=os.path.join(ROOT, ".cache/models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    p.add_argument("--gguf", default=os.path.join(ROOT, "target/bench/smollm2/SmolLM2-135M-Instruct.BF16.gguf"))
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    if not os.path.isfile(os.path.join(args.model, "config.json")):
        sys.exit(f"batch1: {args.model} has no config.json (scripts/smollm2.sh imports it)")
    if not os.path.isfile(args.gguf):
        os.makedirs(os.path.dirname(args.gguf), exist_ok=True)
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts/bench/smollm2_gguf.py"),
                        args.src, args.gguf, "--dtype", "bf16"], check=True)
    llama = LlamaCpp(args.gguf, args.threads, args.steps)
    llama.step_ms()  # warm-up
    rows = []
    for r in range(args.rounds):
        order = ["cairn", "llama"] if r % 2 == 0 else ["llama", "cairn"]
        got = {}
        for side in order:
            got[side] = cairn_step_ms(args.model, args.steps, args.threads) if side == "cairn" else llama.step_ms()
        row, packed, plain = got["cairn"]
        rows.append((row, packed, plain, got["llama"]))
        print(f"round {r}: cairn row {row:.2f} ms (packed {packed:.2f}, plain {plain:.2f}), "
              f"llama.cpp {got['llama']:.2f} ms, llama.cpp / cairn {got['llama'] / row:.2f}x", flush=True)
    med = lambda i: statistics.median(row[i] for row in rows)
    ratio = statistics.median(row[3] / row[0] for row in rows)
    print(f"median: cairn row {med(0):.2f} ms, packed {med(1):.2f} ms, plain {med(2):.2f} ms, "
          f"llama.cpp {med(3):.2f} ms a token; llama.cpp / cairn row {ratio:.2f}x (above 1: Cairn is faster)")


if __name__ == "__main__":
    main()
