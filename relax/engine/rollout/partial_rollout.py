"""``--partial-rollout``: end a step as soon as enough groups are done, abort the rest, resume them later.

Groups are drawn ``--over-sampling-batch-size`` at a time (more when the dynamic filter rejects
some) and every sample is one request to an engine's ``/generate``; groups are taken in the order
they finish. Once ``--rollout-batch-size`` groups are kept, each request still running is aborted
through the engine's ``/abort_request`` (the engine answers with the tokens and log-probs so far)
and every unfinished group goes back to the data source whole, its samples keeping their tokens,
log-probs and per-token weight versions (``abort_count += 1`` for each aborted sample). A later
step resumes them from those tokens (`partial_samples`). Samples aborted
``--partial-rollout-max-aborted-count`` times are not aborted again: the step waits for them.

Every group drawn gets a fate in samples.jsonl: trained, filtered, or recycled with the reason
``partial_rollout_abort`` (a sample was cut) or ``partial_rollout_surplus`` (finished after the
batch was full), so no prompt is lost. Which groups finish first depends on timing, so unlike
the default rollout this mode is not bit-reproducible across runs.
"""

from __future__ import annotations

import asyncio
from typing import Any

from relax.engine.rewards.config import RewardConfig
from relax.engine.rollout.config import RolloutConfig
from relax.engine.rollout.partial_samples import (
    FINISHED,
    append_response,
    mask_offpolicy,
    partial_metrics,
    protected,
    resume_request,
)
from relax.engine.rollout.prompt_input import take_prompt_ids
from relax.engine.rollout.state import MAX_SAMPLING_ROUNDS, GenerateState, dynamic_filter, sample_seed
from relax.utils.gather import gather_or_cancel
from relax.utils.types import Sample

ABORTED = "partial_rollout_abort"
SURPLUS = "partial_rollout_surplus"


class PartialRollout:
    """One step of partial rollout over ``clients`` (objects with async ``generate`` and ``abort_request``)."""

    def __init__(self, cfg: RolloutConfig, rewards: RewardConfig, rollout_id: int, state: GenerateState,
                 data_source: Any, clients: list):
        if not clients:
            raise ValueError("partial rollout needs at least one engine client")
        self.cfg, self.rewards, self.rollout_id, self.state, self.data_source = cfg, rewards, rollout_id, state, data_source
        self.clients = clients
        self.keep = dynamic_filter(cfg)
        self.inflight: dict[str, tuple[Any, Sample]] = {}
        self.aborting = False
        self.versions: set[int] = set()  # weight versions that answered this step
        self.num_groups = 0
        self.aborted = 0
        self.recycled = 0

    async def run(self) -> list[list[Sample]]:
        target = self.cfg.rollout_batch_size
        kept: list[list[Sample]] = []
        pending: set[asyncio.Task] = set()
        live = rounds = 0  # live: groups drawn and not rejected (Relax's remaining_batch_size)
        try:
            while len(kept) < target:
                while live < target:
                    rounds += 1
                    if rounds > MAX_SAMPLING_ROUNDS:
                        raise RuntimeError(f"partial rollout kept {len(kept)} of {target} groups after "
                                           f"{MAX_SAMPLING_ROUNDS} draws; check --dynamic-sampling-filter-path")
                    groups = self.data_source.get_samples(self.cfg.draw_size)
                    pending |= {asyncio.ensure_future(self._run_group(g)) for g in groups}
                    live += len(groups)
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for task in sorted(done, key=lambda t: t.result()[0].index):
                    group = task.result()
                    if any(s.status is Sample.Status.ABORTED for s in group):  # aborted by someone else
                        self._recycle(group)
                        live -= 1
                        continue
                    keep, reason = self.keep(group)
                    if not keep:
                        self.state.record(self.rollout_id, group, "filtered", reason or "dynamic_sampling_filter")
                        live -= 1
                    elif len(kept) < target:
                        kept.append(group)
                    else:
                        self._recycle(group)
            self.aborting = True
            await self._abort_inflight()
            for group in await gather_or_cancel(*pending):
                self._recycle(group)
            pending = set()
        finally:
            for task in pending:
                task.cancel()
        kept.sort(key=lambda g: g[0].index)
        self._finish(kept)
        return kept

    async def _run_group(self, group: list[Sample]) -> list[Sample]:
        from relax.engine.rewards import compute_rewards

        client = self.clients[self.num_groups % len(self.clients)]  # a group's samples share an engine
        self.num_groups += 1
        await gather_or_cancel(*(self._generate(client, s) for s in group))
        if not self.aborting and all(s.status in FINISHED for s in group):
            await compute_rewards(self.rewards, group)
        return group

    async def _generate(self, client: Any, sample: Sample) -> None:
        if sample.status in FINISHED or (self.aborting and not protected(self.cfg, sample)):
            return  # finished before it was recycled, or drawn too late to start
        rid = f"relax-{self.rollout_id}-{sample.index}"
        params = dict(self.state.sampling_params,
                      sampling_seed=sample_seed(self.cfg.rollout_seed, self.rollout_id, sample.index))
        self.inflight[rid] = (client, sample)
        try:
            response = await client.generate(resume_request(sample, params, rid, self.state.image_pad_id,
                                                            text=self.cfg.use_slime_router))
        finally:
            del self.inflight[rid]
        take_prompt_ids(sample, response, self.cfg.use_slime_router)
        append_response(sample, response)
        if sample.weight_version is not None:
            self.versions.add(sample.weight_version)

    async def _abort_inflight(self) -> None:
        targets = [(client, rid) for rid, (client, s) in self.inflight.items() if not protected(self.cfg, s)]
        await gather_or_cancel(*(client.abort_request(rid) for client, rid in targets))

    def _recycle(self, group: list[Sample]) -> None:
        cut = [s for s in group if s.status is Sample.Status.ABORTED]
        self.state.record(self.rollout_id, group, "recycled", ABORTED if cut else SURPLUS)
        for s in cut:
            s.abort_count += 1
        self.aborted += len(cut)
        self.recycled += 1
        self.data_source.add_samples([group])

    def _finish(self, kept: list[list[Sample]]) -> None:
        samples = [s for g in kept for s in g]
        tokens = [v for s in samples for v in (s.token_weight_versions or []) if v is not None]
        current = max(self.versions | set(tokens), default=self.rollout_id)
        if self.cfg.mask_offpolicy_in_partial_rollout:
            mask_offpolicy(samples, current)
        self.state.add_metrics(self.rollout_id, partial_metrics(samples, current, self.aborted, self.recycled))


async def generate_partial_rollout_async(cfg: RolloutConfig, rewards: RewardConfig, rollout_id: int,
                                         data_source: Any) -> list[list[Sample]]:
    state = GenerateState(cfg.args, config=cfg)
    return await PartialRollout(cfg, rewards, rollout_id, state, data_source, [state.pool]).run()  # aborts via the router
