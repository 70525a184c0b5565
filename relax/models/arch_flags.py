"""Megatron-LM's model-architecture flags (seed 001's ``scripts/models/*.sh``) against HF configs.

A Relax launch script sources a model script whose ``MODEL_ARGS`` describe the network the way
Megatron-LM builds it (``--num-layers 36 --hidden-size 2560 --swiglu --qk-layernorm ...``). Here
the HF ``config.json`` of ``--hf-checkpoint`` is the source of truth for both backends, so:

* with a ``config.json``, the flags are checked against it: every field where the model the
  flags describe differs from the HF one is an error naming both values (`check_against_config`);
* without one (a directory holding only a tokenizer), the flags build the model: `config_from_flags`
  makes the HF config (qk-layernorm -> Qwen3, qkv bias -> Qwen2, else Llama), `spec_from_flags`
  the Megatron backend's `McoreModelSpec`, and `materialize` writes an HF directory (config,
  tokenizer, seeded random-init weights) that every process of the run loads like any checkpoint.

Flags a script does not pass mean what they mean to Megatron-LM: no ``--swiglu`` is a GELU MLP,
no ``--disable-bias-linear`` puts biases on every linear layer, no ``--untie-embeddings-and-output-weights``
ties them, ``--normalization`` defaults to LayerNorm. So a script that forgets one is caught, not
silently trained as something else. The flags count as "describing a model" once any of
``--num-layers``, ``--hidden-size`` or ``--num-attention-heads`` is given.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relax.utils.flag_slice import FlagSlice
from relax.utils.flag_table import FLAGS_BY_NAME

CORE_FLAGS = ("num_layers", "hidden_size", "num_attention_heads")
FAMILIES = ("qwen3", "qwen2", "llama")


class ArchFlagError(ValueError):
    """The architecture flags describe a model the backends do not build, or one that lacks a size."""


@dataclass(frozen=True)
class ModelArchConfig(FlagSlice):
    """The Megatron-LM architecture flags, as parsed (None / off where a script does not pass them); built once by
    the driver (relax/core/setup.py)."""

    # sizes
    num_layers: int | None
    hidden_size: int | None
    num_attention_heads: int | None
    ffn_hidden_size: int | None
    kv_channels: int | None
    group_query_attention: bool
    num_query_groups: int | None
    # MLP, norms, positions
    swiglu: bool
    normalization: str
    norm_epsilon: float
    position_embedding_type: str
    use_rotary_position_embeddings: bool
    rotary_base: float
    max_position_embeddings: int | None
    seq_length: int | None
    # vocabulary and embeddings
    vocab_size: int | None
    make_vocab_size_divisible_by: int
    untie_embeddings_and_output_weights: bool
    # biases and q/k norms
    disable_bias_linear: bool
    add_qkv_bias: bool
    qk_layernorm: bool
    # initialisation and the dtype the weights are written in
    init_method_std: float
    seed: int
    bf16: bool


def describes_model(arch: ModelArchConfig) -> bool:
    return any(getattr(arch, dest) is not None for dest in CORE_FLAGS)


def _given(arch: ModelArchConfig, dest: str) -> bool:
    return getattr(arch, dest) != FLAGS_BY_NAME[dest.replace("_", "-")].default


@dataclass(frozen=True)
class FlagModel:
    """The model the flags describe, with Megatron-LM's defaults for what is not given (HF field names)."""

    num_hidden_layers: int | None
    hidden_size: int | None
    intermediate_size: int | None
    num_attention_heads: int | None
    num_key_value_heads: int | None
    head_dim: int | None
    gated_silu: bool  # --swiglu
    rms_norm: bool  # --normalization RMSNorm
    rms_norm_eps: float
    rope: bool
    rope_theta: float
    vocab_size: int | None  # padded like Megatron-LM pads it
    tie_word_embeddings: bool
    bias_linear: bool  # biases on every linear layer (no --disable-bias-linear)
    qkv_bias: bool
    qk_norm: bool
    max_position_embeddings: int | None
    initializer_range: float

    @property
    def family(self) -> str:
        if self.qk_norm and self.qkv_bias:
            raise ArchFlagError("--qk-layernorm with --add-qkv-bias: no supported family has both "
                                "(Qwen3: q/k norms, Qwen2: qkv bias, Llama: neither)")
        return "qwen3" if self.qk_norm else "qwen2" if self.qkv_bias else "llama"


def padded_vocab(vocab: int, divisible_by: int) -> int:
    """Megatron-LM pads the vocabulary up to a multiple of ``--make-vocab-size-divisible-by`` (TP 1)."""
    return int(math.ceil(vocab / divisible_by) * divisible_by) if divisible_by > 1 else vocab


