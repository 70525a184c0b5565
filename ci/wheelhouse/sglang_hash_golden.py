"""Write SGLang 0.5.14's own ``gpu_tensor_hash`` of fixed tensors to tests/data/sglang_tensor_hash.json.

    TRITON_INTERPRET=1 python ci/wheelhouse/sglang_hash_golden.py --sglang /tmp/sglsite [--out tests/data/...]

The answers that relax/weights/sglang_checksums.py must reproduce come from SGLang's Triton kernels
themselves (``sglang/srt/layers/multimodal.py``, loaded as a file: it imports only torch and triton). With
``TRITON_INTERPRET=1`` the kernels run on the CPU, so no GPU is needed; ``gpu_tensor_hash`` itself asserts
CUDA tensors, so its three steps (tile kernel, tree reduction, splitmix64) are driven here as it drives them.
On a GPU, tests/gpu/test_sglang_checksums_gpu.py calls ``gpu_tensor_hash`` directly.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
from pathlib import Path

import torch

# (dtype, number of elements, seed): odd byte counts, exactly one tile, one word past a tile, several tiles
CASES = [("bfloat16", 1, 1), ("uint8", 3, 2), ("uint8", 5, 3), ("float32", 8192, 4), ("bfloat16", 16386, 5),
         ("bfloat16", 40000, 6), ("float32", 70001, 7), ("int64", 9000, 8)]


def case_tensor(dtype: str, numel: int, seed: int) -> torch.Tensor:
    """The fixed tensor of a case: random bytes from a seeded generator, viewed as ``dtype``."""
    size = torch.empty(0, dtype=getattr(torch, dtype)).element_size() * numel
    raw = torch.randint(0, 256, (size,), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    return raw.view(getattr(torch, dtype))


def sglang_hash(mod, t: torch.Tensor, seed: int = 0x243F6A88, tile: int = 8192, chunk: int = 1024) -> int:
    tb = t.contiguous().reshape(-1).view(torch.uint8)
    pad = (4 - tb.numel() % 4) % 4
    tb = torch.cat([tb, tb.new_zeros(pad)]) if pad else tb
    u32 = tb.view(torch.uint32)
    n = u32.numel()
    grid = ((n + tile - 1) // tile,)
    partials = torch.empty(grid[0], dtype=torch.uint64)
    mod.hash_tiles32_kernel_blocked[grid](
        u32, partials, n, seed1=seed & 0xFFFFFFFF, seed2=((seed * 0x9E3779B1) ^ 0xDEADBEEF) & 0xFFFFFFFF,
        FM_C1=mod.FMIX32_C1, FM_C2=mod.FMIX32_C2, POS_A=mod.POS_C1, POS_B=mod.POS_C2, TILE=tile, BLOCK=256,
        USE_CG=False)
    cur = partials
    while cur.numel() > 1:
        nxt = torch.empty((cur.numel() + chunk - 1) // chunk, dtype=torch.uint64)
        mod.add_tree_reduce_u64_kernel[(nxt.numel(),)](cur, nxt, cur.numel(), CHUNK=chunk)
        cur = nxt
    return mod._final_splitmix64(int(cur.view(torch.int64).item()))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sglang", required=True, help="the site directory holding sglang 0.5.14")
    p.add_argument("--out", default="tests/data/sglang_tensor_hash.json")
    a = p.parse_args()
    path = Path(a.sglang) / "sglang/srt/layers/multimodal.py"
    spec = importlib.util.spec_from_file_location("sglang_multimodal", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rows = [{"dtype": d, "numel": n, "seed": s, "hash": f"{sglang_hash(mod, case_tensor(d, n, s)):016x}"}
            for d, n, s in CASES]
    Path(a.out).write_text(json.dumps({"source": "sglang 0.5.14 sglang/srt/layers/multimodal.py (TRITON_INTERPRET=1)",
                                       "command": "TRITON_INTERPRET=1 python ci/wheelhouse/sglang_hash_golden.py "
                                                  "--sglang /tmp/sglsite", "cases": rows}, indent=1) + "\n")
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
