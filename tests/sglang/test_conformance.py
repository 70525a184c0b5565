"""Protocol fidelity against the real ``sglang`` package (where it is installed: the GPU image,
``nox -s sglang_conformance``). Skipped with a reason elsewhere (CI has no SGLang).

What is proven here, with SGLang's own code:
* the pinned ``ServerArgs`` option list (relax/backends/sglang/server_args.json) is the installed one,
  and the launcher's command parses with SGLang's own parser into the values it means;
* the request tables of relax/engine/protocol.py are ``io_struct``'s dataclasses and
  ``SamplingParams``' signature, field for field, with SGLang's defaults;
* every request body our client sends constructs the matching ``io_struct`` dataclass (and
  ``/generate``'s normalizes and verifies as SGLang's tokenizer manager does);
* our ``serialized_named_tensors`` items open with SGLang's ``MultiprocessingSerializer`` (its
  ``SafeUnpickler``) and rebuild with its ``FlattenedTensorBucket``, and SGLang's own items open with ours;
* our weight-update group and SGLang's ``init_custom_process_group`` form one group (gloo, two processes).

Importing ``sglang.srt.managers.io_struct`` pulls ``sgl_kernel``, whose CUDA ops cannot load where
there is no GPU driver (the image is built and tested on a CPU machine). When, and only when, that
import fails, `_import_sglang` puts an empty ``sgl_kernel`` module in its place: none of what these
tests check calls a kernel.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import importlib.abc
import importlib.machinery
import inspect
import json
import socket
import sys
import types
from argparse import Namespace

import pytest
import torch

from relax.backends.sglang.config import SGLangLaunchConfig

pytest.importorskip("sglang", reason="needs the sglang package (the GPU image: nox -s sglang_conformance)")
pytestmark = pytest.mark.sglang


class _KernelStub(types.ModuleType):
    """``sgl_kernel`` or one of its submodules without the CUDA library: importing any name works (SGLang
    imports kernels at module level), calling one raises, naming it."""

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Kernel(f"{self.__name__}.{attr}")


class _Kernel:
    """A name imported from the stub (a kernel, or a namespace such as ``scalar_types``): its attributes are
    more of the same; calling one raises."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str):
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Kernel(f"{self._name}.{attr}")

    def __call__(self, *args, **kwargs):
        raise RuntimeError(f"{self._name} called, but there is no GPU here")


