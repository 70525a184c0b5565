"""``--custom-model-provider-path``: a user function that builds the policy model in place of relax's own.

Two contracts, one per train backend:

- ``--train-backend torch``: ``provider(config) -> torch.nn.Module``. ``config`` is the transformers config relax
  builds from ``--hf-checkpoint`` (a preset's, or the directory's ``config.json``; ``_attn_implementation`` already
  set); the module is an HF-style causal LM (``forward(input_ids, attention_mask=..., position_ids=...)`` whose
  output has ``.logits``; the config it was given as ``.config``). It is called with the run's ``--seed`` in force, and cast to the training dtype. A preset
  keeps the provider's own initialisation; a directory's weights are then loaded into it by name.
- ``--train-backend megatron``: Megatron-LM's ``model_provider(pre_process=True, post_process=True, ...)`` returning
  a megatron-core ``GPTModel`` for this pipeline stage; relax also passes ``vp_stage=None`` and ``config`` (the
  ``TransformerConfig`` it built) when the function takes them (relax/backends/megatron/model.py).

Either way the engines build their model from ``--hf-checkpoint`` and the weight sync sends tensors by name, so the
provider's model must keep the checkpoint's parameter names and shapes. The torch contract is checked at launch
(`check_at_launch`): the function is loaded, its signature checked, and it is called once under
``torch.device("meta")`` (no memory, no init) to check the return type and every parameter's name and shape against
the model relax would build; the megatron one (GPU only) is checked for its signature at launch and for the type
and names when the trainer builds it. Every failure is one line naming the flag and the path.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable
from typing import Any

import torch

from relax.utils.plugins import PluginError, load_function

FLAG = "--custom-model-provider-path"
TORCH_SIGNATURE = "provider(config: transformers.PretrainedConfig) -> torch.nn.Module (an HF causal LM)"
MEGATRON_SIGNATURE = ("model_provider(pre_process=True, post_process=True, vp_stage=None, config=None) -> "
                      "megatron.core.models.gpt.GPTModel")


def load_provider(path: str, backend: str) -> Callable[..., Any]:
    """The provider for ``backend`` ("torch" / "megatron"), its signature checked."""
    if backend == "megatron":
        fn = load_function(path, flag=FLAG, signature=MEGATRON_SIGNATURE)
        params = _parameters(fn)
        if params is not None and not _takes_kwargs(params) and not {"pre_process", "post_process"} <= set(params):
            raise PluginError(f"{FLAG} {path}: takes ({', '.join(params)}), not pre_process and post_process; "
                              f"expected {MEGATRON_SIGNATURE}")
        return fn
    return load_function(path, flag=FLAG, signature=TORCH_SIGNATURE, min_args=1)


def _parameters(fn: Callable[..., Any]) -> dict[str, inspect.Parameter] | None:
    try:
        return dict(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return None


def _takes_kwargs(params: dict[str, inspect.Parameter]) -> bool:
    return any(p.kind == p.VAR_KEYWORD for p in params.values())


def megatron_kwargs(fn: Callable[..., Any], **offered: Any) -> dict[str, Any]:
    """The keyword arguments of ``offered`` that ``fn`` takes (pre_process / post_process always)."""
    params = _parameters(fn)
    if params is None or _takes_kwargs(params):
        return offered
    return {k: v for k, v in offered.items() if k in ("pre_process", "post_process") or k in params}


def call_torch_provider(path: str, config: Any) -> torch.nn.Module:
    """``provider(config)``, its return type checked (one line naming the path)."""
    fn = load_provider(path, "torch")
    return _checked_module(fn(config), path)


def _checked_module(model: Any, path: str) -> torch.nn.Module:
    if not isinstance(model, torch.nn.Module):
        raise PluginError(f"{FLAG} {path}: returned {type(model).__name__}, not a torch.nn.Module; "
                          f"expected {TORCH_SIGNATURE}")
    if not hasattr(model, "config"):
        raise PluginError(f"{FLAG} {path}: its {type(model).__name__} has no .config (an HF causal LM keeps the "
                          f"config it was given there); expected {TORCH_SIGNATURE}")
    return model


def check_parameters(model: torch.nn.Module, reference: torch.nn.Module, path: str, hf_checkpoint: str) -> None:
    """The provider's parameter names and shapes must be the checkpoint's (the engines load the sync by name)."""
    mine = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    want = {k: tuple(v.shape) for k, v in reference.state_dict().items()}
    missing, extra = sorted(set(want) - set(mine)), sorted(set(mine) - set(want))
    if missing or extra:
        raise PluginError(f"{FLAG} {path}: its model's parameter names differ from --hf-checkpoint {hf_checkpoint}'s "
                          f"(missing {missing[:3]}, unexpected {extra[:3]}); the engines load the weight sync by name")
    shapes = [f"{k} {list(mine[k])} (checkpoint {list(want[k])})" for k in sorted(want) if mine[k] != want[k]]
    if shapes:
        raise PluginError(f"{FLAG} {path}: parameter shapes differ from --hf-checkpoint {hf_checkpoint}'s: "
                          + "; ".join(shapes[:3]))


def reference_model(config: Any) -> torch.nn.Module:
    """The model relax builds for ``config`` (on whatever device is current: meta at launch)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_config(copy.deepcopy(config))


