"""The ``hf`` rollout backend (``verl_ext.cpu.hf_rollout``): sampling, log-probs, batching, EOS, abort, weight loads.

Sampling is checked against an independent reference (sorting/cumsum written here, vLLM's nucleus rule), generation
against a cache-free full forward of a tiny random Qwen2, and the server object directly on an asyncio loop (no Ray).
"""

from __future__ import annotations

import asyncio
import math

import pytest
import torch
from omegaconf import OmegaConf

from verl_ext.cpu.hf_rollout import GenRequest, HFRolloutServer, generate_batch, padded_width, sample_next_tokens

VOCAB = 48
EOS, PAD = 1, 0


def _tiny_qwen2(seed: int):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      eos_token_id=EOS, pad_token_id=PAD, bos_token_id=EOS, initializer_range=0.3)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg).float().eval()


@pytest.fixture(scope="module")
def model():
    return _tiny_qwen2(0)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, model):
    from transformers import GenerationConfig

    path = tmp_path_factory.mktemp("tiny_qwen2")
    model.save_pretrained(path)
    GenerationConfig(eos_token_id=EOS, pad_token_id=PAD).save_pretrained(path)
    return str(path)


# ---- reference: the distribution a token is drawn from (temperature, then top-k, then vLLM's top-p) ----------


def reference_probs(logits: torch.Tensor, temperature: float, top_k: int = -1, top_p: float = 1.0) -> torch.Tensor:
    """Probabilities of one row after temperature, top-k and top-p (vLLM order), renormalised."""
    probs = torch.softmax(logits.double() / temperature, dim=-1)
    keep = torch.ones_like(probs, dtype=torch.bool)
    if 0 < top_k < probs.numel():
        keep &= probs >= probs.topk(top_k).values[-1]
    probs = torch.where(keep, probs, 0.0)
    probs = probs / probs.sum()
    if top_p < 1.0:
        order = probs.argsort(descending=True)
        mass_before = 0.0
        nucleus = torch.zeros_like(keep)
        for i in order.tolist():  # smallest prefix of the sorted distribution whose mass reaches top_p
            if mass_before >= top_p and nucleus.any():
                break
            nucleus[i] = True
            mass_before += float(probs[i])
        probs = torch.where(nucleus, probs, 0.0)
        probs = probs / probs.sum()
    return probs


def _rows(n, value, dtype=torch.float32):
    return torch.full((n,), value, dtype=dtype)


def _sample_many(logits_row, n, temperature, top_k=-1, top_p=1.0, seed=0, raw=False):
    logits = logits_row.expand(n, -1).clone()
    gen = torch.Generator().manual_seed(seed)
    return sample_next_tokens(logits, _rows(n, temperature), _rows(n, top_k, torch.long), _rows(n, top_p),
                              raw_logprobs=raw, generator=gen)


LOGITS = torch.tensor([2.0, 1.5, 1.0, 0.3, 0.0, -0.5, -1.0, -3.0])
N = 40_000


@pytest.mark.parametrize("temperature,top_k,top_p", [
    (1.0, -1, 1.0), (0.5, -1, 1.0), (1.7, -1, 1.0),      # temperature only
    (1.0, 3, 1.0), (0.8, 1, 1.0), (1.0, 100, 1.0),       # top-k (1 = argmax; >= vocab = off)
    (1.0, -1, 0.6), (1.3, -1, 0.9), (1.0, -1, 1e-9),     # top-p (tiny p = the top token only)
    (0.9, 5, 0.7),                                       # top-k then top-p
])
def test_sampling_follows_the_processed_distribution_and_returns_its_logprobs(temperature, top_k, top_p):
    expected = reference_probs(LOGITS, temperature, top_k, top_p)
    tokens, logprobs = _sample_many(LOGITS, N, temperature, top_k, top_p)
    freq = torch.bincount(tokens, minlength=LOGITS.numel()).double() / N
    assert torch.all(freq[expected == 0] == 0), (freq, expected)  # never outside the truncated support
    assert (freq - expected).abs().max() < 0.012, (freq, expected)  # ~5 sigma at N=40k
    # each token's log-prob is that of the (truncated, renormalised, tempered) distribution it was drawn from
    torch.testing.assert_close(logprobs.double(), expected.log()[tokens], atol=1e-5, rtol=0)


