"""``--megatron-to-hf-mode bridge``: megatron-bridge's `AutoBridge` loads and exports the weights instead of relax's raw converter.

What it replaces: `load_hf_weights` (each rank's slices of the HF weights, weights.py) becomes
``AutoBridge.load_hf_weights([model])`` and the export (export.py) becomes
``AutoBridge.export_hf_weights([model])``, which gathers the TP / PP / EP shards itself and hands every
rank the same full HF tensors; relax groups them into buckets of ``--update-weight-buffer-size``
(rank 0 keeps them, the others yield empty buckets, as in raw mode). The model itself is still
relax's (model.py); megatron-bridge maps its parameter names, local layer spec included.

Versions: megatron-bridge 0.6.2 needs Python 3.12, ``transformers>=5.8,<=5.12.1`` (and, through transformers
5.12.1, ``tokenizers<=0.23.0``) and megatron-core; 0.3.x is the newest release for Python 3.11. The GPU machine
runs transformers 5.17 and tokenizers 0.23.2, so megatron-bridge lives in a --target dir of its own
(ci/wheelhouse/install_bridge.sh: /tmp/bridgesite with megatron-bridge, transformers 5.12.1, tokenizers 0.22.2,
omegaconf 2.4.0; bridge_closure.py says why the rest of its declared requirements are left out), first on
PYTHONPATH only for a run in bridge mode. `bridge_problem` names every installed version that conflicts. Raw mode
needs none of it and is the default.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed as dist

from relax.utils.modules import module_available

INSTALL_HINT = ("pip install megatron-bridge in an environment of its own: 0.6.2 needs Python 3.12 and "
                "transformers>=5.8,<=5.12.1 (on the GPU machine: ci/wheelhouse/install_bridge.sh, then "
                "PYTHONPATH=/tmp/bridgesite first); or use --megatron-to-hf-mode raw")
# whose requirements must hold: megatron-bridge's, and those of the transformers it loads
CHECKED = ("megatron-bridge", "transformers")
# the distributions AutoBridge's load and export of a dense model import (ci/wheelhouse/bridge_closure.py): a
# requirement on any other (peft, wandb, timm, ...) is not checked, its modules never load in bridge mode
IMPORTED = frozenset({"transformers", "tokenizers", "huggingface-hub", "safetensors", "omegaconf", "torch",
                      "megatron-core", "numpy", "packaging", "pyyaml", "regex", "tqdm", "einops", "rich"})


def version_conflicts(dists: tuple[str, ...] = CHECKED, imported: frozenset[str] = IMPORTED) -> list[str]:
    """``"transformers 5.17.0 (megatron-bridge 0.6.2 needs transformers<=5.12.1,>=5.8)"`` for each requirement of
    ``dists`` (extras left out) on an ``imported`` distribution whose installed version its specifier excludes; none
    when the first of ``dists`` is not installed. Versions are read as imports resolve them (the first on
    sys.path); requirements that are not installed are not checked."""
    import importlib.metadata as md

    from packaging.requirements import Requirement

    def version(name: str) -> str | None:
        try:
            return md.version(name)
        except md.PackageNotFoundError:
            return None

    out = []
    if version(dists[0]) is None:  # not installed as a distribution (a stand-in module, a source checkout)
        return out
    for name in dists:
        if version(name) is None:
            continue
        for line in md.requires(name) or []:
            req = Requirement(line)
            if req.marker is not None and not req.marker.evaluate({"extra": ""}):
                continue
            if req.name.lower().replace("_", "-") not in imported:
                continue
            have = version(req.name)
            if have is not None and not req.specifier.contains(have, prereleases=True):
                out.append(f"{req.name} {have} ({name} {version(name)} needs {req.name}{req.specifier})")
    return out


def bridge_problem(hf_checkpoint: str | None) -> str | None:
    """Why bridge mode cannot run here (one line), or None."""
    if not module_available("megatron.bridge"):
        return f"--megatron-to-hf-mode bridge needs megatron-bridge, which is not installed ({INSTALL_HINT})"
    conflicts = version_conflicts()
    if conflicts:
        return (f"--megatron-to-hf-mode bridge: version conflict: {'; '.join(conflicts)}. Put megatron-bridge's own "
                "--target dir first on PYTHONPATH (ci/wheelhouse/install_bridge.sh: /tmp/bridgesite)")
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
        the other ranks (which get the same tensors from megatron-bridge) yield as many empty buckets.

        The names are raw mode's: with tied embeddings megatron-bridge exports ``model.embed_tokens.weight`` only,
        and relax's exporter also sends it as ``lm_head.weight`` (layout.py's tied alias), which an engine that
        holds the output layer as a tensor of its own needs; so it follows the embedding here too."""
        keep = (dist.get_rank() if dist.is_initialized() else 0) == 0
        aliases = {"model.embed_tokens.weight": "lm_head.weight"} if built.layout.tie_word_embeddings else {}
        sent: set[str] = set()
        bucket: list[tuple[str, torch.Tensor]] = []
        size = 0
        for name, tensor in self.bridge.export_hf_weights([built.gpt], cpu=False, show_progress=False):
            for hf_name in (name, aliases.get(name)):
                if hf_name is None or hf_name in sent:
                    continue
                sent.add(hf_name)
                nbytes = tensor.numel() * tensor.element_size()
                if bucket and size + nbytes > bucket_bytes:
                    yield bucket if keep else []
                    bucket, size = [], 0
                bucket.append((hf_name, tensor))
                size += nbytes
        if bucket:
            yield bucket if keep else []
