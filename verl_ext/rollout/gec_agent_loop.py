"""``gec_agent``: verl's single-turn agent loop plus Guided Error Correction / +Force-R, or prompt-side hints
(``algorithm.gec.mode=hint``, docs/hints.md: ``GecAgentLoop._hint``, the design at the top of ``rollout/hints.py``),
on training rollouts only.

Select it with ``actor_rollout_ref.rollout.agent.default_agent_loop=gec_agent`` (or an ``agent_name`` column) and
turn it on with ``algorithm.gec.enable=true``. With ``enable=false``, and for every validation rollout, ``run``
is exactly ``SingleTurnAgentLoop.run`` (same output, no extra fields), but for the name of a v1 sample's request
under ``rollout.full_determinism`` (``det-<index>-<session_id>``, where verl names every v1 request ``det-0``).

When on (training rollouts), the single-turn generation gets at most ``gec.first_generation_budget`` tokens
(room is kept for the longest edit that can be drawn: the original's 1024 first-rollout + 256 continuation
tokens); then the loop
  1. scores the response with verl's own reward manager (``verl.trainer.ppo.reward.load_reward_manager``: the
     same ``reward.custom_reward_function`` / default ``compute_score`` and reward manager as verl's reward loop);
  2. decides right/wrong (the reward's ``acc`` when it returns one, else ``correct_threshold``); with
     ``edit_scope=all_wrong_groups`` it waits for the other first attempts of its group (``GroupFirstAttempts``) and
     leaves a wrong response alone when one of them is right; picks a branch
     (``verl_ext.rollout.gec.choose_branch``) and edits the response token-exactly:
     reflect = response core + cue ids + policy continuation (generated from original prompt + core + cue by the
     same server, up to ``max_continuation_tokens``); answer = core + template ids + EOS; solution = reference
     solution ids + EOS;
  3. returns the original prompt (no hint) with the new response; ``reward_score`` stays None so verl's reward
     loop scores the final response against the row's ground truth. A response GEC leaves as it is already has its
     final score (verl's reward loop would call the same manager's ``run_single`` on the same input: GEC refuses a
     reward model, ``run_checks.check_gec_reward``), so the loop sets ``reward_score`` and ``reward_extra_info``
     itself and verl does not score it again.
Per-sample fields (``verl_ext.rollout.gec.EXTRA_KEYS``) go into ``AgentLoopOutput.extra_fields``, among them
``gec_spans`` (where the policy's first response, the injected pieces and the continuation lie in the final
response: a few ints, nothing decoded); while verl's rollout dump is on (``trainer.rollout_data_dir``) a solution
branch, which replaces the whole first response, also keeps that response's ids (``gec_first_response_ids``) so the
dump can show it (``verl_ext.trainer.gec_dump``).

Rollout log-probs of injected tokens (cue, template, solution, added EOS) are 0.0: no engine sampled them and
the generate API cannot score given tokens. verl's loss uses the actor's recomputed old log-probs (ratio 1 on
the first pass, as in the original); rollout-correction IS weights and ``bypass_mode``, which would treat them as
probability-1 tokens, are refused at start-up (``verl_ext.run_checks.validate_run_config``), and verl_ext's trainers
leave them out of verl's rollout-vs-actor diagnostics (``verl_ext.trainer.rollout_diagnostics``, from
``gec_spans``); with ``mask_injected`` they are out of the loss anyway.

A row may carry its own sampling settings in ``extra_info["sampling_params"]`` (keys ``ROW_SAMPLING_KEYS``, e.g.
``{"temperature": 0}`` for a greedy copy of a validation prompt next to the sampled one); they replace the
trainer's for that row only (:func:`row_sampling_params`), with GEC on or off.

Training and validation rollouts are told apart by a row column: while GEC is on, verl_ext's trainers tag every row
they send to rollout with ``verl_ext.names.TRAINING_ROLLOUT_KEY`` (True: training, False: validation), and verl's
agent-loop workers pass row columns to ``run`` as keyword arguments. A row without the tag (a trainer other than
verl_ext's) is never corrected, with a warning.

Importing this module only registers the class (verl's ``register`` puts ``{"_target_": ...}`` in a dict);
the checks of the verl internals this loop relies on (``verl_compat.check_agent_loop``), the reward manager and the
config run when the loop is first built, once per worker process, so a verl drift never breaks the import of
verl's agent-loop package in a process that does not use ``gec_agent``.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

import numpy as np
from verl.experimental.agent_loop.agent_loop import AgentLoopOutput, register
from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

from verl_ext.data_checks import unknown_sampling_keys
from verl_ext.names import GEC_AGENT_NAME, ROW_SAMPLING_KEYS, TRAINING_ROLLOUT_KEY
from verl_ext.rollout import gec, hints
from verl_ext.verl_compat import check_agent_loop, check_agent_loop_sample_keys

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))

# Per-process caches keyed by id() of verl's config object (one object per agent-loop worker; kept alive here).
_GEC_CONFIGS: dict[int, tuple[Any, Any]] = {}
_REWARD_MANAGERS: dict[int, tuple[Any, Any, Any]] = {}
_WARNED: set[str] = set()
_VERL_CHECKED: list[bool] = []  # [True] once check_agent_loop passed in this process


def _check_verl_once() -> None:
    """What this loop relies on in verl (``verl_compat.check_agent_loop``), once per process, at its first build."""
    if not _VERL_CHECKED:
        check_agent_loop()
        _VERL_CHECKED.append(True)


def _warn_once(key: str, msg: str) -> None:
    if key not in _WARNED:
        _WARNED.add(key)
        logger.warning(msg)


def gec_config_of(config) -> Any:
    """Validated ``GecConfig`` of verl's full config (``config.algorithm.gec``), cached per config object."""
    hit = _GEC_CONFIGS.get(id(config))
    if hit is not None and hit[0] is config:
        return hit[1]
    from verl_ext.config import config_value, load_algorithm_config

    cfg = load_algorithm_config(config_value(config, "algorithm")).gec
    _GEC_CONFIGS[id(config)] = (config, cfg)
    return cfg


