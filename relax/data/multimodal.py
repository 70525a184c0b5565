"""A record's images and videos into its prompt: placeholders expanded to the model's vision tokens, media
prepared in a pool (relax/data/mm_pool.py), the result kept on the sample for the engine and the trainer.

Each ``<image>`` in the record's text (a string prompt or the messages' contents) stands for the next
image of the ``--multimodal-keys`` image column, and becomes ``<|vision_start|>`` + one ``<|image_pad|>``
per merged patch + ``<|vision_end|>``, as Qwen2.5-VL's processor writes it; ``<video>`` likewise with
``<|video_pad|>`` for the next video (relax/data/video_frames.py). ``<audio>`` stands for the next clip of the
audio column and becomes ``<|audio_bos|>`` + one ``<|AUDIO|>`` per audio-tower frame + ``<|audio_eos|>``
(relax/models/omni.py); with ``--use-audio-in-video`` a video given as ``{"frames": [...], "fps": F, "audio":
<clip>}`` becomes ``<|vision_start|><|audio_bos|>`` + its video and audio tokens interleaved by time chunk +
``<|audio_eos|><|vision_end|>``, as Qwen2_5OmniProcessor writes it. The chat template then sees plain text.
``Sample.multimodal_inputs`` holds ``image_data`` / ``video_data`` / ``audio_data`` (what the rollout sends the
engine, as SGLang's fields; a video's sound track is an ``audio_data`` item, in prompt order, with SGLang's
``use_audio_in_video``) and the patches, grids and log-mel features the trainer feeds the model.
"""

from __future__ import annotations

import itertools
import re
from concurrent.futures import Future, ProcessPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from relax.data.dataset import DataError, missing_key
from relax.data.mm_config import MultimodalConfig
from relax.data.mm_pool import ImageSpec, PreparedImages, make_pool, prepare_images
from relax.models.omni import audio_chunking, audio_token_count, is_audio_config, mel_bins
from relax.models.tokenizer import (
    AUDIO_END,
    AUDIO_PAD,
    AUDIO_START,
    IMAGE_PAD,
    VIDEO_PAD,
    VISION_END,
    VISION_START,
)
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
        self.audio_key = (cfg.multimodal_keys or {}).get("audio")
        audio = is_audio_config(model_config)
        if (self.audio_key or cfg.use_audio_in_video) and not audio:
            raise DataError("--multimodal-keys audio and --use-audio-in-video need a model with an audio tower (e.g. "
                            "--hf-checkpoint tiny-qwen2.5-omni)")
        self._chunking = audio_chunking(model_config) if audio else (25.0, 2.0)
        frame_factor = cfg.video("frame_factor")
        if frame_factor % temporal:
            raise DataError(f"--frame-factor {frame_factor} must be a multiple of the model's temporal patch size "
                            f"{temporal}")
        self._spec = dict(patch_size=patch, merge_size=merge, temporal_patch_size=temporal,
                          factor=factor or patch * merge, align=factor or 1, min_tokens=cfg.min_tokens,
                          max_tokens=cfg.max_tokens, video_min_tokens=cfg.video("video_min_token_num"),
                          video_max_tokens=cfg.video("video_max_token_num"), video_fps=float(cfg.video("video_fps")),
                          min_frames=cfg.video("video_fps_min_frames"), max_frames=cfg.video("video_fps_max_frames"),
                          frame_factor=frame_factor, sample_rate=cfg.sample_rate,
                          mel_bins=mel_bins(model_config) if audio else 0, use_audio_in_video=cfg.use_audio_in_video)
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

    def audios_of(self, record: dict[str, Any], where: str) -> list[Any]:
        """The column's audio clips (relax/data/audio.py)."""
        return self._column(self.audio_key, "audio", record, where)

    def _media(self, record: dict[str, Any], where: str) -> tuple[list[Any], list[Any], list[Any]] | None:
        media = self.images_of(record, where), self.videos_of(record, where), self.audios_of(record, where)
        return media if any(media) else None

    def submit(self, record: dict[str, Any], where: str) -> Future | None:
        """Start preparing ``record``'s media in the pool (None: it has none)."""
        media = self._media(record, where)
        if media is None:
            return None
        images, videos, audios = media
        return self.pool.submit(prepare_images, images, where, self.spec(where), videos, audios)

    def prepare(self, record: dict[str, Any], where: str) -> PreparedImages | None:
        """``record``'s media prepared now: in this thread, or by the process pool when there is one."""
        media = self._media(record, where)
        if media is None:
            return None
        images, videos, audios = media
        if isinstance(self.pool, ProcessPoolExecutor):
            return self.pool.submit(prepare_images, images, where, self.spec(where), videos, audios).result()
        return prepare_images(images, where, self.spec(where), videos, audios)

    def expand(self, raw: Any, prepared: PreparedImages | None, where: str) -> Any:
        """``raw`` (a string or messages) with each ``<image>`` / ``<video>`` / ``<audio>`` replaced by its tokens;
        ``prepared.audio_order`` becomes the order the prompt holds its clips in."""
        images = [VISION_START + IMAGE_PAD * n + VISION_END for n in (prepared.pad_counts if prepared else [])]
        audios = [AUDIO_START + AUDIO_PAD * audio_token_count(f.shape[1]) + AUDIO_END
                  for _, f in (prepared.audios if prepared else [])]
        expansions = ((IMAGE_PLACEHOLDER, self.image_key, images),
                      (VIDEO_PLACEHOLDER, self.video_key, self._video_texts(prepared)),
                      (AUDIO_PLACEHOLDER, self.audio_key, audios))
        for tag, key, pieces in expansions:
            found, kind = _count(raw, tag), tag.strip("<>")
            if found and key is None:
                raise DataError(f"{where}: the prompt has {found} {tag} placeholder(s) but --multimodal-keys names no "
                                f"{kind} column")
            if found != len(pieces):
                raise DataError(f"{where}: {len(pieces)} {kind}(s) in column {key!r} but {found} {tag} "
                                "placeholder(s) in the prompt")
        if prepared is not None:
            sounding = (VIDEO_PLACEHOLDER, AUDIO_PLACEHOLDER) if prepared.video_tracks else (AUDIO_PLACEHOLDER,)
            seen, order = dict.fromkeys(sounding, 0), []
            for tag in _tags_in_order(raw, sounding):
                order.append(("video" if tag == VIDEO_PLACEHOLDER else "audio", seen[tag]))
                seen[tag] += 1
            prepared.audio_order = order
        for tag, _, pieces in expansions:
            raw = _replace(raw, tag, iter(pieces))
        return raw

    def _video_texts(self, prepared: PreparedImages | None) -> list[str]:
        """Each video's tokens: its pads, or with its sound track the interleaved video and audio chunks."""
        if prepared is None:
            return []
        if not prepared.video_tracks:
            return [VISION_START + VIDEO_PAD * n + VISION_END for n in prepared.video_pad_counts]
        merge2 = self._spec["merge_size"] ** 2
        return [VISION_START + AUDIO_START + interleave_video_audio(grid, merge2, spg, audio_token_count(f.shape[1]),
                                                                    *self._chunking) + AUDIO_END + VISION_END
                for grid, spg, (_, f) in zip(prepared.video_grid_thw, prepared.second_per_grid_ts,
                                             prepared.video_tracks, strict=True)]

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


