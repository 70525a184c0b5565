"""The trainer's side of a stock SGLang server's ``/weights_checker checksum``: weight equality by read-back.

A stock SGLang 0.5.14 server knows nothing of relax's checksums (`relax.weights.checksum`). What it can say
is ``/weights_checker {"action": "checksum"}``: per parameter of *its own* model, ``f"{tensor_hash(p):016x}"``
(``sglang/srt/utils/weight_checker.py``), where ``tensor_hash`` of a CUDA tensor is
``sglang.srt.layers.multimodal.gpu_tensor_hash``, and the parameters are SGLang's fused ones: a Llama/Qwen
layer holds ``self_attn.qkv_proj`` (q, k and v stacked along dim 0) and ``mlp.gate_up_proj`` (gate, then up),
the embedding and ``lm_head`` have their rows padded with zeros to a multiple of 64
(``VocabParallelEmbedding``'s ``padding_size``; its weight loader zeroes the padding), and a tied ``lm_head``
is the embedding itself. A Qwen2/2.5-VL vision block keeps HF's fused ``attn.qkv`` (q, k, v stacked already)
under SGLang's name ``attn.qkv_proj`` (``VisionAttention(use_qkv_parallel=True)``, loaded whole by
``load_weights``' ``attn.qkv.`` -> ``attn.qkv_proj.`` rename, models/qwen2_5_vl.py), and stacks its
``mlp.gate_proj`` / ``mlp.up_proj`` into ``mlp.gate_up_proj`` like a text layer, biases too.
``/get_weights_by_name`` cannot serve instead: Qwen3 models do not implement it in 0.5.14, and it returns floats
of a truncated slice.

So the trainer computes the same hashes over the bytes it sends, laid out as SGLang holds them, and the
two sets of hex strings are compared name by name (weights.jsonl, ``layout: sglang``): equal hashes of
every parameter, from two independent implementations of one function over the same bytes, is the
read-back equality the embedded engine's checksums give.

`tensor_hash` computes SGLang's function in plain torch integer arithmetic (any device, any reduction
order: every step is exact modulo 2**32 or 2**64). The function, restated: the tensor's bytes, zero-padded
to whole 32-bit little-endian words ``v_i``; with ``i`` the word index, seeds ``s1``, ``s2`` and
murmur3's ``fmix32``, each word gives ``k1 = fmix32(v_i ^ ((i*A + s1) ^ rotl(i, 15)))`` and
``k2 = fmix32(v_i ^ ((i*B + s2) ^ rotl(i, 13)))``; per tile of 8192 words ``h1 = fmix32(sum k1 ^ nbytes)``,
``h2`` likewise; the tiles' ``h1 << 32 | h2`` are summed modulo 2**64 and the sum goes through
splitmix64's finalizer. tests/test_sglang_checksums.py holds SGLang's own answers for fixed tensors, and
tests/gpu/test_sglang_checksums_gpu.py compares with the installed SGLang's kernel.

An engine of several tensor-parallel ranks (``--rollout-num-gpus-per-engine``) answers one set of hashes per
rank, each over that rank's shards (``ranks[r].checksums``), and the trainer hashes the same shards
(`shard`): the stacked ``qkv_proj`` takes rank r's slice of q, k and v (SGLang's ``QKVParallelLinear``: the key
and value heads split evenly, or, with fewer heads than ranks, each head replicated on ``ranks / heads``
consecutive ranks), ``gate_up_proj`` rank r's slice of gate and of up, ``o_proj`` and ``down_proj`` (row
parallel) a slice of their columns, the embedding and ``lm_head`` a slice of the padded rows; norms are whole
on every rank. Those records are keyed ``tp<r>/<name>`` under the layout ``sglang-tp<T>``.

Scope: dense Llama/Qwen-family models, and Qwen2.5-VL on a one-rank engine. A MoE engine hashes its experts
fused per layer and a vision tower is sharded otherwise: those targets are recorded as unverified, with the
reason (`unverifiable`).
"""

