"""The typed slice of the multimodal data flags, with the seed's "default if not set" values resolved once.

``--multimodal-keys`` maps a modality to a record column (``{"image": "images"}``); the column holds one
media value or a list of them (relax/data/media.py). The token budgets and the resize factor shape every
image (relax/data/image_budget.py); ``--mm-processor-pool-size`` picks the pool that decodes them
(relax/data/mm_pool.py). ``--audio-sample-rate`` is the rate every clip is resampled to and its features are
computed at (relax/data/audio.py); ``--use-audio-in-video`` puts each video's sound track in with its frames.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from relax.utils.flag_slice import FlagSlice
from relax.utils.flag_types import ConfigError

MODALITIES = ("image", "video", "audio")
DEFAULT_IMAGE_MIN_TOKENS, DEFAULT_IMAGE_MAX_TOKENS = 4, 16384  # seed 000's "default if not set"
# seed 000's video defaults: tokens per frame, fps, frames, frame factor
VIDEO_DEFAULTS = {"video_min_token_num": 128, "video_max_token_num": 768, "video_fps": 2.0,
                  "video_fps_min_frames": 4, "video_fps_max_frames": 768, "frame_factor": 2}
DEFAULT_SAMPLE_RATE = 16000  # seed 000: --audio-sample-rate "Default is 16000 if not set"


@dataclass(frozen=True)
class MultimodalConfig(FlagSlice):
    multimodal_keys: dict[str, str] | None
    image_min_token_num: int | None
    image_max_token_num: int | None
    image_resize_scale_factor: int | None
    mm_processor_pool_size: int
    video_min_token_num: int | None = None
    video_max_token_num: int | None = None
    video_fps: float | None = None
    video_fps_min_frames: int | None = None
    video_fps_max_frames: int | None = None
    frame_factor: int | None = None
    audio_sample_rate: int | None = None
    use_audio_in_video: bool = False

    @property
    def sample_rate(self) -> int:
        """--audio-sample-rate, the seed's 16000 when not set."""
        return DEFAULT_SAMPLE_RATE if self.audio_sample_rate is None else self.audio_sample_rate

    def video(self, name: str) -> Any:
        """A video flag's value, the seed's default when not set."""
        value = getattr(self, name)
        return VIDEO_DEFAULTS[name] if value is None else value

    @property
    def enabled(self) -> bool:
        return bool(self.multimodal_keys)

    @property
    def min_tokens(self) -> int:
        return DEFAULT_IMAGE_MIN_TOKENS if self.image_min_token_num is None else self.image_min_token_num

    @property
    def max_tokens(self) -> int:
        return DEFAULT_IMAGE_MAX_TOKENS if self.image_max_token_num is None else self.image_max_token_num

    def validate(self) -> None:
        for problem in multimodal_problems(self):
            raise ConfigError(problem)


def multimodal_problems(cfg: Any) -> list[str]:
    """One line per bad multimodal flag value (``cfg``: the slice or the parsed namespace)."""
    problems = []
    keys = cfg.multimodal_keys
    if keys is not None:
        if not isinstance(keys, dict) or not all(isinstance(k, str) and isinstance(v, str) and v
                                                 for k, v in keys.items()):
            problems.append(f"--multimodal-keys {keys!r} must be a JSON object of modality -> column name, "
                            "e.g. '{\"image\": \"images\"}'")
        else:
            for modality in keys:
                if modality not in MODALITIES:
                    problems.append(f"--multimodal-keys: unknown modality {modality!r} (known: "
                                    f"{', '.join(MODALITIES)})")
    for flag, value in (("image-min-token-num", cfg.image_min_token_num),
                        ("image-max-token-num", cfg.image_max_token_num)):
        if value is not None and value < 1:
            problems.append(f"--{flag} {value} must be >= 1")
    lo = DEFAULT_IMAGE_MIN_TOKENS if cfg.image_min_token_num is None else cfg.image_min_token_num
    hi = DEFAULT_IMAGE_MAX_TOKENS if cfg.image_max_token_num is None else cfg.image_max_token_num
    if lo > hi:
        problems.append(f"--image-min-token-num {lo} exceeds --image-max-token-num {hi}")
    if cfg.image_resize_scale_factor is not None and cfg.image_resize_scale_factor < 0:
        problems.append(f"--image-resize-scale-factor {cfg.image_resize_scale_factor} must be >= 0 (0: no alignment)")
    video = {k: VIDEO_DEFAULTS[k] if getattr(cfg, k, None) is None else getattr(cfg, k) for k in VIDEO_DEFAULTS}
    for k in ("video_min_token_num", "video_max_token_num", "video_fps_min_frames", "video_fps_max_frames",
              "frame_factor"):
        if video[k] < 1:
            problems.append(f"--{k.replace('_', '-')} {video[k]} must be >= 1")
    if video["video_fps"] <= 0:
        problems.append(f"--video-fps {video['video_fps']} must be > 0")
    if video["video_min_token_num"] > video["video_max_token_num"]:
        problems.append(f"--video-min-token-num {video['video_min_token_num']} exceeds --video-max-token-num "
                        f"{video['video_max_token_num']}")
    if video["video_fps_min_frames"] > video["video_fps_max_frames"]:
        problems.append(f"--video-fps-min-frames {video['video_fps_min_frames']} exceeds --video-fps-max-frames "
                        f"{video['video_fps_max_frames']}")
    rate = cfg.audio_sample_rate
    if rate is not None and rate < 1000:
        problems.append(f"--audio-sample-rate {rate} must be >= 1000 Hz (the feature extractor's 400-sample window "
                        "and 160-sample hop are fixed)")
    if cfg.mm_processor_pool_size < 0:
        problems.append(f"--mm-processor-pool-size {cfg.mm_processor_pool_size} must be >= 0 (0: a thread pool)")
    return problems
