"""The Megatron fusion knobs (relax/backends/megatron/fusions.py): flags -> TransformerConfig fields,
the triton requirement, the torch-backend refusal, and which optimizers get torch's fused Adam."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from relax.backends.megatron import fusions
from relax.backends.megatron.megatron_config import MegatronConfig
from relax.utils.arguments import parse_args
from relax.utils.flag_types import ConfigError


def _args(**kw) -> MegatronConfig:
    """The Megatron slice of the default flags (fusions on), with ``kw`` changed."""
    return MegatronConfig.from_args(parse_args(["--prompt-data", "x.jsonl", "--rollout-batch-size", "2", "--num-rollout", "1"])).replace(**kw)


FIELDS = {"no_bias_swiglu_fusion": "bias_activation_fusion", "no_bias_dropout_fusion": "bias_dropout_fusion",
          "no_rope_fusion": "apply_rope_fusion"}


def test_fusions_are_on_by_default_and_each_flag_turns_one_off(monkeypatch) -> None:
    monkeypatch.setattr(fusions, "module_available", lambda name: name == "triton")
    assert fusions.fusion_kwargs(_args()) == dict.fromkeys(FIELDS.values(), True)
    for flag, field in FIELDS.items():
        assert fusions.fusion_kwargs(_args(**{flag: True})) == {f: f != field for f in FIELDS.values()}


def test_without_triton_the_error_names_the_flags_that_turn_them_off(monkeypatch) -> None:
    monkeypatch.setattr(fusions, "module_available", lambda name: False)
    with pytest.raises(ConfigError, match="--no-bias-swiglu-fusion --no-bias-dropout-fusion --no-rope-fusion"):
        fusions.fusion_kwargs(_args())
    off = fusions.fusion_kwargs(_args(**dict.fromkeys(FIELDS, True)))
    assert not any(off.values())


@pytest.mark.parametrize("flag", ["--no-bias-swiglu-fusion", "--no-bias-dropout-fusion", "--no-rope-fusion"])
def test_the_flags_are_refused_with_the_torch_backend(flag: str, tmp_path) -> None:
    with pytest.raises(ConfigError, match=f"{flag} needs --train-backend megatron"):
        parse_args(["--preset", "quickstart", flag, "--output-dir", str(tmp_path)])


def test_only_plain_torch_adam_on_cuda_params_is_switched() -> None:
    cpu_adam = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(3))])
    sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(3))], lr=0.1)
    chained = SimpleNamespace(chained_optimizers=[SimpleNamespace(optimizer=cpu_adam), SimpleNamespace(optimizer=sgd),
                                                  SimpleNamespace(optimizer=None)])
    assert fusions.use_fused_torch_adam(chained) == 0
    assert cpu_adam.param_groups[0]["fused"] is None and sgd.param_groups[0].get("fused") is None