from __future__ import annotations

import re

import torch

_M32 = 0xFFFFFFFF
_M64 = (1 << 64) - 1
SEED = 0x243F6A88
_SEED1 = SEED & _M32
_SEED2 = ((SEED * 0x9E3779B1) ^ 0xDEADBEEF) & _M32
_FMIX_C1, _FMIX_C2 = 0x85EBCA6B, 0xC2B2AE35
_POS_A, _POS_B = 0x27D4EB2D, 0x165667B1
TILE_WORDS = 8192
_CHUNK_TILES = 512  # tiles per pass: bounds the int64 temporaries to ~4M words (~32 MB each)

# SGLang's stacked parameters of a Llama/Qwen layer: HF name part -> (SGLang's part, position in the stack)
STACKED = {"q_proj": ("qkv_proj", 0), "k_proj": ("qkv_proj", 1), "v_proj": ("qkv_proj", 2),
           "gate_proj": ("gate_up_proj", 0), "up_proj": ("gate_up_proj", 1)}
_STACKED_NAME = re.compile(r"^(.*\.)(q_proj|k_proj|v_proj|gate_proj|up_proj)\.(weight|bias)$")
# a VL vision block's fused qkv under its checkpoint name (relax.models.checkpoint_names)
_VISION_QKV = re.compile(r"^(visual\.blocks\.\d+\.attn\.)qkv\.(weight|bias)$")
EMBEDDING, LM_HEAD = "model.embed_tokens.weight", "lm_head.weight"
VOCAB_PADDING = 64  # sglang/srt/layers/vocab_parallel_embedding.py DEFAULT_VOCAB_PADDING_SIZE


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``x * c`` modulo 2**32 for int64 ``x`` in [0, 2**32), without int64 overflow (16-bit halves of ``c``)."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    x = x ^ (x >> 16)
    x = _mul32(x, _FMIX_C1)
    x = x ^ (x >> 13)
    x = _mul32(x, _FMIX_C2)
    return x ^ (x >> 16)


def _rotl32(x: torch.Tensor, r: int) -> torch.Tensor:
    return ((x << r) & _M32) | (x >> (32 - r))


def _words(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bytes as 32-bit little-endian words in int64 (zero-padded to a whole word)."""
    raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
    pad = (-raw.numel()) % 4
    if pad:
        raw = torch.cat([raw, raw.new_zeros(pad)])
    return raw.view(torch.int32).to(torch.int64) & _M32


def _splitmix64(x: int) -> int:
    x &= _M64
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & _M64
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def tensor_hash(t: torch.Tensor) -> int:
    """SGLang 0.5.14's ``gpu_tensor_hash`` of ``t`` (on ``t``'s own device)."""
    words = _words(t)
    n = words.numel()
    if n == 0:
        return 0
    nbytes = (n * 4) & _M32
    total = 0
    step = TILE_WORDS * _CHUNK_TILES
    for start in range(0, n, step):
        v = words[start:start + step]
        idx = torch.arange(start, start + v.numel(), device=v.device, dtype=torch.int64) & _M32
        p1 = ((_mul32(idx, _POS_A) + _SEED1) & _M32) ^ _rotl32(idx, 15)
        p2 = ((_mul32(idx, _POS_B) + _SEED2) & _M32) ^ _rotl32(idx, 13)
        k = torch.stack([_fmix32(v ^ p1), _fmix32(v ^ p2)])  # [2, words]
        pad = (-v.numel()) % TILE_WORDS  # words past the end count 0 (the kernel's masked lanes)
        if pad:
            k = torch.cat([k, k.new_zeros(2, pad)], dim=1)
        tiles = (k.view(2, -1, TILE_WORDS).sum(dim=2) & _M32) ^ nbytes  # [2, tiles]: < 2**45 before the mask
        h = _fmix32(tiles)
        sums = h.sum(dim=1).tolist()  # < tiles * 2**32: exact in int64
        total += (sums[0] << 32) + sums[1]
    return _splitmix64(total)


def hex_hash(t: torch.Tensor) -> str:
    """SGLang's checksum string of one tensor (``weight_checker._hash_tensor``)."""
    return f"{tensor_hash(t):016x}"


