"""Offline model zoo: named presets that build HF models from configs (random init).

``--hf-checkpoint`` takes either a preset name from `PRESETS` or a local HF directory. Nothing
here ever touches a hub: directories load with ``local_files_only=True``.

Attention implementation: HF directories load with ``sdpa`` (torch's scaled-dot-product attention:
FlashAttention-2 or memory-efficient kernels on CUDA, a fused math kernel on CPU); tiny CPU presets use ``eager``. Measured on CPU fp32, a full
forward and an incremental KV-cache decode of the same tokens agree to <= 3e-7 (tiny-qwen3)
with eager and <= 5e-7 with sdpa, so eager keeps train/rollout log-probs closest. GPU presets
use ``sdpa``: on an H100 in bf16 (bench-270m, batch 8, 128-token prefill + 32 decode steps)
the two are equally close (mean |log-prob diff| 1.4e-3 eager vs 1.5e-3 sdpa, bf16 rounding
dominates) and sdpa's forward is 1.8x faster.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from relax.models.omni import TINY_OMNI
from relax.models.tokenizer import EOS_ID, PAD_ID, VOCAB_SIZE
from relax.models.vision import TINY_VL, TINY_VL_P14
from relax.utils.flag_types import ConfigError

# What `AutoTokenizer` can load a tokenizer from (fast, sentencepiece, BPE vocab + merges, WordPiece).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "spiece.model", "vocab.json", "vocab.txt", "merges.txt")


@dataclass(frozen=True)
class ModelPreset:
    """A config recipe plus the tokenizer the preset is paired with."""

    family: str  # key of _FAMILIES
    config: dict[str, Any]
    tokenizer: str  # key of relax.models.tokenizer.TOKENIZERS
    attn_implementation: str
    description: str


_TINY = dict(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True)

# MACHINES.md's benchmark model, exactly (267M params, untied embeddings).
_BENCH_270M = dict(vocab_size=32000, hidden_size=1024, intermediate_size=3072, num_hidden_layers=16,
                   num_attention_heads=16, num_key_value_heads=8, head_dim=64)

PRESETS: dict[str, ModelPreset] = {
    "tiny-qwen3": ModelPreset("qwen3", dict(_TINY, head_dim=16), "char", "eager",
                              "81k-param Qwen3 for CPU tests and the quickstart"),
    "tiny-qwen2": ModelPreset("qwen2", dict(_TINY), "char", "eager", "81k-param Qwen2"),
    "tiny-llama": ModelPreset("llama", dict(_TINY, head_dim=16), "char", "eager", "81k-param Llama"),
    "small-qwen3": ModelPreset(
        "qwen3",
        dict(vocab_size=VOCAB_SIZE, hidden_size=192, intermediate_size=768, num_hidden_layers=4,
             num_attention_heads=6, num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
             tie_word_embeddings=True),
        "char", "eager", "2.2M-param Qwen3 for CPU scenarios",
    ),
    "small-qwen3-moe": ModelPreset(
        "qwen3_moe",
        dict(vocab_size=VOCAB_SIZE, hidden_size=192, moe_intermediate_size=192, num_hidden_layers=4,
             num_attention_heads=6, num_key_value_heads=2, head_dim=32, num_experts=4, num_experts_per_tok=2,
             norm_topk_prob=True, max_position_embeddings=1024, tie_word_embeddings=True),
        "char", "eager", "2.2M-param Qwen3-MoE (4 experts, top-2) for expert-parallel runs",
    ),
    "tiny-qwen2.5-vl": ModelPreset("qwen2_5_vl", TINY_VL, "char-vl", "eager",
                                   "130k-param Qwen2.5-VL (1-block vision tower) for CPU multimodal runs"),
    "tiny-qwen2.5-vl-p14": ModelPreset("qwen2_5_vl", TINY_VL_P14, "char-vl", "eager",
                                       "155k-param tiny-qwen2.5-vl with Qwen2.5-VL's 14-pixel patches: what a real "
                                       "SGLang 0.5.14 server can serve (--rollout-backend sglang)"),
    "tiny-qwen2.5-omni": ModelPreset("qwen2_5_omni_thinker", TINY_OMNI, "char-omni", "eager",
                                     "144k-param Qwen2.5-Omni thinker (1-block vision and audio towers) for CPU "
                                     "audio runs"),
    "bench-270m": ModelPreset("qwen3", _BENCH_270M, "wordlevel-32k", "sdpa",
                              "267M-param Qwen3 (MACHINES.md benchmark config, GPU)"),
    "qwen3-0.5b": ModelPreset(
        "qwen3",
        dict(vocab_size=32000, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
             num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=32768,
             tie_word_embeddings=True),
        "wordlevel-32k", "sdpa", "0.47B-param Qwen3 (Qwen3-0.6B shape, vocab 32000; GPU scenarios)",
    ),
    "bench-1b": ModelPreset(
        "qwen3",
        dict(vocab_size=32000, hidden_size=2048, intermediate_size=6144, num_hidden_layers=18,
             num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096,
             tie_word_embeddings=False),
        "wordlevel-32k", "sdpa", "1.04B-param Qwen3 for the Megatron train-MFU benchmark (ci/bench_megatron.py, GPU)",
    ),
}

# Special-token ids shared by every preset tokenizer (relax.models.tokenizer.SPECIAL_TOKENS).
_TOKEN_IDS = dict(pad_token_id=PAD_ID, eos_token_id=EOS_ID, bos_token_id=None)


# each family's transformers class names: the config's alone imports in a fraction of the model's time (launch checks
# need only the config)
_FAMILY_CLASSES = {"qwen3": ("Qwen3Config", "Qwen3ForCausalLM"), "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM"),
                   "qwen2": ("Qwen2Config", "Qwen2ForCausalLM"), "llama": ("LlamaConfig", "LlamaForCausalLM"),
                   "qwen2_5_vl": ("Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration"),
                   "qwen2_5_omni_thinker": ("Qwen2_5OmniThinkerConfig", "Qwen2_5OmniThinkerForConditionalGeneration")}


def _family_class(family: str, which: int) -> type:
    import transformers as tf

    return getattr(tf, _FAMILY_CLASSES[family][which])


@dataclass(frozen=True)
class Checkpoint:
    """What ``--hf-checkpoint`` resolved to: a preset (random init) or a local HF directory."""

    kind: Literal["preset", "dir"]
    name_or_path: str
    config: Any  # transformers.PretrainedConfig


def _unknown(name_or_path: str) -> ConfigError:
    return ConfigError(
        f"--hf-checkpoint {name_or_path!r} is neither a model preset nor an existing directory; "
        f"presets: {', '.join(PRESETS)}"
    )


def build_config(name: str):
    """The HF config of preset ``name`` (special-token ids match its tokenizer)."""
    try:
        preset = PRESETS[name]
    except KeyError:
        raise _unknown(name) from None
    config_cls = _family_class(preset.family, 0)
    values = dict(preset.config)
    if "text_config" in values:  # a VLM: the language model carries the tokenizer's ids too
        values["text_config"] = dict(values["text_config"], **_TOKEN_IDS)
    cfg = config_cls(**values, **_TOKEN_IDS)
    cfg._attn_implementation = preset.attn_implementation
    return cfg


def resolve_checkpoint(name_or_path: str) -> Checkpoint:
    """Classify ``name_or_path`` and load its config (presets win over same-named directories)."""
    if name_or_path in PRESETS:
        return Checkpoint("preset", name_or_path, build_config(name_or_path))
    if Path(name_or_path).is_dir():
        from transformers import AutoConfig

        if not (Path(name_or_path) / "config.json").is_file():
            raise ConfigError(f"--hf-checkpoint {name_or_path}: no config.json (a tokenizer-only directory needs the "
                              "model's architecture flags, e.g. source scripts/models/<model>.sh)")
        return Checkpoint("dir", name_or_path, AutoConfig.from_pretrained(name_or_path, local_files_only=True))
    raise _unknown(name_or_path)


@contextlib.contextmanager
def _seeded(seed: int | None) -> Iterator[None]:
    """Seed parameter init without disturbing the caller's global RNG stream."""
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


