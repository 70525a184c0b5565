"""The lean model runner: our own decoder forward over an HF model's weights, built for decode speed.

Why not HF's modules: a decode step through HF's layers costs ~5 ms on bench-270m even as a
CUDA graph (MACHINES.md) — repeat_kv copies, materialized masks over the whole static cache,
separate q/k/v and gate/up GEMMs, sampling outside the graph. This runner keeps HF's weights
(so weight updates, checksums and the weights checker see one model) and runs:

* **fused projections, one weight buffer**: every parameter becomes a *view* into one flat buffer
  (`WeightArena`), q/k/v and gate/up back to back per layer so each pair or triple is one matrix;
  an in-place weight update of ``q_proj`` is an update of the fused matrix. If anything re-points
  a parameter, the next prefill notices and lays the buffer out again;
* **KV cache** ``[slots, kv_heads, max_len, head_dim]`` per layer (K and V each); row ``i`` lives
  in slot ``i``;
* **graphs that outlive a memory release**: a colocate release frees the KV cache and the weight
  buffer, and a resume takes them back. On CUDA both are `DeviceRegion`s (device_region.py: CUDA's
  virtual memory management, what SGLang's memory saver does), which return at their addresses, so
  the captured graphs (which bake in addresses) are replayed after every release; through the
  caching allocator (no VMM) they come back wherever it puts them. `_prepare` keeps the graphs only
  when the weight buffer and every K and V are at the addresses they were captured over, and captures
  again when any is not, so correctness never rests on the placement. Their activation pool stays
  allocated meanwhile (a few MB per batch bucket);
* **GQA attention without copies** (`decode_attention`): one op per layer writes the new K/V and
  attends over the cache in place, each query-head group against its KV head; on CUDA a Triton
  flash-decoding kernel that reads each row only as far as it goes (elsewhere the reference attends
  over a length bucket, `_length_bucket`, with a mask);
* **batched prefill**: admitted prompts go through one right-padded forward (SDPA, causal +
  key-padding mask), K/V written straight into their slots;
* **shared prompts**: rows admitted together with the same prompt (GRPO's n completions of one
  prompt, sent as one SGLang batch) prefill it once; the first row's slot keeps its K/V and the
  others read their prompt positions from that slot (``decode_attention``'s ``prefix_rows`` /
  ``prefix_lens``, device buffers at fixed addresses like `RowState`'s), so the prefill does 1/n of
  the work and decode reads the prompt's K/V once per group instead of n times (L2 serves the
  rest). When the row that holds a prompt leaves while rows that read it stay, `keep` first copies
  the prompt's K/V into the next of them, which then holds it for the others (SGLang shares
  prompts through its radix cache; this is the same saving for one admission batch);
* **CUDA graphs** (``cuda_graph=True`` on CUDA): one graph per (batch bucket, length bucket,
  filtered, shared prompts or not) captures the whole decode step *including sampling* over the fixed-address
  `RowState` buffers; the host replays it and fetches tokens and log-probs once. With the Triton
  attention kernel, which reads each row only as far as it goes, one length serves all
  (``max_len``), so one graph per batch bucket;
* **PDL on Hopper** (`relax.backends.embedded.pdl`): the decode step's projections are `decode_linear` (on CUDA
  for <= 64 rows a Triton skinny GEMM, `triton_linear`), launched like the attention kernel with programmatic
  dependent launch, and the compiled forward uses inductor's PDL codegen, so each kernel's launch overlaps the
  tail of the one before (``RELAX_DECODE_PDL=0`` turns it off); the MLP's gate/up kernel applies
  ``silu(gate) * up`` in its epilogue when the decode is compiled (``glu``: eight kernels a layer instead of
  nine, rounded as the compiled ops round; ``RELAX_DECODE_GLU=0``), and the attention kernel takes the raw QKV
  projection and applies q/k-norm and RoPE itself, rounded as HF's eager modules (seven; ``RELAX_DECODE_ROPE=0``);
  the o and down projections split K across programs (`decode_linear_partials`: their N leaves SMs idle), and the
  residual add that follows sums the fp32 partials inside its compiled kernel (``RELAX_DECODE_SPLITK=0``); the LM
  head is a `decode_linear` too (``RELAX_DECODE_HEAD=0``: cuBLAS through ``F.linear``; +1-2% tok/s on the H100);
* **torch.compile** (``compile=True``): the decode forward and the sampler (`draw_step`: on CUDA an unfiltered batch
  is one op, `draw_unfiltered`, two Triton kernels that spread each row's vocabulary over many programs
  (``RELAX_DECODE_SAMPLER=0``: `draw`); a filtered one is `draw`: the counter hash's ~30 integer ops, softmax, the
  top-p/top-k sort, the blocked CDF scan) are compiled with the rows dynamic (`_compile_over_rows`) before capture,
  so their small kernels fuse into a few; a graph alone removes launch overhead but not the kernel count. On CUDA
  the prefill's per-layer dense parts (norms, projections, RoPE, MLP) are compiled too (`_layer_in` /
  `_layer_out`: functions of the layer's tensors, one compile for every layer).
  ``compile_mode`` is torch.compile's ``mode`` (ci/bench_engine.py's
  ``lean+graph+autotune`` row tries ``max-autotune-no-cudagraphs``: Triton GEMM templates tuned for
  the decode's M <= 64 projections against cuBLAS; the runner captures its own graphs).

Supported: Qwen2/Qwen3/Llama-style decoders (RMSNorm, SiLU-gated MLP, RoPE with a static
table, optional q/k-norm and q/k/v biases, tied or untied head); anything else raises at
construction with the reason.
"""