def test_top_p_boundary_follows_vllm():
    # probabilities 0.5 / 0.3 / 0.15 / 0.05: a token stays while the mass before it is below top_p
    logits = torch.tensor([0.5, 0.3, 0.15, 0.05]).log()
    for top_p, support in ((0.4, {0}), (0.7, {0, 1}), (0.85, {0, 1, 2}), (0.99, {0, 1, 2, 3})):
        tokens, logprobs = _sample_many(logits, 4000, 1.0, top_p=top_p)
        assert set(tokens.tolist()) == support, top_p
        assert torch.isfinite(logprobs).all()
    # exact boundary: four tokens at 0.25; with top_p=0.5 the third token's prefix mass is exactly 0.5, so vLLM
    # (and HF) drop it and keep two tokens at 0.5 each
    tokens, logprobs = _sample_many(torch.zeros(4), 4000, 1.0, top_p=0.5)
    assert len(set(tokens.tolist())) == 2
    torch.testing.assert_close(logprobs, torch.full_like(logprobs, math.log(0.5)))
    # top_p=0 keeps the top token (never an empty support)
    tokens, logprobs = _sample_many(LOGITS, 100, 1.0, top_p=0.0)
    assert set(tokens.tolist()) == {0} and torch.equal(logprobs, torch.zeros_like(logprobs))


def test_greedy_rows_take_the_argmax_with_the_raw_log_softmax():
    logits = torch.randn(6, 20, generator=torch.Generator().manual_seed(1))
    temperature = torch.tensor([0.0, -1.0, 0.0, 0.0, 1.0, 1.0])
    top_k = torch.tensor([1, 1, -1, 3, -1, 4])
    top_p = torch.tensor([0.5, 1.0, 0.1, 0.9, 1.0, 1.0])
    tokens, logprobs = sample_next_tokens(logits, temperature, top_k, top_p,
                                          generator=torch.Generator().manual_seed(2))
    greedy = temperature <= 0
    assert torch.equal(tokens[greedy], logits[greedy].argmax(-1))  # top-k/top-p do not matter for greedy rows
    lsm = torch.log_softmax(logits, -1)
    torch.testing.assert_close(logprobs[greedy], lsm[greedy].gather(-1, tokens[greedy, None]).squeeze(-1))
    # sampled rows in the same call keep their own settings: row 5 samples from its top-4 only
    assert tokens[5] in logits[5].topk(4).indices


def test_raw_logprobs_mode_reports_the_unprocessed_log_softmax():
    tokens, logprobs = _sample_many(LOGITS, 2000, 0.5, top_k=3, raw=True)
    assert set(tokens.tolist()) <= {0, 1, 2}  # still sampled from the processed distribution
    torch.testing.assert_close(logprobs, torch.log_softmax(LOGITS, -1)[tokens])


# ---- the batched, KV-cached decode loop -----------------------------------------------------------------------


def reference_generate(model, prompt, max_tokens, temperature=0.0, top_k=-1, top_p=1.0, forced=None, eos=(EOS,),
                       ignore_eos=False):
    """Cache-free, unpadded reference: greedy tokens (or the ``forced`` ones) and their processed log-probs."""
    ids, out, lps = list(prompt), [], []
    for step in range(max_tokens):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1].float()
        if temperature <= 0:
            tok = int(logits.argmax()) if forced is None else forced[step]
            lp = float(torch.log_softmax(logits, -1)[tok])
        else:
            tok = forced[step]
            lp = math.log(float(reference_probs(logits, temperature, top_k, top_p)[tok]))
        out.append(tok)
        lps.append(lp)
        ids.append(tok)
        if forced is not None and step + 1 == len(forced):
            break
        if tok in eos and not ignore_eos:
            break
    return out, lps


PROMPTS = [[5, 9, 13], [7], [3, 4, 5, 6, 7, 8, 9], [11, 12], [20, 21, 22, 23]]


@pytest.mark.parametrize("batch_invariant", [True, False])
def test_batched_greedy_equals_one_at_a_time_full_forward(model, batch_invariant):
    requests = [GenRequest(prompt_ids=p, max_tokens=m, temperature=0.0, ignore_eos=True)
                for p, m in zip(PROMPTS, [6, 3, 8, 1, 5])]
    results = generate_batch(model, requests, eos_token_ids=[EOS], pad_token_id=PAD, batch_invariant=batch_invariant,
                             pad_multiple=4)  # widths 4 and 8: two decode loops
    for req, (tokens, logprobs) in zip(requests, results):
        ref_tokens, ref_lps = reference_generate(model, req.prompt_ids, req.max_tokens, ignore_eos=True)
        assert tokens == ref_tokens and len(tokens) == req.max_tokens  # left padding + KV cache change nothing
        assert logprobs == pytest.approx(ref_lps, abs=1e-5)


