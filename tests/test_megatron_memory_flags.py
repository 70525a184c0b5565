"""Activation recompute and optimizer CPU offload on the Megatron backend, the CPU half.

The flag -> megatron-core field mapping (relax/backends/megatron/memory_flags.py), the parse-time
refusals (relax/utils/validation.py ``_megatron_memory``), megatron-core's own config checks those
refusals mirror, and a real fp32 GPTModel on CPU: recompute gives bitwise-equal gradients, and a
frozen embedding would silently cut full recompute's gradients without the backend's hook.
The GPU half (bf16 training steps, peak memory, the offloaded optimizer) is
tests/gpu/test_megatron_memory_flags_gpu.py.
"""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path

import pytest
import torch

from relax.backends.megatron import memory_flags
from relax.backends.megatron.checks import module_available
from relax.backends.megatron.megatron_config import MegatronConfig
from relax.backends.megatron.memory_flags import (
    make_embedding_output_differentiable,
    optimizer_offload_kwargs,
    recompute_kwargs,
)
from relax.utils.arguments import parse_args
from relax.utils.flag_table import FLAGS_BY_NAME
from relax.utils.flag_types import ConfigError
from tests.e2e_helpers import pretend_gpu_machine

BASE = ["--prompt-data", "x.jsonl", "--rollout-batch-size", "2", "--num-rollout", "1"]
OFFLOAD = ["--use-distributed-optimizer", "--use-precision-aware-optimizer", "--optimizer-cpu-offload"]
FLAG_NAMES = ("recompute-granularity", "recompute-method", "recompute-num-layers", "optimizer-cpu-offload",
              "overlap-cpu-optimizer-d2h-h2d", "use-precision-aware-optimizer")
needs_mcore = pytest.mark.skipif(not module_available("megatron.core"), reason="needs megatron-core")


def _ns(**kw) -> MegatronConfig:
    """The Megatron slice of the default flags, with ``kw`` changed."""
    return MegatronConfig.from_args(parse_args(BASE)).replace(**kw)


