"""``--offload-train``: park a trainer's modules and optimizers in CPU memory while the engines roll out.

`offload` moves every parameter (``p.data``), its gradient (``p.grad``), every buffer and every
optimizer state tensor (``optimizer.state[p][k]``) that lives on the device into pinned CPU memory,
then returns the cached blocks to the driver; `onload` moves exactly those tensors back. Tensors are
moved in place (the ``Parameter`` objects, and so the optimizer's keys, stay the same), and a copy
to CPU and back is exact, so training after an offload/onload round trip is bitwise the same as
without it. Tensors that were on the CPU already (Adam's ``step`` counters, a CPU model) are left
alone: on a CPU device both calls walk nothing and return at once.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class OffloadStats:
    seconds: float
    moved_bytes: int  # bytes of the tensors moved
    device_bytes: int  # device memory freed (offload) or taken back (onload); 0 on CPU

    def as_dict(self) -> dict[str, float]:
        return {"seconds": self.seconds, "moved_bytes": self.moved_bytes, "device_bytes": self.device_bytes}


def _to_cpu(t: torch.Tensor) -> torch.Tensor:
    """A pinned CPU copy (asynchronous; the caller synchronizes before trusting it)."""
    out = torch.empty_like(t, device="cpu", pin_memory=True)
    out.copy_(t, non_blocking=True)
    return out


class TrainOffloader:
    """Moves a trainer's modules and optimizers between ``device`` and the CPU, and back."""

    def __init__(self, device: torch.device, modules: Iterable[torch.nn.Module | None],
                 optimizers: Iterable[torch.optim.Optimizer | None]):
        self.device = device
        self.modules = [m for m in modules if m is not None]
        self.optimizers = [o for o in optimizers if o is not None]
        self.offloaded = False
        self._moved: list[tuple[object, str]] = []  # (holder, attribute/key) moved to the CPU by `offload`

    # ------------------------------------------------------------------ walking the tensors
    def _params(self) -> Iterator[torch.nn.Parameter]:
        seen: set[int] = set()
        for module in self.modules:
            for p in module.parameters():
                if id(p) not in seen:  # tied weights are one Parameter
                    seen.add(id(p))
                    yield p

    def _buffers(self) -> Iterator[tuple[torch.nn.Module, str]]:
        for module in self.modules:
            for sub in module.modules():
                for name, buf in sub._buffers.items():
                    if buf is not None:
                        yield sub, name

    def _on_device(self, t: torch.Tensor | None) -> bool:
        return isinstance(t, torch.Tensor) and t.device.type == self.device.type and t.device.type != "cpu"

    # ------------------------------------------------------------------ moves
    def offload(self) -> OffloadStats:
        if self.offloaded:
            raise RuntimeError("trainer is already offloaded")
        start, before = time.perf_counter(), self._allocated()
        moved, self._moved = 0, []
        if self.device.type != "cpu":
            with torch.no_grad():
                for p in self._params():
                    grad, p.grad = p.grad, None  # a grad must live where its parameter lives: move data first
                    if self._on_device(p.data):
                        moved += p.data.nbytes
                        p.data = _to_cpu(p.data)
                        self._moved.append((p, "data"))
                    if self._on_device(grad):
                        moved += grad.nbytes
                        grad = _to_cpu(grad)
                        self._moved.append((p, "grad"))
                    p.grad = grad
                for sub, name in self._buffers():
                    if self._on_device(sub._buffers[name]):
                        moved += sub._buffers[name].nbytes
                        sub._buffers[name] = _to_cpu(sub._buffers[name])
                        self._moved.append((sub._buffers, name))
                for opt in self.optimizers:
                    for state in opt.state.values():
                        for key, value in state.items():
                            if self._on_device(value):
                                moved += value.nbytes
                                state[key] = _to_cpu(value)
                                self._moved.append((state, key))
            self._synchronize()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        self.offloaded = True
        return OffloadStats(time.perf_counter() - start, moved, max(before - self._allocated(), 0))

    def onload(self) -> OffloadStats:
        if not self.offloaded:
            raise RuntimeError("trainer is not offloaded")
        start, before = time.perf_counter(), self._allocated()
        moved = 0
        with torch.no_grad():
            for holder, key in self._moved:  # the offload order: a parameter's data before its grad
                if isinstance(holder, torch.nn.Parameter):
                    if key == "grad" and holder.grad.device.type != "cpu":
                        continue  # came back with its parameter
                    grad, holder.grad = holder.grad, None
                    if key == "data":
                        moved += holder.data.nbytes
                        holder.data = holder.data.to(self.device, non_blocking=True)
                    if grad is not None and grad.device.type == "cpu":  # it was moved with the parameter
                        moved += grad.nbytes
                        grad = grad.to(self.device, non_blocking=True)
                    holder.grad = grad
                else:
                    moved += holder[key].nbytes
                    holder[key] = holder[key].to(self.device, non_blocking=True)
        self._moved = []
        self._synchronize()
        self.offloaded = False
        return OffloadStats(time.perf_counter() - start, moved, max(self._allocated() - before, 0))

    def _allocated(self) -> int:
        return torch.cuda.memory_allocated(self.device) if self.device.type == "cuda" else 0

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
