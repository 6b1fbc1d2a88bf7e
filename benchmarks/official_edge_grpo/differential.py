"""One EDGE-GRPO step, differential: verl_ext's recorded rollout replayed into the official trainer.

Run by ``harness.py differential`` in the side venv (``PYTHONPATH``: the patched official copy and this repository,
for the torch-only ``verl_ext.algos``). Input: verl's rollout dump of a one-step verl_ext ``edge_grpo`` run on the
toy (``trainer.rollout_data_dir``; verl_ext adds GEC's columns: the branch, the first response, the final response
in pieces). The official ``GRPOAhaTrainer`` gets the same prompt, the same first responses (its first
``generate`` returns them), the same branch draws (its ``random.choice`` returns them) and the same reflection
continuations (its second ``generate`` returns them). Both sides then score and weigh the step from the same
weights (the exported toy model):

* verl_ext: the dump's final responses as tokens (the toy's tokenizer is byte-level: text -> ids is exact; each
  piece's token count says where an EOS stands), response mask 1 on every token, reward = toy accuracy,
  ``grpo_scalar_advantage`` -> ``edge_grpo_advantage`` (masked H_i, per-group H̄), and the entropy_grad loss
  (``entropy_grad_split`` + ``entropy_grad_multiplier``, token-mean over the step's tokens);
* official: ``_generate_and_score_completions`` then ``_compute_loss`` of the patched trainer, unchanged.

Per response it writes the final text and token ids, the trained-token count, the reward, the group advantage,
H_i, H̄_g / H_i, the per-token loss weight, and the step's loss and gradient norm (with H_i detached too), to
``<out>/differential.json``, and prints a table.
"""

from __future__ import annotations

import argparse
import json
import random
import sys

CUE_KIND, CONT_KIND, POLICY_KIND = "cue", "continuation", "policy"


def load_dump(path: str) -> list[dict]:
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    groups = {}
    for r in rows:
        groups.setdefault(r.get("gec_group"), []).append(r)
    first = next(iter(groups.values()))
    if len(first) != 8:
        raise SystemExit(f"{path}: the first group has {len(first)} responses, expected 8 (one prompt x 8)")
    return first


def piece_ids(tok, piece: dict) -> list[int]:
    """A dumped piece's token ids: its text encoded, and the EOS its token count says it ends with."""
    ids = tok.encode(piece["text"], add_special_tokens=False)
    extra = int(piece["tokens"]) - len(ids)
    if extra not in (0, 1):
        raise SystemExit(f"piece {piece}: {len(ids)} tokens from its text, {piece['tokens']} recorded")
    return ids + [tok.eos_token_id] * extra


def ours_final_ids(tok, row: dict) -> list[int]:
    return [t for p in row["gec_segments"] for t in piece_ids(tok, p)]


def first_attempt_ids(tok, row: dict, budget: int) -> list[int]:
    """The policy's first response: the dump's first response (solution rows) or its policy piece, + EOS when it
    ended before the first generation's budget (the official code decodes it without special tokens anyway)."""
    if row["gec_branch"] == "solution":
        ids = tok.encode(row["gec_first_response"], add_special_tokens=False)
    else:
        pol = [p for p in row["gec_segments"] if p["kind"] == POLICY_KIND]
        ids = piece_ids(tok, pol[0]) if pol else []
    if len(ids) < budget and (not ids or ids[-1] != tok.eos_token_id):
        ids = ids + [tok.eos_token_id]
    return ids


def continuation_ids(tok, row: dict) -> list[int]:
    return [t for p in row["gec_segments"] if p["kind"] == CONT_KIND for t in piece_ids(tok, p)]