def reward_manager_of(config, tokenizer) -> Any:
    """verl's reward manager, built as ``RewardLoopWorker`` builds it without a reward model (custom fn or default
    score; GEC refuses a reward model), cached."""
    loop = asyncio.get_running_loop()  # verl's reward managers bind the event loop they are built in
    hit = _REWARD_MANAGERS.get(id(config))
    if hit is not None and hit[0] is config and hit[2] is loop:
        return hit[1]
    reward_cfg = config.get("reward", None)
    if reward_cfg is None:
        raise ValueError("GEC needs verl's `reward` config node to score the first response")
    from verl_ext.run_checks import check_gec_reward

    check_gec_reward(config)  # refused at start-up already (validate_run_config); here for other entry points
    from verl_ext.verl_compat import check_reward_manager

    check_reward_manager()
    from verl.trainer.ppo.reward import load_reward_manager

    manager = load_reward_manager(config, tokenizer)
    _REWARD_MANAGERS[id(config)] = (config, manager, loop)
    return manager


# ---------------------------------------------------------------- reward input (as AgentLoopWorker._compute_score)


def _object_column(value) -> np.ndarray:
    arr = np.empty(1, dtype=object)
    arr[0] = value
    return arr


def build_reward_input(prompt_ids: list[int], response_ids: list[int], kwargs: dict, extra_fields: dict,
                       num_turns: int):
    """A one-row DataProto like the one ``AgentLoopWorker._compute_score`` sends to the reward loop worker."""
    import torch
    from tensordict import TensorDict
    from verl.protocol import DataProto

    prompts = torch.tensor(prompt_ids, dtype=torch.int64)
    responses = torch.tensor(response_ids, dtype=torch.int64)
    input_ids = torch.cat([prompts, responses])
    attention_mask = torch.ones_like(input_ids)
    position_ids = torch.arange(input_ids.numel(), dtype=torch.int64)
    batch = TensorDict(
        {
            "prompts": prompts[None],
            "responses": responses[None],
            "input_ids": input_ids[None],
            "attention_mask": attention_mask[None],
            "position_ids": position_ids[None],
        },
        batch_size=1,
    )
    # deep copies: reward managers mutate extra_info (num_turns, rollout_reward_scores, tool fields)
    non_tensor = {k: _object_column(copy.deepcopy(v)) for k, v in kwargs.items()}
    non_tensor["__num_turns__"] = np.array([num_turns])
    non_tensor["tool_extra_fields"] = _object_column(copy.deepcopy(extra_fields))
    non_tensor["prompt_len"] = np.array([len(prompt_ids)])
    non_tensor["response_len"] = np.array([len(response_ids)])
    return DataProto(batch=batch, non_tensor_batch=non_tensor)


def _reward_value(result) -> float:
    if isinstance(result, dict):
        result = result.get("reward_score", result.get("score"))
    if hasattr(result, "item"):
        result = result.item()
    return float(result)


def _merge_token_extra(extra: dict, more: dict) -> None:
    """Fold the continuation's TokenOutput.extra_fields (weight-version bookkeeping) into the first one's."""
    if not more:
        return
    lo = [v for v in (extra.get("min_global_steps"), more.get("min_global_steps")) if v is not None]
    hi = [v for v in (extra.get("max_global_steps"), more.get("max_global_steps")) if v is not None]
    if lo:
        extra["min_global_steps"] = min(lo)
    if hi:
        extra["max_global_steps"] = max(hi)
    if more.get("global_steps") is not None:
        extra["global_steps"] = more["global_steps"]


class _RequestIdRecorder:
    """The loop's server client, remembering the request id of the generation sent through it (verl's
    ``SingleTurnAgentLoop.run`` makes its own); with ``name``, a ``det-`` id verl made is sent as ``name`` instead."""

    def __init__(self, client, name: str | None = None):
        self._client = client
        self._name = name
        self.request_id = None

    async def generate(self, request_id, **kwargs):
        if self._name is not None and str(request_id).startswith("det-"):
            request_id = self._name
        self.request_id = request_id
        return await self._client.generate(request_id=request_id, **kwargs)

    def __getattr__(self, name):
        return getattr(self._client, name)


def join_routing(first, continued, prefix: int, total: int):
    """Router-replay routing of a corrected sequence: ``first[:prefix]`` (the first generation's, up to the kept
    core) then ``continued[prefix:total]`` (the continuation request's, whose sequence is prompt + core + cue +
    continuation); just ``first[:prefix]`` without a continuation. numpy arrays or torch tensors, as verl has them."""
    head = first[:prefix]
    if continued is None:
        return head
    tail = continued[prefix:total]
    if isinstance(head, np.ndarray):
        return np.concatenate([head, np.asarray(tail, dtype=head.dtype)])
    import torch

    return torch.cat([head, torch.as_tensor(tail, dtype=head.dtype, device=head.device)])


# edit_scope=all_wrong_groups: how long a group whose every sample that started in this worker has reported, though
# fewer than rollout.n did, waits for another to start before its wrong members stop. verl starts all the samples of
# a group at once (v1: the n sessions of one _run_prompt; legacy: one gather over the worker's chunk of whole
# groups), so this covers scheduling only, never a generation: it ends a wait for samples that never run here
SIBLING_START_GRACE_S = 60.0


