"""How rollout code reaches the engines: SGLang's ``/generate`` through the run's router.

A batch is cut into one share of whole groups per engine, and each share goes as one batched
request (SGLang's lists of ``input_ids`` and ``sampling_params``): the router sends each to the
engine with the fewest outstanding requests, so every engine gets one share and admits it at once
(one prefill, one decode batch size: a CUDA-graph runner captures one graph, not one per arriving
group), and a group's samples always share an engine. Requests with media (``image_data``, ``video_data``,
``audio_data``) go one per ``/generate`` unless the engines take media batches (``batch_media``: relax's do):
SGLang 0.5.14 processes a batch's media items one after another and only then starts waiting on their answers, and
an item answered meanwhile is gone from its table, so the batch fails with HTTP 500 (``KeyError`` in
``TokenizerManager._wait_one_response``; seen at step 3 of the VLM run). With a supervisor (``--use-fault-tolerance``) a request that
failed because an engine died or hung is retried once the supervisor has replaced the engine (the
router also retries it on another live engine); without one the first failure ends the run with
one line naming the engine.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, Protocol

from relax.engine.rollout.engine_client import EngineClient, EngineError, EngineHTTPError
from relax.utils.gather import gather_or_cancel


class EnginePool(Protocol):
    async def generate_batch(self, requests: list[dict], group_size: int) -> list[dict]: ...


class EngineDiedError(RuntimeError):
    """An engine died or failed mid-request and fault tolerance is off."""


class HttpEnginePool:
    MAX_RETRIES = 3

    def __init__(self, client: EngineClient, supervisor: Any = None,
                 on_failure: Callable[[BaseException], BaseException] | None = None,
                 engines: Callable[[], int] = lambda: 1, batch_media: bool = False):
        self.client = client  # the router (or one engine)
        self.supervisor = supervisor
        self.on_failure = on_failure  # names the failed engine (EngineFleet.failure) when there is no supervisor
        self.engines = engines  # how many engines stand behind the router now
        self.batch_media = batch_media  # a share with media goes as one batch (else one /generate per request)

    async def generate_batch(self, requests: list[dict[str, Any]], group_size: int = 1) -> list[dict[str, Any]]:
        group = max(1, group_size)
        groups = -(-len(requests) // group)  # ceil
        size = -(-groups // max(1, self.engines())) * group  # whole groups per engine share
        chunks = [requests[i:i + size] for i in range(0, len(requests), size)]
        answers = await gather_or_cancel(*(self._generate_share(chunk) for chunk in chunks))
        return [resp for answer in answers for resp in answer]

    async def _generate_share(self, chunk: list[dict[str, Any]]) -> list[Any]:
        """One engine's share: one batched ``/generate``, or one per request where a request carries media and the
        engines do not take media batches."""
        if len(chunk) == 1 or not self.batch_media and any(r.get(k) for r in chunk for k in _MEDIA):
            return list(await gather_or_cancel(*(self._generate(r) for r in chunk)))
        return await self._generate(_batched(chunk))

    async def generate(self, request: dict[str, Any]) -> Any:
        return await self._generate(request)

    async def _generate(self, request: dict[str, Any]) -> Any:
        for attempt in range(self.MAX_RETRIES + 1):
            try:
                return await self.client.generate(request)
            except EngineError as exc:
                if isinstance(exc, EngineHTTPError) and exc.status < 500:
                    raise  # a bad request stays bad wherever it goes
                if self.supervisor is None:
                    if self.on_failure is not None:  # in a thread: it may ask the engines' /health on a loop of its own
                        raise await asyncio.to_thread(self.on_failure, exc) from None
                    raise EngineDiedError(f"an engine failed during generation: {exc}; rerun with "
                                          "--use-fault-tolerance to restart engines") from None
                if attempt == self.MAX_RETRIES:
                    raise
                await asyncio.to_thread(self.supervisor.check_all)  # replaces a dead or hung engine
                await asyncio.sleep(0.5 * (attempt + 1))
        raise AssertionError("unreachable")

    async def abort_request(self, rid: str) -> Any:
        return await self.client.abort_request(rid)


_MEDIA = ("image_data", "video_data", "audio_data")


def _batched(chunk: list[dict[str, Any]]) -> dict[str, Any]:
    """Single requests of one shape -> one SGLang batch request (per-item fields as lists). A media field some
    items lack is None for them; ``use_audio_in_video``, one flag per batch in SGLang, is set when any item sets it
    (it changes only videos with a sound track, and with it every video has one)."""
    present = {k for r in chunk for k in r if k in _MEDIA or k == "use_audio_in_video"}
    if present:
        audio_in_video = any(r.get("use_audio_in_video") for r in chunk)
        chunk = [{**{k: None for k in present & set(_MEDIA)}, **r} for r in chunk]
        if "use_audio_in_video" in present:
            chunk = [dict(r, use_audio_in_video=audio_in_video) for r in chunk]
    keys = set(chunk[0])
    if any(set(r) != keys for r in chunk):
        raise ValueError("a batched /generate needs requests with the same fields")
    # image_data / video_data / audio_data: one entry per item in a batch (SGLang's GenerateReqInput normalizes them so)
    per_item = ("input_ids", "text", "sampling_params", "rid", "return_logprob", "logprob_start_len", *_MEDIA)
    shared = [k for k in keys if k not in per_item]
    if any(r[k] != chunk[0][k] for r in chunk for k in shared):
        raise ValueError(f"a batched /generate shares {', '.join(sorted(shared))}; these requests differ there")
    return {k: [r[k] for r in chunk] if k in per_item else chunk[0][k] for k in keys}
