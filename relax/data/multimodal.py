"""A record's images into its prompt: placeholders expanded to the model's vision tokens, media prepared
in a pool (relax/data/mm_pool.py), the result kept on the sample for the engine and the trainer.

Each ``<image>`` in the record's text (a string prompt or the messages' contents) stands for the next
image of the ``--multimodal-keys`` image column, and becomes ``<|vision_start|>`` + one ``<|image_pad|>``
per merged patch + ``<|vision_end|>``, as Qwen2.5-VL's processor writes it; the chat template then sees
plain text. ``Sample.multimodal_inputs`` holds ``image_data`` (what the rollout sends the engine, as SGLang's
field), ``pixel_values`` and ``image_grid_thw`` (what the trainer feeds the model).
"""

from __future__ import annotations

from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

from relax.data.dataset import DataError, missing_key
from relax.data.mm_config import MultimodalConfig
from relax.data.mm_pool import ImageSpec, PreparedImages, make_pool, prepare_images
from relax.models.vision import IMAGE_PAD, VISION_END, VISION_START, vision_geometry

IMAGE_PLACEHOLDER = "<image>"


def _where_dir(where: str) -> str | None:
    path = where.rsplit(":", 1)[0]
    parent = Path(path).parent
    return str(parent) if path and parent.is_dir() else None


class MultimodalRows:
    """Prepares the images of records and writes their tokens into the prompts (module docstring)."""

    def __init__(self, cfg: MultimodalConfig, model_config: Any):
        patch, merge, temporal = vision_geometry(model_config)
        factor = patch * merge if cfg.image_resize_scale_factor is None else cfg.image_resize_scale_factor
        self.image_key = (cfg.multimodal_keys or {}).get("image")
        self._spec = dict(patch_size=patch, merge_size=merge, temporal_patch_size=temporal,
                          factor=factor or patch * merge, align=factor or 1, min_tokens=cfg.min_tokens,
                          max_tokens=cfg.max_tokens)
        self.pool = make_pool(cfg.mm_processor_pool_size)

    def spec(self, where: str) -> ImageSpec:
        return ImageSpec(**self._spec, base_dir=_where_dir(where))

    def images_of(self, record: dict[str, Any], where: str) -> list[Any]:
        if self.image_key is None:
            return []
        if self.image_key not in record:
            raise DataError(f"{where}: {missing_key(self.image_key, record)} (--multimodal-keys image)")
        value = record[self.image_key]
        if value is None:
            return []
        return list(value) if isinstance(value, list | tuple) else [value]

    def submit(self, record: dict[str, Any], where: str) -> Future | None:
        """Start preparing ``record``'s images in the pool (None: it has none)."""
        images = self.images_of(record, where)
        return self.pool.submit(prepare_images, images, where, self.spec(where)) if images else None

    def prepare(self, record: dict[str, Any], where: str) -> PreparedImages | None:
        """``record``'s images prepared now: in this thread, or by the process pool when there is one."""
        images = self.images_of(record, where)
        if not images:
            return None
        if isinstance(self.pool, ProcessPoolExecutor):
            return self.pool.submit(prepare_images, images, where, self.spec(where)).result()
        return prepare_images(images, where, self.spec(where))

    def expand(self, raw: Any, prepared: PreparedImages | None, where: str) -> Any:
        """``raw`` (a string or messages) with each ``<image>`` replaced by that image's vision tokens."""
        counts = prepared.pad_counts if prepared is not None else []
        found = _count(raw)
        if found != len(counts):
            raise DataError(f"{where}: {len(counts)} image(s) in column {self.image_key!r} but {found} "
                            f"{IMAGE_PLACEHOLDER} placeholder(s) in the prompt")
        pieces = iter(VISION_START + IMAGE_PAD * n + VISION_END for n in counts)
        return _replace(raw, pieces)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _count(raw: Any) -> int:
    if isinstance(raw, str):
        return raw.count(IMAGE_PLACEHOLDER)
    if isinstance(raw, list):
        return sum(_count(m.get("content")) for m in raw if isinstance(m, dict))
    return 0


def _replace(raw: Any, pieces: Any) -> Any:
    if isinstance(raw, str):
        parts = raw.split(IMAGE_PLACEHOLDER)
        return parts[0] + "".join(next(pieces) + p for p in parts[1:])
    if isinstance(raw, list):
        return [dict(m, content=_replace(m.get("content"), pieces)) if isinstance(m, dict) else m for m in raw]
    return raw


def multimodal_inputs(prepared: PreparedImages) -> dict[str, Any]:
    """``Sample.multimodal_inputs`` of a prepared row."""
    return {"image_data": list(prepared.image_data), "pixel_values": prepared.pixel_values,
            "image_grid_thw": [list(g) for g in prepared.image_grid_thw]}
