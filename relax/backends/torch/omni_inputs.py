"""The audio half of an audio-capable model's forward (Qwen2.5-Omni's thinker, relax/models/omni.py).

A sample with audio carries its clips' log-mel features concatenated along time (``input_features``,
``[mel bins, frames of all clips]``) and each clip's frame count (``audio_feature_lengths``), in the order its
prompt holds them; with ``--use-audio-in-video`` its videos' sound tracks are among them and
``use_audio_in_video`` is set. A batch pads the clips to the longest, with ``feature_attention_mask``, as
Qwen2_5OmniProcessor hands them to the model; the audio tower's outputs are written over the prompt's
``<|AUDIO|>`` tokens in order. The multimodal-RoPE positions come from the model's ``get_rope_index`` one row at a
time, each row with its own grids, clip lengths and ``use_audio_in_video`` (HF's takes one flag per call), so the
engine's left-padded rows and the trainer's right-padded rows get the same positions for the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass
class AudioBatch:
    features: torch.Tensor  # [clips, mel bins, longest clip's frames]
    mask: torch.Tensor  # [clips, longest] 1 on a clip's own frames


def _tensor(value: Any, dtype: torch.dtype) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.to(dtype)
    return torch.as_tensor(np.asarray(value), dtype=dtype)


def audio_batch(rows: list[dict[str, Any] | None], device: Any) -> AudioBatch | None:
    """The clips of the rows' audio, in row order, padded to the longest (None when no row has audio)."""
    clips: list[torch.Tensor] = []
    for row in rows:
        if row and row.get("audio_feature_lengths") is not None and len(row["audio_feature_lengths"]):
            lengths = [int(n) for n in _tensor(row["audio_feature_lengths"], torch.long).tolist()]
            clips.extend(torch.split(_tensor(row["input_features"], torch.float32), lengths, dim=1))
    if not clips:
        return None
    longest = max(c.shape[1] for c in clips)
    features = torch.zeros(len(clips), clips[0].shape[0], longest)
    mask = torch.zeros(len(clips), longest, dtype=torch.long)
    for i, c in enumerate(clips):
        features[i, :, :c.shape[1]] = c
        mask[i, :c.shape[1]] = 1
    return AudioBatch(features.to(device), mask.to(device))


def _grid(row: dict[str, Any], key: str, dtype: torch.dtype, device: Any) -> torch.Tensor | None:
    value = row.get(key)
    if value is None or not len(value):
        return None
    return _tensor(value, dtype).to(device)


def omni_positions(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   rows: list[dict[str, Any] | None],
                   prompt_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``[3, B, L]`` positions and ``[B]`` deltas of padded rows, each from ``get_rope_index`` with its own media.

    ``get_rope_index`` sees the prompt only (HF's counts every media start token of the row, and a sampled
    response may hold those ids: text there); the response continues on all three axes at its token index plus
    the prompt's delta, as the engine decodes it."""
    real = attention_mask.bool()
    prompt = real & prompt_mask if prompt_mask is not None else real
    positions, deltas = [], []
    for i, row in enumerate(rows):
        row = row or {}
        p, d = model.get_rope_index(
            input_ids[i:i + 1], _grid(row, "image_grid_thw", torch.long, input_ids.device),
            _grid(row, "video_grid_thw", torch.long, input_ids.device), prompt[i:i + 1].long(),
            use_audio_in_video=bool(row.get("use_audio_in_video")),
            audio_seqlens=_grid(row, "audio_feature_lengths", torch.long, input_ids.device),
            second_per_grids=_grid(row, "second_per_grid_ts", torch.float32, input_ids.device))
        positions.append(p)
        deltas.append(d.reshape(-1))
    positions_, deltas_ = torch.cat(positions, dim=1), torch.cat(deltas).to(input_ids.device)
    after = (real & ~prompt).unsqueeze(0).expand_as(positions_)
    following = (real.long().cumsum(-1) - 1 + deltas_[:, None]).unsqueeze(0).expand_as(positions_)
    return torch.where(after, following, positions_), deltas_


def embed_audio(model: torch.nn.Module, embeds: torch.Tensor, audio_mask: torch.Tensor,
                audio: AudioBatch) -> torch.Tensor:
    """``embeds`` with the audio tower's outputs written over the ``<|AUDIO|>`` tokens of ``audio_mask``."""
    feats = model.get_audio_features(audio.features.to(embeds.dtype), feature_attention_mask=audio.mask,
                                           return_dict=True).last_hidden_state
    if int(audio_mask.sum()) != feats.shape[0]:
        raise ValueError(f"the prompts hold {int(audio_mask.sum())} audio tokens for {feats.shape[0]} audio features "
                         "(audio_feature_lengths does not match the tokens)")
    return embeds.masked_scatter(audio_mask.unsqueeze(-1).expand_as(embeds), feats.to(embeds.dtype))
