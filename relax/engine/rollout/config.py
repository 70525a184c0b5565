"""The typed slice of flags a training rollout reads: how many groups a step draws, how they are sampled, the
user hooks that shape them, and partial rollout.

The default rollout (relax/engine/rollout/sglang_rollout.py), partial rollout and `GenerateState` read only
these fields. Defaults live in the flag schema (relax/utils/flag_table.py) and the cross-flag checks in
relax/utils/validation.py; this class reads every field strictly (relax/utils/flag_slice.py). It carries
``args`` because the hooks it calls keep the seeds' signatures: ``generate(args, sample, sampling_params)``
(seed 001) and the dynamic-sampling filter ``filter(args, samples, **kwargs)`` (seed 000).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from relax.utils.flag_slice import FlagSlice


@dataclass(frozen=True)
class RolloutConfig(FlagSlice):
    # what one step draws: groups, samples per group, and the seed each sample's sampling seed derives from
    rollout_batch_size: int
    over_sampling_batch_size: int | None
    n_samples_per_prompt: int
    rollout_seed: int
    # sampling: the /generate sampling params of every training request
    rollout_temperature: float
    rollout_top_p: float
    rollout_top_k: int
    rollout_max_response_len: int
    rollout_stop: list[str] | None
    rollout_stop_token_ids: list[int] | None
    rollout_skip_special_tokens: bool
    # user hooks, and each call's bound
    custom_generate_function_path: str | None
    dynamic_sampling_filter_path: str | None
    hook_timeout: float
    # partial rollout
    partial_rollout: bool
    partial_rollout_max_aborted_count: int | None
    mask_offpolicy_in_partial_rollout: bool
    # --use-rollout-routing-replay: requests ask for the engines' MoE routing (return_routed_experts)
    use_rollout_routing_replay: bool
    # --use-slime-router: requests carry the prompt text, and the engine's prompt token ids come back
    # (relax/engine/rollout/prompt_input.py)
    use_slime_router: bool
    # the tokenizer's checkpoint, and the reward key samples.jsonl records
    hf_checkpoint: str
    reward_key: str | None
    args: Any = field(default=None, compare=False, repr=False)

    @property
    def draw_size(self) -> int:
        """Groups drawn per round: ``--over-sampling-batch-size``, else ``--rollout-batch-size``."""
        return self.over_sampling_batch_size or self.rollout_batch_size

    def sampling_params(self) -> dict[str, Any]:
        """The rollout's /generate sampling params (each request adds its ``sampling_seed``)."""
        return {
            "temperature": self.rollout_temperature,
            "top_p": self.rollout_top_p,
            "top_k": self.rollout_top_k,
            "max_new_tokens": self.rollout_max_response_len,
            "stop": self.rollout_stop,
            "stop_token_ids": self.rollout_stop_token_ids,
            "skip_special_tokens": self.rollout_skip_special_tokens,
        }

    def validate(self) -> None:
        if self.rollout_batch_size < 1:
            raise ValueError(f"--rollout-batch-size must be >= 1, got {self.rollout_batch_size}")
        if self.partial_rollout_max_aborted_count is not None and self.partial_rollout_max_aborted_count < 0:
            raise ValueError(f"--partial-rollout-max-aborted-count must be >= 0, got "
                             f"{self.partial_rollout_max_aborted_count}")
