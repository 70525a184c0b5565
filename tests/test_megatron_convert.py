"""Megatron backend pieces that run on CPU: config translation, raw weight conversion, flag rules.

The numerical check builds megatron-core's GPTModel (local spec, fp32) on CPU when megatron-core
is installed and compares its logits with the HF model's. megatron-core hard-codes CUDA in three
places that a forward touches (RoPE frequency device, the default causal mask, the CUDA RNG
tracker); the test passes an explicit mask and patches the other two for its own duration.
The backend itself is GPU-only (tests/gpu/test_megatron_gpu.py).
"""

from __future__ import annotations

import contextlib
import os

import pytest
import torch
import transformers as tf

from relax.backends.megatron.checks import module_available
from relax.backends.megatron.config import McoreModelSpec, UnsupportedModelError
from relax.backends.megatron.convert import WeightLayout, hf_to_mcore, mcore_to_hf, pack_qkv, unpack_qkv
from relax.models import build_config, build_model
from relax.utils.arguments import parse_args
from relax.utils.flag_types import ConfigError

FAMILIES = ["tiny-qwen3", "tiny-qwen2", "tiny-llama"]


def test_spec_from_hf_configs() -> None:
    q3, q2, ll = (McoreModelSpec.from_hf(build_config(n)) for n in FAMILIES)
    assert (q3.qk_layernorm, q3.add_qkv_bias, q3.kv_channels, q3.num_query_groups) == (True, False, 16, 2)
    assert (q2.qk_layernorm, q2.add_qkv_bias, q2.kv_channels) == (False, True, 16)
    assert (ll.qk_layernorm, ll.add_qkv_bias, ll.tie_word_embeddings) == (False, False, True)
    bench = McoreModelSpec.from_hf(build_config("bench-270m"))
    assert (bench.tie_word_embeddings, bench.num_attention_heads, bench.num_query_groups) == (False, 16, 8)
    cfg = tf.Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=8, rope_theta=1e6)
    spec = McoreModelSpec.from_hf(cfg)
    assert spec.rope_theta == 1e6 and spec.gpt_model_kwargs()["rotary_base"] == 1e6
    kw = spec.transformer_config_kwargs()
    assert kw["normalization"] == "RMSNorm" and kw["gated_linear_unit"] and not kw["add_bias_linear"]


@pytest.mark.parametrize("cfg, match", [
    (tf.LlamaConfig(hidden_act="gelu"), "hidden_act"),
    (tf.LlamaConfig(rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}), "rope_type"),
    (tf.LlamaConfig(attention_bias=True), "attention_bias"),
    (tf.LlamaConfig(mlp_bias=True), "mlp_bias"),
    (tf.Qwen2Config(use_sliding_window=True), "sliding"),
    (tf.GPT2Config(), "model_type"),
])
def test_unsupported_configs_are_refused(cfg, match: str) -> None:
    with pytest.raises(UnsupportedModelError, match=match):
        McoreModelSpec.from_hf(cfg)


def _layout(name: str, fused_norms: bool = False) -> WeightLayout:
    return WeightLayout.from_spec(McoreModelSpec.from_hf(build_config(name)), fused_norms=fused_norms)


@pytest.mark.parametrize("fused_norms", [False, True], ids=["local", "te"])
@pytest.mark.parametrize("name", FAMILIES + ["small-qwen3"])
def test_hf_mcore_hf_round_trip_is_bitwise(name: str, fused_norms: bool) -> None:
    hf = build_model(name, seed=3).state_dict()
    layout = _layout(name, fused_norms)
    mc = hf_to_mcore(hf, layout)
    back = mcore_to_hf(mc, layout)
    assert set(back) == set(hf)
    for key, tensor in hf.items():
        assert back[key].dtype == tensor.dtype and torch.equal(back[key], tensor), key
    assert ("decoder.layers.0.self_attention.linear_qkv.layer_norm_weight" in mc) == fused_norms


def test_untied_lm_head_maps_to_output_layer() -> None:
    cfg = build_config("tiny-qwen3")
    cfg.tie_word_embeddings = False
    hf = tf.Qwen3ForCausalLM(cfg).state_dict()
    layout = WeightLayout.from_spec(McoreModelSpec.from_hf(cfg))
    mc = hf_to_mcore(hf, layout)
    assert torch.equal(mc["output_layer.weight"], hf["lm_head.weight"])
    assert not torch.equal(mc["output_layer.weight"], mc["embedding.word_embeddings.weight"])


def test_qkv_packing_groups_query_heads_with_their_kv_head() -> None:
    layout = WeightLayout(1, num_heads=6, num_query_groups=2, head_dim=2, qk_layernorm=False, qkv_bias=False,
                          tie_word_embeddings=True)
    # each row holds its head id: q heads 0..5, k heads 10..11, v heads 20..21
    q = torch.arange(6).repeat_interleave(2).float().unsqueeze(1).expand(-1, 3)
    k = (10 + torch.arange(2)).repeat_interleave(2).float().unsqueeze(1).expand(-1, 3)
    v = (20 + torch.arange(2)).repeat_interleave(2).float().unsqueeze(1).expand(-1, 3)
    fused = pack_qkv(q, k, v, layout.num_query_groups, layout.heads_per_group)
    heads = fused[::2, 0].tolist()
    assert heads == [0, 1, 2, 10, 20, 3, 4, 5, 11, 21]
    for a, b in zip(unpack_qkv(fused, layout.num_query_groups, layout.heads_per_group), (q, k, v), strict=True):
        assert torch.equal(a, b)


