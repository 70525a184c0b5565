"""SGLang's ``serialized_named_tensors``: how ``/update_weights_from_tensor`` carries tensors, both ends.

SGLang (``MultiprocessingSerializer``, ``tp_worker.update_weights_from_tensor``) expects one item per
tensor-parallel rank: base64 of a ``multiprocessing.reduction.ForkingPickler`` dump, so a tensor travels
as a handle to memory the sender shares, never as bytes: a CUDA tensor as a CUDA IPC handle (the
colocate path: engine and trainer on one GPU), a host tensor as a shared-memory file descriptor passed
over a local socket (same host). Two object shapes, chosen by ``load_format``:

* ``None`` / ``"direct"``: a list of ``(name, tensor)`` pairs;
* ``"flattened_bucket"``: ``{"flattened_tensor": uint8 tensor, "metadata": [...]}``, every tensor's bytes
  back to back; each metadata entry has ``name, shape, dtype, start_idx, end_idx, numel`` (byte offsets),
  SGLang's ``FlattenedTensorMetadata``. We send ``types.SimpleNamespace`` entries: the receiver reads
  only those attributes, SGLang's own ``SafeUnpickler`` admits ``types.``, and the sender needs no
  ``sglang`` installed.

CUDA devices are named by GPU UUID, as SGLang's ``monkey_patch_torch_reductions`` does: the two
processes may see the same GPU under different indices (Ray gives each actor its own
``CUDA_VISIBLE_DEVICES``). The receiver maps the UUID back to its own index.

Unpickling is restricted to the constructors these payloads need (`_PayloadUnpickler`), so a request
body cannot run arbitrary code. The sender must keep the shared memory alive, and unchanged, until
the receiver has copied it (`relax.weights.transports`).
"""

from __future__ import annotations

import base64
import binascii
import io
import pickle
import types
from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch.multiprocessing import reductions

NamedTensors = list[tuple[str, torch.Tensor]]
LOAD_FORMATS = (None, "direct", "flattened_bucket")
_DEVICE_ARG = 6  # storage_device in the arguments of torch.multiprocessing.reductions.rebuild_cuda_tensor


# ---------------------------------------------------------------------- flattened buckets
@dataclass(frozen=True)
class TensorEntry:
    """SGLang's ``FlattenedTensorMetadata``: where one tensor's bytes sit in a flattened bucket."""

    name: str
    shape: torch.Size
    dtype: torch.dtype
    start_idx: int
    end_idx: int
    numel: int  # bytes, as SGLang counts them (the uint8 view's numel)


def layout(named: Iterable[tuple[str, torch.Tensor]]) -> list[TensorEntry]:
    """The flattened-bucket layout of ``named``: byte ranges back to back, in order."""
    entries, at = [], 0
    for name, t in named:
        nbytes = t.numel() * t.element_size()
        entries.append(TensorEntry(name, torch.Size(t.shape), t.dtype, at, at + nbytes, nbytes))
        at += nbytes
    return entries