@dataclass
class _Group:
    """What a worker knows of one group's first attempts (``GroupFirstAttempts``)."""

    size: int  # rollout.n: the samples a group has
    changed: asyncio.Future  # resolved, then replaced, at every change below
    started: int = 0  # samples that took their seat in this worker
    reported: int = 0  # first attempts scored
    failed: int = 0  # samples that failed before their first attempt was scored
    right: bool = False  # a first attempt was right: the group is not all wrong, whatever else happens
    failure: str = ""  # the first failure, while no right first attempt decided the group
    short_since: float | None = None  # since when every sample that started here has arrived, fewer than size

    @property
    def expected(self) -> int:
        return max(self.size, self.started)

    @property
    def complete(self) -> bool:
        return self.reported + self.failed >= self.expected

    def notify(self) -> None:
        loop = asyncio.get_running_loop()
        if self.reported + self.failed == self.started < self.size:
            self.short_since = loop.time() if self.short_since is None else self.short_since
        else:
            self.short_since = None
        if not self.changed.done():
            self.changed.set_result(None)
        self.changed = loop.create_future()


class GroupFirstAttempts:
    """Whether each group's first attempts are all wrong, for ``edit_scope=all_wrong_groups``. One per worker process:
    verl runs a group's samples as tasks of one agent-loop worker (v1: one ``_run_prompt``; legacy: whole groups per
    chunk, checked at start-up) and starts them together.

    Each sample takes its seat when it starts (:meth:`join`), then reports its first attempt (:meth:`all_wrong`) or
    its failure before that (:meth:`failed`). A right first attempt needs no verdict: it returns at once, and tells
    every wrong one that the group is not all wrong. A wrong one waits for the verdict: not all wrong (a right one
    reported), all wrong (every sample reported, all wrong), or none to be had: every sample reported or failed,
    at least one failed and none was right (a failed sample's first attempt is unknown), the samples that started
    here are all in and fewer than the group's (:data:`SIBLING_START_GRACE_S`), or it waited ``wait_s``
    (``algorithm.gec.group_wait_s``; None: no limit); then it raises, and only it. A failure alone decides nothing:
    a sibling still running may yet be right. So a failure costs the failed sample, and its wrong siblings only
    when every first attempt that was scored in its group is wrong (then at most n - 1 more). A group's entry is
    removed once every sample arrived."""

    def __init__(self):
        self._open: dict[Any, _Group] = {}

    def _group(self, key: Any, size: int) -> _Group:
        group = self._open.get(key)
        if group is None:
            group = self._open[key] = _Group(size, asyncio.get_running_loop().create_future())
        return group

    def _arrived(self, key: Any, group: _Group) -> None:
        if group.reported + group.failed > group.started:  # a report without a seat: that sample started too
            group.started, group.short_since = group.reported + group.failed, None
        if group.complete and self._open.get(key) is group:
            del self._open[key]
        group.notify()

    def join(self, key: Any, size: int) -> int:
        """A sample of group ``key`` (``size`` samples) started in this worker; returns its seat number (0: the
        first to start)."""
        group = self._group(key, size)
        group.started, group.short_since = group.started + 1, None
        group.notify()
        return group.started - 1

    def failed(self, key: Any, size: int, error: BaseException) -> None:
        """A sample of group ``key`` failed before reporting (its generation or scoring raised, or its task was
        cancelled). Its siblings go on waiting: the wrong ones raise once every sample reported or failed and none
        was right (the group can no longer be decided); a right one, before or after, still decides the group."""
        group = self._group(key, size)
        group.failed += 1
        if not group.right and not group.failure:
            group.failure = f"{type(error).__name__}: {error}"
        self._arrived(key, group)

    async def all_wrong(self, key: Any, size: int, correct: bool, wait_s: float | None = None) -> bool:
        """Report a first attempt of group ``key``; whether every first attempt of the group is wrong (a right one:
        False at once, to it and to every wrong one waiting). A wrong one raises if the group ends without a right
        first attempt but with a failed sample (:meth:`failed`), or past the deadlines above."""
        group = self._group(key, size)
        group.reported += 1
        group.right = group.right or correct
        self._arrived(key, group)
        if correct:
            return False
        loop = asyncio.get_running_loop()
        deadline = None if wait_s is None else loop.time() + float(wait_s)
        while True:
            if group.right:
                return False
            if group.complete:
                if group.failed:
                    raise RuntimeError(
                        f"gec_agent: algorithm.gec.edit_scope=all_wrong_groups: group {key!r} cannot be decided: "
                        f"{group.failed} of its {group.expected} samples failed before their first attempt was scored "
                        f"(first: {group.failure}), no other first attempt was right, and this sample's wrong first "
                        "attempt needs the group's verdict")
                return True
            limits = [t - loop.time() for t in (deadline, None if group.short_since is None else
                                                group.short_since + SIBLING_START_GRACE_S) if t is not None]
            try:
                await asyncio.wait_for(asyncio.shield(group.changed), max(min(limits), 0.0) if limits else None)
            except asyncio.TimeoutError:
                if group.short_since is not None and loop.time() >= group.short_since + SIBLING_START_GRACE_S:
                    if self._open.get(key) is group:
                        del self._open[key]
                    raise RuntimeError(
                        f"gec_agent: algorithm.gec.edit_scope=all_wrong_groups: group {key!r}: only {group.started} of "
                        f"its {group.size} samples (actor_rollout_ref.rollout.n) ran in this agent-loop worker, and all "
                        "of them reported or failed: the others never reach it (its samples split across agent-loop "
                        "workers, or a per-prompt sample count, verl's __rollout_n__, other than rollout.n); use "
                        "edit_scope=all") from None
                if deadline is not None and loop.time() >= deadline:
                    raise RuntimeError(
                        f"gec_agent: algorithm.gec.edit_scope=all_wrong_groups waited algorithm.gec.group_wait_s="
                        f"{wait_s:g} s for the first attempts of group {key!r} ({group.reported} of {group.expected} "
                        "reported, the others still running); raise group_wait_s, or set it to null to wait as long "
                        "as they run") from None