def check_at_launch(path: str, backend: str, hf_checkpoint: str, attn_implementation: str | None = None, *,
                    save_hf: bool = False) -> None:
    """Load the provider; with the torch backend, build it once on the meta device and check what it returns
    (``save_hf``: --save-hf writes the model with transformers' ``save_pretrained``, which it must then have)."""
    fn = load_provider(path, backend)
    if backend != "torch":
        return
    from relax.models.registry import resolve_checkpoint

    config = provider_config(resolve_checkpoint(hf_checkpoint).config, attn_implementation)
    with torch.device("meta"):
        try:
            model = fn(copy.deepcopy(config))
        except Exception as exc:  # noqa: BLE001 - one line naming the hook, whatever it raised
            raise PluginError(f"{FLAG} {path}: building the model (on the meta device, the launch check) raised "
                              f"{type(exc).__name__}: {exc}") from None
        check_parameters(_checked_module(model, path), reference_model(config), path, hf_checkpoint)
        if save_hf and not hasattr(model, "save_pretrained"):
            raise PluginError(f"{FLAG} {path}: --save-hf writes the model with transformers' save_pretrained, which "
                              f"its {type(model).__name__} lacks (return a transformers PreTrainedModel)")


def provider_config(config: Any, attn_implementation: str | None) -> Any:
    """A copy of the checkpoint's config as the provider gets it (the attention implementation relax would use)."""
    config = copy.deepcopy(config)
    if attn_implementation:
        config._attn_implementation = attn_implementation
    return config


def build_provided_model(path: str, hf_checkpoint: str, *, dtype: torch.dtype, seed: int | None,
                         attn_implementation: str | None = None) -> torch.nn.Module:
    """The trainer's policy from the provider: built with ``seed`` in force, checked against the checkpoint's names
    and shapes, a directory checkpoint's weights loaded into it, cast to ``dtype``."""
    from relax.models.registry import _seeded, build_model, resolve_checkpoint

    ckpt = resolve_checkpoint(hf_checkpoint)
    attn = attn_implementation or (None if ckpt.kind == "preset" else "sdpa")  # what build_model would use
    config = provider_config(ckpt.config, attn)
    with _seeded(seed):
        model = call_torch_provider(path, config)
    with torch.device("meta"):
        check_parameters(model, reference_model(config), path, hf_checkpoint)
    if ckpt.kind == "dir":  # the provider gives the module, the checkpoint its weights
        model.load_state_dict(build_model(hf_checkpoint, dtype=dtype, attn_implementation=attn).state_dict())
    return model.to(dtype)


def call_megatron_provider(path: str, *, pre_process: bool, post_process: bool, config: Any) -> Any:
    """Megatron-LM's ``model_provider(pre_process, post_process, ...)`` for this stage, its return type checked."""
    from megatron.core.models.gpt import GPTModel

    fn = load_provider(path, "megatron")
    model = fn(**megatron_kwargs(fn, pre_process=pre_process, post_process=post_process, vp_stage=None,
                                 config=config))
    if not isinstance(model, GPTModel):
        raise PluginError(f"{FLAG} {path}: returned {type(model).__name__}, not a megatron-core GPTModel; "
                          f"expected {MEGATRON_SIGNATURE}")
    return model


def provider_mismatch(path: str, hf_checkpoint: str, exc: Exception) -> PluginError:
    """The Megatron model a provider built does not take ``--hf-checkpoint``'s weights (names or shapes)."""
    return PluginError(f"{FLAG} {path}: its GPTModel does not match --hf-checkpoint {hf_checkpoint}'s weight layout "
                       f"({exc}); keep relax's parameter names and shapes (the engines load the sync by name)")
