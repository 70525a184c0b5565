"""Offline model zoo: named presets that build HF models from configs (random init).

`--hf-checkpoint` takes either a preset name from `PRESETS` or a local HF directory. Nothing
here ever touches a hub: directories load with ``local_files_only=True``.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from relax.models.tokenizer import VOCAB_SIZE, build_char_tokenizer


@dataclass(frozen=True)
class ModelPreset:
    """A config factory plus the tokenizer the preset is paired with."""

    family: str  # "qwen3" | "qwen2" | "llama"
    config: dict[str, Any]
    tokenizer: str  # "char" (offline char tokenizer) | "wordlevel-32k" (ids only, for benchmarks)
    description: str


_TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=True)

PRESETS: dict[str, ModelPreset] = {
    "tiny-qwen3": ModelPreset("qwen3", dict(_TINY, vocab_size=VOCAB_SIZE, head_dim=16), "char",
                              "~80k-param Qwen3 for CPU tests and the quickstart"),
    "tiny-qwen2": ModelPreset("qwen2", dict(_TINY, vocab_size=VOCAB_SIZE), "char", "~80k-param Qwen2"),
    "tiny-llama": ModelPreset("llama", dict(_TINY, vocab_size=VOCAB_SIZE, head_dim=16), "char", "~80k-param Llama"),
    "small-qwen3": ModelPreset(
        "qwen3",
        dict(vocab_size=VOCAB_SIZE, hidden_size=192, intermediate_size=512, num_hidden_layers=4,
             num_attention_heads=6, num_key_value_heads=2, head_dim=32, max_position_embeddings=1024,
             tie_word_embeddings=True),
        "char", "~2M-param Qwen3 for CPU scenarios",
    ),
    "bench-270m": ModelPreset(
        "qwen3",
        dict(vocab_size=32000, hidden_size=1024, intermediate_size=3072, num_hidden_layers=16,
             num_attention_heads=16, num_key_value_heads=8, head_dim=64, max_position_embeddings=4096),
        "wordlevel-32k", "267M-param Qwen3 (MACHINES.md benchmark config, GPU)",
    ),
    "qwen3-0.5b": ModelPreset(
        "qwen3",
        dict(vocab_size=32000, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
             num_attention_heads=16, num_key_value_heads=8, head_dim=128, max_position_embeddings=4096),
        "wordlevel-32k", "~0.45B-param Qwen3 (GPU scenarios)",
    ),
}

def _family(name: str) -> tuple[type, type]:
    import transformers as tf

    table = {
        "qwen3": (tf.Qwen3Config, tf.Qwen3ForCausalLM),
        "qwen2": (tf.Qwen2Config, tf.Qwen2ForCausalLM),
        "llama": (tf.LlamaConfig, tf.LlamaForCausalLM),
    }
    return table[name]


def _unknown(name_or_path: str) -> ValueError:
    return ValueError(
        f"--hf-checkpoint {name_or_path!r} is neither a model preset nor an existing directory; "
        f"presets: {', '.join(PRESETS)}"
    )


def build_config(name: str):
    preset = PRESETS[name]
    config_cls, _ = _family(preset.family)
    cfg = config_cls(**preset.config, pad_token_id=0, eos_token_id=2, bos_token_id=None)
    cfg._attn_implementation = "eager"
    return cfg


@contextlib.contextmanager
def _seeded(seed: int | None):
    if seed is None:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def build_model(name_or_path: str, *, dtype: torch.dtype = torch.float32, seed: int | None = None):
    """A preset name -> random init (deterministic for a seed); a directory -> from_pretrained."""
    if name_or_path in PRESETS:
        _, model_cls = _family(PRESETS[name_or_path].family)
        with _seeded(seed):
            model = model_cls(build_config(name_or_path))
        return model.to(dtype)
    if Path(name_or_path).is_dir():
        from transformers import AutoModelForCausalLM

        return AutoModelForCausalLM.from_pretrained(
            name_or_path, local_files_only=True, dtype=dtype, attn_implementation="eager"
        )
    raise _unknown(name_or_path)


def load_tokenizer(name_or_path: str):
    if name_or_path in PRESETS:
        kind = PRESETS[name_or_path].tokenizer
        if kind == "char":
            return build_char_tokenizer()
        from relax.models.wordlevel import build_wordlevel_tokenizer

        return build_wordlevel_tokenizer(PRESETS[name_or_path].config["vocab_size"])
    if Path(name_or_path).is_dir():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(name_or_path, local_files_only=True)
    raise _unknown(name_or_path)


def save_hf(model, tokenizer, out_dir: str | Path) -> Path:
    """Write a directory that `AutoModelForCausalLM/AutoTokenizer.from_pretrained` load offline."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
