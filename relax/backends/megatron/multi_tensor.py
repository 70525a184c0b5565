"""torch foreach stand-ins for megatron-core's local multi-tensor fallbacks (no Transformer Engine, no Apex).

Why: without TE or Apex, megatron's gradient clipping computes the global norm with
`local_multi_tensor_l2_norm`, which turns a list of per-tensor norms into a host list (one
device-to-host read per tensor: ~130 host round trips per optimizer step on bench-270m, each
draining the GPU queue), and scales gradients / copies fp32 main params into bf16 model params with
`local_multi_tensor_scale`, a ``dst.copy_(src * scale)`` per tensor (two kernels each). A py-spy
profile of the GRPO bench on the H100 showed these loops in the optimizer step's host time.

The stand-ins keep each op's contract (``op(chunk_size, noop_flag, tensor_lists, *args)``, as
``multi_tensor_applier`` calls it) and its arithmetic, in torch's multi-tensor kernels:

* `foreach_l2_norm`: ``[1]`` fp32 tensor on the tensors' device, the 2-norm of every tensor of every
  list (the per-tensor norms, stacked, normed again: what the fallback computes, with the last step
  on the device instead of the host), and the per-tensor norms when ``per_tensor`` is asked;
* `foreach_scale`: ``dst = src * scale`` pairwise, in ``src``'s dtype, then cast into ``dst`` (the
  fallback's rounding exactly: ``src * 1.0`` is ``src``, so a scale of one is a plain copy).

Like the fallbacks they replace (and unlike Apex), neither writes ``noop_flag``: megatron's bf16
path does not read it. `install` swaps them in only where megatron bound its own fallbacks.
"""

from __future__ import annotations

from typing import Any

import torch


def foreach_l2_norm(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list[list[torch.Tensor]],
                    per_tensor: bool, *args: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``amp_C.multi_tensor_l2norm``'s contract: (total norm ``[1]`` fp32, per-tensor norms or None)."""
    tensors = [t for group in tensor_lists for t in group]
    if not tensors:
        device = noop_flag.device if isinstance(noop_flag, torch.Tensor) else None
        return torch.zeros(1, dtype=torch.float32, device=device), None
    norms = torch.stack([n.float() for n in torch._foreach_norm(tensors)])
    total = torch.linalg.vector_norm(norms).reshape(1)
    return total, (norms if per_tensor else None)


def foreach_scale(chunk_size: int, noop_flag: torch.Tensor, tensor_lists: list[list[torch.Tensor]],
                  scale: float) -> None:
    """``amp_C.multi_tensor_scale``'s contract: ``tensor_lists = [src, dst]``, ``dst[i] = src[i] * scale``."""
    src, dst = tensor_lists[0], tensor_lists[1]
    if len(src) != len(dst):
        raise ValueError(f"multi_tensor_scale: {len(src)} source tensors but {len(dst)} destinations")
    if not src:
        return
    if all(s is d for s, d in zip(src, dst, strict=True)):
        if scale != 1.0:
            torch._foreach_mul_(dst, scale)
        return
    torch._foreach_copy_(dst, src if scale == 1.0 else torch._foreach_mul(src, scale))


def install() -> list[str]:
    """Point megatron's gradient clipping and optimizer at the stand-ins where they hold megatron's local
    fallbacks (not TE's or Apex's kernels); returns the ``module.name`` bindings replaced."""
    from megatron.core import utils
    from megatron.core.optimizer import clip_grads, optimizer

    swaps = {utils.local_multi_tensor_l2_norm: foreach_l2_norm, utils.local_multi_tensor_scale: foreach_scale}
    replaced = []
    for module in (clip_grads, optimizer):
        for name in ("l2_norm_impl", "multi_tensor_scale_impl"):
            current = getattr(module, name, None)
            if current in swaps:
                setattr(module, name, swaps[current])
                replaced.append(f"{module.__name__.rsplit('.', 1)[-1]}.{name}")
            elif current in swaps.values():
                replaced.append(f"{module.__name__.rsplit('.', 1)[-1]}.{name}")
    return replaced
