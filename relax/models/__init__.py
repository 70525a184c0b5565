"""Offline tiny model zoo, tokenizers and synthetic tasks (no hub access anywhere)."""

from relax.models.registry import (
    PRESETS,
    Checkpoint,
    build_config,
    build_model,
    hf_attention,
    load_tokenizer,
    param_count,
    resolve_checkpoint,
    save_hf,
)

__all__ = [
    "PRESETS", "Checkpoint", "build_config", "build_model", "hf_attention", "load_tokenizer", "param_count",
    "resolve_checkpoint", "save_hf",
]
