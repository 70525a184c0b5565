"""An L2 prefetch for Triton kernels launched with programmatic dependent launch (`relax.backends.embedded.pdl`).

Why: a PDL kernel becomes resident while the kernel before it still runs, then waits in ``gdc_wait``. What
it will read that no earlier kernel of the step writes (a projection's weights, the cache positions a row
already holds) it can ask for during that wait, so its loads after the wait find the bytes in L2 instead
of paying the HBM latency and transfer after the kernel before it ends. ``prefetch.global.L2`` is a hint:
it changes no value (L2 is where the GPU's writes meet, so a line fetched early and written later is
read as written), which is also why the addresses need no mask, only to stay inside the tensor.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def prefetch_l2(ptrs):
    """Ask L2 for the 128-byte line of each address of ``ptrs`` (any shape); returns nothing useful."""
    tl.inline_asm_elementwise("prefetch.global.L2 [$1];\n\tmov.u32 $0, 0;", "=r,l", [ptrs], dtype=tl.int32,
                              is_pure=False, pack=1)