def pad_vocab(t: torch.Tensor) -> torch.Tensor:
    """An embedding or output matrix as SGLang holds it: rows zero-padded to a multiple of `VOCAB_PADDING`."""
    pad = (-t.shape[0]) % VOCAB_PADDING
    return torch.cat([t, t.new_zeros(pad, *t.shape[1:])]) if pad else t


def layout_name(tp_size: int) -> str:
    """The weights.jsonl layout of an SGLang engine of ``tp_size`` ranks (`SGLangLayoutChecksums.result`)."""
    return "sglang" if tp_size == 1 else f"sglang-tp{tp_size}"


def unverifiable(model_names: list[str] | None, tp_size: int, kv_heads: int | None = None) -> str | None:
    """Why a stock SGLang engine's checksums cannot be matched, or None when they can."""
    if model_names and any(".experts." in n for n in model_names):
        return "a stock SGLang MoE engine: its /weights_checker hashes experts fused per layer (dense models only)"
    if tp_size == 1:
        return None
    if kv_heads is None:
        return (f"a stock SGLang engine of {tp_size} tensor-parallel ranks whose model's key/value head count is not "
                "known to the trainer: its ranks' shards cannot be laid out")
    other = next((n for n in model_names or () if _tp_rule(n) is None), None)
    if other is not None:
        return (f"a stock SGLang engine of {tp_size} tensor-parallel ranks: how it shards {other} is not known to the "
                "trainer (dense text models only)")
    return None


_REPLICATED = re.compile(r"(layernorm|\.q_norm|\.k_norm|^model\.norm)\.weight$|\.(o_proj|down_proj)\.bias$")
_ROW_PARALLEL = re.compile(r"\.(o_proj|down_proj)\.weight$")


def _tp_rule(name: str) -> str | None:
    """How SGLang shards HF tensor ``name`` over tensor-parallel ranks: "rows", "columns", "whole", "vocab", or
    None (not a dense text model's tensor)."""
    if name in (EMBEDDING, LM_HEAD):
        return "vocab"
    if _STACKED_NAME.match(name):
        return "rows"
    if _ROW_PARALLEL.search(name):
        return "columns"
    if _REPLICATED.search(name):
        return "whole"
    return None


