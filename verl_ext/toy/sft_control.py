"""``python -m verl_ext.toy.sft_control``: GEC's solution branch as plain supervised learning.

Separates "the tokens" from "the credit": the solution-only GEC run (``METHOD=gec_solution``: every wrong training
response is replaced by the prompt's reference solution + EOS and trained with its corrected reward) is mirrored by
supervised fine-tuning of the same warmed-up model on exactly those solutions, with no RL. For each of ``steps``
steps, the prompts of the RL run's step (verl's dataloader order: ``RandomSampler`` with a generator seeded by
``data.seed``, 16 prompts) each get 8 first attempts from the current model (T = 1, GEC's first-generation budget of
33 tokens, as a GEC training rollout); every wrong one contributes the prompt's reference solution to the step's
batch, and the step is one AdamW update with the actor's settings (the task's lr, ``designs.TASK_LR``; weight decay
0.01, clip 1.0) on the mean token NLL of those solutions (EOS included). Then the held-out figures, measured as the
build measures step 0 (``build.reason_step0_figures``). If SFT on the correct solutions keeps ``toy_chain`` while the solution branch
loses it, the cause is the credit the RL step gives, not the tokens.
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from . import designs, reason
from .build import DEFAULT_TASK, build_toy_assets, reason_split, reason_step0_figures
from .model import _answer_ids, _batchify, _prompt_ids, sample_responses

FIRST_BUDGET = 33  # the toy's first-generation budget with GEC on (64 - cue - 30 continuation tokens)
ROLLOUT_N = 8
BATCH_PROMPTS = 16
WEIGHT_DECAY, GRAD_CLIP = 0.01, 1.0  # verl's actor optimizer; its lr: the task's (designs.TASK_LR)


def step_prompts(seed: int, steps: int, sources: tuple[str, ...] | None, design,
                 chosen: dict | None = None) -> list[list[tuple[str, tuple]]]:
    """The (data source, operands) of each step's prompts, as verl's legacy trainer draws the RL pool
    (``reason.make_rows``' training rows, restricted to ``sources`` as ``+toy.train_sources`` does; ``design``: a
    hard-split design's pool, ``designs.py``, by name or as a ``HardDesign``; ``chosen``: a selecting design's hard
    split): :func:`step_indices` over those rows."""
    design = design if isinstance(design, designs.HardDesign) else designs.parse_design(design)
    split = designs.split_for(design, chosen=chosen)
    rows = designs.train_rows(design, sources, chosen)
    assert all(ops in split.train[s] for s, ops in rows)
    return [[rows[i] for i in batch] for batch in step_indices(seed, steps, len(rows))]


def step_indices(seed: int, steps: int, n_rows: int) -> list[list[int]]:
    """The row indices of each step's prompts in a pool of ``n_rows``: verl's own seeded sampler
    (``create_rl_sampler``, ``data.seed``) in a dataloader built as ``RayPPOTrainer`` builds its training one (the
    toy's batch, ``drop_last``), a fresh pass each epoch. Imports verl (``search.py`` reads them precomputed)."""
    from omegaconf import OmegaConf
    from torchdata.stateful_dataloader import StatefulDataLoader
    from verl.trainer.ppo.utils import create_rl_sampler

    sampler = create_rl_sampler(OmegaConf.create({"shuffle": True, "seed": seed}), list(range(n_rows)))
    loader = StatefulDataLoader(range(n_rows), batch_size=BATCH_PROMPTS, drop_last=True, sampler=sampler)
    batches: list[list[int]] = []
    while len(batches) < steps:
        batches += [batch.tolist() for batch in loader]
    return batches[:steps]


def sft_on_solutions(model, tok, seed: int = 1, steps: int = 60, sources: tuple[str, ...] | None = None,
                     prompts_per_step: list | None = None, lr: float = designs.TASK_LR["chain6"],
                     task: str | None = None,
                     chosen: dict | None = None) -> dict:
    """Train ``model`` in place as described above; returns per-step counts (solutions trained on, mean loss).
    ``prompts_per_step``: each step's (data source, operands), given (``search.py``: precomputed, no verl) instead of drawn
    by :func:`step_prompts` (``steps`` and ``sources`` are then unused). ``lr``: the RL run's learning rate (default
    chain6's);
    ``task``: the reasoning toy whose RL pool is drawn (default the default toy; ``chosen``: its picked hard split)."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=WEIGHT_DECAY)
    dev = next(model.parameters()).device
    log = []
    if prompts_per_step is None:
        prompts_per_step = step_prompts(seed, steps, sources, designs.reason_cell(task or DEFAULT_TASK).design, chosen)
    for step, prompts in enumerate(prompts_per_step, start=1):
        texts = [reason.prompt_text(s, ops) for s, ops in prompts for _ in range(ROLLOUT_N)]
        truth = [str(reason.answer(ops)) for _, ops in prompts for _ in range(ROLLOUT_N)]
        model.eval()
        attempts = sample_responses(model, tok, texts, FIRST_BUDGET, 1.0, seed=seed * 100_003 + step)
        wrong = [i for i, (a, t) in enumerate(zip(attempts, truth)) if reason.final_answer(a["text"]) != t]
        entry = {"step": step, "solutions": len(wrong), "acc_before": 1 - len(wrong) / len(texts)}
        if wrong:
            seqs, starts = [], []
            for i in wrong:
                source, ops = prompts[i // ROLLOUT_N]
                prompt_ids = _prompt_ids(tok, reason.prompt_text(source, ops))
                seqs.append(prompt_ids + _answer_ids(tok, reason.solution(source, ops)))
                starts.append(len(prompt_ids))
            ids, att, pos, labels = _batchify(seqs, tok.pad_token_id, starts)
            model.train()
            loss = model(input_ids=ids.to(dev), attention_mask=att.to(dev), position_ids=pos.to(dev),
                         labels=labels.to(dev)).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
            opt.step()
            entry["loss"] = round(float(loss.detach()), 4)
        log.append(entry)
    model.eval()
    return {"steps": log}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(prog="python -m verl_ext.toy.sft_control", description=__doc__)
    ap.add_argument("--seed", type=int, default=1, help="data.seed / rollout.seed of the RL run mirrored (default 1)")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--train-sources", nargs="*", default=None, help="as +toy.train_sources (default: all three)")
    ap.add_argument("--task", default=None, help="the reasoning toy (+toy=...; default the default toy)")
    ap.add_argument("--lr", type=float, default=None, help="the RL run's learning rate (default the task's: "
                    "designs.TASK_LR)")
    ap.add_argument("--json", action="store_true", help="print the result as one JSON line at the end")
    args = ap.parse_args(argv)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    args.task = args.task or DEFAULT_TASK
    if args.task not in designs.REASON_TASKS:
        ap.error(f"--task {args.task!r}: one of {list(designs.REASON_TASKS)}")
    lr = designs.TASK_LR[args.task] if args.lr is None else args.lr
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    assets = build_toy_assets(verbose=False, task=args.task)
    model = AutoModelForCausalLM.from_pretrained(assets.model_path, dtype=torch.float32, attn_implementation="sdpa")
    tok = AutoTokenizer.from_pretrained(assets.model_path)
    split = reason_split(args.task, assets.stats)
    t0 = time.time()
    before = reason_step0_figures(model, tok, split)
    trained = sft_on_solutions(model, tok, args.seed, args.steps, tuple(args.train_sources or ()) or None, lr=lr,
                               task=args.task, chosen=assets.stats.get("hard_split"))
    after = reason_step0_figures(model, tok, split)
    result = {"task": args.task, "lr": lr, "seed": args.seed, "steps": args.steps, "before": before, "after": after,
              "solutions": sum(s["solutions"] for s in trained["steps"]), "seconds": round(time.time() - t0, 1),
              "acc_before_first_last": [trained["steps"][0]["acc_before"], trained["steps"][-1]["acc_before"]]}
    for source in before:
        print(f"{source}: sampled {before[source]['acc_t1']:.3f} -> {after[source]['acc_t1']:.3f}, "
              f"greedy {before[source]['acc_greedy']:.3f} -> {after[source]['acc_greedy']:.3f}")
    print(f"{result['solutions']} solutions in {args.steps} steps, {result['seconds']} s")
    if args.json:
        print(json.dumps(result))
    return result


if __name__ == "__main__":
    main()
