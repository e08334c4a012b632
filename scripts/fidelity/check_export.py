#!/usr/bin/env python3
"""Loads model directories exported by Cairn with transformers and reports what it computes.

    check_export.py PROBES.json

PROBES.json is a list of probes, one per exported directory:

    [{"dir": "/tmp/.../qwen3",
      "sequences": [{"prompt_ids": [...], "response_ids": [...]}, ...],
      "text": "some text to tokenize",
      "messages": [{"role": "user", "content": "..."}, ...]}, ...]

For each probe it loads the directory the way a user or a server would
(`AutoModelForCausalLM.from_pretrained(dir)` in the config's dtype, `AutoTokenizer`,
`GenerationConfig`), offline, and prints one JSON list on stdout, in probe order:

    [{"dir": ..., "architecture": "Qwen3ForCausalLM", "dtype": "float32",
      "logprobs": [[...], ...],        # log_softmax(logits) at each response token, unpadded
      "text_ids": [...],               # tokenizer(text, add_special_tokens=False)
      "chat_text": "...",              # apply_chat_template(messages, add_generation_prompt=True)
      "eos_token_id": [...]}]          # generation_config.json's stop ids, as a list

The comparison with Cairn happens in the caller (kernel/torch/tests/it/export.rs). Exit
status 3 means transformers is not importable: run scripts/setup.sh.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

try:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
except ImportError as e:  # the venv predates transformers in scripts/requirements.txt
    print(f"check_export.py: {e}; run scripts/setup.sh to install scripts/requirements.txt into .venv", file=sys.stderr)
    sys.exit(3)


def probe(p: dict) -> dict:
    dir = p["dir"]
    with open(os.path.join(dir, "config.json")) as f:
        config = json.load(f)
    dtype_name = config.get("torch_dtype") or config.get("dtype") or "float32"
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype_name]
    model = AutoModelForCausalLM.from_pretrained(dir, dtype=dtype, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(dir, local_files_only=True)
    generation = GenerationConfig.from_pretrained(dir, local_files_only=True)

    logprobs = []
    for s in p["sequences"]:
        prompt, response = s["prompt_ids"], s["response_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([prompt + response])).logits[0].float()
        lp = logits[len(prompt) - 1 : len(prompt) + len(response) - 1].log_softmax(-1)
        logprobs.append([float(x) for x in lp.gather(1, torch.tensor(response)[:, None])[:, 0]])

    eos = generation.eos_token_id
    eos = [] if eos is None else (list(eos) if isinstance(eos, (list, tuple)) else [eos])
    return {
        "dir": dir,
        "architecture": type(model).__name__,
        "dtype": str(next(model.parameters()).dtype).removeprefix("torch."),
        "logprobs": logprobs,
        "text_ids": tokenizer(p["text"], add_special_tokens=False)["input_ids"],
        "chat_text": tokenizer.apply_chat_template(p["messages"], tokenize=False, add_generation_prompt=True),
        "eos_token_id": eos,
    }


def main() -> int:
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        probes = json.load(f)
    torch.set_num_threads(1)
    print(json.dumps([probe(p) for p in probes]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
