"""HF config -> megatron-core model description (pure Python: no megatron import, runs on CPU).

`McoreModelSpec.from_hf` reads a Qwen2 / Qwen3 / Llama-family HF config, or a Qwen3-MoE /
Mixtral one, and returns what the model provider needs: the `TransformerConfig` fields, the
`GPTModel` arguments and the weight layout the raw converter uses. Anything in the HF config
that the local/TE layer specs would silently compute differently (rope scaling, sliding windows,
biases on o_proj or the MLP, a non-SiLU activation, dense layers between MoE layers, router
jitter) is refused with a message naming the config field.

MoE routing: HF takes the softmax over all experts, keeps the top k and, when ``norm_topk_prob``
(Qwen3-MoE) or always (Mixtral), renormalises them; megatron-core's softmax router computes the
same probabilities as a softmax over the top-k logits (``moe_router_pre_softmax=False``), or
without renormalisation as top-k of the full softmax (``moe_router_pre_softmax=True``). No
auxiliary load-balancing loss is added (the RL loss is the only objective) and no token is dropped.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DENSE_MODEL_TYPES = ("qwen2", "qwen3", "llama")
MOE_MODEL_TYPES = ("qwen3_moe", "mixtral")
SUPPORTED_MODEL_TYPES = DENSE_MODEL_TYPES + MOE_MODEL_TYPES


class UnsupportedModelError(ValueError):
    """The HF config asks for something the Megatron backend does not build."""


def _spelling(name: str) -> str:
    return name.lower().removesuffix("config").replace("_", "").replace("-", "")


# --model-name: each family's HF model_type under the spellings a user may give (the model_type itself, or
# slime's: the config class's name, lower-cased, e.g. Qwen3MoeConfig -> qwen3moe)
MODEL_NAMES = {_spelling(t): t for t in SUPPORTED_MODEL_TYPES}


def model_family(config_model_type: str | None, model_name: str | None) -> str | None:
    """The conversion family: ``--model-name`` when given, else the HF config's ``model_type``. A name that is
    no family, or one that contradicts a config whose own model_type is a family, raises `UnsupportedModelError`."""
    if model_name is None:
        return config_model_type
    family = MODEL_NAMES.get(_spelling(model_name))
    if family is None:
        raise UnsupportedModelError(f"--model-name {model_name!r} is not a conversion family this harness knows "
                                    f"({', '.join(SUPPORTED_MODEL_TYPES)})")
    if config_model_type in SUPPORTED_MODEL_TYPES and config_model_type != family:
        raise UnsupportedModelError(f"--model-name {model_name} names the {family} family, but the checkpoint's "
                                    f"config.json says model_type={config_model_type!r}")
    return family


@dataclass(frozen=True)
class McoreModelSpec:
    model_type: str
    num_layers: int
    hidden_size: int
    ffn_hidden_size: int
    num_attention_heads: int
    num_query_groups: int
    kv_channels: int  # head_dim
    vocab_size: int
    max_position_embeddings: int
    rope_theta: float
    norm_epsilon: float
    qk_layernorm: bool  # Qwen3: RMSNorm over head_dim on q and k, before RoPE
    add_qkv_bias: bool  # Qwen2: bias on q/k/v projections
    tie_word_embeddings: bool
    init_method_std: float
    num_experts: int = 0  # 0: a dense model
    moe_ffn_hidden_size: int = 0
    moe_router_topk: int = 0
    moe_router_pre_softmax: bool = False  # top-k of the full softmax, not renormalised (Qwen3-MoE norm_topk_prob=False)

    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @classmethod
    def from_hf(cls, config: Any, model_name: str | None = None) -> McoreModelSpec:
        """``model_name``: ``--model-name``, the family to convert as (`model_family`); default the config's."""
        model_type = model_family(getattr(config, "model_type", None), model_name)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"the Megatron backend builds {', '.join(SUPPORTED_MODEL_TYPES)} models, not model_type={model_type!r}")
        _refuse_unsupported(config, model_type)
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        if heads % kv_heads:
            raise UnsupportedModelError(f"num_attention_heads={heads} is not a multiple of num_key_value_heads={kv_heads}")
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return cls(
            model_type=model_type,
            num_layers=config.num_hidden_layers,
            hidden_size=config.hidden_size,
            ffn_hidden_size=getattr(config, "intermediate_size", None) or 0,
            num_attention_heads=heads,
            num_query_groups=kv_heads,
            kv_channels=head_dim,
            vocab_size=config.vocab_size,
            max_position_embeddings=config.max_position_embeddings,
            rope_theta=float(rope_theta(config)),
            norm_epsilon=float(config.rms_norm_eps),
            qk_layernorm=model_type in ("qwen3", "qwen3_moe"),
            add_qkv_bias=model_type == "qwen2",
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            init_method_std=float(getattr(config, "initializer_range", 0.02)),
            **_moe_fields(config, model_type),
        )

    def transformer_config_kwargs(self) -> dict[str, Any]:
        """Fields of megatron-core's `TransformerConfig` (dtype and activation are added by the provider)."""
        return dict(
            num_layers=self.num_layers,
            hidden_size=self.hidden_size,
            ffn_hidden_size=self.ffn_hidden_size,
            num_attention_heads=self.num_attention_heads,
            num_query_groups=self.num_query_groups,
            kv_channels=self.kv_channels,
            normalization="RMSNorm",
            layernorm_epsilon=self.norm_epsilon,
            qk_layernorm=self.qk_layernorm,
            add_bias_linear=False,
            add_qkv_bias=self.add_qkv_bias,
            gated_linear_unit=True,
            hidden_dropout=0.0,
            attention_dropout=0.0,
            attention_softmax_in_fp32=True,
            init_method_std=self.init_method_std,
            # fusions that need Apex/TE kernels stay off; the TE layer spec brings its own. The SwiGLU,
            # bias-dropout-add and RoPE fusions (torch.compile'd) are the backend's choice: fusions.py
            masked_softmax_fusion=False,
            gradient_accumulation_fusion=False,
            persist_layer_norm=False,
            **self._moe_config_kwargs(),
        )

    def _moe_config_kwargs(self) -> dict[str, Any]:
        if not self.is_moe:
            return {}
        return dict(
            num_moe_experts=self.num_experts,
            moe_ffn_hidden_size=self.moe_ffn_hidden_size,
            moe_router_topk=self.moe_router_topk,
            moe_router_pre_softmax=self.moe_router_pre_softmax,
            moe_router_score_function="softmax",
            moe_router_load_balancing_type="none",  # the RL loss only: no auxiliary balancing loss
            moe_aux_loss_coeff=0.0,
            moe_grouped_gemm=False,  # SequentialMLP: the local spec's experts (grouped GEMM needs TE)
            moe_token_dispatcher_type="alltoall",
        )

    def gpt_model_kwargs(self) -> dict[str, Any]:
        """Arguments of megatron-core's `GPTModel` besides config and layer spec."""
        return dict(
            vocab_size=self.vocab_size,
            max_sequence_length=self.max_position_embeddings,
            share_embeddings_and_output_weights=self.tie_word_embeddings,
            position_embedding_type="rope",
            rotary_percent=1.0,
            rotary_base=self.rope_theta,
        )


