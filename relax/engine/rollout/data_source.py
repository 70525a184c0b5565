"""Rollout data source: epochs over the prompt dataset, seeded shuffling, a recycle buffer.

`RolloutDataSourceWithBuffer` is the default of ``--data-source-path`` (its dotted path is
public). Its whole position (epoch, offset, counters, buffer) is in `state_dict`, so a
resumed run serves exactly the prompts the straight run would have served.
"""

from __future__ import annotations

import copy
import math
from argparse import Namespace
from typing import Any

import numpy as np

from relax.data.dataset import DataError, read_records
from relax.data.prompts import build_samples
from relax.utils.types import Sample


class RolloutDataSourceWithBuffer:
    def __init__(self, args: Namespace, tokenizer: Any = None):
        if tokenizer is None:
            from relax.models import load_tokenizer

            tokenizer = load_tokenizer(args.hf_checkpoint)
        if not args.prompt_data:
            raise DataError("--prompt-data is required")
        records = read_records(args.prompt_data)
        self.prompts, self.num_filtered = build_samples(
            records, tokenizer, path=args.prompt_data, input_key=args.input_key, label_key=args.label_key,
            metadata_key=args.metadata_key, apply_chat_template=args.apply_chat_template,
            apply_chat_template_kwargs=args.apply_chat_template_kwargs, system_prompt=args.system_prompt,
            tool_key=args.tool_key, max_prompt_len=args.rollout_max_prompt_len,
        )
        if not self.prompts:
            raise DataError(f"{args.prompt_data}: no prompts left (empty file, or all longer than --rollout-max-prompt-len)")
        self.n_samples = args.n_samples_per_prompt
        self.shuffle = args.rollout_shuffle
        self.seed = args.rollout_seed
        self.epoch = 0
        self.offset = 0
        self.sample_counter = 0
        self.buffer: list[list[Sample]] = []
        self._order = self._epoch_order(0)

    def __len__(self) -> int:
        return len(self.prompts)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = np.arange(len(self.prompts))
        if self.shuffle:
            np.random.default_rng(self.seed + epoch).shuffle(order)
        return order.tolist()

    def _next_prompt(self) -> tuple[int, Sample]:
        if self.offset >= len(self._order):
            self.epoch += 1
            self.offset = 0
            self._order = self._epoch_order(self.epoch)
        idx = self._order[self.offset]
        self.offset += 1
        return self.epoch * len(self.prompts) + idx, self.prompts[idx]

    def get_samples(self, num_groups: int) -> list[list[Sample]]:
        groups = self.buffer[:num_groups]
        self.buffer = self.buffer[num_groups:]
        while len(groups) < num_groups:
            group_index, prompt = self._next_prompt()
            group = []
            for _ in range(self.n_samples):
                s = copy.deepcopy(prompt)
                s.group_index = group_index
                s.index = self.sample_counter
                self.sample_counter += 1
                group.append(s)
            groups.append(group)
        return groups

    def add_samples(self, groups: list[list[Sample]]) -> None:
        self.buffer.extend(groups)

    def num_rollout_for_epochs(self, num_epoch: int, rollout_batch_size: int) -> int:
        return max(1, math.ceil(num_epoch * len(self.prompts) / rollout_batch_size))

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "offset": self.offset, "sample_counter": self.sample_counter,
                "buffer": copy.deepcopy(self.buffer)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.epoch, self.offset = state["epoch"], state["offset"]
        self.sample_counter = state["sample_counter"]
        self.buffer = copy.deepcopy(state["buffer"])
        self._order = self._epoch_order(self.epoch)