def aligned_order(named: Iterable[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
    """``named`` with wider elements first (stable). The layout has no padding (receivers compute offsets by
    summing sizes), and a dtype view needs an offset its element size divides: with 8-byte tensors first,
    then 4-, 2- and 1-byte ones, every offset is a multiple of its tensor's element size."""
    return sorted(named, key=lambda item: -item[1].element_size())


def flatten_into(buffer: torch.Tensor, named: list[tuple[str, torch.Tensor]]) -> tuple[torch.Tensor, list[TensorEntry]]:
    """Copy ``named`` (in `aligned_order`) into the front of the uint8 ``buffer`` (one multi-tensor copy);
    (the used view, layout)."""
    named = aligned_order(named)
    entries = layout(named)
    used = entries[-1].end_idx if entries else 0
    if used > buffer.numel():
        raise ValueError(f"bucket of {used} bytes does not fit the {buffer.numel()}-byte buffer")
    flat = buffer[:used]
    if named:
        torch._foreach_copy_([flat[e.start_idx:e.end_idx].view(e.dtype).view(e.shape) for e in entries],
                             [t.detach() for _, t in named])
    return flat, entries


def unflatten(flat: torch.Tensor, entries: Iterable) -> NamedTensors:
    """Views into ``flat`` by name (SGLang's ``FlattenedTensorBucket.reconstruct_tensors``)."""
    return [(e.name, flat[e.start_idx:e.end_idx].view(e.dtype).reshape(e.shape)) for e in entries]


# ---------------------------------------------------------------------- sender
class _UuidPickler(pickle.Pickler):
    """ForkingPickler's reductions (shared memory, CUDA IPC) with CUDA devices named by GPU UUID."""

    def __init__(self, file) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.dispatch_table = _forking_table()

    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor) and obj.is_cuda:
            rebuild, args = reductions.reduce_tensor(obj)
            args = list(args)
            args[_DEVICE_ARG] = str(torch.cuda.get_device_properties(args[_DEVICE_ARG]).uuid)
            return rebuild, tuple(args)
        if isinstance(obj, TensorEntry):  # SGLang's receiver reads these attributes only
            return types.SimpleNamespace, (), dict(vars(obj))
        return NotImplemented


def _forking_table() -> dict:
    """copyreg's table plus ForkingPickler's extra reducers (where torch registers its tensor/storage sharing),
    with host storages shared by name (`_share_storage_by_name`)."""
    import copyreg
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing  # noqa: F401 - registers torch's reductions with ForkingPickler

    return {**copyreg.dispatch_table, **ForkingPickler._extra_reducers,  # noqa: SLF001
            torch.UntypedStorage: _share_storage_by_name}


def share_host_buffer(t: torch.Tensor) -> None:
    """Move a host tensor's storage into a named shared-memory segment now (a no-op once it is there, and for
    CUDA tensors), so that encoding it later neither copies it nor moves it under a concurrent reader."""
    if t.device.type == "cpu":
        t.untyped_storage()._share_filename_cpu_()  # noqa: SLF001 - what `_share_storage_by_name` calls


def _share_storage_by_name(storage: torch.UntypedStorage):
    """torch's ``file_system`` sharing of a host storage (torch.multiprocessing.reductions.reduce_storage): a
    named shared-memory segment any process on the host can open. The default ``file_descriptor`` strategy
    hands the fd over a socket guarded by the sender's multiprocessing authkey, which an engine started
    apart from the trainer does not share."""
    if storage.device.type != "cpu":
        raise ValueError(f"cannot share a {storage.device.type} storage by name")
    metadata = storage._share_filename_cpu_()  # noqa: SLF001 - the reduction torch itself uses
    storage._shared_incref()  # noqa: SLF001
    reductions.shared_cache[metadata[1]] = reductions.StorageWeakRef(storage)
    return reductions.rebuild_storage_filename, (type(storage), *metadata)


def encode(obj) -> str:
    """One ``serialized_named_tensors`` item: base64 of the pickled payload (SGLang's ``output_str=True``)."""
    buf = io.BytesIO()
    _UuidPickler(buf).dump(obj)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def encode_flattened_bucket(flat: torch.Tensor, entries: list[TensorEntry]) -> str:
    return encode({"flattened_tensor": flat, "metadata": list(entries)})


def encode_named_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    return encode([(name, t) for name, t in named])


# ---------------------------------------------------------------------- receiver
def _local_cuda_index(device) -> int:
    """A UUID (SGLang's patched reduction) or an index (torch's own) -> this process's index of that GPU."""
    if isinstance(device, int):
        return device
    want = str(device).removeprefix("GPU-")
    for i in range(torch.cuda.device_count()):
        if str(torch.cuda.get_device_properties(i).uuid).removeprefix("GPU-") == want:
            return i
    raise ValueError(f"serialized tensor on GPU {device}: this engine does not see that GPU (CUDA IPC needs the "
                     "sender and the engine on one machine and GPU; use /update_weights_from_distributed)")


def _rebuild_cuda_tensor(*args):
    args = list(args)
    args[_DEVICE_ARG] = _local_cuda_index(args[_DEVICE_ARG])
    return reductions.rebuild_cuda_tensor(*args)


_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8,
    torch.uint8, torch.bool, torch.float8_e4m3fn, torch.float8_e5m2)}