def test_sampled_logprobs_equal_a_teacher_forced_recompute(model):
    settings = [(1.0, -1, 1.0), (0.7, -1, 1.0), (1.0, 5, 1.0), (1.2, -1, 0.8), (0.9, 8, 0.9)]
    requests = [GenRequest(prompt_ids=p, max_tokens=8, temperature=t, top_k=k, top_p=tp, ignore_eos=True)
                for p, (t, k, tp) in zip(PROMPTS, settings)]
    results = generate_batch(model, requests, eos_token_ids=[EOS], pad_token_id=PAD,
                             generator=torch.Generator().manual_seed(3))
    for req, (tokens, logprobs) in zip(requests, results):
        assert len(tokens) == 8
        _, ref_lps = reference_generate(model, req.prompt_ids, 8, req.temperature, req.top_k, req.top_p,
                                        forced=tokens, ignore_eos=True)
        assert all(math.isfinite(lp) for lp in ref_lps)  # every token lies inside its truncated support
        assert logprobs == pytest.approx(ref_lps, abs=1e-5)
    # with T=1 and no truncation this is exactly what the actor recomputes as old_log_probs
    tokens, logprobs = results[0]
    with torch.no_grad():
        full = model(input_ids=torch.tensor([PROMPTS[0] + tokens])).logits[0].float()
    actor = torch.log_softmax(full[len(PROMPTS[0]) - 1: -1], -1).gather(-1, torch.tensor(tokens)[:, None])
    assert logprobs == pytest.approx(actor.squeeze(-1).tolist(), abs=1e-5)


def test_stops_at_eos_unless_ignore_eos(model):
    prompt = PROMPTS[2]
    free_run, _ = reference_generate(model, prompt, 6, ignore_eos=True)
    eos = free_run[2]  # declare the third greedy token an EOS: generation must stop on its first occurrence
    stop_at = free_run.index(eos)
    requests = [GenRequest(prompt_ids=prompt, max_tokens=6, temperature=0.0),
                GenRequest(prompt_ids=prompt, max_tokens=6, temperature=0.0, ignore_eos=True),
                GenRequest(prompt_ids=PROMPTS[0], max_tokens=4, temperature=0.0, ignore_eos=True)]
    (stopped, lp_stopped), (full, lp_full), (other, _) = generate_batch(model, requests, [eos], PAD)
    assert stopped == free_run[: stop_at + 1] and stopped[-1] == eos  # the EOS it stopped on is included
    assert len(lp_stopped) == len(stopped)
    assert full == free_run and len(lp_full) == 6
    assert other == reference_generate(model, PROMPTS[0], 4, ignore_eos=True)[0]  # a finished row disturbs nothing


# ---- the server object (no Ray: its methods are plain coroutines) ---------------------------------------------


def _server(model_dir, seed: int | None = None, **engine_kwargs) -> HFRolloutServer:
    config = OmegaConf.create({"prompt_length": 16, "response_length": 6, "max_num_seqs": 64, "seed": seed,
                               "engine_kwargs": {"hf": {"batch_window_ms": 20, **engine_kwargs}}})
    return HFRolloutServer(config, OmegaConf.create({"path": model_dir}))


def test_server_batches_concurrent_requests(model_dir, model):
    server = _server(model_dir)
    assert server.eos_token_ids == [EOS] and server.pad_token_id == PAD
    assert server.batch_invariant and server.pad_multiple == 16  # default: batch invariant, rollout.prompt_length
    assert not _server(model_dir, batch_invariant=False).batch_invariant

    async def main():
        params = [{"temperature": 0.0, "max_tokens": m, "logprobs": True, "ignore_eos": True} for m in (4, 2, 6, 3, 5)]
        outs = await asyncio.gather(*[server.generate(p, sp, request_id=f"r{i}")
                                      for i, (p, sp) in enumerate(zip(PROMPTS, params))])
        no_lp = await server.generate(PROMPTS[0], {"temperature": 0.0}, request_id="x")
        return outs, no_lp, await server.get_stats()

    outs, no_lp, stats = asyncio.run(main())
    assert stats == {"num_batches": 2, "num_requests": 6}  # the five concurrent requests shared one decode loop
    for prompt, m, out in zip(PROMPTS, (4, 2, 6, 3, 5), outs):
        ref_tokens, ref_lps = reference_generate(model, prompt, m, ignore_eos=True)
        assert out.stop_reason == "completed" and out.token_ids == ref_tokens
        assert out.log_probs == pytest.approx(ref_lps, abs=1e-5)
        assert out.extra_fields["global_steps"] is None
    assert no_lp.log_probs is None and 1 <= len(no_lp.token_ids) <= 6  # default max_tokens: response_length


