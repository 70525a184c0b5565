"""Rollout samples -> what the trainer consumes, including reward post-processing.

``--custom-reward-post-process-path`` follows Relax's signature
``post_process(args, samples) -> (raw_rewards, rewards)``: the returned ``rewards`` replace GRPO
group normalization (the trainer then uses them as they are), ``raw_rewards`` feed the metrics.
"""

from __future__ import annotations

from argparse import Namespace

from relax.algorithms import extract_reward
from relax.backends.torch.batch import TrainSample
from relax.utils.plugins import load_function
from relax.utils.types import Sample

POST_PROCESS_SIGNATURE = "post_process(args, samples: list[Sample]) -> (raw_rewards, rewards)"


def to_train_samples(args: Namespace, groups: list[list[Sample]]) -> tuple[list[TrainSample], list[float]]:
    samples = [s for g in groups for s in g]
    raw = [extract_reward(s.reward, args.reward_key) for s in samples]
    rewards = raw
    if args.custom_reward_post_process_path:
        fn = load_function(args.custom_reward_post_process_path, flag="--custom-reward-post-process-path",
                           signature=POST_PROCESS_SIGNATURE, min_args=2)
        raw, rewards = fn(args, samples)
        if len(rewards) != len(samples):
            raise ValueError(f"--custom-reward-post-process-path returned {len(rewards)} rewards for {len(samples)} samples")
    train = [
        TrainSample(tokens=list(s.tokens), response_length=s.response_length, loss_mask=list(s.effective_loss_mask()),
                    reward=float(r), rollout_log_probs=s.rollout_log_probs, teacher_log_probs=s.teacher_log_probs)
        for s, r in zip(samples, rewards, strict=True)
    ]
    return train, [float(r) for r in raw]
