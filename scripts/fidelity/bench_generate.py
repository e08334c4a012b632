#!/usr/bin/env python3
"""transformers' side of scripts/fidelity/bench_generate.sh.

    bench_generate.py make DIR --batch B --prompt-len P [--hidden H --layers L --vocab V]
        writes a random-weight Qwen3 model (HF format) to DIR/model and B prompts of P ids
        to DIR/prompts.json (seeded, offline).
    bench_generate.py run MODEL_DIR PROMPTS.json NEW_TOKENS THREADS REPS [CAIRN_IDS.json] [--device cuda]
        times transformers' batched greedy `generate()` (KV cache, EOS disabled so every row
        gets NEW_TOKENS tokens) after one warm-up call, and prints one JSON line like the Cairn
        example's. With CAIRN_IDS.json it also reports whether both engines generated the same
        tokens (they should: same greedy decoding of the same model).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

import torch  # noqa: E402


def make(args) -> None:
    from transformers import Qwen3Config, Qwen3ForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()

    heads = max(args.hidden // 32, 1)
    config = Qwen3Config(
        vocab_size=args.vocab,
        hidden_size=args.hidden,
        intermediate_size=3 * args.hidden,
        num_hidden_layers=args.layers,
        num_attention_heads=heads,
        num_key_value_heads=max(heads // 2, 1),
        head_dim=args.hidden // heads,
        tie_word_embeddings=True,
        max_position_embeddings=4096,
        initializer_range=0.3,
    )
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(config).eval()
    model.save_pretrained(os.path.join(args.dir, "model"))
    g = torch.Generator().manual_seed(1)
    prompts = torch.randint(0, args.vocab, (args.batch, args.prompt_len), generator=g).tolist()
    with open(os.path.join(args.dir, "prompts.json"), "w") as f:
        json.dump(prompts, f)


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def run(args) -> None:
    from transformers import AutoModelForCausalLM, GenerationConfig

    from transformers.utils import logging

    logging.disable_progress_bar()
    torch.set_num_threads(args.threads)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32).eval().to(args.device)
    model.generation_config = GenerationConfig()
    with open(args.prompts) as f:
        prompts = json.load(f)
    # Equal-length prompts: no padding needed; the attention mask is all ones.
    ids = torch.tensor(prompts, device=args.device)
    mask = torch.ones_like(ids)
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=args.new_tokens,
        eos_token_id=None,
        pad_token_id=0,
        use_cache=True,
    )
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)  # warm-up
        sync()
        start = time.perf_counter()
        for _ in range(args.reps):
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
        sync()
        seconds = (time.perf_counter() - start) / args.reps
    new = out[:, ids.shape[1] :]
    assert new.shape[1] == args.new_tokens, new.shape
    result = {
        "engine": "transformers",
        "batch": len(prompts),
        "new_tokens": args.new_tokens,
        "threads": torch.get_num_threads(),
        "device": args.device,
        "seconds_per_call": seconds,
        "tokens_per_s": new.numel() / seconds,
    }
    if args.cairn_ids:
        with open(args.cairn_ids) as f:
            result["same_tokens_as_cairn"] = json.load(f) == new.cpu().tolist()
    print(json.dumps(result))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    m.add_argument("--batch", type=int, default=32)
    m.add_argument("--prompt-len", type=int, default=64)
    m.add_argument("--hidden", type=int, default=128)
    m.add_argument("--layers", type=int, default=4)
    m.add_argument("--vocab", type=int, default=512)
    r = sub.add_parser("run")
    r.add_argument("model_dir")
    r.add_argument("prompts")
    r.add_argument("new_tokens", type=int)
    r.add_argument("threads", type=int)
    r.add_argument("reps", type=int)
    r.add_argument("cairn_ids", nargs="?")
    r.add_argument("--device", default="cpu")
    args = parser.parse_args()
    make(args) if args.command == "make" else run(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