class _KernelStubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname == "sgl_kernel" or fullname.startswith("sgl_kernel."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _KernelStub(spec.name)
        module.__path__ = []  # a package: its submodules come from this finder too
        return module

    def exec_module(self, module) -> None:
        pass


def _import_sglang():
    try:
        importlib.import_module("sglang.srt.managers.io_struct")
    except (ImportError, OSError) as exc:
        if "sgl_kernel" not in repr(exc) and "common_ops" not in repr(exc) and "libcuda" not in repr(exc) \
                and "nvrtc" not in repr(exc):
            raise
        for name in [m for m in sys.modules if m.startswith(("sgl_kernel", "sglang.srt"))]:
            del sys.modules[name]
        sys.meta_path.insert(0, _KernelStubFinder())
    modules = [importlib.import_module(f"sglang.srt.{m}") for m in (
        "managers.io_struct", "server_args", "sampling.sampling_params", "utils.common", "weight_sync.tensor_bucket")]
    return Namespace(io=modules[0], server_args=modules[1], sampling=modules[2], common=modules[3],
                     bucket=modules[4])


@pytest.fixture(scope="module")
def sgl():
    return _import_sglang()


# ---------------------------------------------------------------------- ServerArgs and the launcher
def _sglang_parser(sgl) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    sgl.server_args.ServerArgs.add_cli_args(parser)
    return parser


def test_pinned_option_list_is_the_installed_server_args(sgl) -> None:
    import sglang

    from relax.backends.sglang.server_args import PINNED

    pinned = json.loads(PINNED.read_text())
    assert pinned["sglang_version"] == sglang.__version__, "re-pin: python ci/pin_sglang_server_args.py <sglang dir>"
    live = {tuple(a.option_strings): a.dest for a in _sglang_parser(sgl)._actions if a.option_strings
            and a.dest != "help"}
    # the pin holds add_argument's own flags; argparse adds "--no-X" for a BooleanOptionalAction "--X"
    ours = {frozenset(o["flags"] + (["--no-" + f[2:] for f in o["flags"]] if "BooleanOptionalAction" in
                                    (o["action"] or "") else [])): o["dest"] for o in pinned["options"]}
    assert ours == {frozenset(f for f in k if f.startswith("--")): v for k, v in live.items()
                    if any(f.startswith("--") for f in k)}
    fields = {f.name for f in dataclasses.fields(sgl.server_args.ServerArgs)}
    assert set(pinned["fields"]) == fields


def test_launch_command_parses_with_sglangs_own_parser(sgl, monkeypatch) -> None:
    from relax.backends.sglang import launcher
    from relax.utils import machine_flags
    from relax.utils.arguments import parse_args

    monkeypatch.setattr(launcher, "sglang_available", lambda: True)
    monkeypatch.setattr(machine_flags, "has_gpu", lambda args: True)
    args = parse_args(["--prompt-data", "x.jsonl", "--rollout-batch-size", "2", "--num-rollout", "1",
                       "--hf-checkpoint", "/models/qwen", "--train-backend", "torch", "--device", "cuda",
                       "--rollout-backend", "sglang", "--offload-rollout", "--rollout-num-gpus-per-engine", "2",
                       "--resource", '{"actor": [1, 1], "rollout": [1, 2]}',
                       "--seed", "7", "--sglang-mem-fraction-static", "0.6", "--sglang-disable-radix-cache",
                       "--sglang-cuda-graph-bs", "1", "2", "4", "--sglang-log-level", "warning"])
    cmd = launcher.launch_command(SGLangLaunchConfig.from_args(args), engine_index=1, host="127.0.0.1", port=30001, nccl_port=30002, api_key="k")
    ns = _sglang_parser(sgl).parse_args(cmd[3:])
    assert (ns.model_path, ns.tensor_parallel_size, ns.random_seed, ns.port, ns.nccl_port, ns.api_key) == \
        ("/models/qwen", 2, 8, 30001, 30002, "k")
    assert ns.mem_fraction_static == 0.6 and ns.disable_radix_cache and ns.enable_memory_saver
    assert ns.cuda_graph_bs == [1, 2, 4] and ns.log_level == "warning" and ns.dtype == "float32"


# ---------------------------------------------------------------------- request tables
def test_protocol_tables_are_io_structs_fields_and_defaults(sgl) -> None:
    from relax.engine.protocol import ENDPOINTS, REQUIRED, SAMPLING_PARAMS

    for e in ENDPOINTS:
        if e.request is None:
            continue
        cls = getattr(sgl.io, e.request)
        theirs = {}
        for f in dataclasses.fields(cls):
            if f.default is not dataclasses.MISSING:
                theirs[f.name] = f.default
            elif f.default_factory is not dataclasses.MISSING:
                theirs[f.name] = f.default_factory()
            else:
                theirs[f.name] = REQUIRED
        assert theirs == e.fields, e.path
    signature = inspect.signature(sgl.sampling.SamplingParams.__init__)
    assert {n: p.default for n, p in signature.parameters.items() if n != "self"} == SAMPLING_PARAMS


def _capture(monkeypatch) -> list[tuple[str, str, object]]:
    sent: list[tuple[str, str, object]] = []

    async def fake_request(method, url, payload=None, **kwargs):
        sent.append((method, url.split("://", 1)[1].split("/", 1)[1], payload))
        return {"success": True, "message": "", "checksums": {}, "weight_version": "0"}

    monkeypatch.setattr("relax.engine.rollout.engine_client.request", fake_request)
    return sent


def test_every_client_request_constructs_its_io_struct(sgl, monkeypatch) -> None:
    from relax.engine.protocol import ENDPOINTS_BY_PATH
    from relax.engine.rollout.engine_client import EngineClient

    sent = _capture(monkeypatch)
    c = EngineClient("http://e:1")

    async def calls():
        await c.abort_request("r1")
        await c.abort_request(abort_all=True)
        await c.pause_generation("in_place")
        await c.continue_generation()
        await c.update_weights_from_tensor(["aGk="], load_format="flattened_bucket", flush_cache=False,
                                           weight_version=3)
        await c.update_weights_from_disk("/m", weight_version=2)
        await c.init_weights_update_group("127.0.0.1", 1234, 1, 2, group_name="g", backend="gloo")
        await c.update_weights_from_distributed(["w"], ["bfloat16"], [[2, 3]], group_name="g", flush_cache=True,
                                                weight_version=4, load_format="flattened_bucket")
        await c.destroy_weights_update_group("g")
        await c.weights_checker("snapshot")
        await c.release_memory_occupation(["weights", "kv_cache"])
        await c.resume_memory_occupation()

    asyncio.run(calls())
    assert len(sent) == 12
    for _method, path, body in sent:
        cls = getattr(sgl.io, ENDPOINTS_BY_PATH["/" + path].request)
        obj = cls(**body)  # the dataclass SGLang's FastAPI handler builds from the body
        for key, value in body.items():
            assert getattr(obj, key) == value, (path, key)


def test_rollout_generate_requests_normalize_and_verify_as_sglang_does(sgl) -> None:
    from relax.engine.rollout.config import RolloutConfig
    from relax.engine.rollout.engine_pool import _batched
    from relax.utils.arguments import parse_args

    cfg = RolloutConfig.from_args(parse_args(["--preset", "quickstart"])).replace(
        rollout_temperature=0.8, rollout_top_p=0.9, rollout_top_k=20, rollout_max_response_len=64,
        rollout_stop=["\n\n"], rollout_stop_token_ids=[2], rollout_skip_special_tokens=False)
    params = {k: v for k, v in cfg.sampling_params().items() if v is not None}
    singles = [{"input_ids": [1, 2, 3 + i], "sampling_params": {**params, "sampling_seed": 100 + i},
                "return_logprob": True} for i in range(4)]
    for body in [singles[0], _batched(singles)]:
        req = sgl.io.GenerateReqInput(**json.loads(json.dumps(body)))
        req.normalize_batch_and_arguments()
        for sp in ([req.sampling_params] if isinstance(req.sampling_params, dict) else req.sampling_params):
            sampling = sgl.sampling.SamplingParams(**sp)
            sampling.normalize(None)
            sampling.verify(vocab_size=1000)


# ---------------------------------------------------------------------- weight payloads
def test_our_flattened_bucket_opens_with_sglangs_serializer_and_bucket(sgl) -> None:
    from relax.weights import serialized_tensors as payload

    named = [("a", torch.randn(3, 4)), ("b", torch.arange(6, dtype=torch.int64)), ("c", torch.ones(5).bfloat16())]
    flat, entries = payload.flatten_into(torch.empty(1024, dtype=torch.uint8), named)
    obj = sgl.common.MultiprocessingSerializer.deserialize(payload.encode_flattened_bucket(flat, entries))
    meta = [sgl.bucket.FlattenedTensorMetadata(name=m.name, shape=m.shape, dtype=m.dtype, start_idx=m.start_idx,
                                               end_idx=m.end_idx, numel=m.numel) for m in obj["metadata"]]
    rebuilt = dict(sgl.bucket.FlattenedTensorBucket(flattened_tensor=obj["flattened_tensor"],
                                                    metadata=meta).reconstruct_tensors())
    assert all(torch.equal(rebuilt[n], t) for n, t in named)
    plain = sgl.common.MultiprocessingSerializer.deserialize(payload.encode_named_tensors(named))
    assert [n for n, _ in plain] == ["a", "b", "c"] and all(torch.equal(t, dict(named)[n]) for n, t in plain)


def test_sglangs_own_items_open_with_ours(sgl) -> None:
    from relax.weights import serialized_tensors as payload

    named = [("a", torch.randn(2, 2)), ("b", torch.randn(3))]
    bucket = sgl.bucket.FlattenedTensorBucket(named_tensors=named)
    item = sgl.common.MultiprocessingSerializer.serialize(
        {"flattened_tensor": bucket.get_flattened_tensor(), "metadata": bucket.get_metadata()}, output_str=True)
    out = dict(payload.named_tensors(payload.decode(item), "flattened_bucket"))
    assert all(torch.equal(out[n], t) for n, t in named)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sglang_rank(port: int, queue) -> None:
    """An SGLang-side member (rank 1): init_custom_process_group, receives one broadcast."""
    import torch.distributed as dist

    sgl = _import_sglang()
    group = sgl.common.init_custom_process_group(backend="gloo", init_method=f"tcp://127.0.0.1:{port}",
                                                 world_size=2, rank=1, group_name="relax-interop")
    t = torch.zeros(6)
    dist.broadcast(t, src=0, group=group)
    queue.put(t.tolist())


def test_our_weight_group_and_sglangs_form_one_group() -> None:
    import multiprocessing as mp

    from relax.weights.update_group import WeightUpdateGroup

    port = _free_port()
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_sglang_rank, args=(port, queue))
    proc.start()
    group = WeightUpdateGroup("127.0.0.1", port, 0, 2, group_name="relax-interop", backend="gloo", timeout_s=120)
    try:
        group.broadcast([torch.arange(6, dtype=torch.float32)])
        assert queue.get(timeout=120) == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]
    finally:
        group.close()
        proc.join(timeout=60)
    assert proc.exitcode == 0
