"""All of a model's parameters as views of one flat buffer, which can be freed and allocated again in place.

Why one buffer: the lean runner fuses q/k/v and gate/up into one matrix each (one GEMM instead of two
or three), which needs them back to back in memory; laying out *every* parameter in one allocation
also makes a colocate memory release one free and its resume one allocation of the same size. On CUDA
the buffer is a `DeviceRegion` (device_region.py): the release frees its physical memory and keeps its
address, so the decode graphs captured over it stay valid across every release (`LeanRunner` checks the
address before replaying them); elsewhere it comes from the caching allocator, wherever that puts it.

A *group* is a run of parameters stored back to back (same dtype and trailing shape): its `group`
view is their concatenation along dim 0, and each parameter's ``.data`` is a slice of it, so an
in-place update of one parameter is an update of the fused matrix.
"""

from __future__ import annotations

import torch

from relax.backends.embedded import device_region

ALIGN = 256  # bytes: every group starts at a multiple (the CUDA allocator's own alignment for kernels' loads)


class WeightArena:
    def __init__(self, groups: list[list[torch.nn.Parameter]], device: torch.device):
        self.device = device
        # (byte offset, dtype, members, their shapes): the shapes are kept, a discarded parameter has none
        self._layout: list[tuple[int, torch.dtype, list[torch.nn.Parameter], list[torch.Size]]] = []
        offset = 0
        for members in groups:
            first = members[0]
            if any(p.dtype != first.dtype or p.shape[1:] != first.shape[1:] for p in members):
                raise ValueError("a fused group needs one dtype and one trailing shape")
            offset = -(-offset // ALIGN) * ALIGN
            self._layout.append((offset, first.dtype, list(members), [p.shape for p in members]))
            offset += sum(p.numel() for p in members) * first.element_size()
        self.nbytes = offset
        self.buffer: torch.Tensor | None = None
        self._region = (device_region.DeviceRegion(max(offset, 1), device)
                        if device_region.available(torch.device(device)) else None)
        with torch.no_grad():
            self._allocate(copy_values=True)

    @property
    def params(self) -> list[torch.nn.Parameter]:
        return [p for _, _, members, _ in self._layout for p in members]

    def group(self, index: int) -> torch.Tensor:
        """Group ``index``'s members concatenated along dim 0 (a view of the buffer)."""
        offset, dtype, _, shapes = self._layout[index]
        assert self.buffer is not None, "the arena is released"
        numel = sum(s.numel() for s in shapes)
        flat = self.buffer[offset:offset + numel * dtype.itemsize].view(dtype)
        if len(shapes) == 1:
            return flat.view(shapes[0])
        return flat.view(sum(s[0] for s in shapes), *shapes[0][1:])

    def holds(self) -> bool:
        """Whether every parameter is still the view this arena gave it (nothing re-pointed one since)."""
        if self.buffer is None:
            return False
        base = self.buffer.data_ptr()
        for offset, _, members, shapes in self._layout:
            at = base + offset
            for p, shape in zip(members, shapes, strict=True):
                if p.data_ptr() != at or p.shape != shape or not p.is_contiguous():
                    return False
                at += p.numel() * p.element_size()
        return True

    def release(self) -> None:
        """Drop the buffer: a region's physical memory goes back at once (the parameters' views must not be read
        after this: park them first), the caching allocator's once the caller re-points the parameters."""
        self.buffer = None
        if self._region is not None:
            self._region.release()

    def restore(self) -> None:
        """Allocate the buffer again (uninitialised) and point every parameter back at its view."""
        self._allocate(copy_values=False)

    def _allocate(self, *, copy_values: bool) -> None:
        if self._region is not None:
            self._region.restore()
            self.buffer = self._region.tensor(0, max(self.nbytes, 1))
        else:
            self.buffer = torch.empty(max(self.nbytes, 1), dtype=torch.uint8, device=self.device)
        for index, (_, _, members, shapes) in enumerate(self._layout):
            fused, start = self.group(index), 0
            for p, shape in zip(members, shapes, strict=True):
                view = fused if len(members) == 1 else fused[start:start + shape[0]]  # a lone member keeps its shape
                if copy_values:
                    view.copy_(p.data)
                p.data = view
                start += shape[0]
