"""Rollout data source: epochs over the prompt dataset, seeded shuffling, a recycle buffer.

`RolloutDataSourceWithBuffer` is the default of ``--data-source-path`` (its dotted path is
public). It walks the prompts in order, reshuffling each epoch with a generator seeded by
``--rollout-seed + epoch`` when ``--rollout-shuffle`` is on, and hands out groups of
``--n-samples-per-prompt`` deep copies of a prompt sample. Groups given back with
`add_samples` (partial rollout, over-sampling leftovers) are served first: oldest first, or the
ones ``--buffer-filter-path`` selects (Relax's call shape, ``rollout_id`` is None as in Relax).

With ``--use-streaming-dataset`` the prompts are not held: records are read as they are drawn, through a
seeded shuffle buffer of ``--streaming-buffer-size`` records (relax/data/streaming.py), and each becomes a sample
the same way (template, ``--custom-prompt-path``, the ``--rollout-max-prompt-len`` filter) when it is drawn.

Its whole position (epoch, offset, counters, buffer; a streaming source's file cursor, shuffle buffer and
generator state) is in `state_dict`, as plain data, so a resumed run serves exactly the prompts the straight run
would have served.
"""

from __future__ import annotations

import math
from argparse import Namespace
from typing import Any

import numpy as np

from relax.data.dataset import DataError, prompt_files, read_records
from relax.data.prefetch import PrefetchBuffer
from relax.data.prompts import CUSTOM_PROMPT_SIGNATURE, SampleBuilder
from relax.data.streaming import StreamingRecords
from relax.engine.rollout.data_config import PromptDataConfig
from relax.utils.plugins import PluginError, load_function
from relax.utils.types import Sample

STATE_VERSION = 1
BUFFER_FILTER_SIGNATURE = "buffer_filter(args, rollout_id, buffer: list[list[Sample]], num_samples: int) -> list[list[Sample]]"


