"""The Python side of Cairn's benchmarks: the same work as `cairn-bench run SPEC`, done the way
a Python RL stack does it, timed the same way.

    python scripts/bench/reference.py SPEC.json

SPEC (written by scripts/bench/suite.py) names the benchmark kind, the implementation, the
model directory (Hugging Face format, shared with Cairn), the inputs file, the thread count
and the repetitions. The result is one JSON line on stdout (see `emit`).

Implementations, by kind:
- generate / transformers: `model.generate()` (do_sample, top_k 0, top_p 1, DynamicCache) plus
  the log-prob of each sampled token, as Cairn's `generate` reports them; at temperature 0,
  plain greedy `generate()` (do_sample False), with the generated ids in `check.ids`.
- score / torch: one forward per chunk with `logits_to_keep`, f32 `log_softmax`, `gather`.
- train / torch: forward with grad per micro-batch, a plain PyTorch clipped surrogate
  (token-mean over the whole step, dual clip, log-ratio clamp: Cairn's `RlLoss` with the
  default objective), backward, `clip_grad_norm_`, `torch.optim.AdamW`.
- train / trl: TRL's `GRPOTrainer.compute_loss` (loss_type "dapo": token mean over the step)
  on the same micro-batches, then the same backward, clipping and AdamW.
- matmul / torch: f32 matrix products at given shapes, GFLOP/s (the roofline's peak); with
  `weight_layout` "nk" the second operand is a transposed [n, k] matrix (a Linear's `x @ W.T`).

Layout is Cairn's: every (prompt + response) row is left-padded, positions count from the
first real token, and only the last R + 1 positions reach the LM head.
"""

import json
import os
import statistics
import sys
import time


def rss_kb():
    """(VmRSS, VmHWM) of this process in KiB, from /proc/self/status."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                out[key] = int(value.split()[0])
    return out.get("VmRSS", 0), out.get("VmHWM", 0)


def emit(spec, times, work, setup_rss, check=None, extra=None):
    rss, hwm = rss_kb()
    wall, cpu = times if times else ([], [])
    result = {
        "kind": spec["kind"],
        "impl": spec["impl"],
        "times_s": wall,
        "cpu_s": cpu,
        "median_s": statistics.median(wall) if wall else None,
        "median_cpu_s": statistics.median(cpu) if cpu else None,
        "work": work,
        "rss_setup_kb": setup_rss,
        "rss_end_kb": rss,
        "hwm_kb": hwm,
        "check": check or {},
    }
    if extra:
        result.update(extra)
    print(json.dumps(result), flush=True)


def timed(fn, warmup, reps, sync):
    out = None
    for _ in range(warmup):
        out = fn()
        sync()
    wall, cpu = [], []
    for _ in range(reps):
        t, c = time.perf_counter(), time.process_time()
        out = fn()
        sync()
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - t)
    return (wall, cpu), out


def load_model(spec, torch):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(
        spec["model"], dtype=torch.float32, attn_implementation="sdpa"
    )
    return model.to(spec.get("device", "cpu"))


def left_padded(rows, torch, device):
    """Cairn's `LeftPadded`: ids, positions (0.. over real tokens) and the validity mask."""
    width = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), width, dtype=torch.long)
    pos = torch.zeros(len(rows), width, dtype=torch.long)
    valid = torch.zeros(len(rows), width, dtype=torch.long)
    for i, r in enumerate(rows):
        pad = width - len(r)
        ids[i, pad:] = torch.tensor(r, dtype=torch.long)
        pos[i, pad:] = torch.arange(len(r))
        valid[i, pad:] = 1
    return ids.to(device), pos.to(device), valid.to(device)


def right_aligned(values, width, torch, dtype, device):
    """Per-row lists right-aligned into a `[B, width]` tensor, zeros in front."""
    out = torch.zeros(len(values), width, dtype=dtype)
    for i, v in enumerate(values):
        if v:
            out[i, width - len(v):] = torch.tensor(v, dtype=dtype)
    return out.to(device)


