"""A record's images and videos into its prompt: placeholders expanded to the model's vision tokens, media
prepared in a pool (relax/data/mm_pool.py), the result kept on the sample for the engine and the trainer.

Each ``<image>`` in the record's text (a string prompt or the messages' contents) stands for the next
image of the ``--multimodal-keys`` image column, and becomes ``<|vision_start|>`` + one ``<|image_pad|>``
per merged patch + ``<|vision_end|>``, as Qwen2.5-VL's processor writes it; ``<video>`` likewise with
``<|video_pad|>`` for the next video (relax/data/video_frames.py). The chat template then sees plain text.
``Sample.multimodal_inputs`` holds ``image_data`` / ``video_data`` (what the rollout sends the engine, as
SGLang's fields) and the patches and grids the trainer feeds the model.
"""

from __future__ import annotations

from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

from relax.data.dataset import DataError, missing_key
from relax.data.mm_config import MultimodalConfig
from relax.data.mm_pool import ImageSpec, PreparedImages, make_pool, prepare_images
from relax.models.tokenizer import IMAGE_PAD, VIDEO_PAD, VISION_END, VISION_START
from relax.models.vision import vision_geometry

IMAGE_PLACEHOLDER, VIDEO_PLACEHOLDER, AUDIO_PLACEHOLDER = "<image>", "<video>", "<audio>"


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
        self.video_key = (cfg.multimodal_keys or {}).get("video")
        frame_factor = cfg.video("frame_factor")
        if frame_factor % temporal:
            raise DataError(f"--frame-factor {frame_factor} must be a multiple of the model's temporal patch size "
                            f"{temporal}")
        self._spec = dict(patch_size=patch, merge_size=merge, temporal_patch_size=temporal,
                          factor=factor or patch * merge, align=factor or 1, min_tokens=cfg.min_tokens,
                          max_tokens=cfg.max_tokens, video_min_tokens=cfg.video("video_min_token_num"),
                          video_max_tokens=cfg.video("video_max_token_num"), video_fps=float(cfg.video("video_fps")),
                          min_frames=cfg.video("video_fps_min_frames"), max_frames=cfg.video("video_fps_max_frames"),
                          frame_factor=frame_factor)
        self.pool = make_pool(cfg.mm_processor_pool_size)

    def spec(self, where: str) -> ImageSpec:
        return ImageSpec(**self._spec, base_dir=_where_dir(where))

    def _column(self, key: str | None, modality: str, record: dict[str, Any], where: str) -> list[Any]:
        if key is None:
            return []
        if key not in record:
            raise DataError(f"{where}: {missing_key(key, record)} (--multimodal-keys {modality})")
        value = record[key]
        if value is None:
            return []
        return list(value) if isinstance(value, list | tuple) else [value]

    def images_of(self, record: dict[str, Any], where: str) -> list[Any]:
        return self._column(self.image_key, "image", record, where)

    def videos_of(self, record: dict[str, Any], where: str) -> list[Any]:
        """The column's videos: each a list of frames or {"frames", "fps"} (relax/data/video_frames.py)."""
        return self._column(self.video_key, "video", record, where)

    def submit(self, record: dict[str, Any], where: str) -> Future | None:
        """Start preparing ``record``'s media in the pool (None: it has none)."""
        images, videos = self.images_of(record, where), self.videos_of(record, where)
        if not images and not videos:
            return None
        return self.pool.submit(prepare_images, images, where, self.spec(where), videos)

    def prepare(self, record: dict[str, Any], where: str) -> PreparedImages | None:
        """``record``'s media prepared now: in this thread, or by the process pool when there is one."""
        images, videos = self.images_of(record, where), self.videos_of(record, where)
        if not images and not videos:
            return None
        if isinstance(self.pool, ProcessPoolExecutor):
            return self.pool.submit(prepare_images, images, where, self.spec(where), videos).result()
        return prepare_images(images, where, self.spec(where), videos)

    def expand(self, raw: Any, prepared: PreparedImages | None, where: str) -> Any:
        """``raw`` (a string or messages) with each ``<image>`` / ``<video>`` replaced by its vision tokens."""
        for tag, pad, key, counts in (
                (IMAGE_PLACEHOLDER, IMAGE_PAD, self.image_key, prepared.pad_counts if prepared else []),
                (VIDEO_PLACEHOLDER, VIDEO_PAD, self.video_key, prepared.video_pad_counts if prepared else [])):
            found = _count(raw, tag)
            if found and key is None:
                raise DataError(f"{where}: the prompt has {found} {tag} placeholder(s) but --multimodal-keys names no "
                                f"{tag.strip('<>')} column")
            if found != len(counts):
                kind = tag.strip("<>")
                raise DataError(f"{where}: {len(counts)} {kind}(s) in column {key!r} but {found} {tag} "
                                "placeholder(s) in the prompt")
            raw = _replace(raw, tag, iter(VISION_START + pad * n + VISION_END for n in counts))
        if _count(raw, AUDIO_PLACEHOLDER):
            raise DataError(f"{where}: not supported yet: {AUDIO_PLACEHOLDER} in the prompt (the vision-language "
                            "models here have no audio tower)")
        return raw

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def _count(raw: Any, tag: str) -> int:
    if isinstance(raw, str):
        return raw.count(tag)
    if isinstance(raw, list):
        return sum(_count(m.get("content"), tag) for m in raw if isinstance(m, dict))
    return 0


def _replace(raw: Any, tag: str, pieces: Any) -> Any:
    if isinstance(raw, str):
        parts = raw.split(tag)
        return parts[0] + "".join(next(pieces) + p for p in parts[1:])
    if isinstance(raw, list):
        return [dict(m, content=_replace(m.get("content"), tag, pieces)) if isinstance(m, dict) else m for m in raw]
    return raw


def multimodal_inputs(prepared: PreparedImages) -> dict[str, Any]:
    """``Sample.multimodal_inputs`` of a prepared row (the video fields only when it has videos)."""
    out: dict[str, Any] = {"image_data": list(prepared.image_data), "pixel_values": prepared.pixel_values,
                           "image_grid_thw": [list(g) for g in prepared.image_grid_thw]}
    if prepared.video_data:
        out.update(video_data=list(prepared.video_data), pixel_values_videos=prepared.pixel_values_videos,
                   video_grid_thw=[list(g) for g in prepared.video_grid_thw],
                   second_per_grid_ts=list(prepared.second_per_grid_ts))
    return out


def media_request_fields(multimodal_inputs: Any) -> dict[str, Any]:
    """The ``/generate`` fields of a sample's media: SGLang's ``image_data`` (data URIs) and ``video_data`` (each
    video as its sampled frames), only those it has."""
    media = multimodal_inputs if isinstance(multimodal_inputs, dict) else {}
    return {k: list(media[k]) for k in ("image_data", "video_data") if media.get(k)}
