"""`DeviceRegion`: device memory whose address survives a release (CUDA VMM through the driver API).

The GPU tests run on the GPU machine (``pytest -m gpu tests/test_device_region.py``); on a machine without CUDA
the region must say it is unavailable, and callers keep the caching allocator.
"""

from __future__ import annotations

import gc

import pytest
import torch

from relax.backends.embedded import device_region
from relax.backends.embedded.device_region import DeviceRegion, available, held_bytes

MIB = 1 << 20


def test_no_region_off_cuda() -> None:
    assert not available(torch.device("cpu"))
    assert held_bytes(torch.device("cpu")) == 0
    with pytest.raises(RuntimeError, match="no CUDA virtual memory management on cpu"):
        DeviceRegion(MIB, torch.device("cpu"))


@pytest.fixture
def dev() -> torch.device:
    """The current CUDA device with VMM, earlier tests' garbage collected and their cached blocks returned."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    device = torch.device("cuda", torch.cuda.current_device())
    if not available(device):
        pytest.skip("this driver has no CUDA virtual memory management")
    gc.collect()
    torch.cuda.empty_cache()
    return device


@pytest.mark.gpu
def test_release_returns_the_memory_and_restore_keeps_the_address(dev: torch.device) -> None:
    held0 = held_bytes(dev)
    region = DeviceRegion(64 * MIB + 5, dev)
    assert region.nbytes >= 64 * MIB + 5 and region.mapped
    assert held_bytes(dev) - held0 == region.nbytes
    a = region.tensor(0, 4 * MIB).view(torch.float32)
    b = region.tensor(32 * MIB, 4 * MIB).view(torch.float32)
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()  # storages of their own: no aliases
    assert b.data_ptr() - a.data_ptr() == 32 * MIB and a.data_ptr() == region.address
    a.fill_(1.5)
    b.copy_(torch.arange(b.numel(), device=dev, dtype=torch.float32))
    assert float(a.sum()) == 1.5 * a.numel() and float(b[-1]) == b.numel() - 1
    address = a.data_ptr()
    free = torch.cuda.mem_get_info()[0]
    region.release()
    assert not region.mapped and held_bytes(dev) == held0
    assert torch.cuda.mem_get_info()[0] - free >= region.nbytes  # back with the driver
    with pytest.raises(ValueError, match="outside this"):
        region.tensor(region.nbytes - 8, 16)
    region.restore()
    again = region.tensor(0, 4 * MIB).view(torch.float32)
    assert again.data_ptr() == address and torch.cuda.mem_get_info()[0] <= free
    again.fill_(2.0)  # the new physical memory is usable at the old address, through old and new tensors alike
    assert float(a.sum()) == 2.0 * a.numel()
    # a CUDA graph captured before the release writes into the memory mapped after it
    out = region.tensor(8 * MIB, 4).view(torch.float32)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(a[:1] * 3)
    region.release()
    region.restore()
    a.fill_(7.0)
    graph.replay()
    torch.cuda.synchronize()
    assert float(out[0]) == 21.0
    del a, b, again, out, graph
    gc.collect()
    assert held_bytes(dev) - held0 == region.nbytes  # the region itself still holds its memory
    del region
    gc.collect()
    assert held_bytes(dev) == held0  # the last reference went: unmapped and unreserved


@pytest.mark.gpu
def test_tensors_keep_their_region_alive(dev: torch.device) -> None:
    held0 = held_bytes(dev)
    t = DeviceRegion(MIB, dev).tensor(0, MIB)  # the region object itself is gone at once
    gc.collect()
    t.fill_(3)
    assert int(t.sum()) == 3 * MIB and held_bytes(dev) - held0 >= MIB
    regions = [r for r in device_region._LIVE if r.address == t.data_ptr()]
    assert len(regions) == 1
    del t, regions
    gc.collect()
    assert held_bytes(dev) == held0
