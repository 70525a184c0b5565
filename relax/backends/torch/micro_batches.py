"""How one optimizer step's samples are split into micro-batches (fixed size or by token budget).

A micro-batch is a contiguous row range (a ``slice``) of the rollout tensors, so old/ref
log-probs, advantages and the loss index the same rows with no re-packing between phases.

- Fixed: ``--micro-batch-size`` samples per micro-batch.
- Dynamic (``--use-dynamic-batch-size``): samples are taken in order and a micro-batch grows
  while its padded input, ``len(micro-batch) x longest sequence in it`` tokens (prompt +
  response; exactly the ``[b, L]`` tensor the forward runs on), stays within
  ``--max-tokens-per-gpu`` (``--log-probs-max-tokens-per-gpu`` for the no-grad log-prob
  passes). A single sample longer than the budget gets a micro-batch of its own rather than
  failing the run: rollout lengths are only known after generation.

Only the split changes: the loss reducers divide by the whole optimizer step's sample or
token count (``num_global_samples`` / ``num_global_tokens``), never by a micro-batch's, so the
summed gradient is the same whatever the split (up to float summation order).
"""

from __future__ import annotations

from collections.abc import Sequence


def fixed_micro_batches(start: int, stop: int, size: int) -> list[slice]:
    """``[start, stop)`` cut into runs of ``size`` rows (the last may be shorter)."""
    return [slice(i, min(i + size, stop)) for i in range(start, stop, size)]


def token_budget_micro_batches(lengths: Sequence[int], start: int, stop: int, max_tokens: int) -> list[slice]:
    """``[start, stop)`` cut greedily, in order, so each run's ``rows x max(lengths)`` <= ``max_tokens``.

    A row whose own length exceeds ``max_tokens`` forms a run of one.
    """
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    out: list[slice] = []
    first, longest = start, 0
    for i in range(start, stop):
        grown = max(longest, lengths[i])
        if i > first and (i - first + 1) * grown > max_tokens:
            out.append(slice(first, i))
            first, grown = i, lengths[i]
        longest = grown
    if stop > first:
        out.append(slice(first, stop))
    return out


def micro_batches(
    lengths: Sequence[int], start: int, stop: int, *, micro_batch_size: int, max_tokens: int | None
) -> list[slice]:
    """The micro-batches of rows ``[start, stop)``: by token budget when ``max_tokens`` is set, else fixed size."""
    if max_tokens is not None:
        return token_budget_micro_batches(lengths, start, stop, max_tokens)
    return fixed_micro_batches(start, stop, micro_batch_size)
