"""The typed slice of flags the rollout data source reads (relax/engine/rollout/data_source.py): which prompt
files, how each record becomes a prompt sample, and how prompts are served (groups, shuffling, the buffer).

`RolloutDataSourceWithBuffer` keeps Relax's constructor ``(args, tokenizer=None)``: ``--data-source-path`` lets a
user replace the class, and the driver builds every one the same way. It builds this slice from ``args`` at once
and reads nothing else; ``args`` rides along for the ``--buffer-filter-path`` hook, whose signature
``buffer_filter(args, rollout_id, buffer, num_samples)`` is Relax's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from relax.data.mm_config import MultimodalConfig
from relax.utils.flag_slice import FlagSlice, sub_slice


@dataclass(frozen=True)
class PromptDataConfig(FlagSlice):
    # the prompt files, and the tokenizer of --hf-checkpoint when the driver passes none
    prompt_data: str | None
    hf_checkpoint: str | None
    # how a record becomes a prompt sample
    input_key: str
    label_key: str | None
    metadata_key: str
    tool_key: str
    apply_chat_template: bool
    apply_chat_template_kwargs: dict[str, Any]
    system_prompt: str | None
    rollout_max_prompt_len: int | None
    custom_prompt_path: str | None
    # read lazily through a shuffle buffer (relax/data/streaming.py) rather than all at start
    use_streaming_dataset: bool
    streaming_buffer_size: int
    # with --multimodal-keys: the streaming prefetch cache (relax/data/prefetch.py)
    prefetch_chunk_size: int
    prefetch_max_cached: int
    prefetch_num_workers: int
    # how prompts are served: group size, seeded per-epoch shuffling, the recycle buffer's filter
    n_samples_per_prompt: int
    rollout_shuffle: bool
    rollout_seed: int
    buffer_filter_path: str | None
    # --multimodal-keys and the image flags (relax/data/mm_config.py)
    multimodal: MultimodalConfig = sub_slice(MultimodalConfig)
    args: Any = field(default=None, compare=False, repr=False)
