"""Offline tiny model zoo, tokenizers and synthetic tasks (no hub access anywhere)."""

from relax.models.registry import PRESETS, build_config, build_model, load_tokenizer, save_hf

__all__ = ["PRESETS", "build_config", "build_model", "load_tokenizer", "save_hf"]
