"""SGLang's ``image_data``, ``video_data`` and ``audio_data`` fields of ``/generate`` (and ``use_audio_in_video``),
for the embedded engine serving a vision-language or omni model.

SGLang takes one image or a list per request: a path, a URL, a ``data:`` URI or bare base64. Here each is
decoded offline (relax/data/media.py: a URL is refused with one line) and patched by the same image processor
the data loader uses (relax/data/mm_pool.py), at the size it arrives: the sender fitted it to its token
budget. A video is its frames, as the rollout sends them: ``{"frames": [image, ...], "fps": F}`` (or a bare
list of frames at 2 fps), already sampled and sized, patched as they are; a video file is refused (this
engine has no video decoder). The prompt holds each image as SGLang takes it, one ``<|image_pad|>`` per image
(SGLang's HF processor expands each pad into the image's tokens; the rollout sends that form,
relax/engine/rollout/prompt_input.py), which is expanded here to one pad per merged patch, or already so
expanded (the sample's own tokens); a video holds one pad per merged patch. A count that is neither is refused
rather than guessed. An audio clip
is a WAV (path, ``data:`` URI, base64; relax/data/audio.py), resampled to the engine's audio rate (the run's
``--audio-sample-rate``; SGLang's processor resamples to its feature extractor's) and turned into log-mel features
as the data loader does; ``audio_data`` lists the prompt's clips in the order their ``<|AUDIO|>`` runs stand,
a video's sound track among them with ``use_audio_in_video``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from relax.data.audio import prepare_clip
from relax.data.dataset import DataError
from relax.data.media import load_image
from relax.data.mm_pool import patch_images, patch_video
from relax.data.video_frames import video_frames
from relax.models.omni import audio_token_count, is_audio_config, mel_bins
from relax.models.vision import vision_geometry

DEFAULT_VIDEO_FPS = 2.0  # a bare frame list's rate (seed 000's --video-fps default)


def _items(value: Any) -> list[Any]:
    return [] if value is None else value if isinstance(value, list) else [value]


def _check_count(what: str, n: int, want: int, have: int, pad: str) -> None:
    if want != have:
        raise ValueError(f"generate: {what} has {n} item(s) of {want} tokens in all, but input_ids hold {have} "
                         f"{pad} tokens")


def _audio(req: dict[str, Any], input_ids: list[int], config: Any, sample_rate: int) -> dict[str, Any]:
    """The model inputs of ``audio_data``: the clips' features concatenated along time, and each clip's frames."""
    clips = _items(req.get("audio_data"))
    audio = config is not None and is_audio_config(config)
    have = sum(1 for t in input_ids if t == config.audio_token_id) if audio else 0
    if (clips or req.get("use_audio_in_video")) and not audio:
        raise ValueError("generate: audio_data and use_audio_in_video need a model with an audio tower; this engine "
                         "serves one without")
    try:
        feats = [prepare_clip(c, f"generate: audio_data[{i}]", None, sample_rate, mel_bins(config))[1]
                 for i, c in enumerate(clips)]
    except DataError as exc:
        raise ValueError(str(exc)) from None
    _check_count("audio_data", len(feats), sum(audio_token_count(f.shape[1]) for f in feats), have, "<|AUDIO|>")
    if not feats:
        return {}
    return {"input_features": torch.from_numpy(np.concatenate(feats, axis=1)),
            "audio_feature_lengths": torch.tensor([f.shape[1] for f in feats], dtype=torch.long),
            "use_audio_in_video": bool(req.get("use_audio_in_video"))}


def expand_image_pads(input_ids: list[int], pad_id: int, counts: list[int]) -> list[int]:
    """SGLang's form of a prompt (one ``pad_id`` per image) with image ``i``'s pad repeated ``counts[i]`` times, as
    SGLang 0.5.14 expands it (``BaseMultimodalProcessor._expand_input_ids``)."""
    out: list[int] = []
    pieces = iter(counts)
    for t in input_ids:
        out.extend([t] * next(pieces) if t == pad_id else [t])
    return out


def parse_media(req: dict[str, Any], input_ids: list[int], config: Any,
                sample_rate: int = 16000) -> tuple[dict[str, Any] | None, list[int]]:
    """The model inputs of a request's ``image_data`` / ``video_data`` / ``audio_data`` (None for none of them),
    and the prompt's ids with each image's pads expanded (module docstring); ``ValueError`` with one line when
    they are malformed or do not match the prompt's pad tokens. ``sample_rate``: the rate audio is resampled to
    before its features."""
    images, videos = _items(req.get("image_data")), _items(req.get("video_data"))
    audio = _audio(req, input_ids, config, sample_rate)
    if not images and not videos:
        if config is not None and ({config.image_token_id, config.video_token_id} & set(input_ids)):
            raise ValueError("generate: input_ids hold image or video tokens but the request has no image_data or "
                             "video_data")
        return audio or None, input_ids
    if config is None:
        raise ValueError("generate: image_data and video_data need a vision-language model; this engine serves a "
                         "text model")
    patch, merge, temporal = vision_geometry(config)
    out: dict[str, Any] = dict(audio)
    try:
        decoded = [load_image(item, f"generate: image_data[{i}]") for i, item in enumerate(images)]
        clips = [video_frames(v, f"generate: video_data[{i}]", None, DEFAULT_VIDEO_FPS) for i, v in enumerate(videos)]
    except DataError as exc:
        raise ValueError(str(exc)) from None
    have_images = sum(1 for t in input_ids if t == config.image_token_id)
    if decoded:
        pixels, grids = patch_images(decoded, patch, merge, temporal)
        counts = [t * h * w // merge ** 2 for t, h, w in grids]
        if have_images == len(decoded) != sum(counts):  # SGLang's form: one pad per image
            input_ids = expand_image_pads(input_ids, config.image_token_id, counts)
            have_images = sum(counts)
        _check_count("image_data", len(decoded), sum(counts), have_images, "<|image_pad|>")
        out.update(pixel_values=torch.from_numpy(pixels), image_grid_thw=torch.tensor(grids, dtype=torch.long))
    else:
        _check_count("image_data", 0, 0, have_images, "<|image_pad|>")
    have_videos = sum(1 for t in input_ids if t == config.video_token_id)
    if clips:
        patched = []
        for i, (frames, _) in enumerate(clips):
            try:
                patched.append(patch_video(frames, patch, merge, temporal))
            except ValueError as exc:
                raise ValueError(f"generate: video_data[{i}]: {exc}") from None
        grids = [g for _, g in patched]
        _check_count("video_data", len(clips), sum(t * h * w for t, h, w in grids) // merge ** 2, have_videos,
                     "<|video_pad|>")
        out.update(pixel_values_videos=torch.from_numpy(np.concatenate([p for p, _ in patched])),
                   video_grid_thw=torch.tensor(grids, dtype=torch.long),
                   second_per_grid_ts=torch.tensor([temporal / fps for _, fps in clips], dtype=torch.float32))
    else:
        _check_count("video_data", 0, 0, have_videos, "<|video_pad|>")
    return out, input_ids