def flag_model(arch: ModelArchConfig) -> FlagModel:
    hidden, heads = arch.hidden_size, arch.num_attention_heads
    ffn = arch.ffn_hidden_size
    if ffn is None and hidden is not None:  # Megatron-LM's default (arguments.py)
        ffn = int(4 * hidden * 2 / 3 / 64) * 64 if arch.swiglu else 4 * hidden
    head_dim = arch.kv_channels
    if head_dim is None and hidden is not None and heads:
        head_dim = hidden // heads
    return FlagModel(
        num_hidden_layers=arch.num_layers, hidden_size=hidden, intermediate_size=ffn, num_attention_heads=heads,
        num_key_value_heads=arch.num_query_groups if arch.group_query_attention else heads, head_dim=head_dim,
        gated_silu=bool(arch.swiglu), rms_norm=arch.normalization == "RMSNorm", rms_norm_eps=float(arch.norm_epsilon),
        rope=arch.position_embedding_type == "rope" or bool(arch.use_rotary_position_embeddings),
        rope_theta=float(arch.rotary_base),
        vocab_size=None if arch.vocab_size is None else padded_vocab(arch.vocab_size, arch.make_vocab_size_divisible_by),
        tie_word_embeddings=not arch.untie_embeddings_and_output_weights, bias_linear=not arch.disable_bias_linear,
        qkv_bias=bool(arch.add_qkv_bias), qk_norm=bool(arch.qk_layernorm),
        max_position_embeddings=arch.max_position_embeddings or arch.seq_length,
        initializer_range=float(arch.init_method_std),
    )


def _hf_head_dim(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def _hf_qkv_bias(config: Any) -> bool:
    return config.model_type == "qwen2" or bool(getattr(config, "attention_bias", False))


def check_against_config(arch: ModelArchConfig, config: Any, where: str) -> list[str]:
    """Every field where the flags' model differs from the HF ``config`` (``where`` names its file), one line each."""
    if not describes_model(arch):
        return []
    from relax.backends.megatron.config import rope_theta

    m = flag_model(arch)
    gqa = (f"--group-query-attention --num-query-groups {arch.num_query_groups}" if arch.group_query_attention
           else "no --group-query-attention (as many key/value heads as attention heads)")
    numbers = [  # (flags say, their value, HF field, HF value)
        ("--num-layers", m.num_hidden_layers, "num_hidden_layers", config.num_hidden_layers),
        ("--hidden-size", m.hidden_size, "hidden_size", config.hidden_size),
        ("--num-attention-heads", m.num_attention_heads, "num_attention_heads", config.num_attention_heads),
        ("--ffn-hidden-size" if arch.ffn_hidden_size is not None else "Megatron's default --ffn-hidden-size",
         m.intermediate_size, "intermediate_size", config.intermediate_size),
        (gqa, m.num_key_value_heads, "num_key_value_heads",
         getattr(config, "num_key_value_heads", None) or config.num_attention_heads),
        ("--kv-channels" if arch.kv_channels is not None else "hidden-size / num-attention-heads", m.head_dim,
         "head_dim", _hf_head_dim(config)),
        ("--norm-epsilon", m.rms_norm_eps, "rms_norm_eps", getattr(config, "rms_norm_eps", None)),
        ("--rotary-base", m.rope_theta, "rope_theta", rope_theta(config)),
    ]
    if arch.vocab_size is not None:
        numbers.append((f"--vocab-size {arch.vocab_size} padded to a multiple of {arch.make_vocab_size_divisible_by} "
                        "(--make-vocab-size-divisible-by)", m.vocab_size, "vocab_size", config.vocab_size))
    if arch.max_position_embeddings is not None:
        numbers.append(("--max-position-embeddings", m.max_position_embeddings, "max_position_embeddings",
                        config.max_position_embeddings))
    if _given(arch, "init_method_std"):
        numbers.append(("--init-method-std", m.initializer_range, "initializer_range",
                        getattr(config, "initializer_range", None)))
    out = [f"{flag} {ours} does not match {field}={theirs} in {where}" for flag, ours, field, theirs in numbers
           if ours is not None and not _same(ours, theirs)]
    if arch.seq_length is not None and arch.seq_length > config.max_position_embeddings:
        out.append(f"--seq-length {arch.seq_length} exceeds max_position_embeddings={config.max_position_embeddings} "
                   f"in {where}")
    out += _check_switches(m, config, where)
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) or isinstance(b, float):
        return b is not None and math.isclose(float(a), float(b), rel_tol=1e-9)
    return a == b


