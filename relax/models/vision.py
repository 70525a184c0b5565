"""The offline vision-language pieces: the tiny Qwen2.5-VL config and its image processor (the char tokenizer
with Qwen-VL's vision tokens is relax/models/tokenizer.py's ``char-vl``).

Qwen2.5-VL marks an image in the text as ``<|vision_start|><|image_pad|>...<|vision_end|>``: one
``<|image_pad|>`` per merged patch, ``grid_t * grid_h * grid_w / spatial_merge_size**2`` of them. The
tokenizer is the char tokenizer plus those four tokens (relax/models/tokenizer.py), so the tiny
VLM shares the char tasks' vocabulary. The image processor is the one transformers ships for
Qwen2-VL in its PIL form (it needs no torchvision), shaped from the vision tower's config
(relax/data/mm_pool.py: the same for a preset and a checkpoint directory); Qwen2_5_VLProcessor itself is
not used because it insists on a video processor, which needs torchvision: `relax.data.multimodal` expands
the pads the way it would.
"""

from __future__ import annotations

import functools
from typing import Any

from relax.models.tokenizer import IMAGE_PAD_ID, VIDEO_PAD_ID, VISION_END_ID, VISION_START_ID, VL_VOCAB_SIZE

# The tiny vision tower: 8x8 patches merged 2x2, so one image token covers 16x16 pixels (the alignment factor,
# patch_size * spatial_merge_size, that --image-resize-scale-factor defaults to).
TINY_VISION = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, patch_size=8, spatial_merge_size=2,
                   temporal_patch_size=2, out_hidden_size=64, window_size=32, fullatt_block_indexes=[0])
TINY_VL_TEXT = dict(vocab_size=VL_VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                    num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                    rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
                    tie_word_embeddings=True)
TINY_VL = dict(text_config=TINY_VL_TEXT, vision_config=TINY_VISION, image_token_id=IMAGE_PAD_ID,
               video_token_id=VIDEO_PAD_ID, vision_start_token_id=VISION_START_ID, vision_end_token_id=VISION_END_ID,
               tie_word_embeddings=True)
# The same model with Qwen2.5-VL's own 14-pixel patches (28 pixels an image token; a window of 2 merged patches, as
# 32 / 2 / 8 gives the 8-pixel tower): a real SGLang 0.5.14 server serves only this geometry. Its
# Qwen2_5_VLForConditionalGeneration.get_image_feature (models/qwen2_5_vl.py) runs the vision tower on pixel rows of
# exactly 3 * 2 * 14 * 14 = 1176 values and returns any other width unchanged, as a precomputed embedding: the tiny
# tower's 384-value rows would reach the language model unencoded.
TINY_VL_P14 = dict(TINY_VL, vision_config=dict(TINY_VISION, patch_size=14, window_size=56))


def is_vision_config(config: Any) -> bool:
    """Whether an HF config is a vision-language model's (it carries a vision tower config)."""
    return getattr(config, "vision_config", None) is not None


def vision_geometry(config: Any) -> tuple[int, int, int]:
    """(patch_size, spatial_merge_size, temporal_patch_size) of a VLM config's vision tower."""
    v = config.vision_config
    return int(v.patch_size), int(v.spatial_merge_size), int(getattr(v, "temporal_patch_size", 2))


@functools.lru_cache(maxsize=4)
def image_processor(patch: int, merge: int, temporal: int):
    """transformers' Qwen2-VL image processor (its PIL form: no torchvision) for a vision tower of this geometry: what
    the rollout data path patches images with, and what a saved checkpoint's ``preprocessor_config.json`` holds, so
    ``AutoImageProcessor`` (and a server that loads the checkpoint's processor) patches them the same way."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    unit = (patch * merge) ** 2
    return Qwen2VLImageProcessorPil(patch_size=patch, merge_size=merge, temporal_patch_size=temporal,
                                    min_pixels=unit, max_pixels=unit * 65536)
