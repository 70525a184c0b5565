"""Device memory at a virtual address that survives a memory release: CUDA's virtual memory management.

Why: the lean runner's decode CUDA graphs hold the addresses of its weight buffer and KV cache. A colocate
step releases both (SGLang's ``/release_memory_occupation``) and takes them back before the next rollout;
through the caching allocator (``cudaFree`` / ``cudaMalloc``) they return wherever the driver puts them,
and a CUDA-IPC weight sync in between (which maps the trainer's buffers into the engine's address space)
or any other allocation moves them. Every move costs a graph capture: ~20 ms of bench-270m's ~0.19 s
generate on the H100 (`ci/bench_engine.py`'s ``resumed_captures``, one after each resume). SGLang keeps
its graphs valid across a release the same way (its memory saver): the address range is reserved once,
and a release unmaps and frees only the physical memory behind it (``cuMemUnmap`` + ``cuMemRelease``);
a restore creates new physical memory and maps it at the same addresses. The memory really goes back to
the driver, where another process (the colocated trainer) can allocate it.

A `DeviceRegion` hands out tensors over byte ranges of itself (`tensor`), each a storage of its own
(not views of one tensor: torch.compile treats views of one storage as aliases), that keep the region
alive. The caching allocator does not count this memory (``torch.cuda.memory_allocated``), so
`held_bytes` adds the mapped regions of a device to it.

Driver calls go through ``ctypes`` to ``libcuda`` (nothing to build or install); `available` says whether
the device supports them, and callers keep the caching allocator where it does not (the CPU, or a
driver without virtual memory management).
"""

from __future__ import annotations

import ctypes
import functools
import threading
import weakref

import torch

_VMM_SUPPORTED_ATTRIBUTE = 102  # CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
_PINNED, _ON_DEVICE, _READ_WRITE = 1, 1, 3  # allocation type, location type, access flags
_RECOMMENDED_GRANULARITY = 1


class _Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class _AllocFlags(ctypes.Structure):
    _fields_ = [("compressionType", ctypes.c_ubyte), ("gpuDirectRDMACapable", ctypes.c_ubyte),
                ("usage", ctypes.c_ushort), ("reserved", ctypes.c_ubyte * 4)]


class _AllocationProp(ctypes.Structure):  # CUmemAllocationProp
    _fields_ = [("type", ctypes.c_int), ("requestedHandleTypes", ctypes.c_int), ("location", _Location),
                ("win32HandleMetaData", ctypes.c_void_p), ("allocFlags", _AllocFlags)]


class _AccessDesc(ctypes.Structure):  # CUmemAccessDesc
    _fields_ = [("location", _Location), ("flags", ctypes.c_int)]


@functools.cache
def _driver() -> ctypes.CDLL | None:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    u64, size_t = ctypes.c_uint64, ctypes.c_size_t
    signatures = {
        "cuDeviceGetAttribute": [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int],
        "cuMemGetAllocationGranularity": [ctypes.POINTER(size_t), ctypes.POINTER(_AllocationProp), ctypes.c_int],
        "cuMemAddressReserve": [ctypes.POINTER(u64), size_t, size_t, u64, ctypes.c_ulonglong],
        "cuMemAddressFree": [u64, size_t],
        "cuMemCreate": [ctypes.POINTER(u64), size_t, ctypes.POINTER(_AllocationProp), ctypes.c_ulonglong],
        "cuMemRelease": [u64],
        "cuMemMap": [u64, size_t, size_t, u64, ctypes.c_ulonglong],
        "cuMemUnmap": [u64, size_t],
        "cuMemSetAccess": [u64, size_t, ctypes.POINTER(_AccessDesc), size_t],
        "cuGetErrorName": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
    }
    try:
        for name, argtypes in signatures.items():
            fn = getattr(lib, name)
            fn.argtypes, fn.restype = argtypes, ctypes.c_int
    except AttributeError:
        return None
    return lib


def _check(result: int, call: str) -> None:
    if result != 0:
        name = ctypes.c_char_p()
        _driver().cuGetErrorName(result, ctypes.byref(name))
        raise RuntimeError(f"{call} failed: {(name.value or b'CUDA error').decode()} ({result})")


def _prop(index: int) -> _AllocationProp:
    prop = _AllocationProp()
    prop.type, prop.location.type, prop.location.id = _PINNED, _ON_DEVICE, index
    return prop


@functools.cache
def _granularity(index: int) -> int:
    out = ctypes.c_size_t()
    _check(_driver().cuMemGetAllocationGranularity(ctypes.byref(out), ctypes.byref(_prop(index)),
                                                   _RECOMMENDED_GRANULARITY), "cuMemGetAllocationGranularity")
    return int(out.value)


