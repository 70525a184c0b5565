"""Decoding and patching a row's images (and turning its audio into features) off the caller's thread: a thread pool by default, a process
pool of ``--mm-processor-pool-size`` workers when set (no GIL contention; each worker builds its own image
processor once). The work item and its result are plain picklable data.
"""

from __future__ import annotations

from concurrent.futures import Executor, ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from relax.data.image_budget import smart_resize
from relax.data.media import encode_png, load_image
from relax.models.vision import image_processor


@dataclass(frozen=True)
class ImageSpec:
    """What a worker needs to turn a row's image and video values into model inputs (picklable)."""

    patch_size: int
    merge_size: int
    temporal_patch_size: int
    factor: int  # --image-resize-scale-factor resolved: pixels per token side for the budget
    align: int  # what each side is rounded to (factor, or 1 with --image-resize-scale-factor 0)
    min_tokens: int
    max_tokens: int
    base_dir: str | None  # relative image paths are relative to the prompt file
    # videos (relax/data/video_frames.py): the per-frame token budget and the frame sampling
    video_min_tokens: int = 128
    video_max_tokens: int = 768
    video_fps: float = 2.0
    min_frames: int = 4
    max_frames: int = 768
    frame_factor: int = 2
    # audio (relax/data/audio.py): the rate clips are resampled to, the tower's mel bins (0: no audio tower), and
    # whether a video's {"audio": ...} track goes in with it (--use-audio-in-video)
    sample_rate: int = 16000
    mel_bins: int = 0
    use_audio_in_video: bool = False


@dataclass
class PreparedImages:
    """A row's images and videos as the engine receives them (``image_data`` / ``video_data``) and as the model
    consumes them (patches, grids, and for videos the seconds per temporal patch)."""

    image_data: list[str]  # PNG data URIs of the resized images (SGLang's image_data)
    pixel_values: np.ndarray  # [patches, C * temporal * patch * patch] float32
    image_grid_thw: list[list[int]]  # per image (t, h, w) in patches
    pad_counts: list[int]  # <|image_pad|> tokens per image: its patches merged merge x merge
    video_data: list[dict[str, Any]] = field(default_factory=list)  # per video {"frames": [PNG URIs], "fps": F}
    pixel_values_videos: np.ndarray | None = None
    video_grid_thw: list[list[int]] = field(default_factory=list)
    second_per_grid_ts: list[float] = field(default_factory=list)  # seconds per temporal patch (multimodal RoPE)
    video_pad_counts: list[int] = field(default_factory=list)
    # per clip of the audio column, and per video's sound track with --use-audio-in-video: (WAV data URI, features)
    audios: list[tuple[str, np.ndarray]] = field(default_factory=list)
    video_tracks: list[tuple[str, np.ndarray]] = field(default_factory=list)
    # the clips in the order their tokens stand in the prompt: ("audio", i) or ("video", j); set by the expansion
    audio_order: list[tuple[str, int]] = field(default_factory=list)


def patch_images(images: list[Any], patch: int, merge: int, temporal: int) -> tuple[np.ndarray, list[list[int]]]:
    """Qwen2-VL's image processor over already resized images: pixel patches and each image's grid."""
    out = image_processor(patch, merge, temporal)(images=images, return_tensors="np")
    return np.asarray(out["pixel_values"], dtype=np.float32), [list(map(int, g)) for g in out["image_grid_thw"]]


def _fit(img: Any, what: str, spec: ImageSpec, min_tokens: int, max_tokens: int) -> Any:
    from PIL import Image

    from relax.data.dataset import DataError

    try:
        h, w = smart_resize(img.height, img.width, factor=spec.factor, align=spec.align, min_tokens=min_tokens,
                            max_tokens=max_tokens)
    except ValueError as exc:
        raise DataError(f"{what}: {exc}") from None
    return img if (h, w) == (img.height, img.width) else img.resize((w, h), Image.Resampling.BICUBIC)