@pytest.fixture
def gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parse as on the GPU machine: CUDA and megatron-core there (CPU CI has neither)."""
    pretend_gpu_machine(monkeypatch)


def _megatron(*flags: str) -> Namespace:
    return parse_args([*BASE, "--train-backend", "megatron", *flags])


# ---------------------------------------------------------------------- flags -> megatron-core fields
def test_recompute_kwargs() -> None:
    assert recompute_kwargs(_ns()) == {}
    assert recompute_kwargs(_ns(recompute_granularity="selective")) == {
        "recompute_granularity": "selective", "recompute_modules": ["core_attn"]}
    full = _ns(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=2)
    assert recompute_kwargs(full, num_layers=4) == {
        "recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 2,
        "distribute_saved_activations": False}
    assert recompute_kwargs(_ns(recompute_granularity="full", recompute_method="block", recompute_num_layers=4),
                            num_layers=4)["recompute_method"] == "block"
    with pytest.raises(ConfigError, match="^--recompute-num-layers 5: must be between 1 and the model's 4 layers$"):
        recompute_kwargs(_ns(recompute_granularity="full", recompute_method="block", recompute_num_layers=5),
                         num_layers=4)
    with pytest.raises(ConfigError, match="needs --recompute-method"):
        recompute_kwargs(_ns(recompute_granularity="full", recompute_num_layers=1))


def test_optimizer_offload_kwargs(monkeypatch: pytest.MonkeyPatch) -> None:
    assert optimizer_offload_kwargs(_ns()) == {}
    monkeypatch.setattr(memory_flags, "mcore_runs_precision_aware_without_te", lambda: True)  # megatron-core 0.19
    on = _ns(use_distributed_optimizer=True, use_precision_aware_optimizer=True, optimizer_cpu_offload=True)
    assert optimizer_offload_kwargs(on) == {
        "use_precision_aware_optimizer": True, "optimizer_cpu_offload": True, "optimizer_offload_fraction": 1.0,
        "overlap_cpu_optimizer_d2h_h2d": False}  # megatron's default fraction 0.0 would offload nothing
    on = on.replace(overlap_cpu_optimizer_d2h_h2d=True)
    assert optimizer_offload_kwargs(on)["overlap_cpu_optimizer_d2h_h2d"] is True
    aware = _ns(use_distributed_optimizer=True, use_precision_aware_optimizer=True)
    monkeypatch.setattr(memory_flags, "te_available", lambda: False)
    with pytest.raises(ConfigError, match="^not supported yet: --use-precision-aware-optimizer without "
                                          "--optimizer-cpu-offload"):
        optimizer_offload_kwargs(aware)  # checked again where the backend runs: its machine may differ
    monkeypatch.setattr(memory_flags, "te_available", lambda: True)
    assert optimizer_offload_kwargs(aware) == {"use_precision_aware_optimizer": True}
    with pytest.raises(ConfigError, match="needs --use-precision-aware-optimizer"):
        optimizer_offload_kwargs(_ns(use_distributed_optimizer=True, optimizer_cpu_offload=True))
    with pytest.raises(ConfigError, match="needs --use-distributed-optimizer"):
        optimizer_offload_kwargs(_ns(use_precision_aware_optimizer=True, optimizer_cpu_offload=True))
    monkeypatch.setattr(memory_flags, "te_available", lambda: False)
    monkeypatch.setattr(memory_flags, "mcore_runs_precision_aware_without_te", lambda: False)  # megatron-core 0.16
    with pytest.raises(ConfigError, match="^not supported yet: --use-precision-aware-optimizer with megatron-core "):
        optimizer_offload_kwargs(_ns(use_distributed_optimizer=True, use_precision_aware_optimizer=True,
                                     optimizer_cpu_offload=True))


# ---------------------------------------------------------------------- megatron-core's own checks
@needs_mcore
def test_megatron_core_accepts_the_fields_and_rejects_what_relax_refuses() -> None:
    """The mapped fields exist and validate in the installed megatron-core (0.16 on CPU CI, 0.19 on the
    GPU machine: transformer_config.py / optimizer_config.py checks are the same), and the combinations
    refused at parse time are the ones megatron-core itself rejects."""
    import torch.nn.functional as F
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.transformer import TransformerConfig

    base = dict(num_layers=4, hidden_size=64, num_attention_heads=4, activation_func=F.silu,
                use_cpu_initialization=True)
    for args in (_ns(recompute_granularity="selective"),
                 _ns(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
                 _ns(recompute_granularity="full", recompute_method="block", recompute_num_layers=4)):
        config = TransformerConfig(**base, **recompute_kwargs(args, num_layers=4))
        assert config.recompute_granularity == args.recompute_granularity
    assert TransformerConfig(**base, **recompute_kwargs(_ns(recompute_granularity="selective"))).recompute_modules \
        == ["core_attn"]
    with pytest.raises(ValueError, match="recompute_method must be"):
        TransformerConfig(**base, recompute_granularity="full", recompute_num_layers=1)
    with pytest.raises(ValueError, match="recompute_num_layers must be"):
        TransformerConfig(**base, recompute_granularity="full", recompute_method="uniform")
    with pytest.raises(ValueError, match="recompute_num_layers must be None"):
        TransformerConfig(**base, recompute_granularity="selective", recompute_num_layers=1)

    opt = dict(optimizer="adam", lr=1e-5, bf16=True, params_dtype=torch.bfloat16)
    on = _ns(use_distributed_optimizer=True, use_precision_aware_optimizer=True, optimizer_cpu_offload=True)
    if module_available("transformer_engine") or memory_flags.mcore_runs_precision_aware_without_te():
        config = OptimizerConfig(**opt, use_distributed_optimizer=True, **optimizer_offload_kwargs(on))
        assert config.optimizer_cpu_offload and config.optimizer_offload_fraction == 1.0
        assert config.use_precision_aware_optimizer_no_fp8_or_ds_fp8  # the HDO path: fp32 masters in the optimizer
    else:  # e.g. megatron-core 0.16 without TE: refused at backend build, where OptimizerConfig would crash
        with pytest.raises(ConfigError, match="--use-precision-aware-optimizer with megatron-core"):
            optimizer_offload_kwargs(on)
        with pytest.raises(TypeError):
            OptimizerConfig(**opt, use_distributed_optimizer=True, use_precision_aware_optimizer=True,
                            optimizer_cpu_offload=True, optimizer_offload_fraction=1.0)
    with pytest.raises(AssertionError, match="only supported with distributed optimizer"):
        OptimizerConfig(**opt, use_precision_aware_optimizer=True, optimizer_cpu_offload=True)
    if not module_available("transformer_engine") and memory_flags.mcore_runs_precision_aware_without_te():
        with pytest.raises(RuntimeError, match="requires FusedAdam from TransformerEngine"):
            OptimizerConfig(**opt, use_distributed_optimizer=True, use_precision_aware_optimizer=True)


# ---------------------------------------------------------------------- parse-time rules
@pytest.mark.parametrize("flags", [
    ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"],
    ["--recompute-granularity", "selective"],
    ["--recompute-method", "block"],
    ["--recompute-num-layers", "2"],
    OFFLOAD,
    ["--overlap-cpu-optimizer-d2h-h2d"],
])
def test_torch_backend_refuses_the_megatron_memory_flags(flags: list[str]) -> None:
    first = "--" + next(name for name in FLAG_NAMES if f"--{name}" in flags)  # table order
    with pytest.raises(ConfigError, match=f"^not supported yet: {first} with --train-backend torch"):
        parse_args([*BASE, "--train-backend", "torch", *[f for f in flags if f != "--use-distributed-optimizer"]])


@pytest.mark.parametrize(("flags", "message"), [
    (["--recompute-method", "uniform"], "^--recompute-method has no effect without --recompute-granularity full$"),
    (["--recompute-num-layers", "2"], "^--recompute-num-layers has no effect without --recompute-granularity full$"),
    (["--recompute-granularity", "full"], r"^--recompute-granularity full needs --recompute-method \(uniform or block\)\n"
     r"--recompute-granularity full needs --recompute-num-layers N"),  # both problems, one per line
    (["--recompute-granularity", "full", "--recompute-method", "block"],
     "^--recompute-granularity full needs --recompute-num-layers N"),
    (["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "0"],
     "^--recompute-num-layers must be >= 1, got 0$"),
    (["--recompute-granularity", "selective", "--recompute-method", "uniform"],
     "^--recompute-method has no effect with --recompute-granularity selective"),
    (["--recompute-granularity", "selective", "--recompute-num-layers", "1"],
     "^--recompute-num-layers has no effect with --recompute-granularity selective"),
    (["--overlap-cpu-optimizer-d2h-h2d"], "^--overlap-cpu-optimizer-d2h-h2d has no effect without --optimizer-cpu-offload$"),
    (["--use-distributed-optimizer", "--optimizer-cpu-offload"],
     "^--optimizer-cpu-offload needs --use-precision-aware-optimizer"),
    (["--use-precision-aware-optimizer", "--optimizer-cpu-offload"],
     "^--use-precision-aware-optimizer needs --use-distributed-optimizer"),
    ([*OFFLOAD, "--save", "ckpt"], r"^not supported yet: saving the --optimizer-cpu-offload optimizer state .*--no-save-optim"),
    (["--optimizer", "sgd", "--use-distributed-optimizer"],
     "^--optimizer sgd with --use-distributed-optimizer: megatron-core's distributed optimizer holds Adam state only"),
])
def test_megatron_refusals_name_the_flags(gpu, flags: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _megatron(*flags)


def test_precision_aware_without_offload_needs_transformer_engine(gpu, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(memory_flags, "te_available", lambda: False)
    with pytest.raises(ConfigError, match="^not supported yet: --use-precision-aware-optimizer without "
                                          "--optimizer-cpu-offload .*transformer_engine is not installed"):
        _megatron("--use-distributed-optimizer", "--use-precision-aware-optimizer")
    monkeypatch.setattr(memory_flags, "te_available", lambda: True)
    assert _megatron("--use-distributed-optimizer", "--use-precision-aware-optimizer").use_precision_aware_optimizer


def test_megatron_accepts_the_supported_combinations(gpu) -> None:
    args = _megatron("--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "2")
    assert (args.recompute_granularity, args.recompute_method, args.recompute_num_layers) == ("full", "uniform", 2)
    assert _megatron("--recompute-granularity", "selective").recompute_granularity == "selective"
    args = _megatron(*OFFLOAD, "--overlap-cpu-optimizer-d2h-h2d", "--save", "ckpt", "--no-save-optim")
    assert args.optimizer_cpu_offload and args.overlap_cpu_optimizer_d2h_h2d and args.use_precision_aware_optimizer


def test_flags_are_supported_and_documented() -> None:
    doc = (Path(__file__).parents[1] / "docs" / "flags.md").read_text(encoding="utf-8")
    for name in FLAG_NAMES:
        spec = FLAGS_BY_NAME[name]
        assert spec.supported, name
        assert "Megatron-LM" in spec.help and "Here:" in spec.help, name
        assert f"| `--{name}` | {spec.type} | {spec.default!r} (seed: -) | yes |" in doc, name
    assert "--no-save-optim" in FLAGS_BY_NAME["optimizer-cpu-offload"].help
    assert "transformer_engine is not installed" in FLAGS_BY_NAME["use-precision-aware-optimizer"].help


# ---------------------------------------------------------------------- the frozen-embedding hook (plain torch)
class _Toy(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = torch.nn.Embedding(10, 4)
        self.layer = torch.nn.Linear(4, 4)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:  # a reentrant checkpoint, like megatron's full recompute
        return torch.utils.checkpoint.checkpoint(self.layer, self.embedding(ids), use_reentrant=True)


@pytest.mark.filterwarnings("ignore:None of the inputs have requires_grad")
def test_frozen_embedding_hook_restores_checkpointed_gradients() -> None:
    ids = torch.tensor([1, 2, 3])
    toy = _Toy()
    toy.embedding.requires_grad_(False)
    out = toy(ids)
    assert not out.requires_grad  # the checkpointed layer would get no gradient at all
    handle = make_embedding_output_differentiable(toy)
    assert handle is not None
    toy(ids).sum().backward()
    expected = torch.ones(3, 4).T @ toy.embedding(ids)  # d(sum(W x + b))/dW
    torch.testing.assert_close(toy.layer.weight.grad, expected, rtol=0, atol=0)
    assert toy.embedding.weight.grad is None
    with torch.no_grad():
        assert not toy(ids).requires_grad  # inference passes are untouched
    assert make_embedding_output_differentiable(_Toy()) is None  # a trainable embedding needs nothing


# ---------------------------------------------------------------------- a real GPTModel on CPU (fp32)
@pytest.fixture(scope="module")
def cpu_megatron():
    """A one-process gloo world with TP = PP = 1 and RoPE on CPU (as tests/test_megatron_convert.py)."""
    if not module_available("megatron.core"):
        pytest.skip("megatron-core is not installed")
    import contextlib
    import socket

    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel

    owns = not dist.is_initialized()
    if owns:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)
    tracker = tensor_parallel.get_cuda_rng_tracker()
    saved_fork, saved_device = tracker.fork, torch.cuda.current_device
    tracker.fork = lambda *a, **k: contextlib.nullcontext()  # no CUDA RNG on CPU (dropout is 0)
    torch.cuda.current_device = lambda: "cpu"  # RoPE moves its frequencies to "the current device"
    yield
    tracker.fork, torch.cuda.current_device = saved_fork, saved_device
    parallel_state.destroy_model_parallel()
    if owns:
        dist.destroy_process_group()


@pytest.fixture
def cpu_checkpointing(monkeypatch: pytest.MonkeyPatch):
    """Megatron's CheckpointFunction saves and restores the CUDA RNG state; there is none on CPU (no dropout here)."""
    import megatron.core.tensor_parallel.random as mrandom

    monkeypatch.setattr(mrandom, "_get_cuda_rng_state", lambda *a, **k: None)
    monkeypatch.setattr(mrandom, "_set_cuda_rng_state", lambda *a, **k: None)