def interleave_video_audio(grid: list[int], merge2: int, second_per_grid: float, audio_tokens: int,
                           position_per_second: float, seconds_per_chunk: float) -> str:
    """A video's pads and its sound's pads, chunk by chunk of ``seconds_per_chunk`` (Qwen2_5OmniProcessor's
    ``replace_video_with_audio_token``), a frame's time position truncated as the model's ``get_rope_index`` does."""
    t, h, w = grid
    per_frame = h * w // merge2
    times = [int(i * second_per_grid * position_per_second) for i in range(t) for _ in range(per_frame)]
    per_chunk = int(position_per_second * seconds_per_chunk)
    video, audio = _chunks(times, per_chunk), _chunks(list(range(audio_tokens)), per_chunk)
    return "".join(VIDEO_PAD * v + AUDIO_PAD * a
                   for v, a in itertools.zip_longest(video, audio, fillvalue=0))


def _chunks(positions: list[int], per_chunk: int) -> list[int]:
    """Sizes of the runs of ``positions`` (increasing) falling in successive ``per_chunk`` ranges; an empty range
    between two full ones counts as an empty run, as the processor's ``get_chunked_index`` yields it."""
    sizes, start, chunk = [], 0, 1
    for i, p in enumerate(positions):
        if p >= chunk * per_chunk:
            sizes.append(i - start)
            start, chunk = i, chunk + 1
    sizes.append(len(positions) - start)
    return sizes


def _tags_in_order(raw: Any, tags: tuple[str, ...]) -> list[str]:
    """The placeholders of ``tags`` in the order the prompt holds them."""
    if isinstance(raw, str):
        return re.findall("|".join(map(re.escape, tags)), raw)
    if isinstance(raw, list):
        return [t for m in raw if isinstance(m, dict) for t in _tags_in_order(m.get("content"), tags)]
    return []


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
    clips = [(prepared.audios if kind == "audio" else prepared.video_tracks)[i] for kind, i in prepared.audio_order]
    if clips:
        out.update(audio_data=[uri for uri, _ in clips],
                   input_features=np.concatenate([f for _, f in clips], axis=1),
                   audio_feature_lengths=[int(f.shape[1]) for _, f in clips])
    if prepared.video_tracks:
        out["use_audio_in_video"] = True
    return out


def one_pad_per_image(tokens: list[int], pad_id: int, prompt_len: int) -> list[int]:
    """A sample's tokens as a ``/generate`` request carries them: each run of ``pad_id`` (``<|image_pad|>``: one
    image's merged patches) in the first ``prompt_len`` tokens as one pad; the response part as it is.

    SGLang 0.5.14 decodes ``input_ids`` to text and gives it with the images to the model's HF processor
    (multimodal/processors/base_processor.py ``load_mm_data`` / ``process_and_combine_mm_data``), which expands
    *every* ``<|image_pad|>`` of the text into one image's tokens (``Qwen2_5_VLProcessor.__call__``): expanded pads
    would each be taken for another image (an IndexError past the first image's grid). It then keeps the sent ids
    and repeats each pad by its image's token count (``_expand_input_ids``): the very tokens `MultimodalRows.expand`
    wrote, so the engine runs on the sample's own tokens. Relax's engine expands the single pads the same way
    (relax/backends/embedded/image_data.py)."""
    out: list[int] = []
    for i, t in enumerate(tokens[:prompt_len]):
        if t == pad_id and i and tokens[i - 1] == pad_id:
            continue
        out.append(t)
    return out + list(tokens[prompt_len:])


def media_request_fields(multimodal_inputs: Any) -> dict[str, Any]:
    """The ``/generate`` fields of a sample's media: SGLang's ``image_data`` (data URIs), ``video_data`` (each
    video as its sampled frames) and ``audio_data`` (WAV data URIs, in prompt order), only those it has; and
    ``use_audio_in_video`` when its videos' sound tracks are among the audio."""
    media = multimodal_inputs if isinstance(multimodal_inputs, dict) else {}
    out = {k: list(media[k]) for k in ("image_data", "video_data", "audio_data") if media.get(k)}
    if media.get("use_audio_in_video"):
        out["use_audio_in_video"] = True
    return out
