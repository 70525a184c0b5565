"""Model runners: how the engine's running batch keeps its KV cache and runs forwards.

Both runners keep the rows of the running batch in order; the engine keeps its requests and
pending tokens in the same order. The interface:

* ``prefill(prompts) -> logits [n, V]``: add ``n`` rows at the end, return next-token logits;
* ``decode(tokens [B]) -> logits [B, V]``: feed one token per row;
* ``decode_sample(state)``: feed every row's pending token and sample the next one in place
  (`relax.backends.embedded.rows.RowState`, ``sample(..., decoded=True)``: the rows' counters and
  positions move on with it); here eager ``decode`` + ``RowState.sample``;
* ``keep(indices) -> order``: drop the other rows; returns the old index of each new row;
* ``reset()``: drop everything (free the cache).

`HFRunner` (default) uses HF's ``DynamicCache`` with left padding: rows join by merging
caches (the shorter is left-padded, masked out) and leave by index-select; explicit
``position_ids`` keep every row's numbers independent of padding.

`StaticRunner` preallocates ``[slots, kv_heads, max_len, head_dim]`` K/V per layer; row ``i``
lives in slot ``i`` (leaving rows are replaced by rows moved from the end). It drives HF's own
decoder layers with a slot-cache object, so model specifics (qk-norm, biases, RoPE) stay HF's.
On CUDA with ``cuda_graph=True`` the decode step is captured as CUDA graphs per batch-size
bucket (static shapes: attention spans ``max_len`` under a mask).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from relax.backends.embedded.rows import RowState


def _pad_left(t: torch.Tensor, n: int) -> torch.Tensor:
    """Left-pad the sequence axis (-2 for K/V [B, H, L, D], -1 for a mask [B, L]) by ``n``."""
    if n == 0:
        return t
    return F.pad(t, (n, 0)) if t.dim() == 2 else F.pad(t, (0, 0, n, 0))


def _left_padded(prompts: list[list[int]], pad_id: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(prompts), width), dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    return ids.to(device), mask.to(device)


def compact_slots(k_cache: list[torch.Tensor], v_cache: list[torch.Tensor], rows: int,
                  indices: list[int]) -> list[int]:
    """Keep slot rows ``indices`` of a slot KV cache; holes are filled by moving rows from the end
    (few slot copies). Returns the old row of each new row (row ``j`` <- old row ``order[j]``)."""
    keep = set(indices)
    order = list(range(rows))
    n = rows
    for hole in sorted(set(range(rows)) - keep):
        while n > 0 and order[n - 1] not in keep:
            n -= 1
        if hole >= n:
            break
        src = n - 1
        for k, v in zip(k_cache, v_cache, strict=True):
            k[hole].copy_(k[src])
            v[hole].copy_(v[src])
        order[hole] = order[src]
        n -= 1
    return order[:len(keep)]


class _EagerSampling:
    """``decode_sample`` for runners whose decode returns logits."""

    def decode_sample(self, state: RowState) -> None:
        rows = slice(0, state.rows)
        state.sample(self.decode(state.tokens[rows]), rows, decoded=True)


class HFRunner(_EagerSampling):
    """DynamicCache + left padding; works for any HF causal LM."""

    def __init__(self, model: torch.nn.Module, device: torch.device, pad_id: int = 0):
        self.model, self.device, self.pad_id = model, device, pad_id
        self.reset()

    def reset(self) -> None:
        self.cache: Any = None
        self.mask: torch.Tensor | None = None  # [B, L] 1 = real cache slot

    @property
    def rows(self) -> int:
        return 0 if self.mask is None else self.mask.shape[0]

    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        ids, mask = _left_padded(prompts, self.pad_id, self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        self._merge(out.past_key_values, mask)
        return out.logits[:, -1, :]

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = self.mask.sum(-1, keepdim=True)
        mask = torch.cat([self.mask, torch.ones_like(self.mask[:, :1])], dim=-1)
        out = self.model(input_ids=tokens.unsqueeze(-1), attention_mask=mask, position_ids=positions,
                         past_key_values=self.cache, use_cache=True)
        self.mask = mask
        return out.logits[:, -1, :]

    def _merge(self, cache: Any, mask: torch.Tensor) -> None:
        if self.mask is None:
            self.cache, self.mask = cache, mask
            return
        old_len, new_len = self.mask.shape[1], mask.shape[1]
        width = max(old_len, new_len)
        for mine, theirs in zip(self.cache.layers, cache.layers, strict=True):
            mine.keys = torch.cat([_pad_left(mine.keys, width - old_len), _pad_left(theirs.keys, width - new_len)])
            mine.values = torch.cat([_pad_left(mine.values, width - old_len),
                                     _pad_left(theirs.values, width - new_len)])
        self.mask = torch.cat([_pad_left(self.mask, width - old_len), _pad_left(mask, width - new_len)])

    def keep(self, indices: list[int]) -> list[int]:
        if len(indices) == self.rows:
            return list(indices)
        if not indices:
            self.reset()
            return []
        idx = torch.tensor(indices, dtype=torch.long, device=self.mask.device)
        mask = self.mask[idx]
        used = mask.any(0).nonzero()
        start = int(used[0]) if len(used) else 0  # trim columns that are padding in every row
        self.mask = mask[:, start:]
        for layer in self.cache.layers:
            layer.keys = layer.keys[idx, :, start:]
            layer.values = layer.values[idx, :, start:]
        return list(indices)


class _SlotCache:
    """Stands in for an HF ``Cache`` inside attention: writes new K/V to slots, returns the view."""

    def __init__(self, runner: StaticRunner, rows: torch.Tensor, positions: torch.Tensor, view_len: int,
                 prefill_slot: int | None = None):
        self.runner, self.rows, self.positions, self.view_len = runner, rows, positions, view_len
        self.prefill_slot = prefill_slot

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args: Any, **kwargs: Any):
        k_cache, v_cache = self.runner.k[layer_idx], self.runner.v[layer_idx]
        if self.prefill_slot is not None:  # one row, n tokens from position 0
            s, n = self.prefill_slot, key_states.shape[2]
            k_cache[s, :, :n] = key_states[0]
            v_cache[s, :, :n] = value_states[0]
            return k_cache[s:s + 1, :, :n], v_cache[s:s + 1, :, :n]
        k_cache[self.rows, :, self.positions] = key_states[:, :, 0]
        v_cache[self.rows, :, self.positions] = value_states[:, :, 0]
        b = self.rows.shape[0]
        return k_cache[:b, :, :self.view_len], v_cache[:b, :, :self.view_len]


class StaticRunner(_EagerSampling):
    """Preallocated slot KV cache; optional CUDA-graph decode. HF decoder-only models (Qwen2/3, Llama)."""

    def __init__(self, model: torch.nn.Module, device: torch.device, *, slots: int, max_len: int,
                 cuda_graph: bool = False):
        cfg = model.config
        self.model, self.device, self.slots, self.max_len = model, device, slots, max_len
        self.base = model.model
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.kv_shape = (slots, cfg.num_key_value_heads, max_len, head_dim)
        self.dtype = next(model.parameters()).dtype
        self.cuda_graph = cuda_graph and device.type == "cuda"
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.lengths: list[int] = []  # tokens in the cache per row
        self._graphs: dict[int, tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._min = torch.finfo(self.dtype).min
        self.reset()

    def reset(self) -> None:
        """Drop rows; the cache is (re)allocated lazily on the next prefill."""
        self.lengths = []

    def free(self) -> None:
        self.lengths, self.k, self.v, self._graphs = [], [], [], {}

    @property
    def rows(self) -> int:
        return len(self.lengths)

    def _ensure_cache(self) -> None:
        if not self.k:
            n = len(self.base.layers)
            self.k = [torch.zeros(self.kv_shape, dtype=self.dtype, device=self.device) for _ in range(n)]
            self.v = [torch.zeros(self.kv_shape, dtype=self.dtype, device=self.device) for _ in range(n)]

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache: _SlotCache,
                 last_only: bool = True) -> torch.Tensor:
        x = self.base.embed_tokens(ids)
        pos_emb = self.base.rotary_emb(x, positions)
        for layer in self.base.layers:
            x = layer(x, attention_mask=mask, position_ids=positions, past_key_values=cache,
                      position_embeddings=pos_emb, use_cache=True)
            x = x[0] if isinstance(x, tuple) else x
        x = self.base.norm(x[:, -1] if last_only else x)
        return self.model.lm_head(x)

    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        self._ensure_cache()
        if self.rows + len(prompts) > self.slots:
            raise RuntimeError(f"no free KV slot ({self.slots} slots)")
        out = []
        for p in prompts:
            slot, n = self.rows, len(p)
            ids = torch.tensor([p], dtype=torch.long, device=self.device)
            positions = torch.arange(n, device=self.device).unsqueeze(0)
            causal = torch.full((n, n), self._min, dtype=self.dtype, device=self.device).triu(1)[None, None]
            cache = _SlotCache(self, torch.tensor([slot], device=self.device), positions[0], n, prefill_slot=slot)
            out.append(self._forward(ids, positions, causal, cache)[0])
            self.lengths.append(n)
        return torch.stack(out)

    def decode(self, tokens: torch.Tensor) -> torch.Tensor:
        b = self.rows
        positions = torch.tensor(self.lengths, dtype=torch.long, device=self.device)
        if self.cuda_graph:
            logits = self._graph_decode(tokens, positions)
        else:
            view = max(self.lengths) + 1
            logits = self._decode_eager(tokens, positions, view)
        self.lengths = [n + 1 for n in self.lengths]
        return logits[:b]

    def _decode_eager(self, tokens: torch.Tensor, positions: torch.Tensor, view: int) -> torch.Tensor:
        b = tokens.shape[0]
        rows = torch.arange(b, device=self.device)
        keys = torch.arange(view, device=self.device)
        mask = torch.where(keys[None, :] <= positions[:, None], 0.0, self._min).to(self.dtype)[:, None, None, :]
        cache = _SlotCache(self, rows, positions, view)
        return self._forward(tokens.unsqueeze(-1), positions.unsqueeze(-1), mask, cache)

    # -------------------------------------------------------------- CUDA graphs (GPU only)
    def _bucket(self, b: int) -> int:
        size = 1
        while size < b:
            size *= 2
        return min(size, self.slots)

    def _graph_decode(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        b = tokens.shape[0]
        size = self._bucket(b)
        if size not in self._graphs:
            self._graphs[size] = self._capture(size)
        graph, tok_buf, pos_buf, out = self._graphs[size]
        tok_buf.zero_()
        pos_buf.zero_()  # padded rows write position 0 of free slots: harmless
        tok_buf[:b].copy_(tokens)
        pos_buf[:b].copy_(positions)
        graph.replay()
        return out[:b]

    def _capture(self, size: int) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        tok_buf = torch.zeros(size, dtype=torch.long, device=self.device)
        pos_buf = torch.zeros(size, dtype=torch.long, device=self.device)
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # warm up kernels/allocator outside the graph
                self._decode_eager(tok_buf, pos_buf, self.max_len)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = self._decode_eager(tok_buf, pos_buf, self.max_len)
        return graph, tok_buf, pos_buf, out

    def keep(self, indices: list[int]) -> list[int]:
        order = compact_slots(self.k, self.v, self.rows, indices)
        self.lengths = [self.lengths[i] for i in order]
        return order
