"""--model-name: the conversion family the Megatron backend builds and converts a checkpoint as."""

from __future__ import annotations

import copy

import pytest

from relax.backends.megatron.config import McoreModelSpec, UnsupportedModelError
from relax.models import resolve_checkpoint
from relax.utils.arguments import parse_args
from relax.utils.flag_types import ConfigError
from tests.test_train_loop_flags import BASE


def _renamed(preset: str, model_type: str):
    """A preset's config under another model_type (a derivative the family table does not know by name)."""
    config = copy.deepcopy(resolve_checkpoint(preset).config)
    config.model_type = model_type
    return config


def test_the_name_picks_the_family_of_an_unknown_model_type() -> None:
    config = _renamed("tiny-qwen3", "my_qwen3_finetune")
    with pytest.raises(UnsupportedModelError, match="not model_type='my_qwen3_finetune'"):
        McoreModelSpec.from_hf(config)  # inferred: no family
    spec = McoreModelSpec.from_hf(config, "qwen3")
    assert spec.model_type == "qwen3" and spec.qk_layernorm and not spec.add_qkv_bias
    as_qwen2 = McoreModelSpec.from_hf(config, "Qwen2Config")  # slime's spelling: the config class's name
    assert as_qwen2.model_type == "qwen2" and as_qwen2.add_qkv_bias and not as_qwen2.qk_layernorm
    assert McoreModelSpec.from_hf(_renamed("small-qwen3-moe", "x"), "qwen3moe").is_moe


def test_unset_infers_from_the_config() -> None:
    config = resolve_checkpoint("tiny-llama").config
    assert McoreModelSpec.from_hf(config) == McoreModelSpec.from_hf(config, "llama")


@pytest.mark.parametrize("name", ["qwen3", "Qwen3Config", "QWEN3"])
def test_accepted_at_parse_time(name: str) -> None:
    assert parse_args([*BASE, "--model-name", name]).model_name == name


@pytest.mark.parametrize(("name", "message"), [
    ("gpt-oss", "--model-name 'gpt-oss' is not a conversion family this harness knows (qwen2, qwen3, llama, "
                "qwen3_moe, mixtral)"),
    ("llama", "--model-name llama names the llama family, but the checkpoint's config.json says model_type='qwen3'"),
])
def test_refused_in_one_line(name: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_args([*BASE, "--model-name", name])
    assert message in str(info.value)
    assert "\n" not in message