def test_server_abort_returns_queued_requests_and_gates_new_ones(model_dir):
    server = _server(model_dir, batch_window_ms=300)  # a wide window keeps the first requests queued

    async def main():
        queued = [asyncio.create_task(server.generate(p, {"temperature": 0.0}, request_id=str(i)))
                  for i, p in enumerate(PROMPTS[:3])]
        await asyncio.sleep(0.05)
        aborted = await server.abort_all_requests()
        first = await asyncio.gather(*queued)
        parked = asyncio.create_task(server.generate(PROMPTS[3], {"temperature": 0.0}, request_id="late"))
        await asyncio.sleep(0.5)
        parked_while_paused = not parked.done()
        await server.resume_generation()
        late = await asyncio.wait_for(parked, timeout=30)
        await server.abort_all_requests(reject_request=True)
        rejected = await asyncio.wait_for(server.generate(PROMPTS[4], {}, request_id="rej"), timeout=5)
        await server.resume_generation()
        after = await asyncio.wait_for(server.generate(PROMPTS[4], {"max_tokens": 2}, request_id="ok"), timeout=30)
        return aborted, first, parked_while_paused, late, rejected, after, await server.get_stats()

    aborted, first, parked_while_paused, late, rejected, after, stats = asyncio.run(main())
    assert aborted["aborted_count"] == 3
    assert all(o.stop_reason == "aborted" and o.token_ids == [] for o in first)
    assert parked_while_paused and late.stop_reason == "completed" and late.token_ids
    assert rejected.stop_reason == "aborted" and rejected.token_ids == []
    assert after.stop_reason == "completed" and 1 <= len(after.token_ids) <= 2
    assert stats["num_requests"] == 2  # the aborted and rejected requests never ran


def test_server_loads_weights_and_validates_requests(model_dir):
    server = _server(model_dir)
    other = _tiny_qwen2(1)

    async def main():
        loaded = await server.load_weights(list(other.state_dict().items()), global_steps=7)
        out = await server.generate(PROMPTS[2], {"temperature": 0.0, "max_tokens": 5, "logprobs": True,
                                                 "ignore_eos": True}, request_id="w")
        with pytest.raises(RuntimeError, match="no received weight matched"):
            await server.load_weights([("not.a.param", torch.zeros(1))])
        return loaded, out

    loaded, out = asyncio.run(main())
    assert loaded == len(other.state_dict())
    ref_tokens, ref_lps = reference_generate(other, PROMPTS[2], 5, ignore_eos=True)
    assert out.token_ids == ref_tokens and out.log_probs == pytest.approx(ref_lps, abs=1e-5)
    assert out.extra_fields["global_steps"] == 7

    with pytest.raises(ValueError, match="no room"):
        server._make_request(list(range(2, 24)), {})  # 22 prompt tokens > max_model_len 16 + 6
    req = server._make_request(list(range(2, 14)), {})  # 12 tokens: default max_tokens = min(6, 16 + 6 - 12)
    assert req.max_tokens == 6 and req.temperature == 1.0 and req.top_k == -1 and req.top_p == 1.0
    assert server._make_request(list(range(2, 20)), {"max_tokens": 50}).max_tokens == 4  # clamped to the room
    with pytest.raises(NotImplementedError, match="repetition_penalty"):
        server._make_request([2, 3], {"repetition_penalty": 1.2})
    assert server._make_request([2, 3], {"repetition_penalty": 1.0}).max_tokens == 6  # verl's default is fine


# ---- seeded sampling: one request's tokens depend on rollout.seed and its identity only ---------------------------


def _seeded(prompt, seed, max_tokens=10):
    return GenRequest(prompt_ids=prompt, max_tokens=max_tokens, temperature=1.0, ignore_eos=True, seed=seed)


LONG_PROMPT = list(range(2, 42))  # another padded width than PROMPTS' (a GEC continuation next to fresh prompts)


def _compositions(target):
    """Batches holding ``target`` (seed 11) among requests of other prompt lengths, sizes, widths and positions."""
    crowd = [_seeded(PROMPTS[i % 5] + [30] * (i % 4), 100 + i, 3 + i % 9) for i in range(20)]
    return [
        [_seeded(PROMPTS[1], 1), target],                                  # a shorter prompt first
        [target, _seeded(PROMPTS[0] + PROMPTS[2], 2)],                     # a longer one after
        [_seeded(LONG_PROMPT, 3, 4), target, _seeded(PROMPTS[3], 4)],      # a prompt of another padded width
        crowd[:2] + [target] + crowd[2:4],
        crowd[:8] + [target] + crowd[8:16],
        [*crowd, target],
        [GenRequest(prompt_ids=PROMPTS[4], max_tokens=12, temperature=0.0), target],  # a greedy neighbour
    ]


