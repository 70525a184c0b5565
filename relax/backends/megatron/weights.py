"""Moving weights between HF state dicts and a built GPTModel (through the selected converter).

`export_hf_state` is what the weight sync and checksums see: HF names, the model's own bf16
tensors (tied embeddings listed under both HF names, like an HF state dict).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from relax.backends.megatron.convert import EXTRA_STATE_SUFFIX, converters
from relax.backends.megatron.model import BuiltModel


@torch.no_grad()
def load_hf_state(built: BuiltModel, hf_state: Mapping[str, torch.Tensor], *, mode: str = "raw") -> None:
    """Copy an HF state dict into the model (cast to the model's dtype); every weight must be covered."""
    to_mcore, _ = converters(mode)
    converted = to_mcore(hf_state, built.layout)
    params = built.gpt.state_dict(keep_vars=True)
    expected = {k for k in params if not k.endswith(EXTRA_STATE_SUFFIX)}
    missing, unexpected = sorted(expected - set(converted)), sorted(set(converted) - expected)
    if missing or unexpected:
        raise ValueError(f"converted weights do not match the GPTModel: missing={missing[:5]} unexpected={unexpected[:5]}")
    for name, tensor in converted.items():
        target = params[name]
        if tuple(target.shape) != tuple(tensor.shape):
            raise ValueError(f"{name}: converted shape {list(tensor.shape)}, model has {list(target.shape)}")
        target.copy_(tensor.to(device=target.device, dtype=target.dtype))


@torch.no_grad()
def export_hf_state(built: BuiltModel, *, mode: str = "raw") -> dict[str, torch.Tensor]:
    """The model's weights under HF names, on the model's device and in its dtype."""
    _, to_hf = converters(mode)
    state = {k: v.detach() for k, v in built.gpt.state_dict().items() if not k.endswith(EXTRA_STATE_SUFFIX)}
    return to_hf(state, built.layout)