def rope_theta(config: Any) -> float:
    """RoPE base: transformers >= 5 keeps it in ``rope_parameters``, older versions in ``rope_theta``."""
    params = getattr(config, "rope_parameters", None) or {}
    theta = params.get("rope_theta") if isinstance(params, dict) else None
    return theta if theta is not None else getattr(config, "rope_theta", 10000.0)


def _rope_type(config: Any) -> str:
    for source in (getattr(config, "rope_parameters", None), getattr(config, "rope_scaling", None)):
        if isinstance(source, dict):
            kind = source.get("rope_type") or source.get("type")
            if kind:
                return kind
    return "default"


def _moe_fields(config: Any, model_type: str) -> dict[str, Any]:
    if model_type not in MOE_MODEL_TYPES:
        return {}
    experts = config.num_experts if model_type == "qwen3_moe" else config.num_local_experts
    ffn = config.moe_intermediate_size if model_type == "qwen3_moe" else config.intermediate_size
    renormalise = bool(config.norm_topk_prob) if model_type == "qwen3_moe" else True
    return dict(num_experts=int(experts), moe_ffn_hidden_size=int(ffn), moe_router_topk=int(config.num_experts_per_tok),
                moe_router_pre_softmax=not renormalise)


def _refuse_moe(config: Any, model_type: str) -> None:
    if model_type == "qwen3_moe":
        if getattr(config, "mlp_only_layers", None):
            raise UnsupportedModelError(f"mlp_only_layers={config.mlp_only_layers}: dense layers between MoE layers "
                                        "are not built (every layer must be MoE)")
        if getattr(config, "decoder_sparse_step", 1) != 1:
            raise UnsupportedModelError(f"decoder_sparse_step={config.decoder_sparse_step}: every layer must be MoE")
    if model_type == "mixtral":
        if getattr(config, "router_jitter_noise", 0.0):
            raise UnsupportedModelError(f"router_jitter_noise={config.router_jitter_noise}: router jitter is not built")
        if getattr(config, "sliding_window", None):
            raise UnsupportedModelError(f"sliding_window={config.sliding_window}: sliding-window attention is not built")


def _refuse_unsupported(config: Any, model_type: str) -> None:
    _refuse_moe(config, model_type)
    act = getattr(config, "hidden_act", "silu")
    if act != "silu":
        raise UnsupportedModelError(f"hidden_act={act!r}: the Megatron backend builds SwiGLU (silu) MLPs only")
    kind = _rope_type(config)
    if kind != "default":
        raise UnsupportedModelError(f"rope_type={kind!r}: only plain RoPE is built by the Megatron backend")
    if getattr(config, "use_sliding_window", False):
        raise UnsupportedModelError("use_sliding_window=True: sliding-window attention is not built")
    if getattr(config, "mlp_bias", False):
        raise UnsupportedModelError("mlp_bias=True: MLP biases are not built")
    if getattr(config, "shared_expert_intermediate_size", 0):
        raise UnsupportedModelError("shared_expert_intermediate_size: shared experts are not built")
    if model_type != "qwen2" and getattr(config, "attention_bias", False):
        raise UnsupportedModelError(f"attention_bias=True on a {model_type} config also biases o_proj, which is not built")
