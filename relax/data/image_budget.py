"""Fitting an image to a token budget: Qwen2-VL / Qwen2.5-VL / Qwen3-VL's ``smart_resize``.

One image token covers a ``factor x factor`` pixel square (``factor = patch_size * spatial_merge_size``,
16 for the tiny VLM, 28 for Qwen2.5-VL). The image is scaled, keeping its aspect ratio, so that its token
count lies in ``[min_tokens, max_tokens]`` (``--image-min-token-num`` / ``--image-max-token-num``) and each
side is a multiple of ``factor`` (``--image-resize-scale-factor``; 0 keeps the scaled size unaligned, and the
model's image processor aligns it to its own patches).
"""

from __future__ import annotations

import math


def smart_resize(height: int, width: int, *, factor: int, align: int, min_tokens: int,
                 max_tokens: int) -> tuple[int, int]:
    """(height, width) for the budget: ``factor`` is the pixels per token side, ``align`` what each side
    is rounded to (``factor`` normally, 1 when alignment is off)."""
    if height <= 0 or width <= 0:
        raise ValueError(f"image of {width}x{height} pixels")
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"image of {width}x{height} pixels: aspect ratio over 200")
    unit = factor * factor
    min_pixels, max_pixels = min_tokens * unit, max_tokens * unit
    h = max(align, round(height / align) * align)
    w = max(align, round(width / align) * align)
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(align, math.floor(height / beta / align) * align)
        w = max(align, math.floor(width / beta / align) * align)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / align) * align
        w = math.ceil(width * beta / align) * align
    return h, w


def image_tokens(height: int, width: int, factor: int) -> int:
    """Tokens of an aligned ``height x width`` image (one per ``factor x factor`` square)."""
    return (height // factor) * (width // factor)
