"""Micro-batches through megatron-core's schedules (`get_forward_backward_func`), and the pipeline's results.

The RL step (relax/backends/torch/backend.py) cuts each optimizer step into micro-batches (fixed
``--micro-batch-size`` or by token budget) and deals them round-robin to the data-parallel ranks.
`StageRunner.run` hands one rank's micro-batches to megatron-core's schedule: without pipeline
parallelism that is ``forward_backward_no_pipelining`` (forward, loss, backward per micro-batch, the
order the one-GPU backend ran them in), with it the 1F1B schedule, every stage running the same
micro-batches in the same order and exchanging activations (and their shapes: micro-batches differ in
length). The loss function runs on the last stage only; it returns ``(loss, reduced)`` and the
schedule backpropagates ``loss`` unchanged (``calculate_per_token_loss``: relax's losses are already
normalised over the whole optimizer step). `from_last_stage` then gives every stage the last stage's
results (log-probs, metrics).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from relax.backends.megatron.logprobs import gpt_forward
from relax.backends.torch.batch import ModelInputs
from relax.observability.collective_memory import checked

LossFn = Callable[[slice, ModelInputs, torch.Tensor], tuple[torch.Tensor, Any]]
Around = Callable[[slice, ModelInputs], AbstractContextManager]


@dataclass
class StageRunner:
    """This rank's pipeline stage: runs micro-batches through megatron's schedule and shares the last stage's results."""

    seq_multiple: int  # sequence padding: the TP size with --sequence-parallel, else 1
    pad_id: int
    device: torch.device

    @property
    def is_last_stage(self) -> bool:
        from megatron.core import parallel_state as ps

        return ps.is_pipeline_last_stage()

    def run(self, model, micro_batches: list[tuple[slice, ModelInputs]], loss_fn: LossFn, *,
            forward_only: bool, around: Around | None = None) -> list[Any]:
        """``loss_fn(rows, inputs, logits) -> (loss, reduced)`` per micro-batch; the ``reduced`` values on the
        last stage, in order (an empty list on the other stages, and when this rank has no micro-batch).
        ``around(rows, inputs)``: a context entered for this stage's forward of each micro-batch (routing replay,
        relax/backends/megatron/routing_replay.py)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        if not micro_batches:
            return []
        zero_tokens = torch.zeros((), dtype=torch.int, device=self.device)

        def forward_step(data_iterator, stage_model):
            rows, inputs = next(data_iterator)
            with around(rows, inputs) if around is not None else nullcontext():
                output = gpt_forward(stage_model, inputs, seq_multiple=self.seq_multiple, pad_id=self.pad_id)

            def loss(logits: torch.Tensor):
                value, reduced = loss_fn(rows, inputs, logits)
                return value, zero_tokens, reduced  # (loss, tokens, reduced): backpropagated undivided

            return output, loss

        longest = max(inputs.input_ids.shape[1] for _, inputs in micro_batches)
        return get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(micro_batches), model=[model],
            num_microbatches=len(micro_batches), seq_length=longest + (-longest % self.seq_multiple),
            micro_batch_size=max(inputs.input_ids.shape[0] for _, inputs in micro_batches),
            forward_only=forward_only)

    def from_last_stage(self, tensor: torch.Tensor) -> torch.Tensor:
        """The last pipeline stage's ``tensor`` on every stage (in place; one stage: unchanged)."""
        from megatron.core import parallel_state as ps

        if ps.get_pipeline_model_parallel_world_size() == 1:
            return tensor
        on_device = tensor.to(self.device)
        with checked("broadcast(last pipeline stage)"):
            dist.broadcast(on_device, src=ps.get_pipeline_model_parallel_last_rank(),
                           group=ps.get_pipeline_model_parallel_group())
        tensor.copy_(on_device)
        return tensor

    def object_from_last_stage(self, obj: Any) -> Any:
        """The last pipeline stage's picklable ``obj`` (metrics) on every stage."""
        from megatron.core import parallel_state as ps

        if ps.get_pipeline_model_parallel_world_size() == 1:
            return obj
        holder = [obj]
        with checked("broadcast_object_list(last pipeline stage)"):
            dist.broadcast_object_list(holder, src=ps.get_pipeline_model_parallel_last_rank(),
                                       group=ps.get_pipeline_model_parallel_group())
        return holder[0]