# --attention-backend -> the HF attention implementation; auto keeps the preset's or directory's own, fused (Transformer
# Engine's kernel) is refused at parse time
HF_ATTENTION = {"flash": "sdpa", "unfused": "eager", "local": "eager"}


def hf_attention(attention_backend: str | None) -> str | None:
    """The ``attn_implementation`` that ``--attention-backend`` asks of an HF model: flash is torch SDPA (the
    FlashAttention-2 kernel on CUDA), unfused and local the eager matmul-softmax-matmul (Megatron's names for its
    own unfused attention), auto the model's own choice (None)."""
    return HF_ATTENTION.get(attention_backend or "auto")


def build_model(name_or_path: str, *, dtype: torch.dtype = torch.float32, seed: int | None = None,
                attn_implementation: str | None = None):
    """A preset name -> random init (deterministic for a seed); a directory -> ``from_pretrained``.

    Init runs in fp32 on CPU and is then cast, so a seed gives the same weights for every dtype
    up to rounding. ``attn_implementation`` overrides the preset's (directories default to sdpa).
    """
    ckpt = resolve_checkpoint(name_or_path)
    if ckpt.kind == "dir":
        from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

        from relax.models.vision import is_vision_config

        auto = AutoModelForImageTextToText if is_vision_config(ckpt.config) else AutoModelForCausalLM
        return auto.from_pretrained(
            name_or_path, local_files_only=True, dtype=dtype, attn_implementation=attn_implementation or "sdpa"
        )
    cfg = ckpt.config
    if attn_implementation:
        cfg._attn_implementation = attn_implementation
    model_cls = _family_class(PRESETS[name_or_path].family, 1)
    with _seeded(seed):
        model = model_cls(cfg)
    return model.to(dtype)


