"""What a vision-language model's forward needs beyond the tokens, for a micro-batch of train samples.

A sample with images carries its ``pixel_values`` (the processor's patches) and ``image_grid_thw``
(`TrainSample.vision`, from ``Sample.multimodal_inputs``). A micro-batch concatenates them in row order,
as HF's Qwen2.5-VL expects, and `model_forward` gives the model explicit multimodal-RoPE positions from
``get_rope_index`` over the padded rows, the same positions the embedded engine computes for the
same tokens (relax/backends/embedded/vision_runner.py), whatever the padding side.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


@dataclass
class VisionBatch:
    pixel_values: torch.Tensor  # [patches of all images, patch dim]
    image_grid_thw: torch.Tensor  # [images, 3]
    prompt_mask: torch.Tensor  # [b, L] bool: a prompt token (only the prompt's image tokens are images)


def vision_batch(visions: list[dict[str, Any] | None], prompt_mask: torch.Tensor, device: Any) -> VisionBatch | None:
    """The images of a micro-batch's rows, in row order (None when no row has one)."""
    rows = [v for v in visions if v]
    if not rows:
        return None
    pixels = torch.from_numpy(np.concatenate([np.asarray(v["pixel_values"], dtype=np.float32) for v in rows]))
    grids = torch.tensor([g for v in rows for g in v["image_grid_thw"]], dtype=torch.long)
    return VisionBatch(pixels.to(device), grids.to(device), prompt_mask.to(device))


def mrope_positions(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                    image_grid_thw: torch.Tensor, image_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``[3, B, L]`` positions and ``[B]`` deltas (last position + 1 - real tokens) of padded rows;
    ``image_mask`` marks the tokens that stand for image patches."""
    positions, deltas = model.model.get_rope_index(input_ids, image_mask.int(), image_grid_thw=image_grid_thw,
                                                   attention_mask=attention_mask)
    return positions, deltas.reshape(-1)


def embed_with_images(model: torch.nn.Module, input_ids: torch.Tensor, pixel_values: torch.Tensor,
                      image_grid_thw: torch.Tensor, image_mask: torch.Tensor) -> torch.Tensor:
    """Token embeddings with the vision tower's features written over the image tokens of ``image_mask``.

    Done here rather than by HF's forward, which takes every ``<|image_pad|>`` id for an image slot: a sampled
    response may hold that id too (the policy can emit any token), and it is text there."""
    embeds = model.get_input_embeddings()(input_ids)
    feats = model.model.get_image_features(pixel_values.to(embeds.dtype), image_grid_thw, return_dict=True)
    feats = torch.cat(list(feats.pooler_output)).to(embeds.dtype)
    if int(image_mask.sum()) != feats.shape[0]:
        raise ValueError(f"the prompts hold {int(image_mask.sum())} image tokens for {feats.shape[0]} image "
                         "features (image_grid_thw does not match the tokens)")
    return embeds.masked_scatter(image_mask.unsqueeze(-1).expand_as(embeds), feats)


def model_forward(model: torch.nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  vision: VisionBatch | None) -> torch.Tensor:
    """The logits of a (possibly vision) causal LM over right-padded rows."""
    if vision is None:
        return model(input_ids=input_ids, attention_mask=attention_mask).logits
    image_mask = vision.prompt_mask & (input_ids == model.config.image_token_id)
    positions, _ = mrope_positions(model, input_ids, attention_mask, vision.image_grid_thw, image_mask)
    embeds = embed_with_images(model, input_ids, vision.pixel_values, vision.image_grid_thw, image_mask)
    return model(inputs_embeds=embeds, attention_mask=attention_mask, position_ids=positions).logits
