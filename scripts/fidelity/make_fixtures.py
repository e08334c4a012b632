#!/usr/bin/env python3
"""Builds the transformers-fidelity fixtures of cairn-torch, offline.

For each architecture Cairn loads (Qwen2, Qwen2.5, Qwen3, Llama 3), this script builds a tiny
random-weight model from a config with transformers, saves it as a Hugging Face model directory
(config.json in the form the hub uses, safetensors, tokenizer files, generation_config.json),
loads it back from disk with `AutoModelForCausalLM.from_pretrained`, and records what
transformers computes on fixed token ids:

- `single`:  log-probs of response tokens of unpadded sequences (one forward each), at
             temperature 1 and at 0.7;
- `chat`:    a conversation rendered with the directory's chat template and tokenized with its
             tokenizer, and the log-probs of the assistant reply;
- `batch`:   the same kind of sequences as one left-padded batch (attention mask + position ids
             as `generate` builds them);
- `kv_decode`: left-padded prompts prefilled into a `DynamicCache`, then teacher-forced one token
             per step through the cache;
- `greedy`:  `generate(do_sample=False)` of 32 new tokens for a left-padded batch, with the
             log-prob of each chosen token.

Everything is deterministic (fixed seeds, CPU); no network or model hub is used. The outputs are
committed under kernel/torch/tests/fixtures/fidelity/ and read by kernel/torch/tests/it/fidelity.rs
and hosts/cairn/tests/it/logprobs.rs; see the README there.

    source scripts/env.sh && bash scripts/setup.sh
    python scripts/fidelity/make_fixtures.py            # rewrites the fixtures
    python scripts/fidelity/make_fixtures.py --check    # recomputes and compares, writes nothing
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "kernel" / "torch" / "tests" / "fixtures" / "fidelity"
QWEN3_TOKENIZER = ROOT / "kernel" / "fixtures" / "text" / "qwen3"
LLAMA_TEMPLATE = ROOT / "kernel" / "fixtures" / "text" / "chat-templates" / "meta-llama-Llama-3.1-8B-Instruct.jinja"

# The tiny tokenizers keep the first BASE_VOCAB ids of the Qwen3 byte-level BPE (the 256 byte
# symbols and the first merges) and put the special tokens right after them. The models have
# MODEL_VOCAB rows, more than the tokenizer uses, as real checkpoints do (151936 vs 151669).
BASE_VOCAB = 480
MODEL_VOCAB = 512
GREEDY_NEW_TOKENS = 32

QWEN_SPECIAL_OFFSET = 151643  # id of <|endoftext|> in Qwen2/2.5/3
LLAMA_SPECIAL = [
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|python_tag|>",
]
LLAMA_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


# ---------------------------------------------------------------------------------------------
# Model specs: config.json as the hub writes it (transformers 4 style: rope_theta,
# rope_scaling, torch_dtype), scaled down. Comments name the real checkpoint each one follows.
# ---------------------------------------------------------------------------------------------

def qwen_ids(name: str) -> int:
    return BASE_VOCAB + {"<|endoftext|>": 0, "<|im_start|>": 1, "<|im_end|>": 2}[name]


def llama_id(token: str) -> int:
    return BASE_VOCAB + LLAMA_SPECIAL.index(token)


SPECS = [
    {
        # Qwen2-7B-Instruct: q/k/v biases, untied lm_head, GQA.
        "name": "qwen2",
        "tokenizer": "qwen",
        "config": {
            "architectures": ["Qwen2ForCausalLM"],
            "attention_dropout": 0.0,
            "bos_token_id": qwen_ids("<|endoftext|>"),
            "eos_token_id": qwen_ids("<|im_end|>"),
            "hidden_act": "silu",
            "hidden_size": 32,
            "initializer_range": 0.02,
            "intermediate_size": 64,
            "max_position_embeddings": 32768,
            "max_window_layers": 28,
            "model_type": "qwen2",
            "num_attention_heads": 4,
            "num_hidden_layers": 2,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "sliding_window": 131072,
            "tie_word_embeddings": False,
            "torch_dtype": "float32",
            "transformers_version": "4.41.2",
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": MODEL_VOCAB,
        },
        "generation_config": {
            "bos_token_id": qwen_ids("<|endoftext|>"),
            "pad_token_id": qwen_ids("<|endoftext|>"),
            "do_sample": True,
            "eos_token_id": [qwen_ids("<|im_end|>"), qwen_ids("<|endoftext|>")],
            "repetition_penalty": 1.05,
            "temperature": 0.7,
            "top_p": 0.8,
            "top_k": 20,
            "transformers_version": "4.41.2",
        },
        "shards": None,
    },
    {
        # Qwen2.5-0.5B-Instruct: model_type qwen2, tied embeddings, one key/value head (MQA
        # as the extreme of GQA). Saved in two shards with model.safetensors.index.json.
        "name": "qwen2.5-sharded",
        "tokenizer": "qwen",
        "config": {
            "architectures": ["Qwen2ForCausalLM"],
            "attention_dropout": 0.0,
            "bos_token_id": qwen_ids("<|endoftext|>"),
            "eos_token_id": qwen_ids("<|im_end|>"),
            "hidden_act": "silu",
            "hidden_size": 32,
            "initializer_range": 0.02,
            "intermediate_size": 96,
            "max_position_embeddings": 32768,
            "max_window_layers": 21,
            "model_type": "qwen2",
            "num_attention_heads": 4,
            "num_hidden_layers": 2,
            "num_key_value_heads": 1,
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000.0,
            "sliding_window": 32768,
            "tie_word_embeddings": True,
            "torch_dtype": "float32",
            "transformers_version": "4.43.1",
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": MODEL_VOCAB,
        },
        "generation_config": {
            "bos_token_id": qwen_ids("<|endoftext|>"),
            "pad_token_id": qwen_ids("<|endoftext|>"),
            "do_sample": True,
            "eos_token_id": [qwen_ids("<|im_end|>"), qwen_ids("<|endoftext|>")],
            "repetition_penalty": 1.1,
            "temperature": 0.7,
            "top_p": 0.8,
            "top_k": 20,
            "transformers_version": "4.37.0",
        },
        "shards": "100KB",
    },
    {
        # Qwen3-0.6B: q/k RMSNorm, no biases, tied embeddings, head_dim * heads != hidden.
        "name": "qwen3",
        "tokenizer": "qwen",
        "config": {
            "architectures": ["Qwen3ForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": qwen_ids("<|endoftext|>"),
            "eos_token_id": qwen_ids("<|im_end|>"),
            "head_dim": 16,
            "hidden_act": "silu",
            "hidden_size": 32,
            "initializer_range": 0.02,
            "intermediate_size": 64,
            "max_position_embeddings": 40960,
            "max_window_layers": 28,
            "model_type": "qwen3",
            "num_attention_heads": 4,
            "num_hidden_layers": 2,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-06,
            "rope_scaling": None,
            "rope_theta": 1000000,
            "sliding_window": None,
            "tie_word_embeddings": True,
            "torch_dtype": "float32",
            "transformers_version": "4.51.0",
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": MODEL_VOCAB,
        },
        "generation_config": {
            "bos_token_id": qwen_ids("<|endoftext|>"),
            "do_sample": True,
            "eos_token_id": [qwen_ids("<|im_end|>"), qwen_ids("<|endoftext|>")],
            "pad_token_id": qwen_ids("<|endoftext|>"),
            "temperature": 0.6,
            "top_k": 20,
            "top_p": 0.95,
            "transformers_version": "4.51.0",
        },
        "shards": None,
    },
    {
        # Qwen3-8B in bfloat16: untied. Its config.json is the one transformers 5 writes
        # (rope_parameters, dtype), so both config spellings are covered.
        "name": "qwen3-bf16",
        "tokenizer": "qwen",
        "config": {
            "architectures": ["Qwen3ForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": qwen_ids("<|endoftext|>"),
            "eos_token_id": qwen_ids("<|im_end|>"),
            "head_dim": 8,
            "hidden_act": "silu",
            "hidden_size": 32,
            "initializer_range": 0.02,
            "intermediate_size": 64,
            "max_position_embeddings": 40960,
            "max_window_layers": 36,
            "model_type": "qwen3",
            "num_attention_heads": 4,
            "num_hidden_layers": 2,
            "num_key_value_heads": 2,
            "rms_norm_eps": 1e-06,
            "rope_scaling": None,
            "rope_theta": 1000000,
            "sliding_window": None,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "transformers_version": "4.51.0",
            "use_cache": True,
            "use_sliding_window": False,
            "vocab_size": MODEL_VOCAB,
        },
        "generation_config": {
            "bos_token_id": qwen_ids("<|endoftext|>"),
            "do_sample": True,
            "eos_token_id": [qwen_ids("<|im_end|>"), qwen_ids("<|endoftext|>")],
            "pad_token_id": qwen_ids("<|endoftext|>"),
            "temperature": 0.6,
            "top_k": 20,
            "top_p": 0.95,
            "transformers_version": "4.51.0",
        },
        "shards": None,
        "transformers5_config": True,
    },
    {
        # Llama-3.1-8B-Instruct: llama3 RoPE scaling, rms_norm_eps 1e-5, untied, GQA.
        # head_dim 16 and original_max_position_embeddings 64 put RoPE frequencies in all
        # three bands of the llama3 rule (kept, smoothed, divided by `factor`), and the
        # long single sequence runs past 64 positions.
        "name": "llama3",
        "tokenizer": "llama",
        "config": {
            "architectures": ["LlamaForCausalLM"],
            "attention_bias": False,
            "attention_dropout": 0.0,
            "bos_token_id": llama_id("<|begin_of_text|>"),
            "eos_token_id": [
                llama_id("<|end_of_text|>"),
                llama_id("<|eom_id|>"),
                llama_id("<|eot_id|>"),
            ],
            "head_dim": 16,
            "hidden_act": "silu",
            "hidden_size": 32,
            "initializer_range": 0.02,
            "intermediate_size": 64,
            "max_position_embeddings": 131072,
            "mlp_bias": False,
            "model_type": "llama",
            "num_attention_heads": 4,
            "num_hidden_layers": 2,
            "num_key_value_heads": 2,
            "pretraining_tp": 1,
            "rms_norm_eps": 1e-05,
            "rope_scaling": {
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
                "rope_type": "llama3",
            },
            "rope_theta": 500000.0,
            "tie_word_embeddings": False,
            "torch_dtype": "float32",
            "transformers_version": "4.42.3",
            "use_cache": True,
            "vocab_size": MODEL_VOCAB,
        },
        "generation_config": {
            "bos_token_id": llama_id("<|begin_of_text|>"),
            "do_sample": True,
            "eos_token_id": [
                llama_id("<|end_of_text|>"),
                llama_id("<|eom_id|>"),
                llama_id("<|eot_id|>"),
            ],
            "temperature": 0.6,
            "top_p": 0.9,
            "transformers_version": "4.42.3",
        },
        "shards": None,
    },
]


# ---------------------------------------------------------------------------------------------
# Tokenizers
# ---------------------------------------------------------------------------------------------

def tiny_bpe(qwen: dict) -> dict:
    """The Qwen3 tokenizer.json restricted to ids < BASE_VOCAB, without added tokens."""
    tok = copy.deepcopy(qwen)
    model = tok["model"]
    vocab = {t: i for t, i in model["vocab"].items() if i < BASE_VOCAB}
    assert sorted(vocab.values()) == list(range(BASE_VOCAB))
    merges = []
    for merge in model["merges"]:
        a, b = merge if isinstance(merge, list) else merge.split(" ", 1)
        if a in vocab and b in vocab and a + b in vocab:
            merges.append([a, b])
    model["vocab"] = vocab
    model["merges"] = merges
    tok["added_tokens"] = []
    return tok


def qwen_tokenizer(qwen_json: dict, qwen_config: dict) -> tuple[dict, dict]:
    tok = tiny_bpe(qwen_json)
    for added in qwen_json["added_tokens"]:
        added = dict(added)
        added["id"] = added["id"] - QWEN_SPECIAL_OFFSET + BASE_VOCAB
        tok["added_tokens"].append(added)
    config = copy.deepcopy(qwen_config)
    config["added_tokens_decoder"] = {
        str(int(i) - QWEN_SPECIAL_OFFSET + BASE_VOCAB): v
        for i, v in qwen_config["added_tokens_decoder"].items()
    }
    config["model_max_length"] = 40960
    return tok, config


def llama_tokenizer(qwen_json: dict) -> tuple[dict, dict]:
    tok = tiny_bpe(qwen_json)
    tok["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = LLAMA_PATTERN
    tok["normalizer"] = None
    decoder = {}
    for i, content in enumerate(LLAMA_SPECIAL):
        entry = {
            "id": BASE_VOCAB + i,
            "content": content,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        tok["added_tokens"].append(entry)
        decoder[str(BASE_VOCAB + i)] = {k: v for k, v in entry.items() if k != "id"}
    bos = LLAMA_SPECIAL[0]
    tok["post_processor"] = {
        "type": "Sequence",
        "processors": [
            {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True},
            {
                "type": "TemplateProcessing",
                "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
                "pair": [
                    {"SpecialToken": {"id": bos, "type_id": 0}},
                    {"Sequence": {"id": "A", "type_id": 0}},
                    {"SpecialToken": {"id": bos, "type_id": 1}},
                    {"Sequence": {"id": "B", "type_id": 1}},
                ],
                "special_tokens": {bos: {"id": bos, "ids": [BASE_VOCAB], "tokens": [bos]}},
            },
        ],
    }
    config = {
        "added_tokens_decoder": decoder,
        "bos_token": "<|begin_of_text|>",
        "chat_template": LLAMA_TEMPLATE.read_text(),
        "clean_up_tokenization_spaces": True,
        "eos_token": "<|eot_id|>",
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 131072,
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    return tok, config


def write_tokenizer(dir: Path, kind: str) -> None:
    qwen_json = json.loads((QWEN3_TOKENIZER / "tokenizer.json").read_text())
    qwen_config = json.loads((QWEN3_TOKENIZER / "tokenizer_config.json").read_text())
    tok, config = qwen_tokenizer(qwen_json, qwen_config) if kind == "qwen" else llama_tokenizer(qwen_json)
    (dir / "tokenizer.json").write_text(json.dumps(tok, ensure_ascii=False, indent=1) + "\n")
    (dir / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2) + "\n")


# ---------------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------------

def build_model(spec: dict, seed: int):
    """A transformers model of `spec` with weights drawn from a fixed seed.

    The init is wider than transformers' default (std 0.02 gives near-uniform next-token
    distributions, which would make a log-prob comparison say little): linear and embedding
    weights ~ N(0, 0.25^2); biases ~ N(0, 0.3^2); norm weights ~ 1 + N(0, 0.3^2), so that every
    bias and norm tensor changes the output.
    """
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(**{k: v for k, v in spec["config"].items() if k not in ("architectures", "transformers_version", "torch_dtype")})
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=g)
            if "norm" in name:
                p.copy_(1.0 + 0.3 * noise)
            elif name.endswith("bias"):
                p.copy_(0.3 * noise)
            else:
                p.copy_(0.25 * noise)
    if spec["config"]["torch_dtype"] == "bfloat16":
        model = model.to(torch.bfloat16)
    return model


def save_model_dir(spec: dict, dir: Path, seed: int) -> None:
    model = build_model(spec, seed)
    kwargs = {"max_shard_size": spec["shards"]} if spec["shards"] else {}
    model.save_pretrained(dir, **kwargs)
    if spec["shards"]:
        shards = sorted(p.name for p in dir.glob("model-*.safetensors"))
        assert len(shards) >= 2 and (dir / "model.safetensors.index.json").is_file(), shards
    if not spec.get("transformers5_config"):
        (dir / "config.json").write_text(json.dumps(spec["config"], indent=2, sort_keys=True) + "\n")
    (dir / "generation_config.json").write_text(json.dumps(spec["generation_config"], indent=2) + "\n")
    write_tokenizer(dir, spec["tokenizer"])


# ---------------------------------------------------------------------------------------------
# Reference computations (all from the directory on disk)
# ---------------------------------------------------------------------------------------------

def floats(t: torch.Tensor) -> list[float]:
    return [float(x) for x in t.float().reshape(-1)]


def response_logprobs(model, prompt: list[int], response: list[int], temperature: float) -> list[float]:
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    logits = logits[len(prompt) - 1 : len(prompt) + len(response) - 1] / temperature
    logp = logits.log_softmax(-1)
    return floats(logp.gather(1, torch.tensor(response)[:, None])[:, 0])


def left_pad(rows: list[list[int]], pad_id: int):
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, width - len(r) :] = torch.tensor(r)
        mask[i, width - len(r) :] = 1
    # What `generate` builds from the mask: 0.. over the real tokens.
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, positions


def batch_logprobs(model, seqs: list[dict], pad_id: int) -> list[list[float]]:
    rows = [s["prompt_ids"] + s["response_ids"] for s in seqs]
    ids, mask, positions = left_pad(rows, pad_id)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions).logits.float()
    width = ids.shape[1]
    out = []
    for i, s in enumerate(seqs):
        r = len(s["response_ids"])
        lp = logits[i, width - r - 1 : width - 1].log_softmax(-1)
        out.append(floats(lp.gather(1, torch.tensor(s["response_ids"])[:, None])[:, 0]))
    return out


def kv_decode_logprobs(model, prompts: list[list[int]], continuations: list[list[int]], pad_id: int):
    from transformers import DynamicCache

    ids, mask, positions = left_pad(prompts, pad_id)
    cache = DynamicCache(config=model.config)
    lens = torch.tensor([len(p) for p in prompts])
    out = [[] for _ in prompts]
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, cache=cache, use_cache=True).logits[:, -1].float()
        n = len(continuations[0])
        for s in range(n):
            step = torch.tensor([[c[s]] for c in continuations])
            lp = logits.log_softmax(-1).gather(1, step)[:, 0]
            for i, v in enumerate(floats(lp)):
                out[i].append(v)
            mask = torch.cat([mask, torch.ones((len(prompts), 1), dtype=torch.long)], dim=1)
            logits = model(input_ids=step, attention_mask=mask, position_ids=(lens + s)[:, None], cache=cache, use_cache=True).logits[:, -1].float()
    return out


def greedy(model, prompts: list[list[int]], pad_id: int, new_tokens: int = GREEDY_NEW_TOKENS) -> dict:
    from transformers import GenerationConfig

    ids, mask, _ = left_pad(prompts, pad_id)
    config = GenerationConfig(
        do_sample=False,
        max_new_tokens=new_tokens,
        eos_token_id=None,
        bos_token_id=None,
        pad_token_id=pad_id,
        output_logits=True,
        output_scores=True,
        return_dict_in_generate=True,
    )
    # An unset field of `config` falls back to the model's generation_config.json, whose EOS
    # ids would stop rows early and whose repetition_penalty would change the argmax. Cairn's
    # side is plain greedy with no stop ids, so the reference must be too.
    saved = model.generation_config
    model.generation_config = GenerationConfig()
    try:
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, generation_config=config)
    finally:
        model.generation_config = saved
    width = ids.shape[1]
    new = out.sequences[:, width:]
    assert new.shape[1] == new_tokens, new.shape
    logits = torch.stack(out.logits, dim=1).float()  # [B, N, V], raw
    # No logits processor ran: the scores the argmax saw are the raw logits.
    assert torch.equal(torch.stack(out.scores, dim=1).float(), logits)
    logp = logits.log_softmax(-1).gather(2, new[:, :, None])[:, :, 0]
    top2 = logits.topk(2, dim=-1).values
    margin = float((top2[..., 0] - top2[..., 1]).min())
    return {
        "ids": [[int(x) for x in row] for row in new],
        "logprobs": [floats(row) for row in logp],
        "min_top2_margin": margin,
    }


def chat_case(dir: Path, model, kind: str) -> dict:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(dir)
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Put the apple in the fridge, then tell me where it is."},
    ]
    prompt_text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    prompt_ids = tok(prompt_text, add_special_tokens=False)["input_ids"]
    eot = "<|im_end|>" if kind == "qwen" else "<|eot_id|>"
    reply_ids = tok("The apple is in the fridge." + eot, add_special_tokens=False)["input_ids"]
    return {
        "messages": messages,
        "add_generation_prompt": True,
        "prompt_text": prompt_text,
        "prompt_ids": prompt_ids,
        "response_ids": reply_ids,
        "logprobs": response_logprobs(model, prompt_ids, reply_ids, 1.0),
    }


def references(spec: dict, dir: Path, seed: int) -> dict:
    import transformers
    from transformers import AutoModelForCausalLM

    dtype = torch.bfloat16 if spec["config"]["torch_dtype"] == "bfloat16" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(dir, dtype=dtype).eval()
    eager = AutoModelForCausalLM.from_pretrained(dir, dtype=dtype, attn_implementation="eager").eval()
    g = torch.Generator().manual_seed(seed + 1000)
    ids = lambda n: [int(x) for x in torch.randint(0, BASE_VOCAB, (n,), generator=g)]  # noqa: E731
    pad_id = spec["generation_config"].get("pad_token_id", 0)

    single = []
    for p, r, t in [(1, 6, 1.0), (5, 9, 1.0), (13, 3, 1.0), (40, 80, 1.0), (7, 11, 0.7)]:
        prompt, response = ids(p), ids(r)
        single.append({
            "prompt_ids": prompt,
            "response_ids": response,
            "temperature": t,
            "logprobs": response_logprobs(model, prompt, response, t),
        })

    seqs = [{"prompt_ids": ids(p), "response_ids": ids(r)} for p, r in [(3, 5), (11, 2), (1, 7), (6, 6), (17, 4)]]
    batch = {"sequences": seqs, "logprobs": batch_logprobs(model, seqs, pad_id)}
    # The padded batch must give what each sequence gives alone.
    for s, lp in zip(seqs, batch["logprobs"]):
        alone = response_logprobs(model, s["prompt_ids"], s["response_ids"], 1.0)
        assert max(abs(a - b) for a, b in zip(alone, lp)) < (5e-2 if dtype == torch.bfloat16 else 1e-5)

    prompts = [ids(n) for n in (7, 2, 12)]
    conts = [ids(10) for _ in prompts]
    kv = {"prompts": prompts, "continuations": conts, "logprobs": kv_decode_logprobs(model, prompts, conts, pad_id)}

    # Random weights can leave two next-token candidates nearly tied, and then float noise,
    # not a bug, decides the argmax. Draw prompts until every step's top-2 gap is clear and
    # each prompt alone gives the tokens it gets in the batch. In bf16 logits are coarse
    # (exact ties are common), so there the gap only has to be non-zero: one bf16 step.
    min_margin = 1e-9 if dtype == torch.bfloat16 else 1e-3
    for _attempt in range(50):
        gprompts = [ids(n) for n in (4, 9, 1, 6)]
        gen = greedy(model, gprompts, pad_id)
        consistent = all(greedy(model, [p], pad_id)["ids"][0] == gen["ids"][i] for i, p in enumerate(gprompts))
        if consistent and gen["min_top2_margin"] >= min_margin:
            break
    else:
        sys.exit(f"{spec['name']}: no greedy prompts with a top-2 margin >= {min_margin}")
    gen["prompts"] = gprompts
    gen["max_new_tokens"] = GREEDY_NEW_TOKENS

    chat = chat_case(dir, model, spec["tokenizer"])

    # How far transformers' own attention backends are apart on these inputs (documentation).
    eager_diff = 0.0
    for case in single:
        lp = response_logprobs(eager, case["prompt_ids"], case["response_ids"], case["temperature"])
        eager_diff = max(eager_diff, max(abs(a - b) for a, b in zip(lp, case["logprobs"])))

    return {
        "model": spec["name"],
        "dtype": "bfloat16" if dtype == torch.bfloat16 else "float32",
        "made_by": {
            "script": "scripts/fidelity/make_fixtures.py",
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "attn_implementation": model.config._attn_implementation,
            "sdpa_vs_eager_max_abs_diff": eager_diff,
        },
        "single": single,
        "chat": chat,
        "batch": batch,
        "kv_decode": kv,
        "greedy": gen,
    }


def max_diff(a, b) -> float:
    if isinstance(a, list):
        assert len(a) == len(b)
        return max([max_diff(x, y) for x, y in zip(a, b)] + [0.0])
    return abs(a - b)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="recompute and compare with the committed fixtures")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    from transformers.utils import logging

    logging.disable_progress_bar()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)

    with tempfile.TemporaryDirectory() as tmp:
        stage = Path(tmp)
        for seed, spec in enumerate(SPECS):
            dir = stage / "models" / spec["name"]
            dir.mkdir(parents=True)
            save_model_dir(spec, dir, seed)
            ref = references(spec, dir, seed)
            (stage / "reference").mkdir(exist_ok=True)
            (stage / "reference" / f"{spec['name']}.json").write_text(json.dumps(ref, indent=1) + "\n")
            print(
                f"{spec['name']:16} {ref['dtype']:9} greedy margin {ref['greedy']['min_top2_margin']:.4f} "
                f"sdpa-vs-eager {ref['made_by']['sdpa_vs_eager_max_abs_diff']:.2e}"
            )
        if args.check:
            worst = 0.0
            for spec in SPECS:
                new = json.loads((stage / "reference" / f"{spec['name']}.json").read_text())
                old = json.loads((args.out / "reference" / f"{spec['name']}.json").read_text())
                for key in ("single", "batch", "kv_decode"):
                    worst = max(worst, max_diff(
                        [c["logprobs"] for c in new[key]] if key == "single" else new[key]["logprobs"],
                        [c["logprobs"] for c in old[key]] if key == "single" else old[key]["logprobs"],
                    ))
                assert new["greedy"]["ids"] == old["greedy"]["ids"], spec["name"]
            print(f"check: max abs log-prob difference to the committed fixtures {worst:.2e}")
            return 0
        for sub in ("models", "reference"):
            shutil.rmtree(args.out / sub, ignore_errors=True)
            shutil.copytree(stage / sub, args.out / sub)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