def key_value_heads(name_or_path: str) -> int | None:
    """The key/value head count of a preset's or a directory's language model (a VLM's text model), which says how
    a tensor-parallel SGLang engine splits k and v (relax/weights/sglang_checksums.py); None when it has none."""
    config = resolve_checkpoint(name_or_path).config
    config = getattr(config, "text_config", None) or config
    return getattr(config, "num_key_value_heads", None) or getattr(config, "num_attention_heads", None)


def param_count(name: str) -> int:
    """Parameters of preset ``name``, counted on the meta device (allocates nothing)."""
    model_cls = _family_class(PRESETS[name].family, 1)
    with torch.device("meta"):
        model = model_cls(build_config(name))
    return sum(p.numel() for p in model.parameters())


def load_tokenizer(name_or_path: str):
    """The preset's offline tokenizer, or ``AutoTokenizer`` from a local directory."""
    ckpt_kind = "preset" if name_or_path in PRESETS else "dir" if Path(name_or_path).is_dir() else None
    if ckpt_kind == "preset":
        from relax.models.tokenizer import build_tokenizer

        preset = PRESETS[name_or_path]
        vocab = preset.config.get("vocab_size") or preset.config["text_config"]["vocab_size"]
        return build_tokenizer(preset.tokenizer, vocab_size=vocab)
    if ckpt_kind == "dir":
        from transformers import AutoTokenizer

        if not any((Path(name_or_path) / f).is_file() for f in TOKENIZER_FILES):
            raise ConfigError(f"no tokenizer in {name_or_path} (looked for {', '.join(TOKENIZER_FILES)}); "
                              "copy the tokenizer files of the model there")
        return AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
    raise _unknown(name_or_path)


def save_hf(model, tokenizer, out_dir: str | Path) -> Path:
    """Write safetensors weights, config and tokenizer that ``Auto*.from_pretrained`` load offline; a vision-language
    model also gets the image processor its vision tower is shaped for (``preprocessor_config.json``)."""
    from relax.models.vision import image_processor, is_vision_config, vision_geometry

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    if is_vision_config(model.config):
        image_processor(*vision_geometry(model.config)).save_pretrained(out)
    return out