@functools.cache
def _supported(index: int) -> bool:
    lib = _driver()
    if lib is None:
        return False
    value = ctypes.c_int()
    return lib.cuDeviceGetAttribute(ctypes.byref(value), _VMM_SUPPORTED_ATTRIBUTE, index) == 0 and value.value == 1


def available(device: torch.device) -> bool:
    """Whether `DeviceRegion` works on ``device``: a CUDA device whose driver has virtual memory management."""
    return device.type == "cuda" and torch.cuda.is_available() and _supported(_index(device))


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


_LIVE: weakref.WeakSet[DeviceRegion] = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


def held_bytes(device: torch.device) -> int:
    """CUDA memory this process holds on ``device``: the caching allocator's plus every mapped region's."""
    if device.type != "cuda":
        return 0
    index = _index(device)
    with _LIVE_LOCK:
        mapped = sum(r.nbytes for r in _LIVE if r.mapped and r.index == index)
    return int(torch.cuda.memory_allocated(index)) + mapped


class _Slice:
    """``__cuda_array_interface__`` of bytes ``[offset, offset + nbytes)`` of a region; the tensor torch builds over
    it holds this object, which holds the region."""

    def __init__(self, region: DeviceRegion, offset: int, nbytes: int):
        self.region = region
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (region.address + offset, False),
                                         "version": 2}


class DeviceRegion:
    """``nbytes`` (rounded up to the driver's granularity) of device memory whose address outlives `release`."""

    def __init__(self, nbytes: int, device: torch.device):
        if not available(device):
            raise RuntimeError(f"no CUDA virtual memory management on {device}")
        self.index = _index(device)
        self.device = torch.device("cuda", self.index)
        step = _granularity(self.index)
        self.nbytes = max(-(-nbytes // step) * step, step)
        torch.cuda.synchronize(self.device)  # the runtime's primary context is current on this thread from here on
        address = ctypes.c_uint64()
        _check(_driver().cuMemAddressReserve(ctypes.byref(address), self.nbytes, step, 0, 0), "cuMemAddressReserve")
        self.address = int(address.value)
        self._handle: int | None = None
        try:
            self.restore()
        except BaseException:
            _driver().cuMemAddressFree(self.address, self.nbytes)
            raise
        with _LIVE_LOCK:
            _LIVE.add(self)

    @property
    def mapped(self) -> bool:
        return self._handle is not None

    def tensor(self, offset: int, nbytes: int) -> torch.Tensor:
        """A uint8 tensor over bytes ``[offset, offset + nbytes)``, a storage of its own."""
        if offset < 0 or nbytes < 0 or offset + nbytes > self.nbytes:
            raise ValueError(f"bytes [{offset}, {offset + nbytes}) are outside this {self.nbytes}-byte region")
        return torch.as_tensor(_Slice(self, offset, nbytes), device=self.device)

    def release(self) -> None:
        """Give the physical memory back to the driver; the addresses stay reserved. Every kernel that used it
        has finished (synchronized here); its tensors must not be read or written until `restore`."""
        if self._handle is None:
            return
        torch.cuda.synchronize(self.device)
        lib = _driver()
        _check(lib.cuMemUnmap(self.address, self.nbytes), "cuMemUnmap")
        handle, self._handle = self._handle, None
        _check(lib.cuMemRelease(handle), "cuMemRelease")

    def restore(self) -> None:
        """New physical memory (uninitialised) at the same addresses; a no-op while mapped."""
        if self._handle is not None:
            return
        lib = _driver()
        handle = ctypes.c_uint64()
        _check(lib.cuMemCreate(ctypes.byref(handle), self.nbytes, ctypes.byref(_prop(self.index)), 0), "cuMemCreate")
        try:
            _check(lib.cuMemMap(self.address, self.nbytes, 0, handle.value, 0), "cuMemMap")
            access = _AccessDesc()
            access.location.type, access.location.id, access.flags = _ON_DEVICE, self.index, _READ_WRITE
            _check(lib.cuMemSetAccess(self.address, self.nbytes, ctypes.byref(access), 1), "cuMemSetAccess")
        except BaseException:
            lib.cuMemUnmap(self.address, self.nbytes)
            lib.cuMemRelease(handle.value)
            raise
        self._handle = int(handle.value)

    def __del__(self) -> None:  # the last tensor over it is gone: physical memory and the address range go back
        lib = _driver()
        if lib is None or not hasattr(self, "address"):
            return
        if self._handle is not None:
            try:
                torch.cuda.synchronize(self.device)  # a kernel queued before the last tensor went may still use it
            except Exception:  # noqa: BLE001 - interpreter shutdown: the process's mappings go with it
                return
            lib.cuMemUnmap(self.address, self.nbytes)
            lib.cuMemRelease(self._handle)
            self._handle = None
        lib.cuMemAddressFree(self.address, self.nbytes)