def response_logp(model, seqs, temperature, torch, device):
    """`[B, R]` f32 log-probs of the (right-aligned) response tokens, with the caller's grad
    mode, and the `[B, R]` targets."""
    rows = [s["prompt"] + s["response"] for s in seqs]
    r = max(len(s["response"]) for s in seqs)
    ids, pos, valid = left_padded(rows, torch, device)
    targets = right_aligned([s["response"] for s in seqs], r, torch, torch.long, device)
    out = model(input_ids=ids, attention_mask=valid, position_ids=pos, logits_to_keep=r + 1, use_cache=False)
    logits = out.logits[:, :-1].float()
    if temperature not in (0.0, 1.0):
        logits = logits / temperature
    logp = logits.log_softmax(-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logp, targets


def unpad(logp, seqs):
    r = logp.shape[1]
    flat = logp.detach().cpu().tolist()
    return [row[r - len(s["response"]):] for row, s in zip(flat, seqs)]


def run_generate(spec, inputs, torch, sync, setup_rss_fn):
    device = spec.get("device", "cpu")
    model = load_model(spec, torch).eval()
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    prompts = inputs["prompts"]
    new = inputs["max_new_tokens"]
    width = max(len(p) for p in prompts)
    ids = torch.zeros(len(prompts), width, dtype=torch.long)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    ids, mask = ids.to(device), mask.to(device)
    setup_rss = setup_rss_fn()
    seed = [inputs["seed"]]

    greedy = inputs["temperature"] == 0.0

    def once_greedy():
        # Plain greedy generate(), as a user calls it (no output_scores: Cairn's side also
        # computes each token's log-prob, so this leaves transformers the lighter work).
        with torch.no_grad():
            out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                                 temperature=None, top_p=None, top_k=None, max_new_tokens=new)
            return out[:, width:].cpu().tolist(), None

    def once():
        torch.manual_seed(seed[0])
        seed[0] += 1
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=inputs["temperature"],
                top_p=inputs["top_p"],
                top_k=0,
                max_new_tokens=new,
                output_scores=True,
                return_dict_in_generate=True,
            )
            sampled = out.sequences[:, width:]
            scores = torch.stack(out.scores, 1).float()
            logp = scores.log_softmax(-1).gather(-1, sampled.unsqueeze(-1)).squeeze(-1)
            return sampled.cpu().tolist(), logp.cpu().tolist()

    times, (sampled, _) = timed(once_greedy if greedy else once, spec["warmup"], spec["reps"], sync)
    tokens = sum(len(s) for s in sampled)
    emit(spec, times, {"new_tokens": tokens}, setup_rss, check={"ids": sampled} if greedy else None)


def run_score(spec, inputs, torch, sync, setup_rss_fn):
    device = spec.get("device", "cpu")
    model = load_model(spec, torch).eval()
    seqs = inputs["sequences"]
    bs = inputs["batch_size"]
    temperature = inputs["temperature"]
    setup_rss = setup_rss_fn()

    def once():
        out = []
        with torch.no_grad():
            for i in range(0, len(seqs), bs):
                chunk = seqs[i:i + bs]
                logp, _ = response_logp(model, chunk, temperature, torch, device)
                out.extend(unpad(logp, chunk))
        return out

    times, logps = timed(once, spec["warmup"], spec["reps"], sync)
    tokens = sum(len(s["prompt"]) + len(s["response"]) for s in seqs)
    flat = [x for row in logps for x in row]
    emit(spec, times, {"tokens": tokens, "response_tokens": len(flat)}, setup_rss,
         check={"logp_sum": sum(flat), "logp_first": logps[0][:4]})


def micro_ranges(n, size):
    return [(s, min(s + size, n)) for s in range(0, n, size)]


