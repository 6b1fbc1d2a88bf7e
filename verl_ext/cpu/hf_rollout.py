"""``hf`` rollout backend: generation with plain transformers, for machines without vLLM/SGLang (CPU).

Selected with ``actor_rollout_ref.rollout.name=hf``. verl 0.9.1 only registers vllm/sglang/trtllm
(``RolloutReplicaRegistry`` in ``verl.workers.rollout.replica``, ``_ROLLOUT_REGISTRY`` in
``verl.workers.rollout.base``) and always runs rollout through the async agent-loop server path, so this module
plugs into the same two registries those backends use:

* :class:`HFReplica` (``RolloutReplicaRegistry``, "hf"): starts one :class:`HFRolloutServer` Ray actor per replica
  (0 CPU / 0 GPU, named ``hf_server_<replica>_0``), whose handle the agent loop calls ``generate`` on.
* :class:`HFServerAdapter` (``_ROLLOUT_REGISTRY[("hf", "async")]``): lives in each actor/rollout worker. The
  "naive" checkpoint engine calls ``update_weights((name, tensor) generator, global_steps=...)`` on it after every
  actor update; the leader rank of each replica copies the tensors to CPU and sends them to its server.

The server batches concurrent requests: requests that arrive within a short window (default 10 ms after the
last arrival, at most 100 ms, at most ``rollout.max_num_seqs``) share one left-padded, KV-cached decode loop, so
the ``n`` samples of a prompt (and all prompts of a step) are generated together, not one after another. Which
requests share a batch depends on timing (machine load), so by default a batch is computed batch-invariantly
(:func:`generate_batch`): each prompt is left-padded to a width that depends on its own length only (the next
multiple of ``pad_multiple`` above it), requests of different widths decode in separate loops, every linear layer
runs one GEMM per request, on one intra-op thread. A request's logits are then bit for bit the ones it gets alone.

Sampling per request: temperature, top_k, top_p, greedy when temperature <= 0, stop at EOS (unless
``rollout.ignore_eos``) or after ``max_tokens``. Each request samples from its own generator, seeded by
``rollout.seed`` and the request's identity (weight version, prompt tokens, and verl's ``det-<row>`` request name
under ``rollout.full_determinism``, else the request's rank among identical prompts). With the batch-invariant
computation a request's tokens and log-probs do not depend on arrival order or on the other requests in its batch,
so one config and seed give one run. Log-probs follow vLLM's ``logprobs_mode`` (verl's default
``processed_logprobs``): log-softmax of the distribution actually sampled from, i.e. logits / temperature with
top-k/top-p filtering applied in vLLM's order and nucleus rule (with the default top_k=-1, top_p=1 this is exactly
what the actor recomputes as ``old_log_probs``). ``raw_logprobs`` gives log-softmax of the unscaled logits.

``abort_all_requests`` returns the queued requests as ``stop_reason="aborted"`` and closes the admission gate as
verl's vLLM server does: later requests wait for ``resume_generation`` (or, with ``reject_request=True``, return
aborted at once). A batch already decoding finishes (results are complete, from the weights it started with).

Optional knobs, under ``actor_rollout_ref.rollout.engine_kwargs.hf`` (``+`` prefix on the command line):
``dtype`` (default "float32"), ``batch_window_ms`` (10), ``max_batch_wait_ms`` (100), ``batch_invariant`` (true;
false: one loop padded to the batch's longest prompt with GEMMs over the whole batch, faster, but a request's last
float bits, and now and then a sampled token, depend on its batch), ``pad_multiple`` (default
``rollout.prompt_length``), ``num_threads`` (torch intra-op threads in the server, used with
``batch_invariant: false``; default: leave torch's default).

Unsupported: multimodal inputs, LoRA adapter sync without merge (``peft_config``), delta weight formats, and
repetition/presence/frequency penalties and min_p (a request with a non-neutral value is refused).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import inspect
import logging
import os
import time
from dataclasses import dataclass
from typing import Any

import ray
import torch
from verl.workers.rollout.base import _ROLLOUT_REGISTRY, BaseRollout
from verl.workers.rollout.replica import RolloutReplica, RolloutReplicaRegistry, TokenOutput

from verl_ext.config import config_value
from verl_ext.cpu import finish_deferred_registration

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))

ROLLOUT_NAME = "hf"
_SERVER_PREFIX = "hf_"


def register_hf_rollout() -> None:
    """Register the "hf" backend in verl's replica and adapter registries (idempotent)."""
    RolloutReplicaRegistry.register(ROLLOUT_NAME, lambda: HFReplica)
    _ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = f"{__name__}.HFServerAdapter"


