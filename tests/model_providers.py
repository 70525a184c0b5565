"""Model providers for --custom-model-provider-path tests (tests/test_model_provider.py): one that builds the
checkpoint's model with a marker (final norm weights 0.5 instead of 1.0, and an attribute), and broken ones."""

from __future__ import annotations

import torch

MARK = 0.5


def marked(config):
    """The checkpoint's model, its final norm initialised to MARK and tagged: what the trainer holds proves its use."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        model.model.norm.weight.fill_(MARK)
    model.built_by_provider = True
    return model


def not_a_module(config):
    return {"config": config}


class _Wrapped(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.inner = marked(config)


def renamed(config):
    """The same weights under ``inner.`` names: the engines could not load its syncs."""
    return _Wrapped(config)


def wider(config):
    """One more hidden unit in the MLPs: the names match, the shapes do not."""
    import copy

    config = copy.deepcopy(config)
    config.intermediate_size += 1
    return marked(config)


def no_arguments():
    raise AssertionError("never called")


def megatron_provider(pre_process=True, post_process=True, vp_stage=None):
    """Megatron-LM's signature (no config): returns a module that is not a GPTModel, to test the type check."""
    return torch.nn.Linear(2, 2)


def megatron_without_stages(config):
    raise AssertionError("never called")