def _gpt_grads(spec, hf_state, extra: dict, *, freeze_embedding: bool = False, hook: bool = True):
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    from relax.backends.megatron.convert import WeightLayout
    from relax.backends.megatron.model import BuiltModel
    from tests.megatron_helpers import load_hf_state

    config = TransformerConfig(**spec.transformer_config_kwargs(), activation_func=F.silu,
                               use_cpu_initialization=True, perform_initialization=False, **extra)
    gpt = GPTModel(config, get_gpt_layer_local_spec(qk_layernorm=spec.qk_layernorm, normalization="RMSNorm"),
                   **spec.gpt_model_kwargs()).train()
    load_hf_state(BuiltModel(gpt, gpt, config, WeightLayout.from_spec(spec), spec.vocab_size), hf_state)
    if freeze_embedding:
        gpt.embedding.requires_grad_(False)
        if hook:
            make_embedding_output_differentiable(gpt)
    ids = torch.randint(0, spec.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    causal = torch.triu(torch.ones(16, 16, dtype=torch.bool), 1)[None, None]
    logits = gpt(input_ids=ids, position_ids=torch.arange(16).expand(2, -1), attention_mask=causal)
    loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), ids.roll(-1, 1).flatten())
    loss.backward()
    return loss.detach(), {n: p.grad for n, p in gpt.named_parameters()}


