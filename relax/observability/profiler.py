"""What a trainer rank records around its steps: torch.profiler traces (``--use-pytorch-profiler``) and the
timeline's trainer spans (``--timeline-dump-dir``). One helper for every train backend (torch, Megatron).

A target (``train_overall``: the whole step; ``train_log_probs``: the old / reference / teacher log-prob
forwards; ``train_actor``: the optimizer steps) is profiled at the step offsets ``--profile-step-start`` to
``--profile-step-end`` (inclusive; counted from 0 in this launch, so a resumed run counts again), one Chrome
trace per step and rank of the outermost profiled target: ``<trace dir>/<target>_step<offset>_rank<rank>.pt.trace.json``
(the inner targets are labelled ranges in it).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from relax.observability.config import ProfilerConfig

TIMELINE_NAMES = {"train_log_probs": "log_probs", "train_actor": "actor_update"}  # train_overall: the driver's


class TrainProfiler:
    def __init__(self, cfg: ProfilerConfig, rank: int = 0):
        self.cfg, self.rank = cfg, rank
        self.offset = 0  # steps this launch has trained (the profile window counts these)
        # target -> (start unix time, its profiler, or its range in an outer target's trace, step offset)
        self._open: dict[str, tuple[float, Any, Any, int]] = {}
        self._spans: list[dict[str, Any]] = []

    def start(self, target: str, step: int) -> None:
        """Begin ``target``. Only one torch profiler can run at a time: a target inside a profiled one (the log-prob
        forwards inside ``train_overall``) is a labelled range (``record_function``) in the outer trace."""
        import torch

        running = any(prof is not None for _, prof, _, _ in self._open.values())
        prof = label = None
        if self.cfg.profiles(target, self.offset):
            if running:
                label = torch.profiler.record_function(target)
                label.__enter__()
            else:
                activities = [torch.profiler.ProfilerActivity.CPU]
                if torch.cuda.is_available():
                    activities.append(torch.profiler.ProfilerActivity.CUDA)
                prof = torch.profiler.profile(activities=activities, record_shapes=self.cfg.profile_with_flops,
                                              with_stack=self.cfg.profile_with_stack,
                                              profile_memory=self.cfg.profile_with_memory,
                                              with_flops=self.cfg.profile_with_flops)
                prof.__enter__()
        self._open[target] = (time.time(), prof, label, self.offset)

    def stop(self, target: str, step: int) -> Path | None:
        """End ``target``; the trace file when it was profiled on its own."""
        begun, prof, label, offset = self._open.pop(target, (None, None, None, self.offset))
        if begun is not None and self.cfg.timeline_dump_dir and target in TIMELINE_NAMES:
            self._spans.append({"name": TIMELINE_NAMES[target], "row": f"trainer:{self.rank}", "start": begun,
                                "end": time.time(), "step": step})
        if target == "train_overall":
            self.offset += 1
        if label is not None:
            label.__exit__(None, None, None)
        if prof is None:
            return None
        prof.__exit__(None, None, None)
        out = self.cfg.trace_dir / f"{target}_step{offset}_rank{self.rank}.pt.trace.json"
        out.parent.mkdir(parents=True, exist_ok=True)
        prof.export_chrome_trace(str(out))
        return out

    def pop_spans(self) -> list[dict[str, Any]]:
        spans, self._spans = self._spans, []
        return spans