def _generate(model, batch):
    return generate_batch(model, batch, [EOS], PAD, generator=torch.Generator().manual_seed(9), pad_multiple=8)


@pytest.mark.parametrize("threads", [1, 2])
def test_a_request_samples_the_same_tokens_and_logprobs_alone_or_in_any_batch(model, threads):
    # which requests share a batch depends on timing; a batch's size, padding width and a row's place in it used to
    # move a request's logits in the last bits (and so, now and then, a sampled token); now they must not, bit for bit
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for prompt in (PROMPTS[2], PROMPTS[1], LONG_PROMPT):
            alone = _generate(model, [_seeded(prompt, 11)])[0]
            for batch in _compositions(_seeded(prompt, 11)):
                row = next(i for i, r in enumerate(batch) if r.seed == 11)
                assert _generate(model, batch)[row] == alone, (prompt, len(batch), row)
    finally:
        torch.set_num_threads(before)
    assert torch.get_num_threads() == before
    samples = {tuple(_generate(model, [_seeded(PROMPTS[2], s)])[0][0]) for s in range(11, 20)}
    assert len(samples) > 1  # another seed samples differently


def test_padded_width_depends_on_the_prompt_only():
    assert [padded_width(n, 8) for n in (1, 7, 8, 9, 16, 40)] == [8, 8, 16, 16, 24, 48]  # always one pad at least


def test_inverse_cdf_sampling_follows_the_distribution():
    logits = torch.tensor([[0.0, 1.0, 2.0, -30.0]]).repeat(20000, 1)
    g = torch.Generator().manual_seed(0)
    u = torch.rand(20000, generator=g)
    tokens, logprobs = sample_next_tokens(logits, _rows(20000, 1.0), _rows(20000, -1, torch.long), _rows(20000, 1.0),
                                          uniforms=u)
    freq = torch.bincount(tokens, minlength=4).double() / 20000
    assert freq.tolist() == pytest.approx(torch.softmax(logits[0].double(), -1).tolist(), abs=0.015)
    assert logprobs == pytest.approx(torch.log_softmax(logits, -1).gather(-1, tokens[:, None]).squeeze(-1))
    edge = sample_next_tokens(logits[:2], _rows(2, 1.0), _rows(2, 2, torch.long), _rows(2, 1.0),
                              uniforms=torch.tensor([0.0, 1.0 - 1e-9]))[0]
    assert set(edge.tolist()) <= {1, 2}  # top-k=2: never a filtered (zero-probability) token, even at u -> 0 or 1


def test_server_seeds_requests_by_identity_not_arrival(model_dir):
    def run(order, seed=5, rid=lambda i: f"det-{i}"):
        server = _server(model_dir, seed=seed)  # rollout.seed, as verl's rollout config hands it to the server

        async def main():
            sp = {"temperature": 1.0, "max_tokens": 6, "ignore_eos": True}
            outs = {}

            async def one(i):
                outs[i] = (await server.generate(PROMPTS[i % 2], sp, request_id=rid(i))).token_ids
            for i in order:  # arrival order
                await asyncio.sleep(0)
                await asyncio.gather(one(i))
            return outs

        return asyncio.run(main())

    a, b = run([0, 1, 2, 3]), run([3, 1, 0, 2])
    assert a == b  # verl's det-<row> names: each row samples the same whatever the arrival order
    assert a[0] != a[2] or a[1] != a[3]  # the same prompt in two rows: two samples, not one repeated
    assert run([0, 1, 2, 3], seed=6) != a  # rollout.seed reaches the sampling (the batch-invariance e2e test's pair)
    # without det- names (a fresh uuid per request) the k-th request of a prompt at the same weights gets the k-th seed
    import uuid

    c, d = run([0, 1, 2, 3], rid=lambda i: uuid.uuid4().hex), run([0, 1, 2, 3], rid=lambda i: uuid.uuid4().hex)
    assert c == d


def test_new_weights_restart_the_identities(model_dir, model):
    server = _server(model_dir)
    first = server._request_seed("det-0", [1, 2])
    assert server._request_seed("det-0", [1, 2]) != first  # a repeat at the same weights: the next occurrence
    asyncio.run(server.load_weights(list(model.state_dict().items()), global_steps=None))
    assert server._request_seed("det-0", [1, 2]) == first
    asyncio.run(server.load_weights(list(model.state_dict().items()), global_steps=4))
    assert server._request_seed("det-0", [1, 2]) != first  # the weight version is part of the identity
