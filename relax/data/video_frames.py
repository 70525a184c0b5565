"""A row's video as frames, sampled by fps within the frame bounds, without a video decoder.

Without av or decord a video is given as its frames: a list of frame images (any image value of
relax/data/media.py), or ``{"frames": [...], "fps": F}`` naming the rate they were taken at (a bare list is
taken to be at ``--video-fps``, so every frame is kept up to the bounds). A video file (``.mp4``, ...) is
refused in one line naming it and what to install. Sampling follows qwen-vl-utils' ``smart_nframes``:
``duration * --video-fps`` frames, within ``[--video-fps-min-frames, --video-fps-max-frames]`` and the clip's
length, rounded to a multiple of ``--frame-factor`` (Qwen-VL pairs frames into temporal patches), spread
evenly over the clip; a clip shorter than one ``--frame-factor`` repeats its last frame.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np

from relax.data.dataset import DataError
from relax.data.media import load_image

VIDEO_SUFFIXES = (".mp4", ".avi", ".mov", ".mkv", ".webm", ".flv", ".m4v", ".mpeg", ".mpg", ".gif")


def video_frames(value: Any, where: str, base_dir: Path | None, default_fps: float) -> tuple[list[Any], float]:
    """(frames as RGB images, their rate) of one video value."""
    fps = default_fps
    if isinstance(value, dict) and "frames" in value:
        fps = value.get("fps") or default_fps
        if not isinstance(fps, int | float) or fps <= 0:
            raise DataError(f"{where}: video fps {value.get('fps')!r} must be a positive number")
        value = value["frames"]
    if isinstance(value, str):
        if value.lower().endswith(VIDEO_SUFFIXES) or value.startswith("data:video"):
            raise DataError(f"{where}: video {value[:80]} is a video file; decoding one needs av or decord (pip "
                            "install av), not installed here: give the video as a list of frame images")
        raise DataError(f"{where}: a video must be a list of frame images or {{\"frames\": [...], \"fps\": F}}")
    if not isinstance(value, list | tuple) or not value:
        raise DataError(f"{where}: a video must be a non-empty list of frame images, got {type(value).__name__}")
    frames = [load_image(f, f"{where}: frame {i}", base_dir) for i, f in enumerate(value)]
    if len({f.size for f in frames}) > 1:
        raise DataError(f"{where}: the video's frames differ in size ({', '.join(sorted({str(f.size) for f in frames}))})")
    return frames, float(fps)


def sample_indices(total: int, fps: float, *, target_fps: float, min_frames: int, max_frames: int,
                   factor: int) -> list[int]:
    """Indices of the frames to keep (may repeat the last frame of a clip shorter than ``factor``)."""
    lo = math.ceil(min_frames / factor) * factor
    hi = max(factor, math.floor(min(max_frames, total) / factor) * factor)
    wanted = total / fps * target_fps
    n = min(max(wanted, lo), hi, max(total, factor))
    n = max(factor, math.floor(n / factor) * factor)
    if total >= n:
        return np.linspace(0, total - 1, n).round().astype(int).tolist()
    return list(range(total)) + [total - 1] * (n - total)
