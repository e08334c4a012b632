#!/usr/bin/env python3
"""Records llama.cpp's token ids for the tokenization strings, as a committed golden file.

llama.cpp (llama-cpp-python from PyPI, version pinned in requirements-gguf.txt) loads only
the vocabulary of the SmolLM2-135M-Instruct GGUF (`vocab_only=True`: no weights, no compute)
and tokenizes each string of `make_smollm2_fixtures.TOKENIZATION_STRINGS` with
`tokenize(text.encode(), add_bos=False, special=True)`: no BOS, and control tokens written in
the text (`<|im_start|>`) parsed as their ids, as Cairn's tokenizer and transformers do. The
pre-tokenizer is llama.cpp's own `smollm` one, chosen from the GGUF's `tokenizer.ggml.pre`.

Writes kernel/torch/tests/fixtures/smollm2/llamacpp_tokens.json, read by
kernel/torch/tests/it/smollm2.rs. Deterministic; no network.

    source scripts/env.sh && pip install -r scripts/fidelity/requirements-gguf.txt
    python scripts/fidelity/make_llamacpp_golden.py          # rewrites the golden file
    python scripts/fidelity/make_llamacpp_golden.py --check  # compares, writes nothing
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_smollm2_fixtures import GGUF, GGUF_SHA256, OUT, TOKENIZATION_STRINGS, dumps, sha256  # noqa: E402


def golden() -> dict:
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(GGUF), vocab_only=True, verbose=False)
    cases = [
        {"text": s, "ids": [int(i) for i in llm.tokenize(s.encode("utf-8"), add_bos=False, special=True)]}
        for s in TOKENIZATION_STRINGS
    ]
    return {
        "made_by": {
            "script": "scripts/fidelity/make_llamacpp_golden.py",
            "llama_cpp_python": llama_cpp.__version__,
            "gguf": GGUF.name,
            "gguf_sha256": GGUF_SHA256,
            "call": "Llama(model_path, vocab_only=True).tokenize(text.encode(), add_bos=False, special=True)",
        },
        "cases": cases,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="recompute and compare with the committed file")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if not GGUF.is_file():
        sys.exit(f"{GGUF}: missing; run scripts/setup.sh")
    if sha256(GGUF) != GGUF_SHA256:
        sys.exit(f"{GGUF}: sha256 is not {GGUF_SHA256}; run scripts/setup.sh")
    new = golden()
    path = args.out / "llamacpp_tokens.json"
    if args.check:
        old = json.loads(path.read_text())
        if old["cases"] != new["cases"]:
            bad = [n["text"] for n, o in zip(new["cases"], old["cases"]) if n != o]
            sys.exit(f"{path}: llama.cpp now tokenizes differently: {bad}")
        print(f"check: {len(new['cases'])} strings tokenize as committed")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps(new))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