from __future__ import annotations

import functools
import math
import os
import time
from typing import Any

import torch
import torch.nn.functional as F

from relax.backends.embedded.decode_attention import (
    decode_attention,
    mask_bias,
    reads_only_rows,
    reference_decode_attention,
)
from relax.backends.embedded.decode_linear import (
    PARTIAL_ROWS,
    add_partials,
    decode_linear,
    decode_linear_partials,
    glu_rows,
    partial_splits,
)
from relax.backends.embedded.device_region import DeviceRegion, available
from relax.backends.embedded.draw_op import draw_step
from relax.backends.embedded.norm_rope import rms_norm, rotate, sign_folded
from relax.backends.embedded.pdl import compile_options
from relax.backends.embedded.rows import RowState, store_decoded
from relax.backends.embedded.runners import compact_slots
from relax.backends.embedded.weight_arena import WeightArena

_STATIC_ROPE = {"default", "linear", "llama3", "yarn", None}
_MIN_BUCKET = 128
_PREFILL_TOKENS = 16384  # tokens per prefill forward (n prompts x padded length)


def unsupported(model: torch.nn.Module) -> list[str]:
    """What keeps the lean runner from running ``model`` (empty: it can)."""
    cfg = model.config
    base = getattr(model, "model", None)
    layer = base.layers[0] if base is not None and hasattr(base, "layers") else None
    attn = getattr(layer, "self_attn", None)
    mlp = getattr(layer, "mlp", None)
    problems = []
    if not all(hasattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj")):
        problems.append("attention without q/k/v/o projections")
    if not all(hasattr(mlp, n) for n in ("gate_proj", "up_proj", "down_proj")):
        problems.append("MLP without gate/up/down projections")
    elif mlp.gate_proj.bias is not None or mlp.up_proj.bias is not None:
        problems.append("gate/up projection biases")
    if getattr(cfg, "hidden_act", "silu") != "silu":
        problems.append(f"hidden_act {cfg.hidden_act}")
    rope = (getattr(cfg, "rope_parameters", None) or getattr(cfg, "rope_scaling", None) or {}).get("rope_type")
    if rope not in _STATIC_ROPE:
        problems.append(f"rope_type {rope}")
    if "sliding_attention" in (getattr(cfg, "layer_types", None) or ()):
        problems.append("sliding-window layers")
    return problems


def _check_supported(model: torch.nn.Module) -> None:
    problems = unsupported(model)
    if problems:
        raise ValueError(f"the lean runner does not support {type(model).__name__}: {', '.join(problems)}; "
                         "use runner 'hf' or 'static'")


def _bucket(n: int, cap: int) -> int:
    """Batch bucket: the next power of two (capped)."""
    size = 1
    while size < n:
        size *= 2
    return min(size, cap)


def _length_bucket(n: int, cap: int) -> int:
    """Cache-view bucket: four steps per octave from 128 (128, 256, 384, 512, 640, ..., 1024, 1280, ...),
    so attention reads at most ~25% past the longest row with a few dozen graphs at most."""
    octave = _MIN_BUCKET
    while octave * 2 < n:
        octave *= 2
    step = max(_MIN_BUCKET, octave // 4) if octave > _MIN_BUCKET * 4 else _MIN_BUCKET
    return min(-(-n // step) * step, cap)


class LeanRunner:
    """Fused-weight decoder forward with a slot KV cache; optional CUDA-graph decode + sampling."""

    def __init__(self, model: torch.nn.Module, device: torch.device, *, slots: int, max_len: int,
                 cuda_graph: bool = False, compile: bool = False, compile_mode: str | None = None):
        _check_supported(model)
        cfg = model.config
        self.model, self.device, self.slots, self.max_len = model, device, slots, max_len
        self.base = model.model
        self.layers = list(self.base.layers)
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.eps = float(cfg.rms_norm_eps)
        self.cuda_graph = cuda_graph and device.type == "cuda"
        # the sampler and its store compile without inductor's PDL codegen: they follow the LM head's cuBLAS GEMM,
        # which takes no part in PDL (the unfiltered sampler's own Triton kernels launch with PDL, triton_sample.py)
        self._forward_decode = (_compile_over_rows(self._decode_logits, **compile_options(device, compile_mode))
                                if compile else self._decode_logits)
        self._draw = _compile_over_rows(draw_step, mode=compile_mode) if compile else draw_step
        self._store = _compile_over_rows(store_decoded, mode=compile_mode) if compile else store_decoded
        # the prefill's dense parts, each layer's norm / projections / RoPE / MLP around the cache writes and SDPA
        # (eager: ~25 kernels a layer, most of bench-270m's 26 ms prefill of 64 x 128 tokens on the H100); compiled
        # on CUDA with automatic dynamic shapes (the batch and the width turn symbolic on their second value)
        prefill_compiled = compile and device.type == "cuda"
        self._prefill_in = _compile_as_eager(self._layer_in, compile_mode) if prefill_compiled else self._layer_in
        self._prefill_out = _compile_as_eager(self._layer_out, compile_mode) if prefill_compiled else self._layer_out
        self.k: list[torch.Tensor] = []  # one [slots, kv_heads, max_len, head_dim] tensor per layer
        self._cache_region: DeviceRegion | None = None  # on CUDA: K and V live here, at the same address after a release
        self.v: list[torch.Tensor] = []
        self.rows_in_cache = 0
        self._arena: WeightArena | None = None  # every parameter, q/k/v and gate/up fused (`_fuse`)
        self._qkv: list[tuple[torch.Tensor, torch.Tensor | None]] = []  # views of the arena
        self._gate_up: list[torch.Tensor] = []
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None
        self._graphs: dict[tuple[int, int, bool, bool], Any] = {}  # (batch bucket, view, filtered, shared prompts)
        self._pool: Any = None
        self._graph_addresses: tuple[int, ...] | None = None  # (weights, each K and V) the graphs were captured over
        self._one_view = False  # `_prepare`: one graph view for all lengths (the Triton attention kernel)
        self._rope_in_attention = False  # `_prepare`: that kernel applies q/k-norm and RoPE (compiled runners)
        self._glu_rows = 0  # `_fuse`: the most rows whose gate/up kernel applies silu(gate) * up itself (`glu_rows`)
        self._splits = (1, 1)  # `_fuse`: the o and down projections' K splits in the decode (`partial_splits`)
        self._compiled = compile
        # shared prompts (module docstring): the row whose slot holds row i's prompt (i itself: its own) and how many
        # positions row i reads there; device buffers for the decode graphs, host mirrors for the bookkeeping
        self._prefix_rows = torch.arange(slots, device=device)
        self._prefix_lens = torch.zeros(slots, dtype=torch.long, device=device)
        self._shared_from: list[int] = []
        self._shared_len: list[int] = []
        self._sharing = False
        self.shared_prompt_rows = 0  # rows admitted so far that read another row's prompt (tests, ci/bench_engine.py)
        self.captures, self.capture_s = 0, 0.0  # graphs captured so far and the seconds it took (ci/bench_engine.py)
        self.graphs_kept = 0  # memory releases after which the captured graphs were replayed, not captured again
        self._after_release = False

    # ------------------------------------------------------------------ lifecycle
    def reset(self) -> None:
        self.rows_in_cache = 0
        self._set_prefixes([], [])

    def free(self, *, weights: bool = False) -> None:
        """Memory release: drop the KV cache and, with ``weights``, the weight buffer (the caller parks or discards
        the parameters first: a region's memory is gone at once). The graphs are kept; `_prepare` replays them
        only if the weight buffer and every K and V come back at the addresses they were captured over."""
        self.rows_in_cache = 0
        self._set_prefixes([], [])
        self.k, self.v = [], []
        if self._cache_region is not None:
            self._cache_region.release()
        self._after_release = True
        if weights:
            self._qkv, self._gate_up = [], []
            if self._arena is not None:
                self._arena.release()

    def restore_weights(self) -> bool:
        """After a release of the weights: allocate the weight buffer again (values undefined until a weight
        update or the parked copy writes them) with every parameter back at its view. False when there is no
        buffer to restore (nothing fused yet), and the caller allocates the parameters itself."""
        if self._arena is None or self._arena.buffer is not None:
            return False
        self._arena.restore()
        self._fused_views()
        return True

    @property
    def rows(self) -> int:
        return self.rows_in_cache

    def _prepare(self) -> None:
        """(Re)build fused weights, the RoPE table and the cache where missing or stale; keep the graphs only
        while the weights and the cache are where they were captured."""
        if not self._fused_ok():
            self._fuse()
        if self._rope is None:
            dtype = self.model.lm_head.weight.dtype
            positions = torch.arange(self.max_len, device=self.device).unsqueeze(0)
            probe = torch.zeros(1, dtype=dtype, device=self.device)
            cos, sin = self.base.rotary_emb(probe, positions)
            self._rope = (cos[0].contiguous(), sign_folded(sin[0]).contiguous())
        if not self.k:
            caches = self._allocate_cache()
            self.k, self.v = caches[:len(self.layers)], caches[len(self.layers):]
            # decided once per cache, not per step: the Triton kernel reads rows only as far as they go, so one
            # graph view (max_len) serves every length
            self._one_view = reads_only_rows(self.k[0], self.heads)
            # q/k-norm and RoPE inside that kernel (rounded as HF's eager modules, as this runner's eager ops): for the
            # compiled runners, where it was measured (+2.8%, mismatch 8.64e-3 -> 8.35e-3 on the H100); the eager ones
            # keep their ops. RELAX_DECODE_ROPE=0 keeps them outside (an A/B)
            self._rope_in_attention = (self._one_view and self._compiled
                                       and os.environ.get("RELAX_DECODE_ROPE", "1") != "0")
        addresses = (self._arena.buffer.data_ptr(), *(t.data_ptr() for t in (*self.k, *self.v)))
        if addresses != self._graph_addresses:
            self._graphs, self._pool, self._graph_addresses = {}, None, addresses
        elif self._graphs and self._after_release:
            self.graphs_kept += 1
        self._after_release = False

    def _allocate_cache(self) -> list[torch.Tensor]:
        """Every layer's K and V, zeroed. Each is a storage of its own, not a view of one buffer: the decode graph's
        inputs must not alias each other (torch.compile rebuilds aliased mutated inputs from a synthetic base; with
        views of one buffer the first compiled decode hit an illegal memory access on the H100). On CUDA they are
        slices of one `DeviceRegion`, back at the same addresses after every release (device_region.py); else
        one allocation each, in address order (the allocator may hand back the same blocks in another order after
        a release, and then every layer still gets the address its graphs were captured with)."""
        shape = (self.slots, self.kv_heads, self.max_len, self.head_dim)
        dtype = self.model.lm_head.weight.dtype
        count = 2 * len(self.layers)
        if not available(self.device):
            return sorted((torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(count)),
                          key=torch.Tensor.data_ptr)
        nbytes = math.prod(shape) * dtype.itemsize
        stride = -(-nbytes // 256) * 256
        if self._cache_region is None:
            self._cache_region = DeviceRegion(stride * count, self.device)
        region = self._cache_region
        region.restore()
        region.tensor(0, region.nbytes).zero_()
        return [region.tensor(i * stride, nbytes).view(dtype).view(shape) for i in range(count)]

    def _fused_ok(self) -> bool:
        """The arena still holds exactly the model's parameters, each at its view. (The arena lists them in its
        layout's order, fused groups first, not the model's: compared as sets. Compared in order, as until
        2026-11-26, this was never true, and every prefill laid the weights out again and dropped the graphs:
        a capture per generate, ~21 ms of bench-270m's 0.27 s at batch 64 on the H100.)"""
        if self._arena is None or len(self._qkv) != len(self.layers) or not self._arena.holds():
            return False
        mine = [id(p) for p in self._arena.params]
        return len(mine) == len(set(mine)) and set(mine) == {id(p) for p in _unique_params(self.model)}

    @torch.no_grad()
    def _fuse(self) -> None:
        """Lay every parameter out in one buffer, q/k/v (and their biases) and gate/up back to back per layer,
        and re-point the HF parameters at views of it."""
        groups: list[list[torch.nn.Parameter]] = []
        for layer in self.layers:
            a, m = layer.self_attn, layer.mlp
            projs = (a.q_proj, a.k_proj, a.v_proj)
            groups.append([p.weight for p in projs])
            if a.q_proj.bias is not None:
                groups.append([p.bias for p in projs])
            groups.append([m.gate_proj.weight, m.up_proj.weight])
        fused = {id(p) for g in groups for p in g}
        groups += [[p] for p in _unique_params(self.model) if id(p) not in fused]
        self._arena = None  # the old buffer (if any) goes as the parameters move into the new one
        self._arena = WeightArena(groups, self.device)
        self._fused_views()
        # the epilogue rounds silu(gate) * up once, as the compiled ops do; uncompiled, the two eager ops round twice
        # (as HF does), and a GLU there raised the eager runners' log-prob mismatch (9.18e-3 -> 9.34e-3, H100)
        self._glu_rows = glu_rows(self._gate_up[0]) if self._compiled else 0
        # o and down split along K where their N leaves SMs idle, the partials added inside the residual add's
        # compiled kernel (compiled runners only: uncompiled, the adds would be kernels of their own)
        layer = self.layers[0]
        self._splits = ((partial_splits(layer.self_attn.o_proj.weight), partial_splits(layer.mlp.down_proj.weight))
                        if self._compiled else (1, 1))

    def _fused_views(self) -> None:
        """The per-layer fused matrices, as views of the arena (its group order is `_fuse`'s)."""
        self._qkv, self._gate_up, index = [], [], 0
        for layer in self.layers:
            qkv = self._arena.group(index)
            bias = self._arena.group(index + 1) if layer.self_attn.q_proj.bias is not None else None
            index += 2 if bias is not None else 1
            self._qkv.append((qkv, bias))
            self._gate_up.append(self._arena.group(index))
            index += 1

    # ------------------------------------------------------------------ forwards
    def _attention_in(self, i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, linear=F.linear):
        """Norm, fused QKV, q/k-norm and RoPE over q and k together: ``qk [..., H + KV, D]``, ``v [..., KV, D]``.
        ``linear`` is the projection (``F.linear``; the decode step's `decode_linear` on CUDA)."""
        return self._layer_in(x, cos, sin, *self._in_weights(i), linear=linear)

    def _in_weights(self, i: int) -> tuple[torch.Tensor | None, ...]:
        """Layer ``i``'s input norm, fused QKV weight and bias, q-norm and k-norm weights (None where absent)."""
        layer = self.layers[i]
        a = layer.self_attn
        w, b = self._qkv[i]
        q_norm, k_norm = (a.q_norm.weight, a.k_norm.weight) if hasattr(a, "q_norm") else (None, None)
        return layer.input_layernorm.weight, w, b, q_norm, k_norm

    def _layer_qkv(self, x, norm_w, w, b, linear=F.linear):
        """Norm and fused QKV only: ``qk [..., H + KV, D]`` raw (before q/k-norm and RoPE), ``v [..., KV, D]``."""
        qkv = linear(rms_norm(x, norm_w, self.eps), w, b)
        qkv = qkv.view(*x.shape[:-1], self.heads + 2 * self.kv_heads, self.head_dim)
        return qkv[..., :self.heads + self.kv_heads, :], qkv[..., self.heads + self.kv_heads:, :]

    def _layer_in(self, x, cos, sin, norm_w, w, b, q_norm, k_norm, linear=F.linear):
        """`_attention_in` over the weights given (a function of tensors only: one compile serves every layer)."""
        qk, v = self._layer_qkv(x, norm_w, w, b, linear)
        if q_norm is not None:
            qk = rms_norm(qk, torch.cat([q_norm.expand(self.heads, -1), k_norm.expand(self.kv_heads, -1)]), self.eps)
        return rotate(qk, cos, sin), v

    def _attention_out_and_mlp(self, i: int, x: torch.Tensor, attn: torch.Tensor, linear=F.linear,
                               glu: bool = False, splits: tuple[int, int] = (1, 1)) -> torch.Tensor:
        """``glu``: ``linear`` is `decode_linear`, whose gate/up kernel applies ``silu(gate) * up`` itself; ``splits``:
        the o and down projections' K splits (`decode_linear_partials` where > 1)."""
        return self._layer_out(x, attn, *self._out_weights(i), linear=linear, glu=glu, splits=splits)

    def _out_weights(self, i: int) -> tuple[torch.Tensor | None, ...]:
        """Layer ``i``'s o projection (weight, bias), post-attention norm, fused gate/up, down (weight, bias)."""
        layer = self.layers[i]
        o, down = layer.self_attn.o_proj, layer.mlp.down_proj
        return o.weight, o.bias, layer.post_attention_layernorm.weight, self._gate_up[i], down.weight, down.bias

    def _layer_out(self, x, attn, o_w, o_b, norm_w, gate_up, down_w, down_b, linear=F.linear, glu: bool = False,
                   splits: tuple[int, int] = (1, 1)):
        """`_attention_out_and_mlp` over the weights given (tensors only, as `_layer_in`)."""
        x = x + _projection(linear, attn, o_w, o_b, splits[0])
        normed = rms_norm(x, norm_w, self.eps)
        if glu:
            act = linear(normed, gate_up, None, True)
        else:
            gate, up = linear(normed, gate_up).chunk(2, -1)
            act = F.silu(gate) * up
        return x + _projection(linear, act, down_w, down_b, splits[1])

    def _logits(self, x: torch.Tensor, linear=None) -> torch.Tensor:
        """The final norm and the LM head; ``linear`` (the decode's `decode_linear`) runs the head as a decode
        projection: on CUDA for <= 64 rows the Triton skinny GEMM launched with PDL, where cuBLAS's GEMM takes no
        part in PDL (``RELAX_DECODE_HEAD=0``: the module's own ``F.linear``)."""
        x = rms_norm(x, self.base.norm.weight, self.eps)
        if linear is None or os.environ.get("RELAX_DECODE_HEAD", "1") == "0":
            return self.model.lm_head(x)
        return linear(x, self.model.lm_head.weight, self.model.lm_head.bias)

    @torch.no_grad()
    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        """Add rows at the end: right-padded batched forwards of the distinct prompts, K/V straight into the slot
        of each prompt's first row; a repeated prompt's rows read it from there (shared prompts)."""
        self._prepare()
        if self.rows + len(prompts) > self.slots:
            raise RuntimeError(f"no free KV slot ({self.slots} slots)")
        first: dict[tuple[int, ...], int] = {}
        source = [first.setdefault(tuple(p), j) for j, p in enumerate(prompts)]  # each prompt's first row
        owners = [j for j, src in enumerate(source) if src == j]
        out, chunk = [], []
        for j in owners:
            width = max(len(prompts[i]) for i in [*chunk, j])
            if chunk and (len(chunk) + 1) * width > _PREFILL_TOKENS:
                out.append(self._prefill_chunk([prompts[i] for i in chunk], [self.rows + i for i in chunk]))
                chunk = []
            chunk.append(j)
        out.append(self._prefill_chunk([prompts[i] for i in chunk], [self.rows + i for i in chunk]))
        logits = torch.cat(out)
        start = self.rows
        self.rows_in_cache += len(prompts)
        self.shared_prompt_rows += len(prompts) - len(owners)
        self._set_prefixes([*self._shared_from, *(start + src for src in source)],
                           [*self._shared_len, *(0 if src == j else len(prompts[j]) for j, src in enumerate(source))])
        if len(owners) == len(prompts):
            return logits
        row_of_owner = {j: k for k, j in enumerate(owners)}
        return logits[torch.tensor([row_of_owner[src] for src in source], device=logits.device)]

    def _set_prefixes(self, shared_from: list[int], shared_len: list[int]) -> None:
        """Rows' prompt sources (host mirrors) and the decode's device buffers (rows past the end read nothing
        shared). The buffers are written only while some row shares or when sharing ends (then back to none):
        a batch that never shares, which the decode runs without them, costs no copies here."""
        was_sharing = self._sharing
        self._shared_from, self._shared_len = shared_from, shared_len
        self._sharing = any(shared_len)
        if not (self._sharing or was_sharing):
            return
        n = len(shared_from)
        rows = torch.arange(self.slots)
        rows[:n] = torch.tensor(shared_from, dtype=torch.long)
        lens = torch.zeros(self.slots, dtype=torch.long)
        lens[:n] = torch.tensor(shared_len, dtype=torch.long)
        # non_blocking: stream-ordered after any decode step already queued (overlap mode), without waiting for it
        self._prefix_rows.copy_(rows, non_blocking=True)
        self._prefix_lens.copy_(lens, non_blocking=True)

    def _prefill_chunk(self, prompts: list[list[int]], slots: list[int]) -> torch.Tensor:
        n, width = len(prompts), max(len(p) for p in prompts)
        ids = torch.zeros((n, width), dtype=torch.long)
        for j, p in enumerate(prompts):
            ids[j, :len(p)] = torch.tensor(p)
        ids = ids.to(self.device)
        lengths = torch.tensor([len(p) for p in prompts], device=self.device)
        keys = torch.arange(width, device=self.device)
        # [n, 1, T, T]: causal and the key is a real token (padded query rows still see key 0)
        mask = (keys[None, None, :] <= keys[None, :, None]) & (keys[None, None, :] < lengths[:, None, None])
        mask = mask.unsqueeze(1)
        cos, sin = (t[:width].unsqueeze(1) for t in self._rope)  # [T, 1, D]
        slots = (slice(slots[0], slots[0] + n) if slots == list(range(slots[0], slots[0] + n))
                 else torch.tensor(slots, device=self.device))
        x = self.base.embed_tokens(ids)
        for i in range(len(self.layers)):
            qk, v = self._prefill_in(x, cos, sin, *self._in_weights(i))  # [n, T, H + KV, D], [n, T, KV, D]
            q, k, v = qk[:, :, :self.heads].transpose(1, 2), qk[:, :, self.heads:].transpose(1, 2), v.transpose(1, 2)
            self.k[i][slots, :, :width] = k
            self.v[i][slots, :, :width] = v
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.layers[i].self_attn.scaling,
                                               enable_gqa=self.heads != self.kv_heads)
            x = self._prefill_out(x, o.transpose(1, 2).reshape(n, width, -1), *self._out_weights(i))
        last = x[torch.arange(n, device=self.device), lengths - 1]
        return self._logits(last)

    def _decode(self, state: RowState, n: int, view: int, filtered: bool) -> None:
        """One decode step + sampling for rows ``[:n]`` over cache positions ``[:view]`` (graph-safe)."""
        logits = self._forward_decode(state.tokens[:n], state.positions[:n], view, *self._shared_prefixes(n))
        state.sample(logits, slice(0, n), filtered=filtered, sampler=self._draw, decoded=True, store=self._store)

    def _decode_logits(self, tokens: torch.Tensor, positions: torch.Tensor, view: int,
                       *shared: torch.Tensor) -> torch.Tensor:
        """Feed one token per row, write its K/V, return next-token logits (the compiled part).

        Attention is one op per layer (`decode_attention`: on CUDA a flash-decoding Triton kernel
        that writes the new K/V and reads each row's cache in place, only as far as the row goes).
        """
        n = tokens.shape[0]
        if not self._rope_in_attention:  # else the attention kernel reads the tables at the positions itself
            cos, sin = (t[positions].unsqueeze(1) for t in self._rope)  # [n, 1, D]
        x = self.base.embed_tokens(tokens)
        attend = self._attention_op(positions, view)
        linear = decode_linear if self.device.type == "cuda" else F.linear  # the op's dispatch costs on CPU
        # gate/up with silu(gate) * up in its kernel where that kernel takes the batch (a guard under torch.compile:
        # one compile on each side), else the two ops outside, where torch.compile fuses them
        glu = 0 < n <= self._glu_rows
        splits = self._splits if 0 < n <= PARTIAL_ROWS else (1, 1)  # a guard as glu's
        for i in range(len(self.layers)):
            scaling = self.layers[i].self_attn.scaling
            if self._rope_in_attention:  # the kernel applies q/k-norm and RoPE to the raw projection itself
                norm_w, w, b, q_norm, k_norm = self._in_weights(i)
                qk, v = self._layer_qkv(x, norm_w, w, b, linear)
                o = attend(qk, v, self.k[i], self.v[i], positions, scaling, view, *shared, cos=self._rope[0],
                           sin=self._rope[1], q_norm=q_norm, k_norm=k_norm, eps=self.eps)
            else:
                qk, v = self._attention_in(i, x, cos, sin, linear)  # [n, H + KV, D], [n, KV, D]
                o = attend(qk, v, self.k[i], self.v[i], positions, scaling, view, *shared)
            x = self._attention_out_and_mlp(i, x, o.reshape(n, self.heads * self.head_dim), linear, glu, splits)
        return self._logits(x, linear)

    def _shared_prefixes(self, n: int) -> tuple[torch.Tensor, torch.Tensor] | tuple[()]:
        """The attention op's shared-prompt buffers for rows ``[:n]`` while some row reads another's prompt (the
        decode graphs are keyed on it: a batch without shared prompts runs the kernel without the lookup)."""
        return (self._prefix_rows[:n], self._prefix_lens[:n]) if self._sharing else ()

    def _attention_op(self, positions: torch.Tensor, view: int):
        """On CUDA the custom op (what reaches the Triton kernel); elsewhere its reference, called directly with one
        mask shared by every layer (on small-qwen3 on CPU, the op's Python dispatch and a mask per layer made
        decode ~15% slower than the attention this replaced)."""
        if self.device.type == "cuda":
            return decode_attention
        bias = mask_bias(positions, view, self.heads, self.kv_heads, self.model.lm_head.weight.dtype)
        return functools.partial(reference_decode_attention, bias=bias)

    @torch.no_grad()
    def decode_sample(self, state: RowState) -> None:
        n = state.rows
        if not self.cuda_graph:
            self._decode(state, n, max(state.lengths) + 1, state.filtered)
            return
        view = self.max_len if self._one_view else _length_bucket(max(state.lengths) + 1, self.max_len)
        key = (_bucket(n, self.slots), view, state.filtered, self._sharing)
        if key not in self._graphs:
            self._graphs[key] = self._capture(state, *key[:3])
        self._graphs[key].replay()

    def _capture(self, state: RowState, size: int, view: int, filtered: bool) -> Any:
        """Capture a decode step for ``size`` rows (rows past ``state.rows`` are zeroed: harmless)."""
        started = time.perf_counter()
        kept = (state.tokens, state.logprobs, state.counter, state.positions)
        saved = [t.clone() for t in kept]
        stream = torch.cuda.Stream(self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            self._decode(state, size, view, filtered)  # warm-up (and compile) outside the graph
        torch.cuda.current_stream(self.device).wait_stream(stream)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool):
            self._decode(state, size, view, filtered)
        # capturing ran nothing; undo the warm-up's writes to the state (the cache rows it wrote
        # are overwritten by the replay that follows, at the same positions; ``staged`` by the replay itself)
        for t, old in zip(kept, saved, strict=True):
            t.copy_(old)
        self.captures += 1
        self.capture_s += time.perf_counter() - started
        return graph

    def keep(self, indices: list[int]) -> list[int]:
        self._hand_over_prompts(set(indices))
        order = compact_slots(self.k, self.v, self.rows, indices)
        self.rows_in_cache = len(order)
        new_row = {old: new for new, old in enumerate(order)}
        self._set_prefixes([new_row[self._shared_from[old]] for old in order],
                           [self._shared_len[old] for old in order])
        return order

    def _hand_over_prompts(self, kept: set[int]) -> None:
        """Before rows leave: a leaving row whose slot holds the prompt of rows that stay copies that prompt's K/V
        into the first of them, which then holds it for the rest."""
        readers: dict[int, list[int]] = {}
        for row, source in enumerate(self._shared_from):
            if source != row and row in kept and source not in kept:
                readers.setdefault(source, []).append(row)
        for source, rows in readers.items():
            heir, length = rows[0], self._shared_len[rows[0]]
            for cache in (*self.k, *self.v):
                cache[heir, :, :length].copy_(cache[source, :, :length])
            for row in rows:
                self._shared_from[row] = heir
            self._shared_len[heir] = 0


def _projection(linear, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, splits: int) -> torch.Tensor:
    """``linear(x, weight, bias)``, or with ``splits`` > 1 the split-K op's partials added where the caller's fused
    kernel (the residual add) reads them (`decode_linear_partials`, `add_partials`)."""
    if splits == 1:
        return linear(x, weight, bias)
    return add_partials(decode_linear_partials(x, weight, bias, splits), x.dtype)


def _compile_over_rows(fn, **options):
    """``torch.compile(fn)`` with the rows (dim 0 of every tensor argument) dynamic and every other size static.

    Why not ``dynamic=True``: then the vocabulary and hidden sizes are symbols too, and inductor's on-disk cache
    serves a graph compiled for another model's sizes, with kernel configs chosen for them: on the H100, after the
    GPU tests compiled the sampler for a 512-token vocabulary, bench-270m's sampler reused it and its two looped
    reductions over the 32,000-token vocabulary took 7x longer (0.03 -> 0.24 ms per decode step together; 48.9k
    against 57.3k tok/s at batch 64). With only the rows dynamic, a batch of any size reuses one compile and another model
    gets its own. Integers (the graph's length bucket) start static and turn dynamic on their second value
    (torch.compile's automatic dynamic shapes)."""
    compiled = torch.compile(fn, **options)

    def call(*args):
        for arg in args:
            if isinstance(arg, torch.Tensor) and arg.dim() > 0:
                torch._dynamo.maybe_mark_dynamic(arg, 0)
        return compiled(*args)

    return call


def _compile_as_eager(fn, mode: str | None):
    """``torch.compile(fn)`` whose fused kernels round every intermediate to its dtype as the eager ops do
    (inductor's ``emulate_precision_casts``), for the prefill: the prompt's K/V and first token are then the
    eager prefill's, bit for bit where the GEMMs are (tests/test_engine_sampling.py, on CPU). Compiled without
    it (commit 2c4940a), the H100's log-prob mismatch at batch 64 rose from 9.06e-3 to 9.19e-3 (a fresh
    process) and to 9.31e-3 in the in-process order runs, past the 9.3e-3 the engine must stay under."""
    if mode is not None:  # torch.compile takes a mode or options, not both
        return torch.compile(fn, mode=mode)
    return torch.compile(fn, options={"emulate_precision_casts": True})


def _unique_params(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The model's parameters, a tied one once (named_parameters' order)."""
    return [p for _, p in model.named_parameters()]
