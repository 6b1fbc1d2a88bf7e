"""Tiny Qwen2 policy for the toy task: creation, SFT warm-up and evaluation."""

from __future__ import annotations

import math
import time

import torch

from .designs import MODEL_KW

# SFT warm-up. A first prototype's recipe was AdamW lr 3e-3, batch 32, 160 steps; with
# this ChatML prompt that recipe plateaus at chance (acc@T1 0.12, entropy 2.2 after 160 steps;
# lr >= 5e-3 often never leaves the plateau). lr 2e-3 leaves it reliably, so we train at lr 2e-3
# until the exact T=1 accuracy on the training pairs reaches SFT_TARGET_ACC (checked every
# SFT_EVAL_EVERY steps), at most SFT_MAX_STEPS. Stopping there keeps first-token entropy high
# (~1.5-1.8 nats), well above the ~0.3 below which GRPO freezes.
SFT_LR = 2e-3
SFT_BATCH = 32
SFT_MAX_STEPS = 400
SFT_TARGET_ACC = 0.40
SFT_EVAL_EVERY = 10


def create_model(tokenizer, seed: int, model_kw: dict | None = None):
    """A fresh Qwen2 of ``MODEL_KW`` (``designs.py``; or ``model_kw``: another size, a cell's), seeded."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **(MODEL_KW if model_kw is None else model_kw),
    )
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg).float()
    return model


def generation_config(tokenizer):
    from transformers import GenerationConfig

    return GenerationConfig(
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        do_sample=True,
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        max_new_tokens=3,
    )


def _prompt_ids(tokenizer, prompt: str) -> list[int]:
    text = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    return tokenizer.encode(text, add_special_tokens=False)


def _answer_ids(tokenizer, answer: str) -> list[int]:
    return tokenizer.encode(answer, add_special_tokens=False) + [tokenizer.eos_token_id]


def _batchify(seqs: list[list[int]], pad_id: int, label_starts: list[int] | None = None):
    """Left-pad; returns input_ids, attention_mask, position_ids (and labels if label_starts)."""
    L = max(len(s) for s in seqs)
    n = len(seqs)
    ids = torch.full((n, L), pad_id, dtype=torch.long)
    att = torch.zeros((n, L), dtype=torch.long)
    labels = torch.full((n, L), -100, dtype=torch.long)
    for i, s in enumerate(seqs):
        off = L - len(s)
        ids[i, off:] = torch.tensor(s)
        att[i, off:] = 1
        if label_starts is not None:
            labels[i, off + label_starts[i] :] = torch.tensor(s[label_starts[i] :])
    pos = (att.cumsum(-1) - 1).clamp(min=0)
    return ids, att, pos, labels


def sft_warmup(model, tokenizer, examples: list[tuple[str, str]], seed: int, max_steps: int = SFT_MAX_STEPS,
               lr: float = SFT_LR, batch_size: int = SFT_BATCH, target_acc: float | None = SFT_TARGET_ACC,
               eval_every: int = SFT_EVAL_EVERY) -> dict:
    """Plain supervised next-token training on (prompt, answer) pairs; loss on answer + EOS only.

    Stops early once ``evaluate(...)["acc_t1"]`` on ``examples`` reaches ``target_acc``.
    Runs single-threaded (and seeded) so the result does not depend on the core count.
    """
    g = torch.Generator().manual_seed(seed)
    seqs, starts = [], []
    for p, a in examples:
        pi = _prompt_ids(tokenizer, p)
        seqs.append(pi + _answer_ids(tokenizer, a))
        starts.append(len(pi))
    ids, att, pos, labels = _batchify(seqs, tokenizer.pad_token_id, starts)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    t0 = time.time()
    losses = []
    acc = None
    step = 0
    n_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model.train()
        for step in range(1, max_steps + 1):
            idx = torch.randint(0, len(seqs), (batch_size,), generator=g)
            out = model(input_ids=ids[idx], attention_mask=att[idx], position_ids=pos[idx], labels=labels[idx])
            opt.zero_grad(set_to_none=True)
            out.loss.backward()
            opt.step()
            losses.append(float(out.loss.detach()))
            if target_acc is not None and step % eval_every == 0:
                acc = evaluate(model, tokenizer, examples)["acc_t1"]
                model.train()
                if acc >= target_acc:
                    break
    finally:
        model.eval()
        torch.set_num_threads(n_threads)
    return {"sft_steps": step, "sft_max_steps": max_steps, "sft_lr": lr, "sft_batch": batch_size,
            "sft_target_acc": target_acc, "sft_seconds": round(time.time() - t0, 2),
            "sft_loss_first": round(losses[0], 4) if losses else None,
            "sft_loss_last": round(sum(losses[-10:]) / max(1, len(losses[-10:])), 4) if losses else None}


@torch.no_grad()
def evaluate(model, tokenizer, examples: list[tuple[str, str]]) -> dict:
    """Exact T=1 statistics (no sampling noise).

    acc_t1: probability that a temperature-1 sample equals answer + EOS
            (product of the teacher-forced token probabilities), averaged over examples.
    acc_greedy: greedy (argmax at every answer position, teacher-forced) exact match.
    entropy_first: mean entropy (nats) of the first response token distribution.
    p_first_is_digit: probability that the first response token is a digit.
    """
    if not examples:
        return {"n": 0}
    model.eval()
    seqs, starts = [], []
    for p, a in examples:
        pi = _prompt_ids(tokenizer, p)
        seqs.append(pi + _answer_ids(tokenizer, a))
        starts.append(len(pi))
    ids, att, pos, _ = _batchify(seqs, tokenizer.pad_token_id)
    logits = model(input_ids=ids, attention_mask=att, position_ids=pos).logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    L = ids.shape[1]
    digit_ids = torch.tensor([tokenizer.convert_tokens_to_ids(str(d)) for d in range(10)])
    acc_t1, acc_greedy, ent, fmt = [], [], [], []
    for i, s in enumerate(seqs):
        off = L - len(s)
        first = off + starts[i] - 1  # position predicting the first answer token
        n_ans = len(s) - starts[i]
        lp = 0.0
        greedy_ok = True
        for k in range(n_ans):
            row = logp[i, first + k]
            tgt = ids[i, first + k + 1]
            lp += float(row[tgt])
            greedy_ok &= int(row.argmax()) == int(tgt)
        acc_t1.append(math.exp(lp))
        acc_greedy.append(float(greedy_ok))
        p0 = logp[i, first].exp()
        ent.append(float(-(p0 * logp[i, first]).sum()))
        fmt.append(float(p0[digit_ids].sum()))
    n = len(examples)
    return {
        "n": n,
        "acc_t1": round(sum(acc_t1) / n, 4),
        "acc_greedy": round(sum(acc_greedy) / n, 4),
        "entropy_first": round(sum(ent) / n, 4),
        "p_first_is_digit": round(sum(fmt) / n, 4),
    }


# ---------------------------------------------------------------- the reasoning task (reason.py)


def sft_warmup_steps(model, tokenizer, examples: list[tuple[str, str, str]], seed: int, steps: int, lr: float,
                     batch_size: int, warmup_frac: float = 0.05) -> dict:
    """Supervised next-token training for a fixed number of steps on (prompt, context, target) triples.

    The response is context + target + EOS; the loss is on target + EOS only (context: a wrong attempt the model
    reads but is not taught). AdamW with a linear warm-up and cosine decay; single-threaded and seeded, so one machine
    builds the same weights every time whatever its core count. Batches go to the model's device.
    """
    g = torch.Generator().manual_seed(seed)
    dev = next(model.parameters()).device
    seqs, starts = [], []
    for p, ctx, tgt in examples:
        pi = _prompt_ids(tokenizer, p) + tokenizer.encode(ctx, add_special_tokens=False)
        seqs.append(pi + _answer_ids(tokenizer, tgt))
        starts.append(len(pi))
    ids, att, pos, labels = _batchify(seqs, tokenizer.pad_token_id, starts)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    n_warm = max(1, int(steps * warmup_frac))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: (s + 1) / n_warm if s < n_warm else 0.5 * (1 + math.cos(math.pi * (s - n_warm) / max(1, steps - n_warm))))
    t0 = time.time()
    losses = []
    n_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model.train()
        for _ in range(steps):
            idx = torch.randint(0, len(seqs), (batch_size,), generator=g)
            att_b = att[idx]
            keep = int(att_b.sum(0).nonzero().min())  # drop all-padding columns (left padding)
            out = model(input_ids=ids[idx, keep:].to(dev), attention_mask=att_b[:, keep:].to(dev),
                        position_ids=pos[idx, keep:].to(dev), labels=labels[idx, keep:].to(dev))
            opt.zero_grad(set_to_none=True)
            out.loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            losses.append(float(out.loss.detach()))
    finally:
        model.eval()
        torch.set_num_threads(n_threads)
    return {"sft_steps": steps, "sft_lr": lr, "sft_batch": batch_size, "sft_examples": len(seqs),
            "sft_seconds": round(time.time() - t0, 2),
            "sft_loss_first": round(losses[0], 4) if losses else None,
            "sft_loss_last": round(sum(losses[-20:]) / max(1, len(losses[-20:])), 4) if losses else None}


@torch.no_grad()
def sample_responses(model, tokenizer, prompts: list[str], max_new_tokens: int, temperature: float, seed: int,
                     prefixes: list[str] | None = None) -> list[dict]:
    """Generate one response per prompt (optionally after a given response prefix); T <= 0 is greedy.

    Returns per prompt: ``text`` (decoded, without EOS), ``n_tokens`` (generated, EOS included) and ``entropy``
    (mean over the generated tokens of the entropy of the T = 1 next-token distribution, nats). Runs on the model's
    device (its own seeded generator there).
    """
    dev = next(model.parameters()).device
    g = torch.Generator(device=dev).manual_seed(seed)
    eos = tokenizer.eos_token_id
    seqs = []
    for i, p in enumerate(prompts):
        ids = _prompt_ids(tokenizer, p)
        if prefixes is not None:
            ids = ids + tokenizer.encode(prefixes[i], add_special_tokens=False)
        seqs.append(ids)
    n = len(seqs)
    ids, att, pos, _ = (t.to(dev) for t in _batchify(seqs, tokenizer.pad_token_id))
    out = model(input_ids=ids, attention_mask=att, position_ids=pos, use_cache=True)
    past, logits = out.past_key_values, out.logits[:, -1, :].float()
    next_pos = pos[:, -1:] + 1
    out_tok = torch.full((n, max_new_tokens), tokenizer.pad_token_id, dtype=torch.long, device=dev)
    out_len = torch.zeros(n, dtype=torch.long, device=dev)
    ent_sum = torch.zeros(n, device=dev)
    done = torch.zeros(n, dtype=torch.bool, device=dev)
    for step in range(max_new_tokens):
        logp = torch.log_softmax(logits, -1)
        ent = -(logp.exp() * logp).sum(-1)
        if temperature > 0:
            nxt = torch.multinomial(torch.softmax(logits / temperature, -1), 1, generator=g).squeeze(-1)
        else:
            nxt = logits.argmax(-1)
        active = ~done
        out_tok[active, step] = nxt[active]
        out_len += active.long()
        ent_sum += torch.where(active, ent, torch.zeros_like(ent))
        done |= nxt == eos
        if bool(done.all()):
            break
        att = torch.cat([att, torch.ones((n, 1), dtype=att.dtype, device=dev)], -1)
        feed = torch.where(done, torch.full_like(nxt, tokenizer.pad_token_id), nxt).unsqueeze(-1)
        out = model(input_ids=feed, attention_mask=att, position_ids=next_pos, past_key_values=past, use_cache=True)
        past, logits = out.past_key_values, out.logits[:, -1, :].float()
        next_pos = next_pos + 1
    out_tok, out_len, ent_sum = out_tok.cpu(), out_len.cpu(), ent_sum.cpu()
    tokens = [out_tok[i, : out_len[i]].tolist() for i in range(n)]
    res = []
    for i in range(n):
        toks = tokens[i]
        body = toks[:-1] if toks and toks[-1] == eos else toks
        res.append({"text": tokenizer.decode(body, skip_special_tokens=True), "n_tokens": len(toks),
                    "entropy": float(ent_sum[i]) / max(1, len(toks))})
    return res


def load_checkpoint(actor_dir: str):
    """The policy of a one-rank verl FSDP checkpoint (``<run>/checkpoints/global_step_N/actor``) as an HF model.

    Returns ``(model, tokenizer)``. Checkpoints of several ranks are refused: verl's model merger
    (``python -m verl.model_merger merge``) turns those into an HF folder.
    """
    import os

    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    shards = sorted(f for f in os.listdir(actor_dir) if f.startswith("model_world_size_"))
    if shards != ["model_world_size_1_rank_0.pt"]:
        raise ValueError(f"{actor_dir}: expected one rank's model_world_size_1_rank_0.pt, found {shards or 'none'}; "
                         "merge a multi-rank checkpoint with `python -m verl.model_merger merge` first")
    state = torch.load(os.path.join(actor_dir, shards[0]), map_location="cpu", weights_only=False)
    state = {k: (v.to_local() if hasattr(v, "to_local") else v) for k, v in state.items()}  # one-rank DTensors
    hf_dir = os.path.join(actor_dir, "huggingface")
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(hf_dir))
    model.load_state_dict(state, strict=True)
    return model.eval(), AutoTokenizer.from_pretrained(hf_dir)

