"""The lean runner's sampling step: unfiltered rows through one op that runs the Triton sampler on CUDA.

Why an op: compiled, `relax.backends.embedded.sampling.draw` without top-p/top-k is five inductor reductions, one
program per row each (28 us of a decode step at batch 64 on the H100); `relax.backends.embedded.triton_sample`
does the same draw in two kernels that spread each row's vocabulary over many programs. As a
``torch.library`` custom op, ``torch.compile`` keeps it one opaque call and a CUDA graph captures its kernels.
Its CPU (and fallback) implementation is `draw` itself, so on CPU the tokens are `draw`'s; on CUDA they are the
same draw up to the rounding of the sums (tests/test_triton_sample.py).
Filtered batches (some row with top-p/top-k) keep `draw`'s sort; ``RELAX_DECODE_SAMPLER=0`` in the engine's
environment sends unfiltered ones there too (an A/B).
"""

from __future__ import annotations

import os

import torch

from relax.backends.embedded.sampling import draw
from relax.utils.modules import optional_module


def reference_unfiltered(logits: torch.Tensor, temperature: torch.Tensor, seed: torch.Tensor,
                         counter: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`draw` without filters (each row's number from ``(seed, counter)``): what the kernels compute."""
    return draw(logits, temperature, torch.ones_like(temperature, dtype=torch.float32), torch.full_like(seed, -1),
                seed, counter, filtered=False)


@torch.library.custom_op("relax::draw_unfiltered", mutates_args=())
def draw_unfiltered(logits: torch.Tensor, temperature: torch.Tensor, seed: torch.Tensor,
                    counter: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """See the module docstring; this is the CPU (and fallback) implementation."""
    return reference_unfiltered(logits, temperature, seed, counter)


@draw_unfiltered.register_fake
def _(logits, temperature, seed, counter):
    rows = logits.shape[0]
    return logits.new_empty(rows, dtype=torch.int64), logits.new_empty(rows, dtype=torch.float32)


@draw_unfiltered.register_kernel("cuda")
def _(logits, temperature, seed, counter):
    kernels = optional_module("relax.backends.embedded.triton_sample", "the decode sampler runs torch's ops")
    if kernels is None or not kernels.supports(logits):
        return reference_unfiltered(logits, temperature, seed, counter)
    return kernels.sample_unfiltered(logits, temperature, seed, counter)


def draw_step(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor,
              seed: torch.Tensor, counter: torch.Tensor, filtered: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """`draw`'s signature: unfiltered CUDA batches through `draw_unfiltered`, everything else through `draw`."""
    if filtered or logits.device.type != "cuda" or os.environ.get("RELAX_DECODE_SAMPLER", "1") == "0":
        return draw(logits, temperature, top_p, top_k, seed, counter, filtered)
    return draw_unfiltered(logits, temperature, seed, counter)
