"""The typed slice of flags evaluation reads (relax/engine/rollout/evaluation.py): when to evaluate, which sets,
how their prompts are built and sampled, and what is logged.

Built once by the driver (relax/core/setup.py) with ``EvalConfig.from_args(args)``
(relax/utils/flag_slice.py); defaults live in the flag schema. An unset eval sampling flag falls back to its
rollout flag, which the rollout's own slice carries (`eval_sampling_params` takes both).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from relax.data.mm_config import MultimodalConfig
from relax.utils.flag_slice import FlagSlice, sub_slice


@dataclass(frozen=True)
class EvalConfig(FlagSlice):
    # when: every --eval-interval steps, step 0 too unless skipped
    eval_interval: int | None
    skip_eval_before_train: bool
    # the sets (NAME PATH pairs) and how their prompts are built; an unset eval key falls back to the dataset's
    eval_prompt_data: list[str] | None
    eval_config: str | None  # a file of sets with their own keys and sampling (eval_file.py); replaces the pairs
    eval_input_key: str | None
    eval_label_key: str | None
    label_key: str | None
    eval_tool_key: str | None
    tool_key: str | None
    metadata_key: str
    apply_chat_template: bool
    apply_chat_template_kwargs: dict[str, Any]
    system_prompt: str | None
    eval_max_prompt_len: int | None
    # media columns, as the training data's (--multimodal-keys; relax/data/multimodal.py)
    hf_checkpoint: str | None
    multimodal: MultimodalConfig = sub_slice(MultimodalConfig)
    # sampling: None falls back to the rollout's flag
    eval_temperature: float | None
    eval_top_p: float | None
    eval_top_k: int | None
    eval_max_response_len: int | None
    eval_min_new_tokens: int | None  # SGLang's min_new_tokens (the sglang backend; the embedded engine lacks it)
    eval_max_context_len: int | None  # prompt + response cap per request (resolved from --rollout-max-context-len)
    n_samples_per_eval_prompt: int
    # scoring and logging
    eval_reward_key: str | None
    log_passrate: bool

    def due(self, step: int) -> bool:
        """Whether the step ``step`` starts with an evaluation."""
        if not self.eval_interval:
            return False
        if step == 0 and self.skip_eval_before_train:
            return False
        return step % self.eval_interval == 0

    def validate(self) -> None:
        if self.n_samples_per_eval_prompt < 1:
            raise ValueError(f"--n-samples-per-eval-prompt must be >= 1, got {self.n_samples_per_eval_prompt}")