def patch_video(frames: list[Any], patch: int, merge: int, temporal: int) -> tuple[np.ndarray, list[int]]:
    """Qwen2-VL's video patches of equally sized frames (a multiple of ``temporal`` of them): each token holds
    ``temporal`` consecutive frames' pixels of one patch, tokens ordered (time, then the image order).

    Each frame goes through the image processor (its resize to the patch grid, rescale and normalization); an
    image patch holds its frame ``temporal`` times along time, of which the first copy is taken."""
    if len(frames) % temporal:
        raise ValueError(f"{len(frames)} frames: not a multiple of the temporal patch size {temporal}")
    per_frame, grids = patch_images(frames, patch, merge, temporal)
    _, gh, gw = grids[0]
    n = gh * gw
    first = per_frame.reshape(len(frames), n, 3, temporal, patch, patch)[:, :, :, 0]  # [F, n, C, p, p]
    groups = first.reshape(len(frames) // temporal, temporal, n, 3, patch, patch).transpose(0, 2, 3, 1, 4, 5)
    return np.ascontiguousarray(groups.reshape(-1, 3 * temporal * patch * patch)), [len(frames) // temporal, gh, gw]


def _prepare_video(value: Any, what: str, spec: ImageSpec, base: Any) -> tuple[dict[str, Any], np.ndarray, list[int],
                                                                               float]:
    from relax.data.video_frames import sample_indices, video_frames

    frames, fps = video_frames(value, what, base, spec.video_fps)
    keep = sample_indices(len(frames), fps, target_fps=spec.video_fps, min_frames=spec.min_frames,
                          max_frames=spec.max_frames, factor=spec.frame_factor)
    fitted = [_fit(frames[i], what, spec, spec.video_min_tokens, spec.video_max_tokens) for i in keep]
    sampled_fps = fps * len(keep) / len(frames)  # the sampled frames' rate over the clip's duration
    pixels, grid = patch_video(fitted, spec.patch_size, spec.merge_size, spec.temporal_patch_size)
    return ({"frames": [encode_png(f) for f in fitted], "fps": sampled_fps}, pixels, grid,
            spec.temporal_patch_size / sampled_fps)


def _prepare_audio(out: PreparedImages, clips: list[Any], videos: list[Any], where: str, spec: ImageSpec,
                   base: Any) -> None:
    from relax.data.audio import prepare_clip
    from relax.data.dataset import DataError

    if (clips or spec.use_audio_in_video and videos) and not spec.mel_bins:
        raise DataError(f"{where}: audio needs a model with an audio tower (e.g. --hf-checkpoint tiny-qwen2.5-omni)")
    out.audios = [prepare_clip(c, f"{where}: audio {i}", base, spec.sample_rate, spec.mel_bins)
                  for i, c in enumerate(clips)]
    if spec.use_audio_in_video:
        for i, v in enumerate(videos):
            if not isinstance(v, dict) or v.get("audio") is None:
                raise DataError(f"{where}: video {i} has no sound track: with --use-audio-in-video every video is "
                                "{\"frames\": [...], \"fps\": F, \"audio\": <clip>}")
            out.video_tracks.append(prepare_clip(v["audio"], f"{where}: video {i} audio", base, spec.sample_rate,
                                                 spec.mel_bins))


def prepare_images(values: list[Any], where: str, spec: ImageSpec, videos: list[Any] = (),
                   audios: list[Any] = ()) -> PreparedImages:
    """Load, fit to the token budgets, and patch one row's images and videos, and turn its audio clips into
    features (runs in a pool worker)."""
    from pathlib import Path

    base = Path(spec.base_dir) if spec.base_dir else None
    resized = [_fit(load_image(value, f"{where}: image {i}", base), f"{where}: image {i}", spec, spec.min_tokens,
                    spec.max_tokens) for i, value in enumerate(values)]
    merge2 = spec.merge_size * spec.merge_size
    if resized:
        pixels, grids = patch_images(resized, spec.patch_size, spec.merge_size, spec.temporal_patch_size)
    else:
        pixels, grids = np.zeros((0, 3 * spec.temporal_patch_size * spec.patch_size ** 2), np.float32), []
    out = PreparedImages([encode_png(img) for img in resized], pixels, grids, [t * h * w // merge2 for t, h, w in grids])
    clips = [_prepare_video(v, f"{where}: video {i}", spec, base) for i, v in enumerate(videos)]
    if clips:
        out.video_data = [c[0] for c in clips]
        out.pixel_values_videos = np.concatenate([c[1] for c in clips])
        out.video_grid_thw = [c[2] for c in clips]
        out.second_per_grid_ts = [c[3] for c in clips]
        out.video_pad_counts = [t * h * w // merge2 for t, h, w in out.video_grid_thw]
    _prepare_audio(out, list(audios), list(videos), where, spec, base)
    return out


def _exit_with_parent(parent: int) -> None:
    """A pool worker's initializer: leave when the process that made the pool is gone.

    Each worker holds both ends of the pool's call queue, so it never sees end-of-file when its parent dies
    (killed by Ray, or ending without shutting the pool down): it would block forever, an orphan keeping its
    inherited stdout open. A daemon thread polls the parent id instead."""
    import os
    import threading
    import time

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(0)

    threading.Thread(target=watch, name="relax-mm-parent-watch", daemon=True).start()


def make_pool(size: int) -> Executor:
    """``size`` 0: a thread pool (the default); > 0: a process pool of ``size`` workers (spawned, so no lock or
    thread state of the parent is copied), shut down at exit and gone with their parent."""
    if size > 0:
        import atexit
        import multiprocessing
        import os

        pool = ProcessPoolExecutor(max_workers=size, mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_exit_with_parent, initargs=(os.getpid(),))
        atexit.register(pool.shutdown, wait=False, cancel_futures=True)
        return pool
    return ThreadPoolExecutor(max_workers=2, thread_name_prefix="relax-mm")