class RolloutDataSourceWithBuffer:
    """Reads ``--prompt-data`` once; ``tokenizer`` defaults to the ``--hf-checkpoint`` one. What it reads of the
    flags is its `PromptDataConfig` slice (``self.config``)."""

    # seed hook: seed 000's --data-source-path names this class; the driver builds any such class from args
    def __init__(self, args: Namespace, tokenizer: Any = None):
        cfg = self.config = PromptDataConfig.from_args(args)
        if not cfg.prompt_data:
            raise DataError("--prompt-data is required")
        if tokenizer is None:
            from relax.models import load_tokenizer

            tokenizer = load_tokenizer(cfg.hf_checkpoint)
        prompt_fn = None
        if cfg.custom_prompt_path:
            prompt_fn = load_function(cfg.custom_prompt_path, flag="--custom-prompt-path",
                                      signature=CUSTOM_PROMPT_SIGNATURE, min_args=2)
        self.builder = SampleBuilder(
            tokenizer, input_key=cfg.input_key, label_key=cfg.label_key, metadata_key=cfg.metadata_key,
            apply_chat_template=cfg.apply_chat_template, apply_chat_template_kwargs=cfg.apply_chat_template_kwargs,
            system_prompt=cfg.system_prompt, tool_key=cfg.tool_key, max_prompt_len=cfg.rollout_max_prompt_len,
            prompt_fn=prompt_fn, prompt_fn_path=cfg.custom_prompt_path or "<prompt_fn>",
            media=_media_rows(cfg),
        )
        self.num_records, self.num_filtered, self.prompts = 0, 0, []
        self.stream: StreamingRecords | None = None
        self.prefetch: PrefetchBuffer | None = None
        if cfg.use_streaming_dataset:  # records are read as they are drawn (relax/data/streaming.py)
            self.stream = StreamingRecords(
                prompt_files(cfg.prompt_data), required_keys=[cfg.input_key], buffer_size=cfg.streaming_buffer_size,
                shuffle=cfg.rollout_shuffle, seed=cfg.rollout_seed)
            self.num_records = self.stream.num_records
            if self.builder.media is not None and cfg.prefetch_max_cached > 0:  # media decoded ahead (prefetch.py)
                self.prefetch = PrefetchBuffer(self.stream, self.builder.media, chunk_size=cfg.prefetch_chunk_size,
                                               max_cached=cfg.prefetch_max_cached,
                                               num_workers=cfg.prefetch_num_workers)
        else:
            for path in prompt_files(cfg.prompt_data):  # one file, or several read in order (seed 004)
                records = read_records(path, required_keys=[cfg.input_key])
                prompts, filtered = self.builder.build_all(records, path=path, first_index=self.num_records)
                self.prompts += prompts
                self.num_records += len(records)
                self.num_filtered += filtered
        if not (self.prompts or self.stream and self.num_records):
            raise DataError(
                f"{cfg.prompt_data}: no prompts left (empty file, or all longer than --rollout-max-prompt-len)"
            )
        self.n_samples = cfg.n_samples_per_prompt
        self.shuffle = cfg.rollout_shuffle
        self.seed = cfg.rollout_seed
        self.epoch = 0
        self.offset = 0  # position in this epoch's order
        self.sample_counter = 0  # next Sample.index
        self.buffer: list[list[Sample]] = []
        self._order = self._epoch_order(0) if self.stream is None else []
        self.args = args  # what the --buffer-filter-path hook gets (Relax's signature)
        self.buffer_filter = None
        if cfg.buffer_filter_path:
            self.buffer_filter = load_function(cfg.buffer_filter_path, flag="--buffer-filter-path",
                                               signature=BUFFER_FILTER_SIGNATURE, min_args=4)

    def __len__(self) -> int:
        """Prompts in an epoch; a streaming source counts records (it cannot know the too-long ones in advance)."""
        return self.num_records if self.stream is not None else len(self.prompts)

    def _epoch_order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.prompts)))
        return np.random.default_rng(self.seed + epoch).permutation(len(self.prompts)).tolist()

    def _next_prompt(self) -> tuple[int, Sample]:
        if self.stream is not None:
            return self._next_streamed()
        if self.offset >= len(self._order):
            self.epoch += 1
            self.offset = 0
            self._order = self._epoch_order(self.epoch)
        prompt = self.prompts[self._order[self.offset]]
        self.offset += 1
        # unique per (epoch, record); the record index survives --rollout-max-prompt-len filtering
        return self.epoch * self.num_records + prompt.group_index, prompt

    def _next_streamed(self) -> tuple[int, Sample]:
        for _ in range(self.num_records):  # a whole epoch of too-long records serves nothing
            drawn, prepared = self.prefetch.next() if self.prefetch is not None else (self.stream.next(), None)
            prompt = self.builder.build(drawn.record, drawn.index, drawn.where, prepared)
            if prompt is not None:
                self.epoch = drawn.epoch
                return drawn.epoch * self.num_records + drawn.index, prompt
            self.num_filtered += 1
        raise DataError(f"{self.config.prompt_data}: no prompts left (all longer than --rollout-max-prompt-len)")

    def _new_group(self) -> list[Sample]:
        group_index, prompt = self._next_prompt()
        group = []
        for _ in range(self.n_samples):
            s = prompt.copy()
            s.group_index = group_index
            s.index = self.sample_counter
            self.sample_counter += 1
            group.append(s)
        return group

    def get_samples(self, num_groups: int) -> list[list[Sample]]:
        """``num_groups`` groups: buffered ones first (oldest first, or as the buffer filter picks), then fresh prompts."""
        groups = self._take_from_buffer(num_groups)
        while len(groups) < num_groups:
            groups.append(self._new_group())
        return groups

    def _take_from_buffer(self, num_groups: int) -> list[list[Sample]]:
        if self.buffer_filter is None or not self.buffer:
            groups, self.buffer = self.buffer[:num_groups], self.buffer[num_groups:]
            return groups
        # the filter gets a copy: Relax filters that pop from the list they get work, and a group
        # leaves the buffer only when it is returned, so none is lost or served twice
        taken = self.buffer_filter(self.args, None, list(self.buffer), num_groups)
        buffered = {id(g) for g in self.buffer}
        if not isinstance(taken, list) or not all(isinstance(g, list) and id(g) in buffered for g in taken):
            raise PluginError(f"--buffer-filter-path must return groups taken from the buffer it was given; "
                              f"expected {BUFFER_FILTER_SIGNATURE}")
        if len(taken) > num_groups or len({id(g) for g in taken}) < len(taken):
            raise PluginError(f"--buffer-filter-path returned {len(taken)} groups (duplicates or more than the "
                              f"{num_groups} asked for); expected {BUFFER_FILTER_SIGNATURE}")
        chosen = {id(g) for g in taken}
        self.buffer = [g for g in self.buffer if id(g) not in chosen]
        return taken

    def add_samples(self, groups: list[list[Sample]]) -> None:
        """Give groups back; the next `get_samples` calls serve them before new prompts."""
        for group in groups:
            if not isinstance(group, list):
                raise TypeError(f"add_samples takes a list of groups (list[list[Sample]]), got {type(group).__name__}")
        self.buffer.extend(groups)

    def get_buffer_length(self) -> int:
        return len(self.buffer)

    def num_rollout_for_epochs(self, num_epoch: int, rollout_batch_size: int) -> int:
        """Rollout steps that cover ``num_epoch`` passes over the prompts (the last step may cross an epoch)."""
        return max(1, math.ceil(num_epoch * len(self) / rollout_batch_size))

    def state_dict(self) -> dict[str, Any]:
        """Plain data (ints, lists, dicts): picklable and JSON-serializable. A streaming source's position is its
        stream's: the file cursor, the shuffle buffer's records, the generator state and the epoch."""
        state = {
            "version": STATE_VERSION,
            "num_prompts": len(self),
            "epoch": self.epoch,
            "offset": self.offset,
            "sample_counter": self.sample_counter,
            "buffer": [[s.to_dict() for s in group] for group in self.buffer],
        }
        if self.prefetch is not None:  # the consumer's position, not the prefetch thread's
            state["stream"] = self.prefetch.state_dict()
        elif self.stream is not None:
            state["stream"] = self.stream.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("num_prompts", len(self)) != len(self):
            raise DataError(
                f"resume: the data source state was saved for {state['num_prompts']} prompts but "
                f"--prompt-data now has {len(self)}"
            )
        if ("stream" in state) != (self.stream is not None):
            saved = "with" if "stream" in state else "without"
            raise DataError(f"resume: the data source state was saved {saved} --use-streaming-dataset; "
                            f"resume with the same setting")
        self.epoch, self.offset = state["epoch"], state["offset"]
        self.sample_counter = state["sample_counter"]
        self.buffer = [[s if isinstance(s, Sample) else Sample.from_dict(s) for s in group]
                       for group in state["buffer"]]
        if self.stream is not None:
            # a prefetching run saves {stream, skip} (relax/data/prefetch.py); either form resumes either way
            saved = state["stream"] if "skip" in state["stream"] else {"stream": state["stream"], "skip": 0}
            if self.prefetch is not None:
                self.prefetch.load_state_dict(saved)
            else:
                self.stream.load_state_dict(saved["stream"])
                for _ in range(saved["skip"]):
                    self.stream.next()
        else:
            self._order = self._epoch_order(self.epoch)


def _media_rows(cfg: PromptDataConfig) -> Any:
    """The image preparer of ``--multimodal-keys`` (relax/data/multimodal.py), None without the flag."""
    if not cfg.multimodal.enabled:
        return None
    from relax.data.multimodal import MultimodalRows
    from relax.models import resolve_checkpoint
    from relax.models.vision import is_vision_config

    model_config = resolve_checkpoint(cfg.hf_checkpoint).config
    if not is_vision_config(model_config):
        raise DataError(f"--multimodal-keys needs a vision-language --hf-checkpoint; {cfg.hf_checkpoint} has no "
                        "vision tower (e.g. --hf-checkpoint tiny-qwen2.5-vl)")
    return MultimodalRows(cfg.multimodal, model_config)
