"""Decoding and patching a row's images off the caller's thread: a thread pool by default, a process
pool of ``--mm-processor-pool-size`` workers when set (no GIL contention; each worker builds its own image
processor once). The work item and its result are plain picklable data.
"""

from __future__ import annotations

import functools
from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np

from relax.data.image_budget import smart_resize
from relax.data.media import encode_png, load_image


@dataclass(frozen=True)
class ImageSpec:
    """What a worker needs to turn image values into model inputs (picklable)."""

    patch_size: int
    merge_size: int
    temporal_patch_size: int
    factor: int  # --image-resize-scale-factor resolved: pixels per token side for the budget
    align: int  # what each side is rounded to (factor, or 1 with --image-resize-scale-factor 0)
    min_tokens: int
    max_tokens: int
    base_dir: str | None  # relative image paths are relative to the prompt file


@dataclass
class PreparedImages:
    """A row's images as the engine receives them (``image_data``) and as the model consumes them."""

    image_data: list[str]  # PNG data URIs of the resized images (SGLang's image_data)
    pixel_values: np.ndarray  # [patches, C * temporal * patch * patch] float32
    image_grid_thw: list[list[int]]  # per image (t, h, w) in patches
    pad_counts: list[int]  # <|image_pad|> tokens per image: its patches merged merge x merge


@functools.lru_cache(maxsize=4)
def _processor(patch: int, merge: int, temporal: int):
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    unit = (patch * merge) ** 2
    return Qwen2VLImageProcessorPil(patch_size=patch, merge_size=merge, temporal_patch_size=temporal,
                                    min_pixels=unit, max_pixels=unit * 65536)


def patch_images(images: list[Any], patch: int, merge: int, temporal: int) -> tuple[np.ndarray, list[list[int]]]:
    """Qwen2-VL's image processor over already resized images: pixel patches and each image's grid."""
    out = _processor(patch, merge, temporal)(images=images, return_tensors="np")
    return np.asarray(out["pixel_values"], dtype=np.float32), [list(map(int, g)) for g in out["image_grid_thw"]]


def prepare_images(values: list[Any], where: str, spec: ImageSpec) -> PreparedImages:
    """Load, fit to the token budget, and patch one row's images (runs in a pool worker)."""
    from pathlib import Path

    from PIL import Image

    from relax.data.dataset import DataError

    resized = []
    base = Path(spec.base_dir) if spec.base_dir else None
    for i, value in enumerate(values):
        img = load_image(value, f"{where}: image {i}", base)
        try:
            h, w = smart_resize(img.height, img.width, factor=spec.factor, align=spec.align,
                                min_tokens=spec.min_tokens, max_tokens=spec.max_tokens)
        except ValueError as exc:
            raise DataError(f"{where}: image {i}: {exc}") from None
        resized.append(img if (h, w) == (img.height, img.width) else img.resize((w, h), Image.Resampling.BICUBIC))
    pixels, grids = patch_images(resized, spec.patch_size, spec.merge_size, spec.temporal_patch_size)
    merge2 = spec.merge_size * spec.merge_size
    return PreparedImages([encode_png(img) for img in resized], pixels, grids,
                          [t * h * w // merge2 for t, h, w in grids])


def make_pool(size: int) -> Executor:
    """``size`` 0: a thread pool (the default); > 0: a process pool of ``size`` workers."""
    if size > 0:
        import multiprocessing

        return ProcessPoolExecutor(max_workers=size, mp_context=multiprocessing.get_context("spawn"))
    return ThreadPoolExecutor(max_workers=2, thread_name_prefix="relax-mm")