def test_conversion_errors_name_the_tensor() -> None:
    hf = build_model("tiny-qwen3", seed=0).state_dict()
    layout = _layout("tiny-qwen3")
    with pytest.raises(KeyError, match="q_norm"):
        hf_to_mcore({k: v for k, v in hf.items() if "layers.1.self_attn.q_norm" not in k}, layout)
    with pytest.raises(KeyError, match="no Megatron counterpart"):
        hf_to_mcore({**hf, "model.extra.weight": torch.zeros(1)}, layout)
    mc = hf_to_mcore(hf, layout)
    with pytest.raises(KeyError, match="no HF counterpart"):
        mcore_to_hf({**mc, "decoder.layers.9.mlp.linear_fc1.weight": torch.zeros(1)}, layout)


# ---------------------------------------------------------------------- flag rules
BASE = ["--prompt-data", "x.jsonl", "--rollout-batch-size", "2", "--num-rollout", "1"]


def test_megatron_backend_on_cpu_is_refused_with_a_reason(monkeypatch) -> None:
    monkeypatch.setattr("relax.backends.megatron.checks.module_available", lambda name: True)
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        parse_args([*BASE, "--train-backend", "megatron", "--device", "cpu"])


def test_megatron_backend_needs_megatron_core(monkeypatch) -> None:
    monkeypatch.setattr("relax.backends.megatron.checks.module_available", lambda name: False)
    with pytest.raises(ConfigError, match="needs megatron-core"):  # on a GPU machine (a CPU one: machine_flags.py)
        parse_args([*BASE, "--train-backend", "megatron", "--device", "cuda"])


def test_megatron_rules(monkeypatch) -> None:
    monkeypatch.setattr("relax.backends.megatron.checks.module_available", lambda name: True)
    args = parse_args([*BASE, "--train-backend", "megatron", "--device", "cuda", "--use-distributed-optimizer",
                       "--megatron-to-hf-mode", "raw"])
    assert args.train_backend == "megatron" and args.use_distributed_optimizer
    if not module_available("megatron.bridge"):
        with pytest.raises(ConfigError, match="needs megatron-bridge, which is not installed .*Python 3.12"):
            parse_args([*BASE, "--train-backend", "megatron", "--device", "cuda", "--megatron-to-hf-mode", "bridge"])
    # the PPO critic is built for Megatron too (relax/backends/torch/critic.py, a copy on every rank)
    assert parse_args([*BASE, "--train-backend", "megatron", "--device", "cuda", "--advantage-estimator",
                       "ppo"]).advantage_estimator == "ppo"
    with pytest.raises(ConfigError, match="--use-distributed-optimizer needs --train-backend megatron"):
        parse_args([*BASE, "--train-backend", "torch", "--use-distributed-optimizer"])
    with pytest.raises(ConfigError, match=r"trainer's 1 rank\(s\) .* not divisible by tensor x context x pipeline"):
        parse_args([*BASE, "--train-backend", "megatron", "--device", "cuda", "--tensor-model-parallel-size", "2"])


# ---------------------------------------------------------------------- real GPTModel on CPU
@pytest.fixture(scope="module")
def cpu_megatron():
    if not module_available("megatron.core"):
        pytest.skip("megatron-core is not installed")
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel

    owns = not dist.is_initialized()
    if owns:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(29400 + os.getpid() % 500))
        dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    tracker = tensor_parallel.get_cuda_rng_tracker()
    saved_fork, saved_device = tracker.fork, torch.cuda.current_device
    tracker.fork = lambda *a, **k: contextlib.nullcontext()  # no CUDA RNG on CPU (dropout is 0)
    torch.cuda.current_device = lambda: "cpu"  # RoPE moves its frequencies to "the current device"
    yield
    tracker.fork, torch.cuda.current_device = saved_fork, saved_device
    parallel_state.destroy_model_parallel()
    if owns:
        dist.destroy_process_group()


@pytest.mark.megatron
@pytest.mark.parametrize("name", FAMILIES)
def test_gptmodel_on_cpu_matches_hf_logits(cpu_megatron, name: str) -> None:
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    from relax.backends.megatron.model import BuiltModel
    from tests.megatron_helpers import export_hf_state, load_hf_state

    hf = build_model(name, seed=5).eval()
    spec = McoreModelSpec.from_hf(hf.config)
    config = TransformerConfig(**spec.transformer_config_kwargs(), activation_func=F.silu,
                               use_cpu_initialization=True, perform_initialization=False)
    gpt = GPTModel(config, get_gpt_layer_local_spec(qk_layernorm=spec.qk_layernorm, normalization="RMSNorm"),
                   **spec.gpt_model_kwargs()).eval()
    built = BuiltModel(gpt, gpt, config, WeightLayout.from_spec(spec), spec.vocab_size)
    load_hf_state(built, hf.state_dict())  # checks names and shapes against the real GPTModel
    exported = export_hf_state(built)
    assert all(torch.equal(exported[k], v) for k, v in hf.state_dict().items())
    ids = torch.randint(0, spec.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    causal = torch.triu(torch.ones(16, 16, dtype=torch.bool), 1)[None, None]
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
        out = gpt(input_ids=ids, position_ids=torch.arange(16).expand(2, -1), attention_mask=causal)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)
