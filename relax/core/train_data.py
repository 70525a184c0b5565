"""Rollout samples -> what the trainer consumes, including reward post-processing.

``--custom-reward-post-process-path`` follows Relax's signature
``post_process(args, samples) -> (raw_rewards, rewards)``: the returned ``rewards`` replace GRPO
group normalization (the trainer then uses them as they are), ``raw_rewards`` feed the metrics.

``--custom-convert-samples-to-train-data-path`` replaces the whole conversion, as in Relax: it
gets the flat sample list and returns Relax's train-data dict (one entry per sample in each
column); its ``rewards`` are final like a post-process hook's.

With ``--use-opd --opd-type sglang`` the teacher server scores every sample first
(`relax.engine.rollout.opd_teacher`), so both paths see ``sample.teacher_log_probs``; a
convert hook that returns no ``teacher_log_probs`` column keeps the samples' own.
"""

from __future__ import annotations

from argparse import Namespace
from typing import Any

from relax.algorithms import extract_reward
from relax.backends.torch.batch import TrainSample
from relax.utils.plugins import PluginError, culprit, load_function, wrong_answer
from relax.utils.types import Sample

POST_PROCESS_SIGNATURE = "post_process(args, samples: list[Sample]) -> (raw_rewards, rewards)"
CONVERT_SIGNATURE = ("convert_samples_to_train_data(args, samples: list[Sample]) -> dict with tokens, response_lengths, "
                     "rewards, loss_masks (optional raw_reward, rollout_log_probs, teacher_log_probs)")
_CONVERT_FLAG = "--custom-convert-samples-to-train-data-path"
_REQUIRED = ("tokens", "response_lengths", "rewards", "loss_masks")
_OPTIONAL = ("raw_reward", "rollout_log_probs", "teacher_log_probs")


def to_train_samples(args: Namespace, groups: list[list[Sample]]) -> tuple[list[TrainSample], list[float]]:
    samples = [s for g in groups for s in g]
    if args.use_opd and args.opd_type == "sglang":  # the teacher scores the responses over HTTP
        from relax.engine.rollout.opd_teacher import attach_teacher_log_probs

        attach_teacher_log_probs(samples)
    if args.custom_convert_samples_to_train_data_path:
        return _custom_convert(args, samples)
    raw = [extract_reward(s.reward, args.reward_key) for s in samples]
    rewards = raw
    if args.custom_reward_post_process_path:
        fn = load_function(args.custom_reward_post_process_path, flag="--custom-reward-post-process-path",
                           signature=POST_PROCESS_SIGNATURE, min_args=2)
        path = args.custom_reward_post_process_path
        with culprit("--custom-reward-post-process-path", path):
            out = fn(args, samples)
        if not (isinstance(out, tuple | list) and len(out) == 2):
            raise wrong_answer(f"--custom-reward-post-process-path {path}", out, POST_PROCESS_SIGNATURE,
                               got=type(out).__name__)
        raw, rewards = out
        if len(raw) != len(samples) or len(rewards) != len(samples):
            raise PluginError(f"--custom-reward-post-process-path {path} returned {len(raw)} raw rewards and "
                              f"{len(rewards)} rewards for {len(samples)} samples")
    train = [
        TrainSample(tokens=list(s.tokens), response_length=s.response_length, loss_mask=list(s.effective_loss_mask()),
                    reward=float(r), rollout_log_probs=s.rollout_log_probs, teacher_log_probs=s.teacher_log_probs,
                    sample_id=_sample_id(s), routed_experts=s.rollout_routed_experts, vision=_vision(s))
        for s, r in zip(samples, rewards, strict=True)
    ]
    return train, [float(r) for r in raw]


def _custom_convert(args: Namespace, samples: list[Sample]) -> tuple[list[TrainSample], list[float]]:
    fn = load_function(args.custom_convert_samples_to_train_data_path, flag=_CONVERT_FLAG,
                       signature=CONVERT_SIGNATURE, min_args=2)
    with culprit(_CONVERT_FLAG, args.custom_convert_samples_to_train_data_path):
        data = fn(args, samples)
    if not isinstance(data, dict):
        raise wrong_answer(_CONVERT_FLAG, data, CONVERT_SIGNATURE, got=type(data).__name__)
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise PluginError(f"{_CONVERT_FLAG} returned a dict without {', '.join(missing)}; expected {CONVERT_SIGNATURE}")
    columns: dict[str, Any] = {k: data[k] for k in (*_REQUIRED, *_OPTIONAL) if data.get(k) is not None}
    for key, column in columns.items():
        if not isinstance(column, list | tuple) or len(column) != len(samples):
            size = len(column) if isinstance(column, list | tuple) else type(column).__name__
            raise PluginError(f"{_CONVERT_FLAG}: {key!r} has {size} entries for {len(samples)} samples")
    train = [
        TrainSample(tokens=list(columns["tokens"][i]), response_length=int(columns["response_lengths"][i]),
                    loss_mask=list(columns["loss_masks"][i]), reward=float(columns["rewards"][i]),
                    rollout_log_probs=columns["rollout_log_probs"][i] if "rollout_log_probs" in columns else None,
                    teacher_log_probs=(columns["teacher_log_probs"][i] if "teacher_log_probs" in columns
                                       else samples[i].teacher_log_probs),
                    sample_id=_sample_id(samples[i]), routed_experts=samples[i].rollout_routed_experts,
                    vision=_vision(samples[i]))
        for i in range(len(samples))
    ]
    raw = columns.get("raw_reward", columns["rewards"])
    return train, [float(extract_reward(r, args.reward_key)) for r in raw]


def _vision(sample: Sample) -> dict[str, Any] | None:
    """What the trainer feeds a multimodal model of a sample's images, videos and audio (relax/data/multimodal.py),
    or None."""
    mm = sample.multimodal_inputs
    if not isinstance(mm, dict) or mm.get("pixel_values") is None:
        return None
    keys = ("pixel_values", "image_grid_thw", "pixel_values_videos", "video_grid_thw", "second_per_grid_ts",
            "input_features", "audio_feature_lengths", "use_audio_in_video")
    return {k: mm[k] for k in keys if mm.get(k) is not None}


def _sample_id(sample: Sample) -> tuple[int, int] | None:
    """``(group_index, index)``: what samples.jsonl names a sample by (None when a custom rollout left them unset)."""
    if sample.group_index is None or sample.index is None:
        return None
    return (int(sample.group_index), int(sample.index))
