"""What the rollout functions share (the default rollout, partial rollout, multi-turn): the process-wide
`GenerateState`, per-sample sampling seeds, the finish-reason -> status map and the dynamic-sampling filter.
What they read of the flags is the `RolloutConfig` slice (relax/engine/rollout/config.py).

A leaf below relax/engine/rollout/sglang_rollout.py (which re-exports `GenerateState` and `sample_seed` under
their Relax paths) and relax/engine/rollout/partial_rollout.py, so neither imports the other for them.
"""

from __future__ import annotations

import functools
from argparse import Namespace
from typing import Any

from relax.engine.rollout.config import RolloutConfig
from relax.utils.types import Sample

_MASK63 = (1 << 63) - 1


def sample_seed(rollout_seed: int, rollout_id: int, sample_index: int) -> int:
    """A well-mixed 63-bit seed from (rollout_seed, rollout_id, sample_index) (splitmix64 finaliser)."""
    x = (rollout_seed * 0x9E3779B97F4A7C15 + rollout_id * 0xBF58476D1CE4E5B9 + sample_index) & ((1 << 64) - 1)
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return (x ^ (x >> 31)) & _MASK63


class _Singleton(type):
    """``GenerateState(args)`` returns the process-wide instance, as in Relax/slime."""

    _instance: Any = None

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        if cls._instance is None:
            cls._instance = super().__call__(*args, **kwargs)
        return cls._instance

    def reset(cls) -> None:
        cls._instance = None


class GenerateState(metaclass=_Singleton):
    """Process-wide rollout state: tokenizer, default sampling params and the engine pool.

    ``config``: the run's rollout slice (`install` passes the driver's); built from ``args`` otherwise."""

    # seed hook: seed 001's custom generate example calls GenerateState(args)
    def __init__(self, args: Namespace | None, *, config: RolloutConfig | None = None, tokenizer: Any = None,
                 pool: Any = None):
        self.config = config if config is not None else RolloutConfig.from_args(args)
        if tokenizer is None:
            from relax.models import load_tokenizer

            tokenizer = load_tokenizer(self.config.hf_checkpoint)
        self.args = args
        self.tokenizer = tokenizer
        self.pool = pool
        self.sampling_params = self.config.sampling_params()
        self._fates: list[dict[str, Any]] = []  # filtered / recycled samples, drained into samples.jsonl
        self._metrics: dict[int, dict[str, float]] = {}  # per rollout id, merged into that step's metrics

    @functools.cached_property
    def image_pad_id(self) -> int | None:
        """The tokenizer's ``<|image_pad|>`` id (None: it has none): a request holds one per image
        (relax/engine/rollout/prompt_input.py)."""
        from relax.models.tokenizer import IMAGE_PAD

        vocab = getattr(self.tokenizer, "get_vocab", None)
        return vocab().get(IMAGE_PAD) if callable(vocab) else None

    def record(self, step: int, group: list[Sample], fate: str, reason: str) -> None:
        from relax.metrics.sample_records import sample_fields

        self._fates += [{"step": step, "group_index": s.group_index, "index": s.index, "attempts": s.abort_count + 1,
                         "fate": fate, "reason": reason, **sample_fields(s, self.config.reward_key)} for s in group]

    def drain_fates(self) -> list[dict[str, Any]]:
        fates, self._fates = self._fates, []
        return fates

    def add_metrics(self, step: int, metrics: dict[str, float]) -> None:
        self._metrics.setdefault(step, {}).update(metrics)

    def add_seconds(self, step: int, key: str, seconds: float) -> None:
        """Add to a per-step time metric (a rollout can generate in several rounds)."""
        metrics = self._metrics.setdefault(step, {})
        metrics[key] = metrics.get(key, 0.0) + seconds

    def pop_metrics(self, step: int) -> dict[str, float]:
        return self._metrics.pop(step, {})

    @classmethod
    def install(cls, config: RolloutConfig, *, tokenizer: Any = None, pool: Any = None) -> GenerateState:
        """Replace the process-wide state (the driver calls this once engines are up); ``GenerateState(args)``
        then returns it, with ``args`` the one the slice was built from."""
        type(cls).reset(cls)
        return cls(config.args, config=config, tokenizer=tokenizer, pool=pool)


FINISH_STATUS = {"length": Sample.Status.TRUNCATED, "stop": Sample.Status.COMPLETED, "abort": Sample.Status.ABORTED}


MAX_SAMPLING_ROUNDS = 64
FILTER_SIGNATURE = "filter(args, samples: list[Sample], **kwargs) -> DynamicFilterOutput | bool"


def dynamic_filter(cfg: RolloutConfig):
    """``keep(group) -> (keep, reason)``: the ``--dynamic-sampling-filter-path`` hook, called with the seeds'
    ``args`` (``cfg.args``); every group is kept without one."""
    if not cfg.dynamic_sampling_filter_path:
        return lambda g: (True, None)
    from relax.utils.plugins import culprit, load_function, wrong_answer

    path = cfg.dynamic_sampling_filter_path
    fn = load_function(path, flag="--dynamic-sampling-filter-path", signature=FILTER_SIGNATURE, min_args=2)

    def keep(group: list[Sample]) -> tuple[bool, str | None]:
        with culprit("--dynamic-sampling-filter-path", path, f"group {group[0].group_index if group else None}"):
            out = fn(cfg.args, group)
        if isinstance(out, bool):
            return out, None
        if not hasattr(out, "keep"):
            raise wrong_answer(f"--dynamic-sampling-filter-path {path}", out, FILTER_SIGNATURE)
        return bool(out.keep), getattr(out, "reason", None)

    return keep
