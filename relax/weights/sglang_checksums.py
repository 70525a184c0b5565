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

Scope: dense Llama/Qwen-family models and Qwen2.5-VL on a one-rank engine (``--rollout-num-gpus-per-engine 1``). A
tensor-parallel engine reports one rank's shards, and a MoE engine its experts fused per layer: those
targets are recorded as unverified, with the reason (`unverifiable`).
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


def unverifiable(model_names: list[str] | None, tp_size: int) -> str | None:
    """Why a stock SGLang engine's checksums cannot be matched, or None when they can."""
    if tp_size != 1:
        return (f"a stock SGLang engine of {tp_size} tensor-parallel ranks: its /weights_checker hashes each rank's "
                "shards, which the trainer does not compute (one-rank engines only)")
    if model_names and any(".experts." in n for n in model_names):
        return "a stock SGLang MoE engine: its /weights_checker hashes experts fused per layer (dense models only)"
    return None


class SGLangLayoutChecksums:
    """Fed the HF-named tensors of a sync bucket by bucket; gives SGLang's checksums of SGLang's parameters.

    Unstacked tensors are hashed as they come; the parts of a stacked parameter are kept (copied: the
    bucket's buffer is reused) until the last part arrives, then stacked in SGLang's order and hashed.
    """

    def __init__(self) -> None:
        self.checksums: dict[str, str] = {}
        self._parts: dict[str, dict[int, torch.Tensor]] = {}
        self._sizes: dict[str, int] = {}

    def add(self, named: list[tuple[str, torch.Tensor]]) -> None:
        for name, t in named:
            m = _STACKED_NAME.match(name)
            if name in (EMBEDDING, LM_HEAD):
                self.checksums[name] = hex_hash(pad_vocab(t))
                continue
            if m is None:
                self.checksums[_VISION_QKV.sub(r"\1qkv_proj.\2", name)] = hex_hash(t)
                continue
            prefix, part, kind = m.groups()
            fused, position = STACKED[part]
            key = f"{prefix}{fused}.{kind}"
            self._sizes[key] = 3 if fused == "qkv_proj" else 2
            parts = self._parts.setdefault(key, {})
            parts[position] = t.detach().clone()
            if len(parts) == self._sizes[key]:
                self.checksums[key] = hex_hash(torch.cat([parts[i] for i in range(len(parts))]))
                del self._parts[key]

    def result(self) -> dict[str, str]:
        """The checksums under SGLang's names. A tied ``lm_head`` (bytes equal to the embedding's: the trainer
        lists it as HF does) is the embedding itself in SGLang, so it is not listed twice."""
        if self._parts:
            missing = {key: sorted(set(range(self._sizes[key])) - set(parts)) for key, parts in self._parts.items()}
            raise ValueError(f"incomplete stacked parameters after the sync (key: missing parts): {missing}")
        out = dict(self.checksums)
        if LM_HEAD in out and out.get(EMBEDDING) == out[LM_HEAD]:
            del out[LM_HEAD]
        return out