def _check_switches(m: FlagModel, config: Any, where: str) -> list[str]:
    act = getattr(config, "hidden_act", "silu")
    hf_bias_linear = bool(getattr(config, "mlp_bias", False))
    switches = [  # (flags say, HF says, do they agree)
        ("--swiglu" if m.gated_silu else "no --swiglu (a GELU MLP)", f"hidden_act={act!r} (gated MLP)",
         m.gated_silu == (act == "silu")),
        ("RMSNorm" if m.rms_norm else "--normalization LayerNorm (Megatron's default)", "RMSNorm layers",
         m.rms_norm),
        ("RoPE" if m.rope else "learned absolute positions (no --position-embedding-type rope or "
         "--use-rotary-position-embeddings)", "RoPE", m.rope),
        ("tied embeddings (no --untie-embeddings-and-output-weights)" if m.tie_word_embeddings
         else "--untie-embeddings-and-output-weights", f"tie_word_embeddings={config.tie_word_embeddings}",
         m.tie_word_embeddings == bool(config.tie_word_embeddings)),
        ("biases on every linear layer (no --disable-bias-linear)" if m.bias_linear else "--disable-bias-linear",
         f"mlp_bias={hf_bias_linear}", m.bias_linear == hf_bias_linear),
        ("--add-qkv-bias" if m.qkv_bias else "no --add-qkv-bias", f"model_type={config.model_type!r} "
         f"(q/k/v biases: {_hf_qkv_bias(config)})", m.qkv_bias == _hf_qkv_bias(config)),
        ("--qk-layernorm" if m.qk_norm else "no --qk-layernorm", f"model_type={config.model_type!r} "
         f"(q/k norms: {config.model_type == 'qwen3'})", m.qk_norm == (config.model_type == "qwen3")),
    ]
    return [f"{ours} does not match {where}: {theirs}" for ours, theirs, agree in switches if not agree]


def config_from_flags(arch: ModelArchConfig, *, pad_token_id: int | None, eos_token_id: int | None,
                      vocab_from_tokenizer: int) -> Any:
    """The HF config of the model the flags describe; `ArchFlagError` names what is missing or not built."""
    import transformers as tf

    m = flag_model(arch)
    missing = [f"--{d.replace('_', '-')}" for d in CORE_FLAGS if getattr(arch, d) is None]
    if m.max_position_embeddings is None:
        missing.append("--max-position-embeddings (or --seq-length)")
    if missing:
        raise ArchFlagError(f"building the model from flags needs {', '.join(missing)}")
    refused = [what for what, bad in (
        ("no --swiglu (a GELU MLP)", not m.gated_silu), ("--normalization LayerNorm", not m.rms_norm),
        ("learned absolute positions (pass --position-embedding-type rope)", not m.rope),
        ("biases on every linear layer (pass --disable-bias-linear)", m.bias_linear)) if bad]
    if refused:
        raise ArchFlagError(f"not supported yet: building a model with {', '.join(refused)}; the Qwen2, Qwen3 "
                            "and Llama families are built")
    classes = {"qwen3": tf.Qwen3Config, "qwen2": tf.Qwen2Config, "llama": tf.LlamaConfig}
    vocab = m.vocab_size or padded_vocab(vocab_from_tokenizer, arch.make_vocab_size_divisible_by)
    return classes[m.family](
        vocab_size=vocab, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
        num_hidden_layers=m.num_hidden_layers, num_attention_heads=m.num_attention_heads,
        num_key_value_heads=m.num_key_value_heads, head_dim=m.head_dim, hidden_act="silu",
        rms_norm_eps=m.rms_norm_eps, rope_theta=m.rope_theta, max_position_embeddings=m.max_position_embeddings,
        tie_word_embeddings=m.tie_word_embeddings, initializer_range=m.initializer_range,
        pad_token_id=pad_token_id, eos_token_id=eos_token_id, bos_token_id=None,
    )


def spec_from_flags(arch: ModelArchConfig, *, pad_token_id: int | None = None, eos_token_id: int | None = None,
                    vocab_from_tokenizer: int = 0) -> Any:
    """The Megatron backend's `McoreModelSpec` for the model the flags describe (no HF config needed)."""
    from relax.backends.megatron.config import McoreModelSpec

    return McoreModelSpec.from_hf(config_from_flags(arch, pad_token_id=pad_token_id, eos_token_id=eos_token_id,
                                                    vocab_from_tokenizer=vocab_from_tokenizer))


def materialize(arch: ModelArchConfig, tokenizer: Any, out_dir: str | Path) -> Path:
    """Write the model the flags describe as an HF directory: config, the tokenizer, seeded random-init weights.

    Every process of the run (trainer, engines, services) then loads it like any checkpoint.
    Weights are written in the training dtype (bf16 with ``--bf16``), initialised like presets are.
    """
    import torch
    import transformers as tf

    config = config_from_flags(arch, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                               vocab_from_tokenizer=len(tokenizer))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(arch.seed)
        model = tf.AutoModelForCausalLM.from_config(config)
    model.to(torch.bfloat16 if arch.bf16 else torch.float32).save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
