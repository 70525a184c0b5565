"""What real SGLang 0.5.14 can serve of a vision-language run, checked at flag parsing (relax/utils/validation.py).

Beside the launcher because it is a fact about the SGLang version relax pins (server_args.json), not about relax:
it changes when that version does.
"""

from __future__ import annotations

from typing import Any

SGLANG_PATCH_VALUES = 1176  # 3 x 2 x 14 x 14: the patch row width SGLang 0.5.14's Qwen2.5-VL runs its vision tower on


def sglang_vision_problems(keys: dict | None, config: Any, checkpoint: str) -> list[str]:
    """What real SGLang 0.5.14 cannot serve of a vision-language run. Its Qwen2.5-VL ``get_image_feature`` takes a
    patch row of any other width than 1176 values for a precomputed embedding and skips the vision tower, silently;
    only images were run against it (a video's pad tokens are sent expanded, which its processor would take for
    one video each)."""
    out = []
    vision = getattr(config, "vision_config", None)
    if vision is not None:
        width = (getattr(vision, "in_channels", getattr(vision, "in_chans", 3)) * getattr(vision, "temporal_patch_size", 2)
                 * getattr(vision, "patch_size", 14) ** 2)
        if width != SGLANG_PATCH_VALUES:
            out.append(f"--rollout-backend sglang cannot serve {checkpoint}: its patches hold {width} values and SGLang "
                       f"0.5.14 runs the vision tower only on {SGLANG_PATCH_VALUES} (14-pixel patches; e.g. "
                       "--hf-checkpoint tiny-qwen2.5-vl-p14)")
    other = sorted(set(keys or {}) - {"image"})
    if other:
        out.append(f"not supported yet: --multimodal-keys {', '.join(other)} with --rollout-backend sglang (only "
                   "images have run against SGLang)")
    return out
