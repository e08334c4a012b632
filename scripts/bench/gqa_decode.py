"""One attention decode step of SmolLM2-135M's shape (9 query heads, 3 key/value heads, head
dim 64), 64 rows, with libtorch's SDPA two ways, in one process, alternated:

- `gqa`: query `[B, 9, 1, D]` against the cache `[B, 3, S, D]` with `enable_gqa` (what Cairn's
  no-grad forward does in f32);
- `fold`: the 3 query heads of each key/value head on the query axis, `[B, 3, 3, D]` against
  the same cache (what it does for bf16 decode steps).

Prints milliseconds per call (median of rounds) and gqa / fold; checks both give the same
output to rounding. Needs only torch (the project's .venv has it).

    .venv/bin/python scripts/bench/gqa_decode.py [--threads 2] [--rounds 5]
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--rows", type=int, default=64)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    b, h, kv, d = args.rows, 9, 3, 64
    print(f"torch {torch.__version__}, {args.threads} threads, {b} rows, heads {h}/{kv}, dim {d}")
    print("| dtype | keys S | gqa ms | fold ms | gqa / fold | max abs diff |")
    print("|---|---:|---:|---:|---:|---:|")
    for dtype in (torch.bfloat16, torch.float32):
        for s in (64, 256):
            g = torch.Generator().manual_seed(s)
            q = torch.randn(b, h, 1, d, generator=g).to(dtype)
            k = torch.randn(b, kv, s, d, generator=g).to(dtype)
            v = torch.randn(b, kv, s, d, generator=g).to(dtype)
            mask = torch.zeros(b, 1, 1, s, dtype=dtype)
            mask[:, :, :, :5] = float("-inf")  # left padding
            qf = q.reshape(b, kv, h // kv, d)

            def gqa():
                return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)

            def fold():
                return F.scaled_dot_product_attention(qf, k, v, attn_mask=mask).reshape(b, h, 1, d)

            diff = (gqa().float() - fold().float()).abs().max().item()
            times = {"gqa": [], "fold": []}
            for r in range(args.rounds):
                order = [("gqa", gqa), ("fold", fold)]
                for name, f in order if r % 2 == 0 else order[::-1]:
                    for _ in range(3):
                        f()
                    n = 20
                    t = time.perf_counter()
                    for _ in range(n):
                        f()
                    times[name].append((time.perf_counter() - t) / n * 1e3)
            ratio = statistics.median(a / c for a, c in zip(times["gqa"], times["fold"]))
            print(f"| {str(dtype)[6:]} | {s} | {statistics.median(times['gqa']):.2f} | "
                  f"{statistics.median(times['fold']):.2f} | {ratio:.2f}x | {diff:.1e} |")


if __name__ == "__main__":
    main()