@needs_mcore
@pytest.mark.megatron
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_recompute_on_a_cpu_gptmodel_gives_bitwise_equal_gradients(cpu_megatron, cpu_checkpointing) -> None:
    from relax.backends.megatron.config import McoreModelSpec
    from relax.models import build_model

    hf = build_model("tiny-qwen3", seed=5)
    spec, state = McoreModelSpec.from_hf(hf.config), hf.state_dict()
    base_loss, base = _gpt_grads(spec, state, {})
    variants = [_ns(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
                _ns(recompute_granularity="full", recompute_method="block", recompute_num_layers=1),
                _ns(recompute_granularity="selective")]
    for args in variants:
        loss, grads = _gpt_grads(spec, state, recompute_kwargs(args, spec.num_layers))
        assert torch.equal(loss, base_loss), args
        assert all(torch.equal(grads[n], g) for n, g in base.items()), args

    full = recompute_kwargs(variants[0], spec.num_layers)
    frozen_loss, frozen = _gpt_grads(spec, state, {}, freeze_embedding=True)
    trained = {n for n, g in frozen.items() if g is not None}
    assert len(trained) > 1 and not any(n.startswith("embedding") for n in trained)
    loss, grads = _gpt_grads(spec, state, full, freeze_embedding=True)
    assert torch.equal(loss, frozen_loss) and all(torch.equal(grads[n], frozen[n]) for n in trained)
    _, cut = _gpt_grads(spec, state, full, freeze_embedding=True, hook=False)  # what the backend's hook prevents
    assert {n for n, g in cut.items() if g is not None} == {"decoder.final_layernorm.weight"}

