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


def megatron_gpt(pre_process=True, post_process=True, vp_stage=None, config=None):
    """A user's Megatron-LM provider for small-qwen3 (TP 1): the GPTModel relax builds, from relax's layer spec, and
    a line in the file named by RELAX_TEST_PROVIDER_LOG for each build (what the GPU test reads)."""
    import os
    from pathlib import Path

    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )

    from relax.backends.megatron.config import McoreModelSpec
    from relax.backends.megatron.model import local_layer_spec, transformer_engine_available
    from relax.backends.megatron.norms import HiddenRMSNorm
    from relax.models import build_config

    spec = McoreModelSpec.from_hf(build_config("small-qwen3"))
    if transformer_engine_available():
        layer_spec = get_gpt_layer_with_transformer_engine_spec(num_experts=None, moe_grouped_gemm=False,
                                                                qk_layernorm=spec.qk_layernorm)
    else:
        layer_spec = TransformerBlockSubmodules(layer_specs=[local_layer_spec(spec.qk_layernorm)]
                                                * get_num_layers_to_build(config), layer_norm=HiddenRMSNorm)
    with Path(os.environ["RELAX_TEST_PROVIDER_LOG"]).open("a") as fh:
        fh.write(f"pre_process={pre_process} post_process={post_process} vp_stage={vp_stage}\n")
    return GPTModel(config=config, transformer_layer_spec=layer_spec, pre_process=pre_process,
                    post_process=post_process, parallel_output=False, **spec.gpt_model_kwargs())


class _Bare(torch.nn.Module):
    """The checkpoint's weights under its names in a plain module (no save_pretrained)."""

    def __init__(self, config):
        super().__init__()
        hf = marked(config)
        self.config, self.model, self.lm_head = config, hf.model, hf.lm_head


def bare(config):
    return _Bare(config)
