"""Per-row decode state of the running batch, in preallocated device buffers.

Row ``i`` of every buffer belongs to the engine's ``i``-th running request. Keeping the pending
token, the sampling parameters, the token counter (which indexes the request's random stream)
and the cache position on the device, at fixed addresses, is what lets a runner sample inside
a captured CUDA graph: a decode step reads and writes these buffers in place and the host only
fetches the sampled tokens and log-probs. Rows past ``rows`` are kept at zero so padded rows of
a graph bucket stay harmless (position 0, greedy, ``active`` 0).

A decode step's device bookkeeping (the token counter and cache position of every active row move
on by one; the sampled tokens and log-probs land side by side in ``staged``, float64, the layout the
host reads) happens in the step itself (``sample(..., decoded=True)``), so a runner that captures the
step as a CUDA graph captures it too: between two graph replays the host then queues only the copy of
``staged`` to pinned memory (outside the graph, the same work was five more kernels and a copy per step,
each launched by the host). Padded rows have ``active`` 0, so a bucket's spare rows never move.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from relax.backends.embedded.sampling import SamplingParams, draw


class RowState:
    """Device buffers of capacity ``slots`` plus host mirrors of what the host must know."""

    def __init__(self, slots: int, device: torch.device):
        self.slots, self.device = slots, device
        zeros = lambda dtype: torch.zeros(slots, dtype=dtype, device=device)  # noqa: E731
        self.tokens = zeros(torch.long)      # pending token: sampled, not yet in the KV cache
        self.positions = zeros(torch.long)   # tokens already in the KV cache
        self.counter = zeros(torch.long)     # the sampled token's position in the sequence (random-stream index)
        self.seed = zeros(torch.long)
        self.temperature = zeros(torch.float32)
        self.top_p = zeros(torch.float32)
        self.top_k = zeros(torch.long)
        self.logprobs = zeros(torch.float32)
        self.active = zeros(torch.long)      # 1 for the running rows, 0 past them (a graph's padded rows)
        self.staged = torch.zeros(slots, 2, dtype=torch.float64, device=device)  # [token, log-prob] per row
        self.lengths: list[int] = []         # host mirror of ``positions``
        self._filters: list[bool] = []       # host: does the row use top-p/top-k?

    @property
    def rows(self) -> int:
        return len(self.lengths)

    @property
    def filtered(self) -> bool:
        return any(self._filters)

    def _buffers(self) -> tuple[torch.Tensor, ...]:
        return (self.tokens, self.positions, self.counter, self.seed, self.temperature, self.top_p, self.top_k,
                self.logprobs, self.active, self.staged)

    def clear(self) -> None:
        for buf in self._buffers():
            buf.zero_()
        self.lengths, self._filters = [], []

    def append(self, params: list[SamplingParams], seeds: list[int], counters: list[int],
               lengths: list[int]) -> slice:
        """Add rows at the end (after a prefill of ``lengths`` tokens each); return their slice."""
        start, n = self.rows, len(params)
        if start + n > self.slots:
            raise RuntimeError(f"no free row ({self.slots} slots)")
        rows = slice(start, start + n)
        host = {
            self.positions: lengths, self.counter: counters, self.seed: seeds,
            self.temperature: [p.temperature for p in params], self.top_p: [p.top_p for p in params],
            self.top_k: [p.top_k for p in params], self.active: [1] * n,
        }
        for buf, values in host.items():
            buf[rows].copy_(torch.tensor(values, dtype=buf.dtype), non_blocking=True)
        self.lengths += list(lengths)
        self._filters += [p.top_p < 1 or p.top_k > 0 for p in params]
        return rows

    def sample(self, logits: torch.Tensor, rows: slice, filtered: bool | None = None,
               sampler: Callable[..., tuple[torch.Tensor, torch.Tensor]] = draw, *, decoded: bool = False,
               store: Callable[..., None] | None = None) -> torch.Tensor:
        """Sample rows ``rows`` from ``logits`` in place: pending tokens, log-probs and ``staged``; returns the tokens.

        ``decoded``: the logits are a decode step's (the pending tokens entered the cache), so the active rows'
        counters and positions move on by one here too (`store_decoded`). ``sampler`` is `draw` or a compiled
        copy of it, ``store`` `store_sample` / `store_decoded` or a compiled copy (the lean runner's ``compile``)."""
        tokens, logprobs = sampler(logits, self.temperature[rows], self.top_p[rows], self.top_k[rows],
                                   self.seed[rows], self.counter[rows],
                                   self.filtered if filtered is None else filtered)
        kept = (self.tokens[rows], self.logprobs[rows], self.staged[rows])
        if decoded:
            (store or store_decoded)(tokens, logprobs, *kept, self.active[rows], self.counter[rows],
                                     self.positions[rows])
        else:
            (store or store_sample)(tokens, logprobs, *kept)
        return tokens

    def fetch(self, rows: slice) -> Fetch:
        """Start copying the tokens and log-probs of ``rows`` to the host; ``.result()`` waits for them.

        On CUDA the copy goes to pinned memory behind an event (PyTorch's caching host allocator
        recycles the buffers), so the host can launch the next decode step before it waits for
        this one (the engine's overlap mode).
        """
        return Fetch(self, rows)

    def advance(self, rows: slice) -> None:
        """After sampling ``rows`` from a prefill's logits: bump their counters (the prompt is in the cache already)."""
        self.counter[rows] += 1

    def fed(self, rows: slice) -> None:
        """Host mirror of a decode step of ``rows`` (`sample` with ``decoded`` moved the device positions)."""
        self.lengths[rows] = [n + 1 for n in self.lengths[rows]]

    def keep(self, order: list[int]) -> None:
        """Row ``j`` becomes old row ``order[j]``; rows past the new end are zeroed."""
        old, n = self.rows, len(order)
        if order != list(range(n)):
            idx = torch.tensor(order, dtype=torch.long, device=self.device)
            for buf in self._buffers():
                buf[:n] = buf[idx]
        for buf in self._buffers():
            buf[n:old].zero_()
        self.lengths = [self.lengths[i] for i in order]
        self._filters = [self._filters[i] for i in order]


def store_sample(tokens: torch.Tensor, logprobs: torch.Tensor, token_buf: torch.Tensor, logprob_buf: torch.Tensor,
                 staged: torch.Tensor) -> None:
    """Write sampled ``tokens`` / ``logprobs`` into a row state's buffers (graph-safe, compile-able)."""
    token_buf.copy_(tokens)
    logprob_buf.copy_(logprobs)
    staged[:, 0].copy_(tokens)
    staged[:, 1].copy_(logprobs)


def store_decoded(tokens: torch.Tensor, logprobs: torch.Tensor, token_buf: torch.Tensor, logprob_buf: torch.Tensor,
                  staged: torch.Tensor, active: torch.Tensor, counter: torch.Tensor, positions: torch.Tensor) -> None:
    """`store_sample` for a decode step, which also moves each active row's counter and position on by one."""
    store_sample(tokens, logprobs, token_buf, logprob_buf, staged)
    counter.add_(active)
    positions.add_(active)


class Fetch:
    """Sampled tokens/log-probs of some rows on their way to the host."""

    def __init__(self, state: RowState, rows: slice):
        staged = state.staged[rows]
        self.event: torch.cuda.Event | None = None
        if state.device.type != "cuda":
            self.host = staged.clone()
            return
        self.host = torch.empty(staged.shape, dtype=staged.dtype, pin_memory=True)
        self.host.copy_(staged, non_blocking=True)
        self.event = torch.cuda.Event()
        self.event.record()

    def result(self) -> tuple[list[int], list[float]]:
        if self.event is not None:
            self.event.synchronize()
        return [int(t) for t in self.host[:, 0].tolist()], self.host[:, 1].tolist()