@dataclass
class _Seat:
    """One sample's place in its group: taken when it starts; reports its first attempt once, or fails before."""

    board: GroupFirstAttempts
    key: Any
    size: int
    wait_s: float | None = None
    reported: bool = False
    number: int = field(init=False, default=0)  # its seat in the group: 0 for the first to start

    def __post_init__(self):
        self.number = self.board.join(self.key, self.size)

    def then(self, *suffix: Any) -> _Seat:
        """A seat of the same sample at a later barrier of its group (key + ``suffix``), e.g. a hint level's."""
        return _Seat(self.board, (*self.key, *suffix), self.size, self.wait_s)

    async def all_wrong(self, correct: bool) -> bool:
        self.reported = True
        return await self.board.all_wrong(self.key, self.size, correct, self.wait_s)

    def failed(self, error: BaseException) -> None:
        if not self.reported:
            self.reported = True
            self.board.failed(self.key, self.size, error)


_FIRST_ATTEMPTS = GroupFirstAttempts()


@dataclass
class _Plan:
    cue_ids: list[int]
    answer_ids: list[int] | None  # answer template with the ground truth; None: the row has no ground truth
    solution_ids: list[int] | None  # the row's reference solution; None: it has none
    solution_fits: bool  # solution + EOS fit in rollout.response_length
    first_budget: int  # gec.first_generation_budget
    errors: list[str] = field(default_factory=list)  # what GEC could not use in the row (KEY_ERROR)


@dataclass
class _HintedSample:
    """One hinted sample of a member (mode ``hint``)."""

    level: int  # index into hint_levels
    output: AgentLoopOutput  # the row verl builds for the hinted prompt
    score: float
    reward_info: dict
    correct: bool
    succeeded: bool = False  # its level succeeded (scope one: this sample is right; all: a member's is)


def row_sampling_params(sampling_params: dict, extra_info, ignore_unknown: bool = False) -> dict:
    """``sampling_params`` with the row's own ``extra_info["sampling_params"]`` applied (unset entries are kept).

    Unknown keys are an error (a typo would otherwise sample at the trainer's settings and read as a result), or
    left out with ``ignore_unknown`` (GEC training rows, where they are counted instead: ``gec/errors``)."""
    row = extra_info.get("sampling_params") if isinstance(extra_info, dict) else None
    if not row:
        return sampling_params
    unknown = unknown_sampling_keys(extra_info)
    if unknown and not ignore_unknown:
        raise ValueError(f"extra_info.sampling_params: unknown key(s) {unknown}; allowed: {list(ROW_SAMPLING_KEYS)}")
    params = dict(sampling_params)
    params.update({k: v for k, v in row.items() if v is not None and k in ROW_SAMPLING_KEYS})
    return params


def _with_max_tokens(sampling_params: dict, cap: int) -> dict:
    """The sampling params with ``max_tokens`` at most ``cap`` (vLLM, SGLang and the hf backend all honour it)."""
    params = dict(sampling_params)
    given = params.pop("max_new_tokens", None)
    given = params.get("max_tokens", given)
    params["max_tokens"] = int(cap) if given is None else min(int(given), int(cap))
    return params


def is_training_rollout(kwargs: dict) -> bool:
    """The row's training tag (``gec.is_training_rollout``); warns once per process about untagged rows."""
    if TRAINING_ROLLOUT_KEY not in kwargs:
        _warn_once(
            "untagged",
            f"gec_agent: a rollout row without {TRAINING_ROLLOUT_KEY!r} (verl_ext's trainers tag every row while "
            "algorithm.gec.enable=true; run through `python -m verl_ext.main`); GEC is OFF for such rows",
        )
    return gec.is_training_rollout(kwargs)


