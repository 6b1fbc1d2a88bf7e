"""Runs the official ``GRPOAhaTrainer`` on the exported toy (run by ``harness.py train`` in the side venv).

Not part of verl_ext: this file imports only the official package (``trl_edge`` from the patched copy on
``PYTHONPATH``), transformers, datasets and torch. It drives the trainer the way the official ``scripts/grpo.py``
does (the model and tokenizer from one directory, the prompt as one user message, ``trainer.train()``,
``trainer.save_model``) with the toy's two reward functions:

* ``toy_accuracy_reward``: the toy's rule reward (``verl_ext/toy/reason_reward.py``, loaded by path: exact match of
  the text after the last ``#``), 1 or 0;
* ``toy_format_reward``: 1 for every response, as the official ``box_format_reward`` is in practice, so the
  official wrong-response test (``rewards != 2``) stays as it is.

It writes ``<out>/steps.jsonl`` (one line per optimizer step: the trainer's logged metrics, the accuracy of the
first attempts and of the final responses, whether the group was all wrong before correction, the step's wall
seconds) and the final model as an HF directory ``<out>/model``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import time

METHOD_FLAGS = {  # the official flags of the paper's ablation rows (train_grpo.sh passes all three for EDGE-GRPO)
    "grpo": {"force_reflection": False, "GEC": False, "EDA": False},
    "force_r_eda": {"force_reflection": True, "GEC": False, "EDA": True},
    "edge_grpo": {"force_reflection": True, "GEC": True, "EDA": True},
}


def load_toy_reward(path: str):
    spec = importlib.util.spec_from_file_location("toy_reason_reward", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.compute_score


class RewardLog:
    """The toy's two reward functions; every call of the accuracy one is kept for the step's log (with GEC or
    Force-R on, the trainer grades twice a step: the first attempts, then the final responses)."""

    def __init__(self, compute_score):
        self.compute_score = compute_score
        self.calls: list[list[float]] = []

    def toy_accuracy_reward(self, completions, answer, **kwargs):
        texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
        scores = [float(self.compute_score("toy", t, a)["acc"]) for t, a in zip(texts, answer)]
        self.calls.append(scores)
        return scores

    @staticmethod
    def toy_format_reward(completions, **kwargs):
        return [1.0] * len(completions)

    def take_step(self) -> dict:
        calls, self.calls = self.calls, []
        if not calls:
            return {}
        first, final = calls[0], calls[-1]
        return {
            "toy/acc_first": sum(first) / len(first),
            "toy/acc_final": sum(final) / len(final),
            "toy/all_wrong_first": float(not any(first)),
            "toy/all_wrong_final": float(not any(final)),
            "toy/reward_calls": len(calls),
        }


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", required=True, help="the exported toy model directory")
    ap.add_argument("--train", required=True, help="the exported train parquet (problem / answer / solution)")
    ap.add_argument("--reward-path", required=True, help="verl_ext/toy/reason_reward.py")
    ap.add_argument("--out", required=True)
    ap.add_argument("--method", choices=sorted(METHOD_FLAGS), required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--lr", type=float, required=True)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--max-steps", type=int, default=-1, help="-1: one epoch")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--save-steps", type=int, default=0, help="also save the model every N steps (0: at the end only)")
    args = ap.parse_args(argv)

    import torch
    from datasets import load_dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl_edge import GRPOAhaTrainer, GRPOConfig

    torch.set_num_threads(args.threads)
    os.makedirs(args.out, exist_ok=True)
    rewards = RewardLog(load_toy_reward(args.reward_path))
    model = AutoModelForCausalLM.from_pretrained(args.model, torch_dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    dataset = load_dataset("parquet", data_files={"train": args.train})["train"]
    dataset = dataset.map(lambda ex: {"prompt": [{"role": "user", "content": ex["problem"]}]})

    config = GRPOConfig(
        output_dir=args.out,
        num_train_epochs=1,
        max_steps=args.max_steps,
        per_device_train_batch_size=8,  # one prompt x 8 responses per optimizer step, as 8 ranks x 1 in the paper
        num_generations=8,
        gradient_accumulation_steps=1,
        max_prompt_length=32,
        max_completion_length=64,  # overridden by the patched generation lengths
        learning_rate=args.lr,
        lr_scheduler_type="linear",
        warmup_steps=0,
        beta=0.0,
        temperature=args.temperature,
        seed=args.seed,
        bf16=False,
        use_cpu=True,
        logging_steps=1,
        save_strategy="steps" if args.save_steps > 0 else "no",
        save_steps=max(args.save_steps, 1),
        save_only_model=True,
        report_to="none",
        dataloader_num_workers=0,
        **METHOD_FLAGS[args.method],
    )
    trainer = GRPOAhaTrainer(
        model=model,
        reward_funcs=[rewards.toy_format_reward, rewards.toy_accuracy_reward],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
    )

    steps_path = os.path.join(args.out, "steps.jsonl")

    class StepLog(TrainerCallback):
        def __init__(self):
            self.t0 = time.perf_counter()
            open(steps_path, "w").close()

        def on_step_begin(self, a, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_log(self, a, state, control, logs=None, **kw):
            if logs is None or "loss" not in logs:
                return
            row = {"step": state.global_step, "step_s": time.perf_counter() - self.t0, **logs, **rewards.take_step()}
            with open(steps_path, "a") as f:
                f.write(json.dumps(row) + "\n")

    trainer.add_callback(StepLog())
    t0 = time.perf_counter()
    trainer.train()
    train_s = time.perf_counter() - t0
    trainer.save_model(os.path.join(args.out, "model"))
    with open(os.path.join(args.out, "run.json"), "w") as f:
        json.dump({**vars(args), "train_s": train_s, "steps": trainer.state.global_step}, f, indent=1)
    print(f"official_train: {trainer.state.global_step} steps in {train_s:.1f} s -> {args.out}/model")


if __name__ == "__main__":
    main()