class ReplayChoice:
    """Stands in for the ``random`` module in the official trainer: ``choice`` returns the recorded branches."""

    def __init__(self, decisions: list[int]):
        self.decisions = list(decisions)

    def choice(self, seq):
        return seq[self.decisions.pop(0)]

    def __getattr__(self, name):
        return getattr(random, name)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dump", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--train", required=True)
    ap.add_argument("--reward-path", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--first-budget", type=int, default=33)
    ap.add_argument("--mode", choices=["gec", "force_reflect"], default="gec")
    args = ap.parse_args(argv)

    import pandas as pd
    import torch
    import trl_edge.trainer.grpo_aha_trainer as official_module
    from official_train import RewardLog, load_toy_reward
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl_edge import GRPOAhaTrainer, GRPOConfig

    from verl_ext.algos.edge_grpo import (
        edge_grpo_advantage,
        entropy_grad_multiplier,
        entropy_grad_split,
        response_entropy,
    )
    from verl_ext.algos.grpo import grpo_scalar_advantage

    torch.set_num_threads(1)
    rows = load_dump(args.dump)
    tok = AutoTokenizer.from_pretrained(args.model)
    eos = tok.eos_token_id
    problem = rows[0]["input"].split("user\n", 1)[-1].split("\n", 1)[0].strip()
    table = pd.read_parquet(args.train)
    match = table[table["problem"] == problem]
    if len(match) != 1:
        raise SystemExit(f"prompt {problem!r}: {len(match)} rows of {args.train}")
    answer, solution = str(match["answer"].iloc[0]), str(match["solution"].iloc[0])
    branches = [r["gec_branch"] for r in rows]

    # ---- the official trainer, replayed -------------------------------------------------------------------
    rewards = RewardLog(load_toy_reward(args.reward_path))
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32)
    ds = pd.DataFrame({"problem": [problem], "answer": [answer], "solution": [solution]})
    from datasets import Dataset

    dataset = Dataset.from_pandas(ds).map(lambda ex: {"prompt": [{"role": "user", "content": ex["problem"]}]})
    config = GRPOConfig(output_dir=args.out, per_device_train_batch_size=8, num_generations=8, max_prompt_length=32,
                        max_completion_length=64, learning_rate=1e-5, beta=0.0, temperature=args.temperature,
                        bf16=False, use_cpu=True, report_to="none", save_strategy="no", seed=1,
                        force_reflection=True, GEC=args.mode == "gec", EDA=True)
    trainer = GRPOAhaTrainer(model=model, reward_funcs=[rewards.toy_format_reward, rewards.toy_accuracy_reward],
                             args=config, train_dataset=dataset, processing_class=tok)
    firsts = [first_attempt_ids(tok, r, args.first_budget) for r in rows]
    conts = [continuation_ids(tok, r) for r in rows]
    calls = []

    def replay_generate(input_ids, attention_mask=None, generation_config=None, **kw):
        pieces = firsts if not calls else [c if b == "reflect" else [eos] for c, b in zip(conts, branches)]
        calls.append({"max_new_tokens": generation_config.max_new_tokens, "top_k": generation_config.top_k,
                      "top_p": generation_config.top_p, "temperature": generation_config.temperature})
        width = max(len(p) for p in pieces)
        out = torch.full((input_ids.size(0), width), eos, dtype=input_ids.dtype)
        for i, p in enumerate(pieces):
            out[i, :len(p)] = torch.tensor(p, dtype=input_ids.dtype)
        return torch.cat([input_ids, out], dim=1)

    trainer.model.generate = replay_generate
    decisions = []
    for b in branches:  # the official two-level draw: reflect vs inject, then answer vs solution
        if b == "reflect":
            decisions.append(0)
        elif b in ("answer", "solution"):
            decisions += [1, 0 if b == "answer" else 1]
    official_module.random = ReplayChoice(decisions if args.mode == "gec" else [])
    trainer.model.train()
    inputs = [{"prompt": [{"role": "user", "content": problem}], "answer": answer, "solution": solution}] * 8
    out = trainer._generate_and_score_completions([dict(x, prompt=list(x["prompt"])) for x in inputs])
    rewards_official = [1.0 + a for a in rewards.calls[-1]]
    o_ids, o_mask, o_adv = out["completion_ids"], out["completion_mask"], out["advantages"]
    full = torch.cat([out["prompt_ids"], o_ids], 1)
    attn = torch.cat([out["prompt_mask"], o_mask], 1)
    with torch.no_grad():
        _, o_ent = trainer._get_per_token_logps(trainer.model, full, attn, o_ids.size(1), EDA=True)
    o_h = o_ent.mean(1)  # the official H_i: unmasked mean over the padded width
    o_factor = o_h.mean() / o_h
    o_adv_hat = o_adv / o_h * o_h.mean()
    o_weight = o_adv_hat.unsqueeze(1) * o_mask / o_mask.sum()  # bnpo: -sum(A^ ratio mask) / sum(mask)
    trainer.model.zero_grad()
    loss_o = trainer._compute_loss(trainer.model, out)
    loss_o.backward()
    gnorm_o = torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), float("inf")).item()

    # ---- verl_ext on its own final responses ----------------------------------------------------------------
    model2 = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32)
    prompt_ids = out["prompt_ids"][0][out["prompt_mask"][0].bool()].tolist()
    finals = [ours_final_ids(tok, r) for r in rows]
    width = max(len(f) for f in finals)
    resp = torch.full((8, width), eos, dtype=torch.long)
    mask = torch.zeros((8, width), dtype=torch.float32)
    for i, f in enumerate(finals):
        resp[i, :len(f)] = torch.tensor(f)
        mask[i, :len(f)] = 1
    seq = torch.cat([torch.tensor([prompt_ids] * 8), resp], 1)
    seq_attn = torch.cat([torch.ones((8, len(prompt_ids))), mask], 1)
    scores = torch.tensor([float(r["score"]) for r in rows])
    gid = torch.zeros(8, dtype=torch.long)
    a_ours = grpo_scalar_advantage(scores, gid, 1)

    def forward(m):
        logits = m(input_ids=seq, attention_mask=seq_attn).logits[:, len(prompt_ids) - 1:-1, :] / args.temperature
        logp_all = torch.log_softmax(logits, -1)
        ent = -(logp_all.exp() * logp_all).sum(-1)
        return logp_all.gather(-1, resp.unsqueeze(-1)).squeeze(-1), ent

    with torch.no_grad():
        _, ent_old = forward(model2)
    adv_hat, _ = edge_grpo_advantage(a_ours, ent_old, mask, gid, 1)
    h_ours = response_entropy(ent_old, mask)
    adv_old, h_bar, h_old, _ = entropy_grad_split(a_ours, ent_old, mask, gid, 1)
    w_ours = adv_hat.unsqueeze(1) * mask / mask.sum()

    def ours_loss(grad_through_entropy: bool):
        model2.zero_grad()
        logp, ent = forward(model2)
        mult = torch.ones(8)
        if grad_through_entropy:
            mult, _, _ = entropy_grad_multiplier(response_entropy(ent, mask), h_bar, h_old)
        adv = adv_old * mult
        loss = -(torch.exp(logp - logp.detach()) * adv.unsqueeze(1) * mask).sum() / mask.sum()
        loss.backward()
        return loss.item(), torch.nn.utils.clip_grad_norm_(model2.parameters(), float("inf")).item()

    loss_u_grad, gnorm_u_grad = ours_loss(True)
    loss_u_det, gnorm_u_det = ours_loss(False)

    # the official formula (A_i / H_i(θ) · H̄ detached, bnpo) written out on verl_ext's tokens with the masked H_i:
    # what entropy_grad must equal, value and gradient
    model2.zero_grad()
    logp_f, ent_f = forward(model2)
    h_f = response_entropy(ent_f, mask)
    adv_f = a_ours / h_f * h_f.mean().detach()
    loss_f = -(torch.exp(logp_f - logp_f.detach()) * adv_f.unsqueeze(1) * mask).sum() / mask.sum()
    loss_f.backward()
    gnorm_f = torch.nn.utils.clip_grad_norm_(model2.parameters(), float("inf")).item()

    # the official loss with H_i detached (the same formula, for the share of the gradient through 1/H_i)
    trainer.model.zero_grad()
    logp, _ = trainer._get_per_token_logps(trainer.model, full, attn, o_ids.size(1), EDA=True)
    det = o_adv_hat.detach()
    loss_od = -(torch.exp(logp - logp.detach()) * det.unsqueeze(1) * o_mask).sum() / o_mask.sum()
    loss_od.backward()
    gnorm_o_det = torch.nn.utils.clip_grad_norm_(trainer.model.parameters(), float("inf")).item()

    per_response = []
    for i, r in enumerate(rows):
        o_len = int(o_mask[i].sum())
        o_tokens = o_ids[i, :o_len].tolist()
        per_response.append({
            "branch": r["gec_branch"],
            "ours_text": tok.decode(finals[i], skip_special_tokens=False),
            "official_text": tok.decode(o_tokens, skip_special_tokens=False),
            "ours_ids": finals[i], "official_ids": o_tokens,
            "ids_equal": finals[i] == o_tokens,
            "ours_trained": int(mask[i].sum()), "official_trained": o_len,
            "ours_reward": float(scores[i]), "official_reward": rewards_official[i],
            "ours_adv": float(a_ours[i]), "official_adv": float(o_adv[i]),
            "ours_H": float(h_ours[i]), "official_H": float(o_h[i]),
            "ours_factor": float(adv_hat[i] / a_ours[i]) if a_ours[i] != 0 else float(h_ours.mean() / h_ours[i]),
            "official_factor": float(o_factor[i]),
            "ours_adv_hat": float(adv_hat[i]), "official_adv_hat": float(o_adv_hat[i]),
            "ours_token_weight": float(w_ours[i, 0]), "official_token_weight": float(o_weight[i, 0]),
            "ours_step_weight": float(w_ours[i].sum()), "official_step_weight": float(o_weight[i].sum()),
        })
    result = {
        "mode": args.mode, "problem": problem, "answer": answer, "branches": branches, "generate_calls": calls,
        "official_padded_width": int(o_ids.size(1)),
        "loss": {"official": loss_o.item(), "official_H_detached": loss_od.item(),
                 "ours_entropy_grad": loss_u_grad, "ours_detached": loss_u_det,
                 "official_formula_on_ours_masked": loss_f.item()},
        "grad_norm": {"official": gnorm_o, "official_H_detached": gnorm_o_det,
                      "ours_entropy_grad": gnorm_u_grad, "ours_detached": gnorm_u_det,
                      "official_formula_on_ours_masked": gnorm_f},
        "responses": per_response,
    }
    with open(f"{args.out}/differential.json", "w") as f:
        json.dump(result, f, indent=1)
    cols = ["branch", "ids_equal", "ours_trained", "official_trained", "ours_reward", "official_reward", "ours_adv",
            "official_adv", "ours_H", "official_H", "ours_factor", "official_factor", "ours_token_weight",
            "official_token_weight"]
    print(f"prompt {problem} answer {answer}; generate calls {calls}")
    print(" | ".join(cols))
    for p in per_response:
        print(" | ".join(f"{p[c]:.4g}" if isinstance(p[c], float) else str(p[c]) for c in cols))
        if not p["ids_equal"]:
            print(f"   ours:     {p['ours_text']!r}\n   official: {p['official_text']!r}")
    print("loss", result["loss"])
    print("grad_norm", result["grad_norm"])


if __name__ == "__main__":
    sys.path.insert(0, __file__.rsplit("/", 1)[0])
    main()
