"""The weight digest of relax/weights/checksum.py as one Triton kernel launch per device (CUDA).

Why: the torch formulation runs ~12 element-wise int64 kernels per tensor chunk (mix, positions, two
weighted products and sums), so a sync's 2 GB of bf16 took 35-51 ms per side on an H100, about as long
as the transfer it checks. This kernel reads every word once: each program takes one block of one
tensor (through a table of data pointers, so nothing is concatenated or copied), computes both
weighted sums of its words and writes them as a partial; one `index_add_` folds the partials per
tensor. Integer arithmetic wraps modulo 2**64 in both, so the digest equals the torch (and CPU) one
bit for bit (tests/gpu/test_checksum_gpu.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096  # words per program


@triton.jit
def _block_sums(ptr_table, nwords_table, block_tensor, block_first, partial_a, partial_b,
                a_mul, a_add, b_mul, b_add, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    t = tl.load(block_tensor + pid)
    first = tl.load(block_first + pid)
    base = tl.load(ptr_table + t).to(tl.pointer_type(tl.int64))
    n = tl.load(nwords_table + t)
    pos = first + tl.arange(0, BLOCK).to(tl.int64)
    inside = pos < n
    w = tl.load(base + pos, mask=inside, other=0)
    mixed = w ^ ((w >> 31) & 0x1FFFFFFFF)  # arithmetic shift, masked to 33 bits: the logical xor-shift
    wa = (pos * a_mul + a_add) | 1
    wb = (pos * b_mul + b_add) | 1
    tl.store(partial_a + pid, tl.sum(tl.where(inside, mixed * wa, 0), axis=0))
    tl.store(partial_b + pid, tl.sum(tl.where(inside, mixed * wb, 0), axis=0))


def digests(words: list[torch.Tensor], a: tuple[int, int], b: tuple[int, int]) -> torch.Tensor:
    """``[n, 2]`` int64 digests of int64 word tensors on one CUDA device; ``a``, ``b``: (multiplier, offset)."""
    device = words[0].device
    counts = [w.numel() for w in words]
    nblocks = torch.tensor([-(-c // BLOCK) for c in counts])
    block_tensor = torch.repeat_interleave(torch.arange(len(words)), nblocks)
    first_block = (nblocks.cumsum(0) - nblocks).repeat_interleave(nblocks)  # each tensor's first block index
    block_first = (torch.arange(block_tensor.numel()) - first_block) * BLOCK  # first word of every block
    ptrs = torch.tensor([w.data_ptr() for w in words], dtype=torch.int64)
    tables = [x.to(device, non_blocking=True) for x in (ptrs, torch.tensor(counts, dtype=torch.int64), block_tensor,
                                                        block_first)]
    total = int(block_tensor.numel())
    partial_a = torch.empty(total, dtype=torch.int64, device=device)
    partial_b = torch.empty(total, dtype=torch.int64, device=device)
    with torch.cuda.device(device):
        _block_sums[(total,)](*tables, partial_a, partial_b, a[0], a[1], b[0], b[1], BLOCK=BLOCK)
    owner = tables[2]
    sums = [torch.zeros(len(words), dtype=torch.int64, device=device).index_add_(0, owner, p)
            for p in (partial_a, partial_b)]
    return torch.stack(sums, dim=1)