def _kv_slice(t: torch.Tensor, rank: int, tp_size: int, kv_heads: int) -> torch.Tensor:
    """Rank ``rank``'s rows of a key or value projection (SGLang's ``QKVParallelLinear``): the heads split
    evenly over the ranks, or each head on ``tp_size / kv_heads`` consecutive ranks when there are fewer."""
    head_rows = t.shape[0] // kv_heads
    per_rank = max(kv_heads // tp_size, 1)
    first = (rank // max(tp_size // kv_heads, 1)) * per_rank
    return t[first * head_rows:(first + per_rank) * head_rows]


def shard(name: str, parts: list[torch.Tensor], rank: int, tp_size: int, kv_heads: int) -> torch.Tensor:
    """Tensor-parallel rank ``rank``'s part of SGLang's parameter made of HF tensors ``parts`` (one, or the q/k/v or
    gate/up pieces of a stacked parameter, in stack order), as that rank holds it."""
    rule = "rows" if len(parts) > 1 else _tp_rule(name)
    if rule == "whole":
        return parts[0]
    if rule == "vocab":
        padded = pad_vocab(parts[0])
        rows = padded.shape[0] // tp_size
        return padded[rank * rows:(rank + 1) * rows]
    if rule == "columns":
        cols = parts[0].shape[1] // tp_size
        return parts[0][:, rank * cols:(rank + 1) * cols].contiguous()
    if rule != "rows":
        raise ValueError(f"{name}: how SGLang shards it over tensor-parallel ranks is not known")
    pieces = []
    for position, t in enumerate(parts):
        if len(parts) == 3 and position > 0:  # k and v
            pieces.append(_kv_slice(t, rank, tp_size, kv_heads))
        else:
            rows = t.shape[0] // tp_size
            pieces.append(t[rank * rows:(rank + 1) * rows])
    return torch.cat(pieces)


class SGLangLayoutChecksums:
    """Fed the HF-named tensors of a sync bucket by bucket; gives SGLang's checksums of SGLang's parameters, for
    engines of each of ``tp_sizes`` tensor-parallel ranks (``kv_heads``: the model's key/value heads, needed
    beyond one rank).

    Unstacked tensors are hashed as they come; the parts of a stacked parameter are kept (copied: the
    bucket's buffer is reused) until the last part arrives, then stacked in SGLang's order and hashed.
    """

    def __init__(self, tp_sizes: tuple[int, ...] = (1,), kv_heads: int | None = None) -> None:
        if any(t != 1 for t in tp_sizes) and kv_heads is None:
            raise ValueError("checksums of tensor-parallel SGLang engines need the model's key/value head count")
        self.tp_sizes = tuple(sorted(set(tp_sizes)))
        self.kv_heads = kv_heads
        self.checksums: dict[int, dict[str, str]] = {t: {} for t in self.tp_sizes}
        self._parts: dict[str, dict[int, torch.Tensor]] = {}
        self._sizes: dict[str, int] = {}

    def add(self, named: list[tuple[str, torch.Tensor]]) -> None:
        for name, t in named:
            m = _STACKED_NAME.match(name)
            if m is None:
                key = name if name in (EMBEDDING, LM_HEAD) else _VISION_QKV.sub(r"\1qkv_proj.\2", name)
                self._hash(key, name, [t])
                continue
            prefix, part, kind = m.groups()
            fused, position = STACKED[part]
            key = f"{prefix}{fused}.{kind}"
            self._sizes[key] = 3 if fused == "qkv_proj" else 2
            parts = self._parts.setdefault(key, {})
            parts[position] = t.detach().clone()
            if len(parts) == self._sizes[key]:
                self._hash(key, key, [parts[i] for i in range(len(parts))])
                del self._parts[key]

    def _hash(self, key: str, name: str, parts: list[torch.Tensor]) -> None:
        """Hash SGLang's parameter ``key`` (HF pieces ``parts``) as each engine size holds it."""
        for tp_size, sums in self.checksums.items():
            if tp_size == 1:
                whole = pad_vocab(parts[0]) if name in (EMBEDDING, LM_HEAD) else parts[0] if len(parts) == 1 \
                    else torch.cat(parts)
                sums[key] = hex_hash(whole)
                continue
            if len(parts) == 1 and _tp_rule(name) is None:
                continue  # not a dense text model's tensor: such a target is unverifiable (`unverifiable`)
            for rank in range(tp_size):
                sums[f"tp{rank}/{key}"] = hex_hash(shard(name, parts, rank, tp_size, self.kv_heads))

    def result(self, tp_size: int = 1) -> dict[str, str]:
        """The checksums under SGLang's names (``tp<r>/`` before them beyond one rank). A tied ``lm_head`` (bytes
        equal to the embedding's: the trainer lists it as HF does) is the embedding itself in SGLang, so it is
        not listed twice."""
        if self._parts:
            missing = {key: sorted(set(range(self._sizes[key])) - set(parts)) for key, parts in self._parts.items()}
            raise ValueError(f"incomplete stacked parameters after the sync (key: missing parts): {missing}")
        out = dict(self.checksums[tp_size])
        ranks = [""] if tp_size == 1 else [f"tp{r}/" for r in range(tp_size)]
        if all(out.get(f"{r}{LM_HEAD}") is not None and out.get(f"{r}{EMBEDDING}") == out[f"{r}{LM_HEAD}"]
               for r in ranks):
            for r in ranks:
                del out[f"{r}{LM_HEAD}"]
        return out
