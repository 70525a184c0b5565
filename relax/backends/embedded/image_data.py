"""SGLang's ``image_data`` field of ``/generate``, for the embedded engine serving a vision-language model.

SGLang takes one image or a list per request: a path, a URL, a ``data:`` URI or bare base64 (bytes and
PIL images inside a Python process). Here each is decoded offline (relax/data/media.py: a URL is refused
with one line) and patched by the same image processor the data loader uses (relax/data/mm_pool.py), at
the size it arrives: the sender fitted it to its token budget. The prompt must already hold one
``<|image_pad|>`` per merged patch of each image, in order (as the rollout's tokens do); a count that
differs is refused rather than guessed.
"""

from __future__ import annotations

from typing import Any

import torch

from relax.data.dataset import DataError
from relax.data.media import load_image
from relax.data.mm_pool import patch_images
from relax.models.vision import vision_geometry


def parse_image_data(value: Any, input_ids: list[int], config: Any) -> dict[str, torch.Tensor] | None:
    """``pixel_values`` / ``image_grid_thw`` tensors of a request's ``image_data`` (None for none);
    ``ValueError`` with one line when it is malformed or does not match the prompt's image tokens."""
    if value is None or value == []:
        if config is not None and config.image_token_id in input_ids:
            raise ValueError("generate: input_ids hold image tokens but the request has no image_data")
        return None
    if config is None:
        raise ValueError("generate: image_data needs a vision-language model; this engine serves a text model")
    items = value if isinstance(value, list) else [value]
    images = []
    for i, item in enumerate(items):
        try:
            images.append(load_image(item, f"generate: image_data[{i}]"))
        except DataError as exc:
            raise ValueError(str(exc)) from None
    patch, merge, temporal = vision_geometry(config)
    pixels, grids = patch_images(images, patch, merge, temporal)
    want = sum(t * h * w for t, h, w in grids) // (merge * merge)
    have = sum(1 for t in input_ids if t == config.image_token_id)
    if want != have:
        raise ValueError(f"generate: image_data has {len(images)} image(s) of {want} image tokens in all, but "
                         f"input_ids hold {have} <|image_pad|> tokens")
    return {"pixel_values": torch.from_numpy(pixels), "image_grid_thw": torch.tensor(grids, dtype=torch.long)}