@register(GEC_AGENT_NAME)
class GecAgentLoop(SingleTurnAgentLoop):
    """Single-turn agent loop with Guided Error Correction / +Force-R on training rollouts."""

    def __init__(self, *args, **kwargs):
        _check_verl_once()
        super().__init__(*args, **kwargs)
        self.gec_config = gec_config_of(self.config)
        check_agent_loop_sample_keys()  # once per process (cached): verl hands each sample its own key
        self._first_request_id = None  # the first generation's, reused by a reflection continuation

    # ------------------------------------------------------------ helpers

    def _encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _stop_ids(self) -> set[int]:
        tok = self.tokenizer
        ids = {int(i) for i in (getattr(tok, "all_special_ids", None) or [])}
        for attr in ("eos_token_id", "pad_token_id"):
            value = getattr(tok, attr, None)
            if isinstance(value, int):
                ids.add(value)
            elif isinstance(value, (list, tuple)):
                ids.update(int(v) for v in value)
        return ids

    def _eos_id(self, terminator: int | None) -> int:
        if terminator is not None:
            return int(terminator)
        eos = self.tokenizer.eos_token_id
        if isinstance(eos, (list, tuple)):
            eos = eos[0]
        if eos is None:
            raise ValueError("GEC needs an EOS token id (tokenizer.eos_token_id is None)")
        return int(eos)

    async def _score(self, prompt_ids, response_ids, kwargs, extra_fields, num_turns) -> tuple[float, dict]:
        """(score, reward_extra_info) of a response, from verl's reward manager."""
        manager = reward_manager_of(self.config, self.tokenizer)
        data = build_reward_input(prompt_ids, response_ids, kwargs, extra_fields, num_turns)
        result = await manager.run_single(data)
        extra = result.get("reward_extra_info") if isinstance(result, dict) else None
        return _reward_value(result), (extra if isinstance(extra, dict) else {})

    def _dumps_rollouts(self) -> bool:
        """Whether verl dumps the training rollouts (``trainer.rollout_data_dir``): then GEC keeps what shows an edit."""
        trainer = self.config.get("trainer", None) or {}
        return bool(trainer.get("rollout_data_dir", None))

    def _rng(self, kwargs: dict, weight_version=None):
        """The sample's branch draw, seeded by what identifies it across runs and tells the n samples of a uid apart:
        v1's ``session_id`` or the legacy manager's per-row ``priority`` (``verl_compat`` checks that verl passes
        them), its dataset row (``index``) and the weights it was generated with -- not verl's ``uid``, a fresh uuid
        per run, which would make two runs with one seed draw differently. Without session_id and priority: an
        unseeded draw, so the n samples still draw independently."""
        parts = [kwargs.get(k) for k in ("session_id", "priority", "global_steps", "index")]
        parts = [p.item() if hasattr(p, "item") else p for p in parts]
        if parts[0] is None and parts[1] is None:
            _warn_once("sample_key", "gec_agent: a row without session_id (v1) or priority (legacy manager): GEC's "
                                     "branch draws are unseeded (independent, not reproducible)")
            parts.append(uuid4().hex)
        return gec.sample_rng(self.gec_config.seed, *parts, weight_version)

    # ------------------------------------------------------------ run

    def _plan(self, kwargs: dict) -> _Plan:
        """Token ids of the possible edits of this sample and the first generation's budget, before generating."""
        cfg = self.gec_config
        cue_ids = self._encode(cfg.cue)
        try:
            answer_ids = self._encode(gec.answer_text(cfg, gec.ground_truth_text(kwargs.get("reward_model"))))
        except ValueError:  # no ground truth: a drawn answer branch is left unedited and counted
            answer_ids = None
        solution = gec.reference_solution(kwargs.get("extra_info"), cfg.solution_key)
        solution_ids = self._encode(solution) if solution is not None else None
        solution_fits = solution_ids is not None and len(solution_ids) + 1 <= self.response_length  # + EOS
        budget = gec.first_generation_budget(
            cfg, self.response_length, cue_tokens=len(cue_ids),
            answer_tokens=len(answer_ids) if answer_ids is not None else None, solution_fits=solution_fits,
        )
        return _Plan(cue_ids, answer_ids, solution_ids, solution_fits, budget)

    def _sample_request_name(self, kwargs: dict) -> str | None:
        """Under ``rollout.full_determinism``, the name of a v1 sample's requests: ``det-<index>-<session_id>``.

        verl's single-turn loop names a request ``det-<priority>``, and v1 passes no priority: every request of a
        v1 step would be ``det-0``, and a seeded backend (verl_ext's ``hf``) would tell the n samples of a prompt
        apart only by the order they arrive in. The dataset row and the session are the sample's identity in every
        run. None (verl's name kept): the legacy trainer (its priority is the row), full_determinism off, or a row
        without ``index``."""
        session, index = kwargs.get("session_id"), kwargs.get("index")
        if session is None or not getattr(self.rollout_config, "full_determinism", False):
            return None
        if index is None:
            _warn_once("sample_name", "gec_agent: a v1 row without index: its requests keep verl's name (det-0), "
                                      "so a seeded run's samples follow the order requests arrive in")
            return None
        index = index.item() if hasattr(index, "item") else index
        return f"det-{index}-{int(session)}"

    async def _run_single_turn(self, sampling_params: dict[str, Any], kwargs: dict) -> AgentLoopOutput:
        """verl's single-turn generation of this sample, through a recorder of its request id (and its v1 name)."""
        client = self.server_manager
        self.server_manager = recorder = _RequestIdRecorder(client, self._sample_request_name(kwargs))
        try:  # this loop serves one sample
            output = await super().run(sampling_params, **kwargs)
        finally:
            self.server_manager = client
        self._first_request_id = recorder.request_id
        return output

    async def run(self, sampling_params: dict[str, Any], **kwargs) -> AgentLoopOutput:
        extra_info = kwargs.get("extra_info")
        if not self.gec_config.enable or not is_training_rollout(kwargs):
            return await self._run_single_turn(row_sampling_params(sampling_params, extra_info), kwargs)
        # a GEC training row: what GEC cannot use in the row's data is counted (gec/errors), the driver stops the run
        # past algorithm.gec.max_error_frac (v1 would otherwise log a failed loop and drop or evict its group)
        sampling_params = row_sampling_params(sampling_params, extra_info, ignore_unknown=True)
        plan = self._plan(kwargs)
        unknown = unknown_sampling_keys(extra_info)
        if unknown:
            plan.errors.append(f"unknown extra_info.sampling_params key(s) {unknown} (allowed: "
                               f"{list(ROW_SAMPLING_KEYS)}), left out")
        first_params = _with_max_tokens(sampling_params, plan.first_budget)
        seat = self._group_seat(kwargs)
        try:  # until the sample reports its first attempt, a failure here must resolve its group (edit_scope)
            output = await self._run_single_turn(first_params, kwargs)
            finish = self._hint if self.gec_config.mode == "hint" else self._correct
            return await finish(output, sampling_params, kwargs, plan, first_params["max_tokens"], seat)
        except BaseException as error:  # cancellation included
            if seat is not None:
                seat.failed(error)  # no-op once it reported
            raise

    def _group_seat(self, kwargs: dict) -> _Seat | None:
        """The sample's seat in its group under ``edit_scope=all_wrong_groups``, or under mode ``hint`` at a step
        with hints due (None otherwise)."""
        cfg = self.gec_config
        if cfg.mode == "hint":
            if not hints.hints_due(kwargs.get("global_steps"), cfg.hint_warmup_steps):
                return None
        elif cfg.edit_scope != "all_wrong_groups":
            return None
        if kwargs.get("uid") is None:
            raise ValueError("gec_agent: algorithm.gec.edit_scope=all_wrong_groups (and mode=hint) needs each row's "
                             "uid (verl's trainers pass it to the agent loop); this row has none")
        steps = kwargs.get("global_steps")  # with the uid: a prompt drawn again at another step is another group
        key = (str(kwargs["uid"]), steps.item() if hasattr(steps, "item") else steps)
        return _Seat(_FIRST_ATTEMPTS, key, int(self.rollout_config.n), self.gec_config.group_wait_s)

    async def _correct(self, output: AgentLoopOutput, sampling_params: dict, kwargs: dict, plan: _Plan,
                       first_cap: int, seat: _Seat | None) -> AgentLoopOutput:
        cfg = self.gec_config
        prompt_ids = list(output.prompt_ids)
        response_ids = list(output.response_ids)
        score_before, reward_info = await self._score(prompt_ids, response_ids, kwargs, output.extra_fields,
                                                      output.num_turns)
        correct_before = gec.response_is_correct(cfg, score_before, reward_info)
        core, terminator = gec.split_terminal(response_ids, self._stop_ids())
        group_all_wrong = True if seat is None else await seat.all_wrong(correct_before)
        branch = gec.choose_branch(
            cfg,
            correct=correct_before,
            prompt_len=len(prompt_ids),
            has_solution=plan.solution_ids is not None,
            solution_fits=plan.solution_fits,
            rng=self._rng(kwargs, output.extra_fields.get("global_steps")),
            own_tokens=len(core),
            group_all_wrong=group_all_wrong,
        )
        errors = list(plan.errors)
        if branch in gec.ANSWER_BRANCHES and plan.answer_ids is None:
            branch = gec.BRANCH_NO_GROUND_TRUTH  # left unedited, counted (gec/errors)
            errors.append(f"the row has no reward_model.ground_truth and drew the answer injection ({branch})")
        elif branch in gec.ANSWER_BRANCHES and len(core) + len(plan.answer_ids) + 1 > self.response_length:
            branch = gec.BRANCH_ANSWER_NO_ROOM  # never a cut template (no boxed answer, no EOS)
        fields = self._first_attempt_fields(branch, score_before, correct_before, response_ids,
                                            first_cap=first_cap, terminator=terminator, errors=errors)
        if branch not in gec.EDIT_BRANCHES:
            return self._as_sampled(output, fields, score_before, reward_info)

        core_seg = gec.Segment(
            ids=core,
            injected=False,
            kind=gec.SPAN_POLICY,
            mask=list(output.response_mask[: len(core)]),
            logprobs=list(output.response_logprobs[: len(core)]) if output.response_logprobs else None,
        )
        continuation_cut = False
        cont_routing = None
        if branch == gec.BRANCH_REFLECT:
            cue_ids = plan.cue_ids
            budget = gec.continuation_budget(self.response_length, len(core) + len(cue_ids),
                                             cfg.max_continuation_tokens)
            cont_ids, cont_lps = [], None
            if budget > 0:
                cont_ids, cont_lps, cont_routing = await self._continue(prompt_ids + core + cue_ids, budget,
                                                                        sampling_params, output, kwargs)
                cont_ids = cont_ids[:budget]
                cont_lps = cont_lps[:budget] if cont_lps is not None else None
            # cut by the response budget rather than by max_continuation_tokens (or no room at all)
            if budget < cfg.max_continuation_tokens:
                stopped = bool(cont_ids) and gec.split_terminal(cont_ids, self._stop_ids())[1] is not None
                continuation_cut = budget == 0 or (len(cont_ids) >= budget and not stopped)
            segments = [core_seg, gec.Segment(cue_ids, injected=True, kind=gec.SPAN_CUE),
                        gec.Segment(cont_ids, injected=False, logprobs=cont_lps, kind=gec.SPAN_CONTINUATION)]
            fields[gec.KEY_CONTINUATION_TOKENS] = len(cont_ids)
        elif branch in gec.ANSWER_BRANCHES:
            segments = [core_seg, gec.Segment(plan.answer_ids, injected=True, kind=gec.SPAN_ANSWER),
                        gec.Segment([self._eos_id(terminator)], injected=True, kind=gec.SPAN_EOS)]
        else:  # solution: the reference solution replaces the whole response
            segments = [gec.Segment(plan.solution_ids, injected=True, kind=gec.SPAN_SOLUTION),
                        gec.Segment([self._eos_id(terminator)], injected=True, kind=gec.SPAN_EOS)]
            if self._dumps_rollouts():  # the final response no longer holds the first one
                fields[gec.KEY_FIRST_RESPONSE_IDS] = response_ids

        built = gec.assemble_response(
            segments,
            response_length=self.response_length,
            mask_injected=cfg.mask_injected,
            with_logprobs=output.response_logprobs is not None,
        )
        if branch == gec.BRANCH_REFLECT:
            fields[gec.KEY_CONTINUATION_TOKENS] = built.segment_lengths[2]
        fields[gec.KEY_INJECTED_TOKENS] = built.injected_tokens
        fields[gec.KEY_SPANS] = built.spans
        fields[gec.KEY_TRUNCATED] = bool(built.truncated or continuation_cut)

        output.response_ids = built.response_ids
        output.response_mask = built.response_mask
        output.response_logprobs = built.response_logprobs
        if output.routed_experts is not None:
            # router replay: the first generation's routing up to the kept core; a reflection continues with the
            # continuation request's (prompt + core + cue + continuation); verl zero-fills what has none
            prefix = len(prompt_ids) + built.policy_prefix_tokens
            continued = cont_routing if branch == gec.BRANCH_REFLECT else None
            output.routed_experts = join_routing(output.routed_experts, continued, prefix,
                                                 len(prompt_ids) + len(built.response_ids))
        output.extra_fields.update(fields)
        return output

    # ------------------------------------------------------------ mode hint (docs/hints.md; rollout/hints.py)

    async def _hint(self, output: AgentLoopOutput, sampling_params: dict, kwargs: dict, plan: _Plan,
                    first_cap: int, seat: _Seat | None) -> AgentLoopOutput:
        """Mode ``hint``: the first attempt, scored, reported to its group (``seat``; None: hints not due); in an
        all-wrong group, the hinted samples its scope asks of this member (:meth:`_hinted_samples`), and the one
        :func:`hints.final_hint_level` picks replaces the first attempt. Every row gets ``hints.HINT_EXTRA_KEYS``
        and, as a response GEC leaves as sampled, GEC's fields."""
        cfg = self.gec_config
        response_ids = list(output.response_ids)
        score, reward_info = await self._score(list(output.prompt_ids), response_ids, kwargs, output.extra_fields,
                                               output.num_turns)
        correct = gec.response_is_correct(cfg, score, reward_info)
        all_wrong = seat is not None and await seat.all_wrong(correct)
        branch = gec.BRANCH_GROUP_NOT_ALL_WRONG if seat is not None and not (correct or all_wrong) else gec.BRANCH_NONE
        fields = self._first_attempt_fields(branch, score, correct, response_ids, first_cap=first_cap,
                                            terminator=gec.split_terminal(response_ids, self._stop_ids())[1],
                                            errors=plan.errors)
        fields.update({hints.KEY_HINT_LEVEL: -1, hints.KEY_HINT_ATTEMPTS: [], hints.KEY_HINT_SKIP: "",
                       hints.KEY_HINT_TOO_LONG: 0})
        if not all_wrong:
            return self._as_sampled(output, fields, score, reward_info)
        row = hints.plan_row_hints(
            gec.reference_solution(kwargs.get("extra_info"), cfg.solution_key), fractions=cfg.hint_levels,
            rule=cfg.hint_rule, hinted_prompt_ids=self._hinted_prompt_builder(output, kwargs),
            max_prompt_length=self.prompt_length)
        fields.update({hints.KEY_HINT_SKIP: row.skip, hints.KEY_HINT_TOO_LONG: row.too_long})
        if not row.levels or not hints.samples_with_hints(cfg.hint_scope, seat.number):
            return self._as_sampled(output, fields, score, reward_info)
        samples = await self._hinted_samples(row.levels, output, first_cap, sampling_params, kwargs, seat)
        fields[hints.KEY_HINT_ATTEMPTS] = [[s.level, s.correct] for s in samples]
        final = hints.final_hint_level(cfg.hint_scope, [s.succeeded for s in samples])
        if final is None:  # scope one, no level right: the member keeps its first attempt (Scaf-GRPO)
            return self._as_sampled(output, fields, score, reward_info)
        kept = samples[final]
        fields[hints.KEY_HINT_LEVEL] = kept.level
        if self._dumps_rollouts():  # the final response no longer holds the first one
            fields[gec.KEY_FIRST_RESPONSE_IDS] = response_ids
        return self._as_sampled(kept.output, fields, kept.score, kept.reward_info)

    async def _hinted_samples(self, levels: list[hints.HintLevel], output: AgentLoopOutput, budget: int,
                              sampling_params: dict, kwargs: dict, seat: _Seat) -> list[_HintedSample]:
        """This member's hinted samples, lowest level first (:func:`hints.next_hint_level`), until a level succeeds:
        scope ``one``: its own sample is right; ``all``: a member of the group is right at that level (each level a
        barrier of its own, the group's key + ``("hint", level)``)."""
        samples: list[_HintedSample] = []
        while (i := hints.next_hint_level(len(levels), [s.succeeded for s in samples])) is not None:
            level = levels[i]
            if self.gec_config.hint_scope == "one":
                sample = await self._hinted_sample(level, output, budget, sampling_params, kwargs)
                sample.succeeded = sample.correct
            else:
                level_seat = seat.then("hint", level.level)
                try:  # until it reports, a failure must resolve the level's barrier for its siblings
                    sample = await self._hinted_sample(level, output, budget, sampling_params, kwargs)
                    sample.succeeded = not await level_seat.all_wrong(sample.correct)
                except BaseException as error:
                    level_seat.failed(error)  # no-op once it reported
                    raise
            samples.append(sample)
        return samples

    async def _hinted_sample(self, level: hints.HintLevel, output: AgentLoopOutput, budget: int,
                             sampling_params: dict, kwargs: dict) -> _HintedSample:
        """The policy's sample given ``level``'s hinted prompt, scored: the output verl's single-turn loop builds
        for that prompt (the hint is prompt; the response, its mask and rollout log-probs are the generation's)."""
        token_output = await self._generate(level.prompt_ids, budget, sampling_params, output, kwargs,
                                            suffix=f"-hint{level.level}")
        n = min(len(token_output.token_ids), self.response_length)
        routing = getattr(token_output, "routed_experts", None)
        hinted = output.model_copy(update={
            "prompt_ids": list(level.prompt_ids),
            "response_ids": list(token_output.token_ids[:n]),
            "response_mask": [1] * n,
            "response_logprobs": list(token_output.log_probs[:n]) if token_output.log_probs else None,
            "routed_experts": routing[: len(level.prompt_ids) + self.response_length] if routing is not None else None,
            "extra_fields": {**output.extra_fields, **(token_output.extra_fields or {})},
        })
        score, reward_info = await self._score(hinted.prompt_ids, hinted.response_ids, kwargs, hinted.extra_fields,
                                               hinted.num_turns)
        correct = gec.response_is_correct(self.gec_config, score, reward_info)
        return _HintedSample(level.level, hinted, float(score), reward_info, correct)

    def _hinted_prompt_builder(self, output: AgentLoopOutput, kwargs: dict):
        """The placement's hinted prompt ids for a hint text: ``assistant_prefix``: the row's prompt ids then the
        hint's; ``user``: verl's prompt builder (as ``SingleTurnAgentLoop.run``, without its length cap) on the
        row's messages with ``hint_template`` appended to the last user message."""
        cfg = self.gec_config
        if cfg.hint_placement == "assistant_prefix":
            return lambda text: hints.assistant_prefix_prompt_ids(output.prompt_ids, self._encode(text))
        mm = output.multi_modal_data or {}

        def user(text: str) -> list[int]:
            messages = hints.user_hint_messages(list(kwargs["raw_prompt"]), cfg.hint_template, text)
            return list(self.continuous_token_builder.build_initial_tokens(
                messages, images=mm.get("images"), videos=mm.get("videos"), audios=mm.get("audios")))

        return user

    def _first_attempt_fields(self, branch: str, score: float, correct: bool, response_ids: list[int], *,
                              first_cap: int, terminator: int | None, errors: list[str]) -> dict:
        """The GEC fields (``gec.EXTRA_KEYS`` but the spans) of a sample's first attempt and its branch."""
        fields = {
            gec.KEY_BRANCH: branch,
            gec.KEY_SCORE_BEFORE: float(score),
            gec.KEY_CORRECT_BEFORE: bool(correct),
            gec.KEY_CONTINUATION_TOKENS: 0,
            gec.KEY_INJECTED_TOKENS: 0,
            gec.KEY_TRUNCATED: False,
            gec.KEY_RESPONSE_LEN_BEFORE: len(response_ids),
            gec.KEY_FIRST_HIT_CAP: len(response_ids) >= first_cap and terminator is None,
            gec.KEY_ERROR: "; ".join(errors),
        }
        if self._dumps_rollouts():  # on every row: verl's DataProto.concat needs the same columns in every chunk
            fields[gec.KEY_FIRST_RESPONSE_IDS] = None
        return fields

    @staticmethod
    def _as_sampled(output: AgentLoopOutput, fields: dict, score: float, reward_info: dict) -> AgentLoopOutput:
        """``output`` returned with its response as the policy sampled it (every token a policy token) and its
        score final."""
        fields[gec.KEY_SPANS] = [[gec.SPAN_POLICY, 0, len(output.response_ids)]] if output.response_ids else []
        output.extra_fields.update(fields)
        # unedited: verl's reward loop would compute the same score again (the same manager's run_single on the
        # same input; no reward model with GEC, run_checks.check_gec_reward)
        output.reward_score = float(score)
        output.extra_fields["reward_extra_info"] = reward_info
        return output

    async def _continue(self, ids: list[int], budget: int, sampling_params: dict, output: AgentLoopOutput,
                        kwargs: dict) -> tuple[list[int], list[float] | None, Any]:
        """The policy's continuation of ``ids`` (original prompt + core + cue), at most ``budget`` tokens:
        (token ids, log-probs or None, routed experts or None).

        Sent with the first generation's request id: verl's load balancer routes by it (sticky sessions), so the
        continuation lands on the replica that holds prompt + core in its prefix cache."""
        token_output = await self._generate(ids, budget, sampling_params, output, kwargs)
        _merge_token_extra(output.extra_fields, token_output.extra_fields or {})
        lps = list(token_output.log_probs) if token_output.log_probs else None
        return list(token_output.token_ids), lps, getattr(token_output, "routed_experts", None)

    async def _generate(self, ids: list[int], budget: int, sampling_params: dict, output: AgentLoopOutput,
                        kwargs: dict, suffix: str = ""):
        """One more generation of this sample from ``ids``, at most ``budget`` tokens (verl's ``TokenOutput``),
        with the first generation's multi-modal inputs; its request id is the first generation's plus ``suffix``."""
        params = dict(sampling_params)
        params.pop("max_new_tokens", None)
        params["max_tokens"] = int(budget)
        priority = int(kwargs.get("priority", 0) or 0)
        request_id = self._first_request_id
        if request_id is None:  # the first generation went by another path: a request of its own
            request_id = (f"det-{priority}-gec" if getattr(self.rollout_config, "full_determinism", False)
                          else uuid4().hex)
        request_id = f"{request_id}{suffix}"
        mm = output.multi_modal_data or {}
        optional = {}
        # verl 0.9.1's SGLang video payload; verl main (0.10.0.dev) has no such field nor generate argument
        mm_processor_output = getattr(output, "mm_processor_output", None)
        if mm_processor_output is not None:
            optional["mm_processor_output"] = mm_processor_output
        start = time.perf_counter()
        token_output = await self.server_manager.generate(
            request_id=request_id,
            prompt_ids=ids,
            sampling_params=params,
            image_data=mm.get("images"),
            audio_data=mm.get("audios"),
            video_data=mm.get("videos"),
            mm_processor_kwargs=output.mm_processor_kwargs,
            priority=priority,
            **optional,
        )
        output.metrics.generate_sequences += time.perf_counter() - start
        return token_output
