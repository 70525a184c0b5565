"""``/weights_checker``: prove that a weight sync writes every tensor (SGLang 0.5.14's actions).

Actions (``{"action": ...}``, SGLang's default ``checksum``), answered ``{"success", "message"}`` like
SGLang's (``sglang/srt/utils/weight_checker.py``); an unknown action answers ``success`` false:

* ``snapshot``: keep a host copy of every state-dict tensor;
* ``reset_tensors``: overwrite every floating tensor with noise (a tensor that a later sync skips keeps
  noise, so its checksum cannot match the trainer's);
* ``compare``: the current weights against the snapshot, bit for bit; ``success`` false names the tensors
  that differ;
* ``checksum``: per-tensor checksums keyed by HF name (`relax.weights.checksum`), so both sides of every
  sync go to weights.jsonl. The answer has SGLang 0.5.14's shape, ``ranks`` (one rank here: its
  ``checksums``, ``per_gpu_checksum``, ``parallelism_info``) and ``per_engine_checksum``, combined as
  SGLang combines them, plus ``checksums`` at the top (relax's reader). The ranks' values are relax's
  checksums of HF-named tensors; with ``layout="sglang"`` (``serve-engine --weights-checker-layout sglang``)
  they are what a stock SGLang 0.5.14 server answers for the same model (its ``tensor_hash`` of its fused
  parameters, `relax.weights.sglang_checksums`), so the trainer's read-back of stock servers runs on a CPU.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Callable
from typing import Any

import torch

from relax.models.checkpoint_names import checkpoint_state, moe_style
from relax.weights.checksum import state_checksums
from relax.weights.sglang_checksums import SGLangLayoutChecksums

ACTIONS = ("snapshot", "reset_tensors", "compare", "checksum")
# SGLang's ParallelismInfo of a one-rank engine
ONE_RANK = {"tp_rank": 0, "tp_size": 1, "dp_rank": 0, "dp_size": 1, "pp_rank": 0, "pp_size": 1, "rank": 0, "size": 1}


def combined_checksum(checksums: dict[str, str]) -> str:
    """SGLang's ``per_gpu_checksum``: sha256 over the sorted names, each followed by its checksum."""
    h = hashlib.sha256()
    for name in sorted(checksums):
        h.update(name.encode())
        h.update(checksums[name].encode())
    return h.hexdigest()


def engine_checksum(ranks: list[dict[str, Any]]) -> str:
    """SGLang's ``per_engine_checksum``: sha256 over the ranks' ``per_gpu_checksum`` in rank order."""
    h = hashlib.sha256()
    for rank in ranks:
        h.update(rank["per_gpu_checksum"].encode())
    return h.hexdigest()


def model_tensors(model: torch.nn.Module) -> Callable[[], dict[str, torch.Tensor]]:
    """An HF model's tensors under HF checkpoint names, as weight syncs name them (relax/models/checkpoint_names.py):
    views of its parameters."""
    return lambda: checkpoint_state(model.state_dict(), moe_style(getattr(model, "config", None)))


class WeightsChecker:
    """``state`` gives the holder's tensors under HF checkpoint names; ``write`` loads HF-named tensors into the
    holder (default: copy into ``state``'s tensors, which must then be views of the weights)."""

    def __init__(self, state: Callable[[], dict[str, torch.Tensor]], layout: str = "relax", *,
                 write: Callable[[list[tuple[str, torch.Tensor]]], None] | None = None):
        self._state = state
        self._write = write
        self.layout = layout  # the ranks' checksums: relax's of HF-named tensors, or "sglang": SGLang's own
        self._snapshot: dict[str, torch.Tensor] | None = None
        self._resets = itertools.count(1)  # each reset draws new noise

    def run(self, action: str) -> dict[str, Any]:
        if action not in ACTIONS:  # SGLang: the checker raises, the answer is success false (400)
            return {"success": False, "message": f"Unsupported action={action!r}; one of {', '.join(ACTIONS)}"}
        return getattr(self, action)()

    @torch.no_grad()
    def snapshot(self) -> dict[str, Any]:
        self._snapshot = {k: v.detach().cpu().clone() for k, v in self._state().items()}
        return {"success": True, "message": f"snapshot of {len(self._snapshot)} tensors"}

    @torch.no_grad()
    def reset_tensors(self) -> dict[str, Any]:
        gen = torch.Generator().manual_seed(next(self._resets))
        noise: dict[int, torch.Tensor] = {}  # one draw per storage: tied names get the same noise
        named = []
        for name, t in self._state().items():
            if not t.is_floating_point():
                continue
            if t.data_ptr() not in noise:
                draw = torch.randn(t.shape, generator=gen, dtype=torch.float32) * 0.02 + 0.5
                noise[t.data_ptr()] = draw.to(t.device, t.dtype)
            named.append((name, t, noise[t.data_ptr()]))
        if self._write is not None:
            self._write([(name, value) for name, _, value in named])
        else:
            for _, t, value in named:
                t.copy_(value)
        return {"success": True, "message": f"reset {len(noise)} tensors"}

    def checksum(self) -> dict[str, Any]:
        state = self._state()
        sums = state_checksums(state.items())
        rank_sums = sums
        if self.layout == "sglang":
            stacked = SGLangLayoutChecksums()
            stacked.add(list(state.items()))
            rank_sums = stacked.result()
        ranks = [{"checksums": rank_sums, "per_gpu_checksum": combined_checksum(rank_sums),
                  "parallelism_info": dict(ONE_RANK)}]
        return {"success": True, "message": f"checksums of {len(sums)} tensors", "ranks": ranks,
                "per_engine_checksum": engine_checksum(ranks), "checksums": sums}

    @torch.no_grad()
    def compare(self) -> dict[str, Any]:
        if self._snapshot is None:
            return {"success": False, "message": "compare needs a snapshot first"}
        state = self._state()
        differ = sorted(name for name, ref in self._snapshot.items()
                        if name not in state or state[name].shape != ref.shape
                        or not torch.equal(state[name].detach().cpu(), ref))
        missing = sorted(set(state) - set(self._snapshot))
        if differ or missing:
            return {"success": False, "message": f"{len(differ)} tensors differ from the snapshot "
                    f"({', '.join(differ[:5])}{'...' if len(differ) > 5 else ''}); {len(missing)} not in it"}
        return {"success": True, "message": f"all {len(state)} tensors equal the snapshot"}