def run_train(spec, inputs, torch, sync, setup_rss_fn):
    device = spec.get("device", "cpu")
    model = load_model(spec, torch).train()
    seqs = inputs["sequences"]
    o = inputs["objective"]
    opt_cfg = inputs["optimizer"]
    temperature = inputs["temperature"]
    total_tokens = sum(len(s["response"]) for s in seqs)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=opt_cfg["lr"], betas=tuple(opt_cfg["betas"]), eps=opt_cfg["eps"],
        weight_decay=opt_cfg["weight_decay"],
    )
    ranges = micro_ranges(len(seqs), inputs["micro_batch_rows"])
    trl_trainer = make_trl_trainer(spec, inputs, model, torch) if spec["impl"] == "trl" else None
    setup_rss = setup_rss_fn()
    losses = []

    def plain_loss(chunk, rows):
        logp, _ = response_logp(model, chunk, temperature, torch, device)
        r = logp.shape[1]
        mask = right_aligned([[1.0] * len(s["response"]) for s in chunk], r, torch, torch.float32, device)
        adv = right_aligned([inputs["advantages"][i] for i in rows], r, torch, torch.float32, device)
        old = right_aligned([inputs["old_logp"][i] for i in rows], r, torch, torch.float32, device)
        clamp = o["log_ratio_clamp"]
        ratio = torch.exp((logp - old).clamp(-clamp, clamp))
        unclipped = -adv * ratio
        clipped = -adv * ratio.clamp(1 - o["clip_low"], 1 + o["clip_high"])
        pg = torch.maximum(unclipped, clipped)
        if o.get("dual_clip") is not None:
            pg = torch.where(adv < 0, torch.minimum(pg, -adv * o["dual_clip"]), pg)
        return (pg * mask).sum() / total_tokens

    def trl_loss(chunk, rows):
        batch = trl_batch(chunk, rows, inputs, total_tokens, torch, device)
        return trl_trainer.compute_loss(model, batch)

    compute = trl_loss if trl_trainer is not None else plain_loss

    def once():
        step_loss = 0.0
        for start, end in ranges:
            chunk = seqs[start:end]
            loss = compute(chunk, list(range(start, end)))
            loss.backward()
            step_loss += loss.item()
        norm = torch.nn.utils.clip_grad_norm_(params, opt_cfg["max_grad_norm"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        losses.append(step_loss)
        return float(norm)

    times, _ = timed(once, spec["warmup"], spec["reps"], sync)
    tokens = sum(len(s["prompt"]) + len(s["response"]) for s in seqs)
    emit(spec, times, {"tokens": tokens, "response_tokens": total_tokens, "micro_batches": len(ranges)},
         setup_rss, check={"first_loss": losses[0]})


def trl_batch(chunk, rows, inputs, total_tokens, torch, device):
    """TRL's layout: prompts left-padded, completions right-padded, one advantage per row."""
    pw = max(len(s["prompt"]) for s in chunk)
    cw = max(len(s["response"]) for s in chunk)
    b = len(chunk)
    prompt_ids = torch.zeros(b, pw, dtype=torch.long)
    prompt_mask = torch.zeros(b, pw, dtype=torch.long)
    completion_ids = torch.zeros(b, cw, dtype=torch.long)
    completion_mask = torch.zeros(b, cw, dtype=torch.long)
    old = torch.zeros(b, cw)
    adv = torch.zeros(b)
    for i, (s, row) in enumerate(zip(chunk, rows)):
        p, c = s["prompt"], s["response"]
        prompt_ids[i, pw - len(p):] = torch.tensor(p)
        prompt_mask[i, pw - len(p):] = 1
        completion_ids[i, :len(c)] = torch.tensor(c)
        completion_mask[i, :len(c)] = 1
        old[i, :len(c)] = torch.tensor(inputs["old_logp"][row])
        adv[i] = inputs["advantages"][row][0] if c else 0.0
    return {
        "prompt_ids": prompt_ids.to(device),
        "prompt_mask": prompt_mask.to(device),
        "completion_ids": completion_ids.to(device),
        "completion_mask": completion_mask.to(device),
        "old_per_token_logps": old.to(device),
        "advantages": adv.to(device),
        "num_items_in_batch": torch.tensor(float(total_tokens), device=device),
    }


def make_trl_trainer(spec, inputs, model, torch):
    """A GRPOTrainer around `model`, built offline; only its `compute_loss` is used."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from datasets import Dataset
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast
    from trl import GRPOConfig, GRPOTrainer

    vocab = {f"t{i}": i for i in range(model.config.vocab_size)}
    tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t1")),
                                  pad_token="t0", eos_token="t2", unk_token="t1")
    o = inputs["objective"]
    micro = inputs["micro_batch_rows"]
    n_micro = len(micro_ranges(len(inputs["sequences"]), micro))
    args = GRPOConfig(
        output_dir=os.path.join(os.path.dirname(os.path.abspath(spec["inputs"])), "trl-out"),
        use_cpu=spec.get("device", "cpu") == "cpu",
        report_to=[],
        per_device_train_batch_size=8,
        num_generations=8,
        gradient_accumulation_steps=n_micro,
        steps_per_generation=n_micro,
        loss_type="dapo",
        beta=0.0,
        epsilon=o["clip_low"],
        epsilon_high=o["clip_high"],
        temperature=inputs["temperature"] or 1.0,
        max_completion_length=max(len(s["response"]) for s in inputs["sequences"]),
        bf16=False,
        fp16=False,
        logging_steps=10**9,
        save_strategy="no",
        disable_tqdm=True,
        # GRPOConfig turns activation checkpointing on by default; Cairn and the plain
        # reference keep activations, so TRL does too here (its default would recompute).
        gradient_checkpointing=False,
    )
    data = Dataset.from_dict({"prompt": ["t3 t4"] * 16})
    trainer = GRPOTrainer(model=model, reward_funcs=lambda completions, **kw: [0.0] * len(completions),
                          args=args, train_dataset=data, processing_class=tok)
    trainer.model.train()
    # Set by Trainer's training loop; compute_loss reads it to rescale the token normaliser.
    trainer.current_gradient_accumulation_steps = n_micro
    return trainer


def run_matmul(spec, inputs, torch, sync, setup_rss_fn):
    device = spec.get("device", "cpu")
    setup_rss = setup_rss_fn()
    results = []
    # "nk": the second operand is a transposed [n, k] matrix, as in `x @ W.T` of a Linear layer
    # (and of a tied LM head); "kn" (default): a plain [k, n] matrix.
    nk = inputs.get("weight_layout", "kn") == "nk"
    for m, k, n in inputs["shapes"]:
        a = torch.randn(m, k, device=device)
        b = torch.randn(n, k, device=device).t() if nk else torch.randn(k, n, device=device)
        flops = 2.0 * m * k * n
        reps = max(3, min(200, int(2e10 / flops)))
        (times, cpu), _ = timed(lambda: a @ b, 2, reps, sync)
        best = min(times)
        med = statistics.median(times)
        results.append({"shape": [m, k, n], "gflops_best": flops / best / 1e9,
                        "gflops_median": flops / med / 1e9,
                        "gflops_cpu_median": flops / max(statistics.median(cpu), 1e-9) / 1e9})
    emit(spec, [], {}, setup_rss, extra={"matmul": results})


def main():
    with open(sys.argv[1]) as f:
        spec = json.load(f)
    threads = int(spec["threads"])
    os.environ["OMP_NUM_THREADS"] = str(threads)
    import torch

    torch.set_num_threads(threads)
    device = spec.get("device", "cpu")
    sync = (lambda: torch.cuda.synchronize()) if device.startswith("cuda") else (lambda: None)
    inputs = {}
    if spec.get("inputs"):
        with open(spec["inputs"]) as f:
            inputs = json.load(f)

    def setup_rss():
        return rss_kb()[0]

    kinds = {"generate": run_generate, "score": run_score, "train": run_train, "matmul": run_matmul}
    kinds[spec["kind"]](spec, inputs, torch, sync, setup_rss)


if __name__ == "__main__":
    main()