class _PayloadUnpickler(pickle.Unpickler):
    """Admits only what tensor payloads are made of (SGLang's SafeUnpickler is broader: all of ``torch.``)."""

    _ALLOWED = {
        ("torch.multiprocessing.reductions", "rebuild_cuda_tensor"): _rebuild_cuda_tensor,
        ("torch.multiprocessing.reductions", "rebuild_tensor"): reductions.rebuild_tensor,
        ("torch.multiprocessing.reductions", "rebuild_storage_fd"): reductions.rebuild_storage_fd,
        ("torch.multiprocessing.reductions", "rebuild_storage_filename"): reductions.rebuild_storage_filename,
        ("torch.multiprocessing.reductions", "rebuild_typed_storage"): reductions.rebuild_typed_storage,
        ("torch.storage", "UntypedStorage"): torch.UntypedStorage,
        ("torch", "UntypedStorage"): torch.UntypedStorage,
        ("torch.storage", "TypedStorage"): torch.TypedStorage,  # the storage class a CUDA tensor's reduction names
        ("torch", "TypedStorage"): torch.TypedStorage,
        ("torch", "Size"): torch.Size,
        ("torch", "Tensor"): torch.Tensor,
        ("torch.nn.parameter", "Parameter"): torch.nn.Parameter,
        ("types", "SimpleNamespace"): types.SimpleNamespace,
        ("builtins", "list"): list, ("builtins", "tuple"): tuple, ("builtins", "dict"): dict,
        ("sglang.srt.weight_sync.tensor_bucket", "FlattenedTensorMetadata"): TensorEntry,
    }

    def find_class(self, module: str, name: str):
        if module == "torch" and name in _DTYPES:
            return _DTYPES[name]
        if (module, name) == ("multiprocessing.resource_sharer", "DupFd"):
            from multiprocessing.resource_sharer import DupFd

            return DupFd
        if (module, name) == ("copyreg", "_reconstructor"):
            import copyreg

            return copyreg._reconstructor  # noqa: SLF001 - only ever rebuilds the classes admitted here
        if (module, name) == ("builtins", "object"):
            return object
        found = self._ALLOWED.get((module, name))
        if found is None:
            raise ValueError(f"serialized tensor payload refers to {module}.{name}, which a weight payload does "
                             "not contain (refused)")
        return found


def decode(item: str | bytes) -> object:
    """Unpickle one ``serialized_named_tensors`` item (base64 text, as JSON carries it, or raw bytes)."""
    try:
        raw = base64.b64decode(item, validate=True) if isinstance(item, str) else bytes(item)
    except (binascii.Error, ValueError, TypeError) as exc:
        raise ValueError(f"serialized_named_tensors item is not base64: {exc}") from None
    try:
        return _PayloadUnpickler(io.BytesIO(raw)).load()
    except ValueError:
        raise
    except Exception as exc:  # noqa: BLE001 - a malformed or stale payload (e.g. its sender is gone)
        raise ValueError(f"serialized_named_tensors item cannot be opened: {type(exc).__name__}: {exc}") from None


def named_tensors(obj: object, load_format: str | None) -> NamedTensors:
    """The ``(name, tensor)`` pairs of a decoded item, by ``load_format``; ValueError naming what is wrong."""
    if load_format not in LOAD_FORMATS:
        raise ValueError(f"load_format {load_format!r} is not implemented by this engine "
                         f"(one of {', '.join(str(f) for f in LOAD_FORMATS)})")
    if load_format == "flattened_bucket":
        if not isinstance(obj, dict) or set(obj) != {"flattened_tensor", "metadata"}:
            raise ValueError("load_format flattened_bucket: the item must hold {flattened_tensor, metadata}")
        flat, entries = obj["flattened_tensor"], obj["metadata"]
        if not isinstance(flat, torch.Tensor) or flat.dtype != torch.uint8 or flat.dim() != 1:
            raise ValueError("load_format flattened_bucket: flattened_tensor must be a 1-D uint8 tensor")
        for e in entries:
            if not all(hasattr(e, k) for k in ("name", "shape", "dtype", "start_idx", "end_idx")):
                raise ValueError("load_format flattened_bucket: a metadata entry lacks name/shape/dtype/start_idx/"
                                 "end_idx")
            if not 0 <= e.start_idx <= e.end_idx <= flat.numel():
                raise ValueError(f"load_format flattened_bucket: {e.name} lies outside the flattened tensor")
        return unflatten(flat, entries)
    if not isinstance(obj, list) or not all(
            isinstance(x, tuple | list) and len(x) == 2 and isinstance(x[0], str) and isinstance(x[1], torch.Tensor)
            for x in obj):
        raise ValueError("serialized_named_tensors item must hold a list of (name, tensor) pairs")
    return [(name, t) for name, t in obj]
