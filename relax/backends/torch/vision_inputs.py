"""What a vision-language model's forward needs beyond the tokens, for a micro-batch of train samples.

A sample with images carries its ``pixel_values`` (the processor's patches) and ``image_grid_thw``, one with
videos ``pixel_values_videos``, ``video_grid_thw`` and ``second_per_grid_ts`` (`TrainSample.vision`, from
``Sample.multimodal_inputs``). A micro-batch concatenates them in row order, as HF's Qwen2.5-VL expects, and
`model_forward` gives the model explicit multimodal-RoPE positions from ``get_rope_index`` over the padded
rows, the same positions the embedded engine computes for the same tokens
(relax/backends/embedded/vision_runner.py), whatever the padding side. An audio-capable model's clips and its
per-row positions are relax/backends/torch/omni_inputs.py's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from relax.backends.torch.omni_inputs import AudioBatch, audio_batch, embed_audio, omni_positions
from relax.models.omni import is_audio_config


@dataclass
class VisionBatch:
    pixel_values: torch.Tensor | None  # [patches of all images, patch dim]
    image_grid_thw: torch.Tensor | None  # [images, 3]
    prompt_mask: torch.Tensor  # [b, L] bool: a prompt token (only the prompt's media tokens are media)
    pixel_values_videos: torch.Tensor | None = None
    video_grid_thw: torch.Tensor | None = None  # [videos, 3]
    second_per_grid_ts: torch.Tensor | None = None  # [videos]
    audio: AudioBatch | None = None  # the rows' audio clips (omni_inputs.py)
    rows: list[dict[str, Any] | None] | None = None  # each padded row's own media (an omni model's positions)


def _cat(rows: list[dict[str, Any]], pixels: str, grids: str) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    arrays = [np.asarray(v[pixels], dtype=np.float32) for v in rows if v.get(grids)]
    if not arrays:
        return None, None
    grid = torch.tensor([g for v in rows for g in v.get(grids) or []], dtype=torch.long)
    return torch.from_numpy(np.concatenate(arrays)), grid


def vision_batch(visions: list[dict[str, Any] | None], prompt_mask: torch.Tensor, device: Any) -> VisionBatch | None:
    """The media of a micro-batch's rows, in row order (None when no row has any)."""
    rows = [v for v in visions if v]
    if not rows:
        return None
    pixels, grids = _cat(rows, "pixel_values", "image_grid_thw")
    videos, video_grids = _cat(rows, "pixel_values_videos", "video_grid_thw")
    seconds = [t for v in rows for t in v.get("second_per_grid_ts") or []]
    return VisionBatch(_to(pixels, device), _to(grids, device), prompt_mask.to(device), _to(videos, device),
                       _to(video_grids, device),
                       torch.tensor(seconds, dtype=torch.float32, device=device) if seconds else None,
                       audio_batch(visions, device), list(visions))


def _to(t: torch.Tensor | None, device: Any) -> torch.Tensor | None:
    return None if t is None else t.to(device)


def media_masks(model: torch.nn.Module, input_ids: torch.Tensor,
                prompt_mask: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(image, video) token masks: the pad ids of the prompt (a sampled response may hold them too: text there)."""
    image, video = input_ids == model.config.image_token_id, input_ids == model.config.video_token_id
    if prompt_mask is not None:
        image, video = image & prompt_mask, video & prompt_mask
    return image, video


def audio_mask(model: torch.nn.Module, input_ids: torch.Tensor, prompt_mask: torch.Tensor | None) -> torch.Tensor:
    """The prompt's ``<|AUDIO|>`` tokens."""
    mask = input_ids == model.config.audio_token_id
    return mask & prompt_mask if prompt_mask is not None else mask


def mrope_positions(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    vision: VisionBatch, image_mask: torch.Tensor,
                    video_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[3, B, L]`` positions and ``[B]`` deltas (last position + 1 - real tokens) of padded rows."""
    if is_audio_config(model.config):
        return omni_positions(model, input_ids, attention_mask, vision.rows, vision.prompt_mask)
    types = image_mask.int() + 2 * video_mask.int()  # HF's mm_token_type_ids: text 0, image 1, video 2
    positions, deltas = model.model.get_rope_index(
        input_ids, types, image_grid_thw=vision.image_grid_thw, video_grid_thw=vision.video_grid_thw,
        second_per_grid_ts=vision.second_per_grid_ts, attention_mask=attention_mask)
    return positions, deltas.reshape(-1)


def embed_with_media(model: torch.nn.Module, input_ids: torch.Tensor, vision: VisionBatch, image_mask: torch.Tensor,
                     video_mask: torch.Tensor, prompt_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Token embeddings with the vision tower's features written over the media tokens of the masks.

    Done here rather than by HF's forward, which takes every pad id for a media slot: a sampled response may
    hold that id too (the policy can emit any token), and it is text there."""
    embeds = model.get_input_embeddings()(input_ids)
    for what, pixels, grid, mask, features in (
            ("image", vision.pixel_values, vision.image_grid_thw, image_mask, model.get_image_features),
            ("video", vision.pixel_values_videos, vision.video_grid_thw, video_mask, model.get_video_features)):
        if pixels is None:
            continue
        feats = torch.cat(list(features(pixels.to(embeds.dtype), grid, return_dict=True).pooler_output))
        if int(mask.sum()) != feats.shape[0]:
            raise ValueError(f"the prompts hold {int(mask.sum())} {what} tokens for {feats.shape[0]} {what} "
                             f"features ({what}_grid_thw does not match the tokens)")
        embeds = embeds.masked_scatter(mask.unsqueeze(-1).expand_as(embeds), feats.to(embeds.dtype))
    if vision.audio is not None:
        embeds = embed_audio(model, embeds, audio_mask(model, input_ids, prompt_mask), vision.audio)
    return embeds


def model_forward(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  vision: VisionBatch | None) -> torch.Tensor:
    """The logits of a (possibly vision) causal LM over right-padded rows."""
    if vision is None:
        return model(input_ids=input_ids, attention_mask=attention_mask).logits
    image_mask, video_mask = media_masks(model, input_ids, vision.prompt_mask)
    positions, _ = mrope_positions(model, input_ids, attention_mask, vision, image_mask, video_mask)
    embeds = embed_with_media(model, input_ids, vision, image_mask, video_mask, vision.prompt_mask)
    return model(inputs_embeds=embeds, attention_mask=attention_mask, position_ids=positions).logits
