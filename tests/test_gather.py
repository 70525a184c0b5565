"""`relax.utils.gather.gather_or_cancel`: the first failure ends every sibling call before it is raised, so a hook that
fails on every sample is one error, not one traceback per sample at the event loop's shutdown."""

from __future__ import annotations

import asyncio
import gc

import pytest

from relax.utils import gather
from relax.utils.gather import gather_or_cancel


def _run_collecting_loop_errors(main) -> tuple[object, list[dict]]:
    """``asyncio.run(main())``, with what the loop reports to its exception handler (its shutdown tracebacks)."""
    reported: list[dict] = []

    async def wrapped():
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: reported.append(context))
        return await main()

    result = asyncio.run(wrapped())
    gc.collect()  # a task destroyed with an unread error reports it now
    return result, reported


def test_results_come_in_the_calls_order() -> None:
    async def one(i: int) -> int:
        await asyncio.sleep(0.001 * (5 - i))  # later calls finish first
        return i

    async def main():
        return await gather_or_cancel(*(one(i) for i in range(5)))

    assert asyncio.run(main()) == [0, 1, 2, 3, 4]
    assert asyncio.run(_empty()) == []


async def _empty():
    return await gather_or_cancel()


def test_the_first_failure_cancels_the_siblings_and_ends_them_before_it_is_raised() -> None:
    ended: list[str] = []

    async def fails() -> None:
        await asyncio.sleep(0.01)
        raise ValueError("hook bug")

    async def slow(name: str) -> None:
        try:
            await asyncio.sleep(30)
        finally:
            ended.append(name)

    async def main():
        with pytest.raises(ValueError, match="hook bug"):
            await gather_or_cancel(slow("a"), fails(), slow("b"))
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        return ended[:], left

    (ended_at_raise, left), reported = _run_collecting_loop_errors(main)
    assert sorted(ended_at_raise) == ["a", "b"] and left == []  # asyncio.gather leaves both running
    assert reported == []


def test_siblings_failing_the_same_way_report_nothing_at_shutdown() -> None:
    """Every sample hits the same bug: one error comes out, and the loop prints none of the others."""
    async def fails(i: int) -> None:
        await asyncio.sleep(0.001 * (i % 3))
        try:
            await asyncio.sleep(0.005)
        finally:
            raise KeyError(f"sample {i}")  # fails even while being cancelled

    async def main():
        with pytest.raises(KeyError) as info:
            await gather_or_cancel(*(fails(i) for i in range(40)))
        return str(info.value)

    first, reported = _run_collecting_loop_errors(main)
    assert first.startswith("'sample ")
    assert reported == []


def test_cancelling_the_caller_cancels_every_call() -> None:
    cancelled: list[int] = []

    async def waits(i: int) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(i)
            raise

    async def main():
        outer = asyncio.ensure_future(gather_or_cancel(*(waits(i) for i in range(3))))
        await asyncio.sleep(0.01)
        outer.cancel()
        with pytest.raises(asyncio.CancelledError):
            await outer
        return sorted(cancelled)

    assert asyncio.run(main()) == [0, 1, 2]


def test_a_call_that_ignores_its_cancellation_is_waited_for_at_most_the_bound(monkeypatch) -> None:
    monkeypatch.setattr(gather, "CANCEL_WAIT_S", 0.2)

    async def stubborn() -> None:
        for _ in range(3):
            try:
                await asyncio.sleep(0.5)
            except asyncio.CancelledError:
                pass

    async def fails() -> None:
        raise RuntimeError("first")

    async def main():
        loop = asyncio.get_running_loop()
        start = loop.time()
        with pytest.raises(RuntimeError, match="first"):
            await gather_or_cancel(stubborn(), fails())
        return loop.time() - start

    assert asyncio.run(main()) < 1.0  # the bound (0.2 s), not the stubborn call's 1.5 s


def test_a_reward_function_failing_on_every_sample_leaves_no_scoring_call_behind() -> None:
    """The bug this module fixes: a --custom-rm-path function that raises, scored one sample at a time (its
    --hook-timeout path); the other samples' calls used to outlive the error and fail at the loop's shutdown."""
    from relax.engine.rewards import _per_sample
    from relax.utils.types import Sample

    def broken(args, sample):
        raise TypeError("expected str, not Namespace")

    score = _per_sample(broken, "--custom-rm-path mod.broken", None, timeout_s=5.0)
    samples = [Sample(index=i, group_index=i // 4, prompt="p") for i in range(16)]

    async def main():
        with pytest.raises(TypeError) as info:
            await score(samples)
        left = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        return info.value, left

    (error, left), reported = _run_collecting_loop_errors(main)
    assert left == [] and reported == []
    assert any("in reward function --custom-rm-path mod.broken (sample index" in n for n in error.__notes__)
