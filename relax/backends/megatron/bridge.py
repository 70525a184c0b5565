"""``--megatron-to-hf-mode bridge``: megatron-bridge's `AutoBridge` loads and exports the weights instead of relax's raw converter.

What it replaces: `load_hf_weights` (each rank's slices of the HF weights, weights.py) becomes
``AutoBridge.load_hf_weights([model])`` and the export (export.py) becomes
``AutoBridge.export_hf_weights([model])``, which gathers the TP / PP / EP shards itself and hands every
rank the same full HF tensors; relax groups them into buckets of ``--update-weight-buffer-size``
(rank 0 keeps them, the others yield empty buckets, as in raw mode). The model itself is still
relax's (model.py); megatron-bridge maps its parameter names, local layer spec included.

Versions (checked 2026-11-24 against the PyPI mirror): megatron-bridge 0.6.2 needs Python 3.12,
``transformers>=5.8,<=5.12.1`` and ``megatron-core[dev,mlm]`` (plus flashinfer, wandb, mlflow, ...);
0.3.x is the newest release for Python 3.11. Our GPU machine runs transformers 5.17 and our CPU
environment 5.24, so megatron-bridge needs an environment of its own (Python 3.12, transformers
5.12.1, megatron-core 0.19, torch >= 2.6); raw mode needs none of it and is the default.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from relax.utils.modules import module_available

INSTALL_HINT = ("pip install megatron-bridge in an environment of its own: 0.6.2 needs Python 3.12 and "
                "transformers>=5.8,<=5.12.1; or use --megatron-to-hf-mode raw")


def bridge_problem(hf_checkpoint: str | None) -> str | None:
    """Why bridge mode cannot run here (one line), or None."""
    if not module_available("megatron.bridge"):
        return f"--megatron-to-hf-mode bridge needs megatron-bridge, which is not installed ({INSTALL_HINT})"
    if not hf_checkpoint or not Path(hf_checkpoint).is_dir():
        return (f"--megatron-to-hf-mode bridge reads HF checkpoints from a directory; --hf-checkpoint {hf_checkpoint} "
                "is a preset (use --megatron-to-hf-mode raw)")
    return None


class BridgeWeights:
    """One HF checkpoint directory, loaded into and exported from relax's GPTModel by megatron-bridge."""

    def __init__(self, hf_dir: str):
        from megatron.bridge import AutoBridge

        self.bridge = AutoBridge.from_hf_pretrained(hf_dir)

    def load(self, built) -> None:
        self.bridge.load_hf_weights([built.gpt])

    def buckets(self, built, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Full HF tensors on rank 0 in buckets of at most ``bucket_bytes`` (a bigger tensor: a bucket of its own);
        the other ranks (which get the same tensors from megatron-bridge) yield as many empty buckets."""
        keep = (dist.get_rank() if dist.is_initialized() else 0) == 0
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        for name, tensor in self.bridge.export_hf_weights([built.gpt], cpu=False, show_progress=False):
            nbytes = tensor.numel() * tensor.element_size()
            if bucket and size + nbytes > bucket_bytes:
                yield bucket if keep else []
                bucket, size = [], 0
            bucket.append((name, tensor))
            size += nbytes
        if bucket:
            yield bucket if keep else []
