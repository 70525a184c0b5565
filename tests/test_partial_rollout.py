"""Partial rollout against a scripted engine: aborted samples resume from their tokens, off-policy
tokens are masked, --partial-rollout-max-aborted-count is honored and every drawn sample has a fate.

The scripted engine decodes one token per tick and honours /abort_request like the embedded
engine (partial output, finish_reason abort). Its token at position p of a sample's sequence
depends only on (sample index, p), so a resumed sample must equal the one straight generation.
"""

from __future__ import annotations

import asyncio

import pytest

from relax.engine.rewards import RewardConfig
from relax.engine.rollout.config import RolloutConfig
from relax.engine.rollout.partial_rollout import ABORTED, SURPLUS, PartialRollout
from relax.engine.rollout.sglang_rollout import GenerateState
from relax.models import load_tokenizer
from relax.utils.arguments import parse_args
from relax.utils.types import Sample

N = 2  # samples per prompt
SLOW, FAST, TICK = 40, 3, 0.004


def _is_slow(index: int) -> bool:
    return (index // N) % 2 == 1  # every other group is slow


def _token(index: int, position: int) -> int:
    return 3 + (index * 7 + position) % 90


class ScriptedEngine:
    def __init__(self) -> None:
        self.version = 0
        self.requests: list[dict] = []
        self.aborts: list[str] = []
        self._abort: dict[str, asyncio.Event] = {}
        self.prompt_len: dict[int, int] = {}  # the input is prompt + partial response

    async def generate(self, request: dict) -> dict:
        self.requests.append(request)
        rid, ids = request["rid"], list(request["input_ids"])
        index = int(rid.rsplit("-", 1)[1])
        total = SLOW if _is_slow(index) else FAST
        done_before = request["_done"] = len(ids) - self.prompt_len.setdefault(index, len(ids))
        stop = self._abort[rid] = asyncio.Event()
        out: list[int] = []
        finish = {"type": "stop"}
        while done_before + len(out) < total:
            if len(out) >= request["sampling_params"]["max_new_tokens"]:
                finish = {"type": "length"}
                break
            await asyncio.sleep(TICK)
            if stop.is_set():
                finish = {"type": "abort"}
                break
            out.append(_token(index, done_before + len(out)))
        del self._abort[rid]
        logprobs = [[-0.01 * (done_before + i + 1), t, None] for i, t in enumerate(out)]
        return {"text": "x" * len(out), "output_ids": out,
                "meta_info": {"finish_reason": finish, "weight_version": self.version,
                              "output_token_logprobs": logprobs}}

    async def abort_request(self, rid: str) -> dict:
        self.aborts.append(rid)
        if rid in self._abort:
            self._abort[rid].set()
        return {"success": True}


class RecordingSource:
    """The real data source, recording what each step drew."""

    def __init__(self, args) -> None:
        from relax.engine.rollout.data_source import RolloutDataSourceWithBuffer

        self.inner = RolloutDataSourceWithBuffer(args, tokenizer=load_tokenizer("tiny-qwen3"))
        self.drawn: list[Sample] = []

    def get_samples(self, n: int) -> list[list[Sample]]:
        groups = self.inner.get_samples(n)
        self.drawn += [s for g in groups for s in g]
        return groups

    def add_samples(self, groups) -> None:
        self.inner.add_samples(groups)


def _args(*extra: str, over_sampling: int = 4):
    return parse_args(["--preset", "quickstart", "--rollout-batch-size", "2", "--n-samples-per-prompt", str(N),
                       "--over-sampling-batch-size", str(over_sampling), "--rollout-max-response-len", "64",
                       "--micro-batch-size", "4", "--partial-rollout", *extra])


def _step(args, step: int, source, engine: ScriptedEngine) -> tuple[list[list[Sample]], list[dict], dict]:
    state = GenerateState.install(RolloutConfig.from_args(args), tokenizer=load_tokenizer("tiny-qwen3"), pool=None)
    engine.version = step
    source.drawn = []
    kept = asyncio.run(PartialRollout(state.config, RewardConfig.from_args(args), step, state, source, [engine]).run())
    return kept, state.drain_fates(), state.pop_metrics(step)


def _run(args, steps: int):
    engine, source = ScriptedEngine(), RecordingSource(args)
    return engine, source, [_step(args, k, source, engine) for k in range(steps)]


def test_aborted_samples_resume_from_their_tokens() -> None:
    engine, source, steps = _run(_args(), 2)
    (kept0, fates0, metrics0), (kept1, _, metrics1) = steps
    assert all(not _is_slow(s.index) for g in kept0 for s in g), "the fast groups fill step 0"
    assert metrics0["rollout/aborted_samples"] == 2 * N and {f["reason"] for f in fates0 if f["fate"] == "recycled"} == {ABORTED}
    resumed = [s for g in kept1 for s in g if s.abort_count == 1]
    assert resumed and metrics1["rollout/resumed_samples"] == len(resumed)
    for s in resumed:
        first = next(r for r in engine.requests if r["rid"] == f"relax-0-{s.index}")
        second = next(r for r in engine.requests if r["rid"] == f"relax-1-{s.index}")
        partial = second["input_ids"][len(first["input_ids"]):]
        assert 0 < len(partial) < SLOW and second["_done"] == len(partial)
        assert s.response_tokens[: len(partial)] == partial, "the resumed response starts with the partial tokens"
        assert s.response_tokens == [_token(s.index, p) for p in range(SLOW)], "same as one straight generation"
        assert s.tokens == first["input_ids"] + s.response_tokens and s.response_length == SLOW
        assert second["sampling_params"]["max_new_tokens"] == 64 - len(partial)
        assert len(s.rollout_log_probs) == len(s.loss_mask) == len(s.token_weight_versions) == SLOW
        assert s.rollout_log_probs == pytest.approx([-0.01 * (p + 1) for p in range(SLOW)])
        assert s.token_weight_versions == [0] * len(partial) + [1] * (SLOW - len(partial))
        assert s.status is Sample.Status.COMPLETED and s.weight_version == 1


class TextEngine(ScriptedEngine):
    """The scripted engine taking SGLang's text requests too: it tokenizes the text and answers its
    ``prompt_token_ids`` (``return_prompt_token_ids``), as SGLang does."""

    def __init__(self) -> None:
        super().__init__()
        self.tokenizer = load_tokenizer("tiny-qwen3")
        self.sent: list[dict] = []

    def encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    async def generate(self, request: dict) -> dict:
        self.sent.append(dict(request))
        if "text" not in request:
            return await super().generate(request)
        ids = self.encode(request["text"])
        answer = await super().generate({k: v for k, v in request.items() if k != "text"} | {"input_ids": ids})
        return {**answer, "prompt_token_ids": ids}


def test_the_text_router_sends_a_sample_as_text_until_it_has_response_tokens() -> None:
    """--use-slime-router with --partial-rollout: a sample not started goes as its prompt text (its tokens become the
    engine's prompt_token_ids), a resumed one as its token ids, and it ends as one straight generation."""
    args = _args("--use-slime-router")
    engine, source = TextEngine(), RecordingSource(args)
    (_, _, metrics0), (kept1, _, _) = [_step(args, k, source, engine) for k in range(2)]
    assert metrics0["rollout/aborted_samples"] == 2 * N
    starts = [r for r in engine.sent if "_done" not in r and not r.get("input_ids")]
    assert starts and all("text" in r and r["return_prompt_token_ids"] for r in starts)
    resumed = [s for g in kept1 for s in g if s.abort_count == 1]
    assert resumed
    for s in resumed:
        first = next(r for r in engine.sent if r["rid"] == f"relax-0-{s.index}")
        second = next(r for r in engine.sent if r["rid"] == f"relax-1-{s.index}")
        assert "input_ids" not in first and "text" not in second
        prompt = engine.encode(first["text"])
        assert s.tokens[: s.prompt_length] == prompt == second["input_ids"][: len(prompt)]
        assert s.response_tokens == [_token(s.index, p) for p in range(SLOW)], "same as one straight generation"
        assert s.tokens == prompt + s.response_tokens
    fresh = [s for g in kept1 for s in g if s.abort_count == 0]
    assert all("text" in next(r for r in engine.sent if r["rid"] == f"relax-1-{s.index}") for s in fresh)


@pytest.mark.parametrize("mask", [False, True])
def test_offpolicy_tokens_are_masked_only_when_asked(mask: bool) -> None:
    _, _, steps = _run(_args(*(["--mask-offpolicy-in-partial-rollout"] if mask else [])), 2)
    kept1, _, metrics = steps[1]
    samples = [s for g in kept1 for s in g]
    old = [(s, i) for s in samples for i, v in enumerate(s.token_weight_versions) if v < 1]
    assert old and metrics["rollout/offpolicy_tokens"] == len(old) and metrics["rollout/token_staleness_max"] == 1
    assert all(s.loss_mask[i] == (0 if mask else 1) for s, i in old)
    for s in samples:  # tokens of the current policy always train
        assert all(m == 1 for m, v in zip(s.loss_mask, s.token_weight_versions, strict=True) if v == 1)


@pytest.mark.parametrize("limit", [0, 1])
def test_max_aborted_count_is_honored(limit: int) -> None:
    # 3 fast and 3 slow groups a draw: at step 1 the fast ones fill the batch while the slow samples
    # cut at step 0 are still running
    engine, source, steps = _run(_args("--partial-rollout-max-aborted-count", str(limit), over_sampling=6), 3)
    every = [s for kept, _, _ in steps for g in kept for s in g] + [s for g in source.inner.buffer for s in g]
    assert max(s.abort_count for s in every) == limit, "no sample is aborted more than the limit"
    assert all(metrics["rollout/abort_count_max"] <= limit for _, _, metrics in steps)
    if limit == 0:
        assert not engine.aborts and all(s.status is Sample.Status.COMPLETED for s in every)
        assert {f["reason"] for _, fates, _ in steps for f in fates} == {SURPLUS}
    else:  # step 1: the samples cut at step 0 are protected and run to the end; fresh slow ones are cut
        protected = {r["rid"] for r in engine.requests if r["rid"].startswith("relax-1-") and r["_done"] > 0}
        assert protected and not protected & set(engine.aborts)
        assert any(r.startswith("relax-1-") for r in engine.aborts), "unprotected samples are still cut"


def test_every_drawn_sample_has_a_fate_and_none_is_lost() -> None:
    args = _args("--partial-rollout-max-aborted-count", "2")
    engine, source = ScriptedEngine(), RecordingSource(args)
    trained: set[int] = set()
    recycled: set[int] = set()
    for step in range(4):
        kept, fates, _ = _step(args, step, source, engine)
        here = {s.index for g in kept for s in g} | {f["index"] for f in fates}
        assert here == {s.index for s in source.drawn}, f"step {step}: a drawn sample has no fate"
        now_trained = {s.index for g in kept for s in g}
        assert not now_trained & trained, "a sample is trained once"
        trained |= now_trained
        recycled = (recycled - now_trained) | {f["index"] for f in fates if f["fate"] == "recycled"}
    assert recycled == {s.index for g in source.inner.buffer for s in g}, "what is not trained waits in the buffer"