def _server_name(replica_rank: int, node_rank: int = 0, kind: str = "", name_suffix: str = "") -> str:
    """Ray actor name of a replica's server; the adapter looks it up with the same function."""
    kind = f"{kind}_" if kind else ""
    return f"{_SERVER_PREFIX}server_{kind}{replica_rank}_{node_rank}{name_suffix}"


def _engine_kwargs(config) -> dict:
    return dict(config_value(config, f"engine_kwargs.{ROLLOUT_NAME}", None) or {})


# ---------------------------------------------------------------------------------------------------------------
# Sampling and the batched decode loop (pure torch; unit-testable without Ray)
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class GenRequest:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_k: int = -1
    top_p: float = 1.0
    ignore_eos: bool = False
    seed: int | None = None  # this request's own sampling stream (request_seed); None: the batch's generator


def request_seed(seed: int, *identity: Any) -> int:
    """A 63-bit sampling seed from the rollout seed and a request's identity (stable across processes and runs)."""
    digest = hashlib.sha256(repr((int(seed), *identity)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def sample_next_tokens(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor,
    top_p: torch.Tensor,
    raw_logprobs: bool = False,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row with per-row temperature/top_k/top_p; return (tokens, log-probs).

    ``uniforms`` (one U[0, 1) number per row) samples by inverse CDF, so a row's token depends on its own number and
    distribution only, not on the other rows of the batch; without it ``torch.multinomial`` draws from ``generator``.

    Rows with temperature <= 0 are greedy (argmax of the raw logits, log-probs of softmax(logits)), as in vLLM.
    top_k <= 0 or >= vocab means no top-k; top_p >= 1 means no top-p. The log-prob of the chosen token is taken
    from the distribution it was sampled from (temperature-scaled and filtered), vLLM's ``processed_logprobs``;
    with ``raw_logprobs`` it is log_softmax of the unscaled logits instead.
    """
    logits = logits.float()
    vocab = logits.size(-1)
    greedy = temperature <= 0
    temp = torch.where(greedy, torch.ones_like(temperature), temperature).unsqueeze(-1)
    scaled = logits / temp
    neg_inf = torch.finfo(scaled.dtype).min

    use_k = (~greedy) & (top_k > 0) & (top_k < vocab)
    if bool(use_k.any()):
        k = torch.where(use_k, top_k, torch.full_like(top_k, vocab)).clamp(1, vocab)
        kth = scaled.sort(dim=-1, descending=True).values.gather(-1, (k - 1).unsqueeze(-1))
        scaled = scaled.masked_fill(use_k.unsqueeze(-1) & (scaled < kth), neg_inf)

    use_p = (~greedy) & (top_p < 1.0)
    if bool(use_p.any()):
        sorted_vals, sorted_idx = scaled.sort(dim=-1, descending=True)
        probs = torch.softmax(sorted_vals, dim=-1)
        # nucleus as in vLLM / HF: drop a token once the mass before it reaches top_p; the top token always stays
        drop = ((probs.cumsum(-1) - probs) >= top_p.unsqueeze(-1)) & use_p.unsqueeze(-1)
        drop[..., 0] = False
        sorted_vals = sorted_vals.masked_fill(drop, neg_inf)
        scaled = torch.empty_like(scaled).scatter_(-1, sorted_idx, sorted_vals)

    logprobs = torch.log_softmax(scaled, dim=-1)
    probs = logprobs.exp()
    if uniforms is not None:
        cdf = probs.cumsum(-1)
        target = uniforms.to(cdf.dtype).unsqueeze(-1) * cdf[..., -1:]
        sampled = torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=vocab - 1)
        # never a zero-probability token (a cdf step of 0 at the boundary)
        zero = probs.gather(-1, sampled.unsqueeze(-1)).squeeze(-1) <= 0
        if bool(zero.any()):
            sampled = torch.where(zero, probs.argmax(-1), sampled)
    else:
        sampled = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
    tokens = torch.where(greedy, logits.argmax(-1), sampled)
    if raw_logprobs:
        logprobs = torch.log_softmax(logits, dim=-1)
    return tokens, logprobs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


@contextlib.contextmanager
def _per_request_linears(model: torch.nn.Module):
    """While open, every ``nn.Linear`` of ``model`` runs one GEMM per batch row (:func:`_per_request_linear`).

    A GEMM over the whole batch rounds a row differently depending on the batch's size and the row's place in it
    (BLAS picks its kernels by the number of rows); one matrix per request gives every request the same GEMM shape
    whatever else is in its batch.
    """
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    for m in linears:
        m.forward = functools.partial(_per_request_linear, m)
    try:
        yield
    finally:
        for m in linears:
            del m.forward


def _per_request_linear(layer: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if x.dim() != 3:
        return torch.nn.functional.linear(x, layer.weight, layer.bias)
    out = torch.bmm(x, layer.weight.t().expand(x.size(0), -1, -1))  # [batch, tokens, in] x [batch, in, out]
    return out if layer.bias is None else out + layer.bias


def padded_width(prompt_len: int, pad_multiple: int) -> int:
    """The batch-invariant prompt width: the smallest multiple of ``pad_multiple`` above the prompt's length (at least
    one pad column, so the attention mask is never all ones and no model drops it for a causal shortcut)."""
    return pad_multiple * (prompt_len // pad_multiple + 1)


@contextlib.contextmanager
def _one_thread():
    """Intra-op parallelism splits some kernels (SDPA's decode step) by batch size: decode on one thread."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@torch.inference_mode()
def generate_batch(
    model: torch.nn.Module,
    requests: list[GenRequest],
    eos_token_ids: list[int],
    pad_token_id: int,
    raw_logprobs: bool = False,
    generator: torch.Generator | None = None,
    batch_invariant: bool = True,
    pad_multiple: int = 32,
) -> list[tuple[list[int], list[float]]]:
    """Generate for all requests: left-pad prompts, prefill once, then decode with the KV cache.

    ``batch_invariant`` (default) makes a request's logits bit for bit independent of the other requests in the
    batch: requests are grouped by :func:`padded_width`, each group decodes on its own (same key length for every
    request at every step), linear layers run one GEMM per request (:func:`_per_request_linears`), on one intra-op
    thread. Off: one loop padded to the batch's longest prompt, GEMMs over the whole batch (faster; a request's
    last float bits, and so rarely a sampled token, depend on its batch).

    Requests with a ``seed`` sample from their own generator (one uniform number per token, inverse CDF); the others
    draw from ``generator``. Returns, per request, (response token ids including the EOS it stopped on, per-token
    log-probs).
    """
    if not batch_invariant:
        width = max(len(r.prompt_ids) for r in requests)
        return _decode(model, requests, width, eos_token_ids, pad_token_id, raw_logprobs, generator)
    groups: dict[int, list[int]] = {}
    for i, r in enumerate(requests):
        groups.setdefault(padded_width(len(r.prompt_ids), pad_multiple), []).append(i)
    results: list = [None] * len(requests)
    with _one_thread(), _per_request_linears(model):
        for width, rows in sorted(groups.items()):
            group = [requests[i] for i in rows]
            for i, res in zip(rows, _decode(model, group, width, eos_token_ids, pad_token_id, raw_logprobs, generator)):
                results[i] = res
    return results


def _last_logits_only(model: torch.nn.Module) -> dict:
    """Prefill computes the last position's logits only, where the model takes HF's ``logits_to_keep``."""
    return {"logits_to_keep": 1} if "logits_to_keep" in inspect.signature(model.forward).parameters else {}


def _decode(
    model: torch.nn.Module,
    requests: list[GenRequest],
    width: int,
    eos_token_ids: list[int],
    pad_token_id: int,
    raw_logprobs: bool,
    generator: torch.Generator | None,
) -> list[tuple[list[int], list[float]]]:
    """One left-padded (to ``width``), KV-cached decode loop over ``requests``."""
    device = next(model.parameters()).device
    bsz = len(requests)
    lengths = [len(r.prompt_ids) for r in requests]
    input_ids = torch.full((bsz, width), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((bsz, width), dtype=torch.long)
    for i, r in enumerate(requests):
        input_ids[i, width - lengths[i] :] = torch.tensor(r.prompt_ids, dtype=torch.long)
        attention_mask[i, width - lengths[i] :] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)

    temperature = torch.tensor([float(r.temperature) for r in requests])
    top_k = torch.tensor([int(r.top_k) if r.top_k is not None else -1 for r in requests], dtype=torch.long)
    top_p = torch.tensor([float(r.top_p) if r.top_p is not None else 1.0 for r in requests])
    max_new = torch.tensor([max(1, int(r.max_tokens)) for r in requests], dtype=torch.long)
    stop_on_eos = torch.tensor([not r.ignore_eos for r in requests])
    eos = torch.tensor(sorted(set(eos_token_ids)), dtype=torch.long)
    steps = int(max_new.max())
    seeded = [torch.Generator().manual_seed(int(r.seed)) if r.seed is not None else None for r in requests]
    own = any(g is not None for g in seeded)

    out_tokens = torch.full((bsz, steps), pad_token_id, dtype=torch.long)
    out_logprobs = torch.zeros((bsz, steps))
    out_len = torch.zeros(bsz, dtype=torch.long)
    done = torch.zeros(bsz, dtype=torch.bool)

    out = model(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        position_ids=position_ids.to(device),
        use_cache=True,
        **_last_logits_only(model),
    )
    past = out.past_key_values
    logits = out.logits[:, -1, :]
    next_pos = position_ids[:, -1:] + 1
    for step in range(steps):
        uniforms = None
        if own:
            shared = torch.rand(bsz, generator=generator)
            uniforms = torch.stack([torch.rand(1, generator=g)[0] if g is not None else shared[i]
                                    for i, g in enumerate(seeded)])
        tokens, logprobs = sample_next_tokens(
            logits.cpu(), temperature, top_k, top_p, raw_logprobs=raw_logprobs, generator=generator,
            uniforms=uniforms,
        )
        active = ~done
        out_tokens[active, step] = tokens[active]
        out_logprobs[active, step] = logprobs[active]
        out_len += active.long()
        done = done | (active & stop_on_eos & torch.isin(tokens, eos)) | (out_len >= max_new)
        if bool(done.all()):
            break
        feed = torch.where(done, torch.full_like(tokens, pad_token_id), tokens).unsqueeze(-1)
        attention_mask = torch.cat([attention_mask, torch.ones((bsz, 1), dtype=torch.long)], dim=-1)
        out = model(
            input_ids=feed.to(device),
            attention_mask=attention_mask.to(device),
            position_ids=next_pos.to(device),
            past_key_values=past,
            use_cache=True,
        )
        past = out.past_key_values
        logits = out.logits[:, -1, :]
        next_pos = next_pos + 1

    return [(out_tokens[i, : out_len[i]].tolist(), out_logprobs[i, : out_len[i]].tolist()) for i in range(bsz)]


# ---------------------------------------------------------------------------------------------------------------
# Server actor
# ---------------------------------------------------------------------------------------------------------------


# sampling parameters the hf backend does not implement, with the value at which they change nothing
_NEUTRAL_SAMPLING_PARAMS = {"repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                            "min_p": 0.0}


class HFRolloutServer:
    """Token-in/token-out generation server for one replica (wrapped with ``ray.remote`` by :class:`HFReplica`).

    Implements what verl calls on rollout servers: ``generate`` (called by ``LLMServerClient.generate``), the
    lifecycle methods of ``RolloutReplica`` (no-ops on CPU: nothing to free), and ``load_weights``.
    """

    def __init__(self, config, model_config, replica_rank: int = 0):
        from transformers import AutoModelForCausalLM

        self.config = config
        self.replica_rank = replica_rank
        self.global_steps: int | None = None
        opts = _engine_kwargs(config)
        if opts.get("num_threads"):
            torch.set_num_threads(int(opts["num_threads"]))
        self.batch_window_s = float(opts.get("batch_window_ms", 10)) / 1000.0
        self.max_batch_wait_s = float(opts.get("max_batch_wait_ms", 100)) / 1000.0
        self.max_num_seqs = int(config_value(config, "max_num_seqs", 256))
        self.raw_logprobs = config_value(config, "logprobs_mode", "processed_logprobs") in ("raw_logprobs", "raw_logits")
        self.ignore_eos = bool(config_value(config, "ignore_eos", False))
        self.prompt_length = int(config_value(config, "prompt_length", 512))
        self.batch_invariant = bool(opts.get("batch_invariant", True))
        self.pad_multiple = int(opts.get("pad_multiple") or self.prompt_length)
        self.response_length = int(config_value(config, "response_length", 512))
        self.max_model_len = int(config_value(config, "max_model_len", 0) or (self.prompt_length + self.response_length))
        self.seed = int(config_value(config, "seed", 0) or 0)
        self._occurrences: dict[tuple, int] = {}  # identity -> requests seen with it at the current weights

        path = config_value(model_config, "local_path") or config_value(model_config, "path")
        trust_remote_code = bool(config_value(model_config, "trust_remote_code", False))
        dtype = getattr(torch, str(opts.get("dtype", "float32")))
        self.model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, attn_implementation="sdpa", trust_remote_code=trust_remote_code
        ).eval()
        self.eos_token_ids, self.pad_token_id = self._special_ids(model_config, self.model)

        self._queue: list[tuple[GenRequest, asyncio.Future]] = []
        self._batcher: asyncio.Task | None = None
        self._lock: asyncio.Lock | None = None  # created lazily on the actor's event loop
        # admission gate, as verl's vLLM server: closed by abort_all_requests, opened by resume_generation
        self._paused = False
        self._rejecting = False
        self._resumed: asyncio.Event | None = None  # created lazily on the actor's event loop
        self.num_batches = 0
        self.num_requests = 0

    @staticmethod
    def _special_ids(model_config, model) -> tuple[list[int], int]:
        eos: list[int] = []
        gen = config_value(model_config, "generation_config") or getattr(model, "generation_config", None)
        tok = config_value(model_config, "tokenizer")
        for src in (gen, model.config, tok):
            value = getattr(src, "eos_token_id", None) if src is not None else None
            if value is None:
                continue
            eos.extend(value if isinstance(value, (list, tuple)) else [value])
        pad = None
        for src in (tok, gen, model.config):
            pad = getattr(src, "pad_token_id", None) if src is not None else None
            if pad is not None:
                break
        eos = sorted({int(e) for e in eos})
        if pad is None:
            pad = eos[0] if eos else 0
        return eos, int(pad)

    async def ready(self) -> bool:
        return True

    # ----- generation ------------------------------------------------------------------------------------------

    def _make_request(self, prompt_ids: list[int], sampling_params: dict[str, Any]) -> GenRequest:
        params = dict(sampling_params or {})
        for key, neutral in _NEUTRAL_SAMPLING_PARAMS.items():  # refuse, rather than silently sample differently
            if params.get(key) not in (None, neutral):
                raise NotImplementedError(f"hf rollout backend does not support {key}={params[key]!r}")
        prompt_ids = [int(t) for t in prompt_ids]
        room = self.max_model_len - len(prompt_ids)
        if room < 1:
            raise ValueError(
                f"Prompt length ({len(prompt_ids)}) leaves no room within max_model_len {self.max_model_len}"
            )
        # same default and clamping as verl's vLLM server (``vLLMHttpServer.generate``)
        max_tokens = params.get("max_tokens", params.get("max_new_tokens"))
        if max_tokens is None:
            max_tokens = min(self.response_length, self.prompt_length + self.response_length - len(prompt_ids))
        max_tokens = max(1, min(int(max_tokens), room))
        temperature = params.get("temperature", 1.0)
        return GenRequest(
            prompt_ids=prompt_ids,
            max_tokens=max_tokens,
            temperature=1.0 if temperature is None else float(temperature),
            top_k=int(params.get("top_k", -1) if params.get("top_k") is not None else -1),
            top_p=float(params.get("top_p", 1.0) if params.get("top_p") is not None else 1.0),
            ignore_eos=bool(params.get("ignore_eos", self.ignore_eos)),
        )

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: list[Any] | None = None,
        video_data: list[Any] | None = None,
        **kwargs: Any,
    ) -> TokenOutput:
        if image_data is not None or video_data is not None or kwargs.get("audio_data") is not None:
            raise NotImplementedError("hf rollout backend supports text-only prompts")
        request = self._make_request(prompt_ids, sampling_params)
        request.seed = self._request_seed(request_id, request.prompt_ids)
        while self._paused:  # behind a closed gate: wait for resume_generation, or fail when rejecting
            if self._rejecting:
                return self._aborted_output()
            await self._resume_event().wait()
        future = asyncio.get_running_loop().create_future()
        self._queue.append((request, future))
        if self._batcher is None or self._batcher.done():
            self._batcher = asyncio.create_task(self._run_batches())
        result = await future
        if result is None:  # aborted before it ran
            return self._aborted_output()
        token_ids, log_probs = result
        want_logprobs = bool((sampling_params or {}).get("logprobs", False))
        return TokenOutput(
            token_ids=token_ids,
            log_probs=log_probs if want_logprobs else None,
            stop_reason="completed",
            extra_fields={"global_steps": self.global_steps},
        )

    def _request_seed(self, request_id: Any, prompt_ids: list[int]) -> int:
        """The request's sampling seed: ``rollout.seed``, the weight version, the prompt's tokens, and which request
        it is. verl's agent loops name a request ``det-<row>`` under ``rollout.full_determinism`` (the row's position
        in the step's batch); otherwise the name is a fresh uuid and the k-th request with the same prompt at the same
        weights is told apart by k (identical prompts then swap samples with arrival order, nothing else does)."""
        rid = str(request_id) if request_id is not None else ""
        name = rid if rid.startswith("det-") else None
        identity = (self.global_steps, name, hashlib.sha256(repr(prompt_ids).encode()).hexdigest())
        k = self._occurrences.get(identity, 0)
        self._occurrences[identity] = k + 1
        return request_seed(self.seed, *identity, k)

    def _aborted_output(self) -> TokenOutput:
        return TokenOutput(
            token_ids=[], log_probs=None, stop_reason="aborted", extra_fields={"global_steps": self.global_steps}
        )

    def _resume_event(self) -> asyncio.Event:
        if self._resumed is None:
            self._resumed = asyncio.Event()
        return self._resumed

    def _get_lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    async def _run_batches(self):
        """Drain the queue in batches; a batch closes after ``batch_window_s`` without new arrivals."""
        while self._queue:
            start, seen = time.monotonic(), -1
            while (
                len(self._queue) != seen
                and len(self._queue) < self.max_num_seqs
                and time.monotonic() - start < self.max_batch_wait_s
            ):
                seen = len(self._queue)
                await asyncio.sleep(self.batch_window_s)
            batch = self._queue[: self.max_num_seqs]
            del self._queue[: self.max_num_seqs]
            batch = [(r, f) for r, f in batch if not f.done()]
            if not batch:
                continue
            async with self._get_lock():
                started = time.monotonic()
                try:
                    results = await asyncio.to_thread(
                        generate_batch,
                        self.model,
                        [r for r, _ in batch],
                        self.eos_token_ids,
                        self.pad_token_id,
                        self.raw_logprobs,
                        batch_invariant=self.batch_invariant,
                        pad_multiple=self.pad_multiple,
                    )
                except Exception as e:  # fail the requests, keep the server alive
                    logger.exception("hf rollout batch failed")
                    for _, f in batch:
                        if not f.done():
                            f.set_exception(e)
                    continue
            self.num_batches += 1
            self.num_requests += len(batch)
            logger.info("hf rollout: batch of %d requests in %.3fs", len(batch), time.monotonic() - started)
            for (_, f), res in zip(batch, results, strict=True):
                if not f.done():
                    f.set_result(res)

    # ----- weights ---------------------------------------------------------------------------------------------

    def _copy_weights(self, named_tensors) -> tuple[int, list[str]]:
        state = dict(self.model.named_parameters(remove_duplicate=False))
        state.update(dict(self.model.named_buffers(remove_duplicate=False)))
        loaded, unknown = 0, []
        with torch.no_grad():
            for name, tensor in named_tensors:
                target = state.get(name)
                if target is None:
                    unknown.append(name)
                    continue
                target.copy_(tensor.to(dtype=target.dtype).view_as(target))
                loaded += 1
        return loaded, unknown

    async def load_weights(self, named_tensors, global_steps: int | None = None) -> int:
        """Copy ``(name, tensor)`` pairs (HF parameter names) into the model; waits for the running batch."""
        if isinstance(named_tensors, dict):
            named_tensors = list(named_tensors.items())
        async with self._get_lock():
            loaded, unknown = await asyncio.to_thread(self._copy_weights, named_tensors)
        if loaded == 0:
            raise RuntimeError(f"hf rollout: no received weight matched the model; e.g. {unknown[:5]}")
        if unknown:
            logger.warning("hf rollout: %d received weights not in the model, e.g. %s", len(unknown), unknown[:5])
        if global_steps is not None:
            self.global_steps = global_steps
        self._occurrences.clear()  # new weights: identities start over
        return loaded

    async def set_global_steps(self, global_steps: int):
        if global_steps != self.global_steps:
            self._occurrences.clear()
        self.global_steps = global_steps

    async def get_stats(self) -> dict:
        return {"num_batches": self.num_batches, "num_requests": self.num_requests}

    # ----- lifecycle (nothing to offload on CPU) ---------------------------------------------------------------

    async def wake_up(self, tags: list[str] | None = None, **kwargs):
        return None

    async def sleep(self, **kwargs):
        return None

    async def clear_kv_cache(self):
        return None  # the KV cache lives only inside one generate_batch call

    async def release_kv_cache(self):
        return None

    async def resume_kv_cache(self):
        return None

    async def abort_all_requests(self, reject_request: bool = False, **kwargs) -> dict:
        """Queued (not yet running) requests return empty with stop_reason="aborted"; a running batch finishes.

        Closes the admission gate as verl's vLLM server does: requests that arrive afterwards wait for
        :meth:`resume_generation`, or with ``reject_request=True`` return at once as aborted.
        """
        self._paused = True
        self._rejecting = bool(reject_request)
        self._resume_event().clear()
        aborted = [(r, f) for r, f in self._queue if not f.done()]
        self._queue.clear()
        for _, f in aborted:
            f.set_result(None)
        return {"aborted_count": len(aborted), "request_ids": []}

    async def resume_generation(self):
        self._paused = False
        self._rejecting = False
        self._resume_event().set()

    async def start_profile(self, **kwargs):
        return None

    async def stop_profile(self):
        return None


# ---------------------------------------------------------------------------------------------------------------
# Replica (driver/TaskRunner side) and server adapter (worker side)
# ---------------------------------------------------------------------------------------------------------------


class HFReplica(RolloutReplica):
    """One :class:`HFRolloutServer` actor per replica; ``tensor_model_parallel_size`` should be 1."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(HFRolloutServer)

    def _kind(self) -> str:
        return "reward" if self.is_reward_model else ("teacher" if self.is_teacher_model else "")

    async def launch_servers(self):
        options: dict[str, Any] = dict(
            name=_server_name(self.replica_rank, 0, self._kind(), self.name_suffix),
            num_cpus=0,
            num_gpus=0,
            max_concurrency=self.max_concurrency,
        )
        if self.workers:
            # keep the server on the node of the replica's first worker (it receives that worker's weights)
            node_id = await self.workers[0].__ray_call__.remote(lambda self: ray.get_runtime_context().get_node_id())
            options["scheduling_strategy"] = ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                node_id=node_id, soft=False
            )
        server = self.server_class.options(**options).remote(
            config=self.config, model_config=self.model_config, replica_rank=self.replica_rank
        )
        await server.ready.remote()
        self.servers = [server]
        self._server_handle = server
        # not an http endpoint: only a unique key for verl's load balancer ({address: handle})
        self._server_address = options["name"]

    def rollout_worker_use_gpu(self) -> bool:
        return False


class HFServerAdapter(BaseRollout):
    """Worker-side half of the hf backend: forwards weight updates to the replica's server.

    Every rank iterates the weight generator (FSDP gathers full tensors collectively); only the replica's
    leader rank (``rollout_rank == 0``) copies them to CPU and calls ``server.load_weights``.
    """

    def __init__(self, config, model_config, device_mesh=None, replica_rank: int = -1, **kwargs):
        super().__init__(config, model_config, device_mesh)
        world = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        rank = int(os.environ.get("RANK", 0))
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % world
        self.is_leader_rank = self.rollout_rank == 0
        self._server = None

    def _server_handle(self):
        if self._server is None:
            self._server = ray.get_actor(_server_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]):
        return None

    async def release(self):
        return None

    async def update_weights(self, weights, wire_format: str = "named_tensors", global_steps: int = None, **kwargs):
        if wire_format != "named_tensors":
            raise NotImplementedError(f"hf rollout supports wire_format='named_tensors' only, got {wire_format!r}")
        if kwargs.get("peft_config") is not None:
            raise NotImplementedError("hf rollout: LoRA adapter sync is not supported; set model.lora.merge=True")
        start = time.time()
        named: list[tuple[str, torch.Tensor]] = []
        if hasattr(weights, "__aiter__"):
            async for name, tensor in weights:
                if self.is_leader_rank:
                    named.append((name, tensor.detach().to("cpu", copy=True).contiguous()))
        else:
            for name, tensor in weights:
                if self.is_leader_rank:
                    named.append((name, tensor.detach().to("cpu", copy=True).contiguous()))
        if self.is_leader_rank:
            await self._server_handle().load_weights.remote(named, global_steps=global_steps)
            logger.info(
                "hf rollout: replica %d got %d tensors in %.3fs", self.replica_rank, len(named), time.time() - start
            )


finish_deferred_registration(__name__, register_hf_rollout)  # CPU mode came on while this module imported verl
