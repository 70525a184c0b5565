"""On the GPU: megatron-core's torch.compile'd SwiGLU, bias-dropout-add and RoPE fusions (relax's default,
relax/backends/megatron/fusions.py) compute what the unfused ops compute, measured against an fp32
reference on the same bf16 weights, and torch's fused Adam makes the same update as its foreach Adam."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import transformers as tf

from relax.backends.megatron.checks import module_available
from tests.gpu.test_megatron_attention_gpu import (
    SEQ,
    SMALL,
    _fp32_reference,
    _grad_errors,
    _hf,
    _hf_named_grads,
    _next_token_loss,
)
from tests.gpu.test_megatron_gpu import _report

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.megatron,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not module_available("megatron.core"), reason="needs megatron-core"),
]


def test_fused_and_unfused_layers_agree_in_bf16(mcore) -> None:
    from relax.backends.megatron.config import McoreModelSpec
    from relax.backends.megatron.fusions import fusion_kwargs
    from relax.backends.megatron.megatron_config import MegatronConfig
    from relax.backends.megatron.model import build_gpt_model
    from relax.utils.arguments import parse_args
    from tests.megatron_helpers import load_hf_state

    hf = _hf(SMALL)
    state = {k: v.to(torch.bfloat16) for k, v in hf.state_dict().items()}
    ids = torch.randint(3, SMALL["vocab_size"], (2, SEQ), generator=torch.Generator().manual_seed(5)).cuda()
    pos = torch.arange(SEQ, device="cuda").unsqueeze(0).expand_as(ids)
    logits32, loss32, grads32 = _fp32_reference(hf, ids)
    del hf

    out = {}
    for name, off in (("unfused", True), ("fused", False)):
        extra = fusion_kwargs(MegatronConfig.from_args(parse_args(["--prompt-data", "x.jsonl", "--rollout-batch-size", "2", "--num-rollout", "1"]))
                              .replace(no_bias_swiglu_fusion=off, no_bias_dropout_fusion=off, no_rope_fusion=off))
        built = build_gpt_model(McoreModelSpec.from_hf(tf.Qwen3Config(**SMALL)), use_te=False, extra_config=extra)
        assert built.config.bias_activation_fusion is not off and built.config.bias_dropout_fusion is not off
        assert built.config.apply_rope_fusion is not off
        load_hf_state(built, state)
        built.module.train()
        logits = built.module(input_ids=ids, position_ids=pos, attention_mask=None)
        loss = _next_token_loss(logits, ids)
        loss.backward()
        out[name] = {"err": (logits.detach().float() - logits32).abs(), "loss": float(loss),
                     "grads": _grad_errors(_hf_named_grads(built), grads32)}
        del built, logits, loss
        torch.cuda.empty_cache()
    f, u = out["fused"], out["unfused"]
    results = {"logits_vs_fp32": {k: {"max": float(v["err"].max()), "mean": float(v["err"].mean())}
                                  for k, v in out.items()},
               "loss": {"fp32": float(loss32), "fused": f["loss"], "unfused": u["loss"]},
               "grads_vs_fp32": {"fused": f["grads"], "unfused": u["grads"]}}
    _report("megatron_fusions_parity", results)
    assert f["err"].mean() <= 1.25 * u["err"].mean() + 1e-4, results
    assert abs(f["loss"] - float(loss32)) <= 1.25 * abs(u["loss"] - float(loss32)) + 2e-3, results
    assert f["grads"]["relative"] <= 1.25 * u["grads"]["relative"] + 1e-3, results


def test_fused_adam_makes_the_foreach_update() -> None:
    from relax.backends.megatron.fusions import use_fused_torch_adam

    g = torch.Generator(device="cuda").manual_seed(0)
    shapes = [(1024, 512), (512,), (3, 7)]
    params = {kind: [torch.nn.Parameter(torch.randn(s, device="cuda", generator=g)) for s in shapes]
              for kind in ("foreach", "fused")}
    for a, b in zip(params["foreach"], params["fused"], strict=True):
        b.data.copy_(a.data)
    opts = {kind: torch.optim.AdamW(ps, lr=1e-3, weight_decay=0.1, foreach=True) for kind, ps in params.items()}
    assert use_fused_torch_adam(SimpleNamespace(chained_optimizers=[SimpleNamespace(optimizer=opts["fused"])])) == 1
    assert opts["fused"].param_groups[0]["fused"] is True
    for _ in range(5):
        grads = [torch.randn(s, device="cuda", generator=g) for s in shapes]
        for kind in opts:
            for p, gr in zip(params[kind], grads, strict=True):
                p.grad = gr.clone()
            opts[kind].step()
    for a, b in zip(params["foreach"], params["fused"], strict=True):
        torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)


def test_megatrons_clipping_runs_the_foreach_stand_ins_against_float64(mcore) -> None:
    """multi_tensor.py: after `install`, megatron's own grad-norm and clipping functions run the foreach
    stand-ins and give the float64 global norm and the clipped gradients of the local fallback's arithmetic."""
    from megatron.core.optimizer import clip_grads

    from relax.backends.megatron.multi_tensor import install

    assert install() == ["clip_grads.l2_norm_impl", "clip_grads.multi_tensor_scale_impl",
                         "optimizer.multi_tensor_scale_impl"]
    g = torch.Generator(device="cuda").manual_seed(1)
    params = [torch.nn.Parameter(torch.zeros(s, device="cuda")) for s in [(1024, 512), (512,), (3, 7), (4096,)]]
    for p in params:
        p.grad = torch.randn(p.shape, device="cuda", generator=g)
    grads = [p.grad.clone() for p in params]
    norm = clip_grads.get_grad_norm_fp32([p.grad for p in params])
    expected = float(torch.cat([gr.double().reshape(-1) for gr in grads]).norm())
    assert abs(norm - expected) <= 1e-6 * expected
    clip_grads.clip_grad_by_total_norm_fp32(params, max_norm=1.0, total_norm=norm)
    coeff = 1.0 / (norm + 1.0e-6)
    for p, gr in zip(params, grads, strict=True):
        assert torch.equal(p.grad, gr * coeff)


@pytest.mark.parametrize(("s", "b", "h", "d", "rot"), [(384, 4, 16, 64, 64), (100, 2, 8, 128, 64)])
def test_fused_rope_matches_megatrons_rope_against_float64(s, b, h, d, rot) -> None:
    """relax's fused RoPE (rope_fusion.py) and megatron's unfused one, both in bf16, against megatron's formula in
    float64: values and input gradients; a partial rotary dim (rot < d) passes the rest through untouched."""
    from megatron.core.models.common.embeddings.rope_utils import _apply_rotary_pos_emb_bshd

    from relax.backends.megatron.rope_fusion import fused_rope_bshd

    g = torch.Generator(device="cuda").manual_seed(s)
    t = torch.randn(s, b, h, d, device="cuda", generator=g).bfloat16()
    freqs = torch.rand(s, 1, 1, rot, device="cuda", generator=g) * s
    upstream = torch.randn(s, b, h, d, device="cuda", generator=g).bfloat16()
    errors = {}
    for name, fn, dtype in (("float64", _apply_rotary_pos_emb_bshd, torch.float64),
                            ("unfused", _apply_rotary_pos_emb_bshd, torch.bfloat16),
                            ("fused", fused_rope_bshd, torch.bfloat16)):
        x = t.to(dtype).clone().requires_grad_()  # its own leaf: t.to(bfloat16) would be t itself, grads summed
        out = fn(x, freqs.double() if dtype == torch.float64 else freqs)
        out.backward(upstream.to(dtype))
        errors[name] = (out.detach().double(), x.grad.double())
    ref_out, ref_grad = errors.pop("float64")
    err = {k: (float((o - ref_out).abs().max()), float((gr - ref_grad).abs().max())) for k, (o, gr) in errors.items()}
    assert err["fused"][0] <= err["unfused"][0] + 1e-6 and err["fused"][1] <= err["unfused"][1] + 1e-6, err
    assert err["fused"][0] < 0.05 and err["fused"][1] < 0.05, err  # bf16 rounding of |values| up to ~4
    assert torch.equal(errors["fused"][0][..., rot:], t[..., rot:].double())  # the unrotated channels pass through


@pytest.mark.parametrize("shape", [(384, 4, 16, 64), (384, 4, 1024)])
def test_compiled_rms_norm_matches_torchs_against_float64(shape) -> None:
    """relax's norms (norms.py) run a compiled RMSNorm on CUDA: values and input / weight gradients in bf16
    no further from float64 than torch's own fused RMSNorm."""
    from relax.backends.megatron.norms import rms_norm

    g = torch.Generator(device="cuda").manual_seed(len(shape))
    x = torch.randn(*shape, device="cuda", generator=g).bfloat16()
    w = (1 + 0.1 * torch.randn(shape[-1], device="cuda", generator=g)).bfloat16()
    upstream = torch.randn(*shape, device="cuda", generator=g).bfloat16()
    results = {}
    for name, fn, dtype in (("float64", lambda a, b: torch.nn.functional.rms_norm(a, (a.shape[-1],), b, 1e-6),
                             torch.float64),
                            ("torch", lambda a, b: torch.nn.functional.rms_norm(a, (a.shape[-1],), b, 1e-6),
                             torch.bfloat16),
                            ("compiled", lambda a, b: rms_norm(a, b, 1e-6), torch.bfloat16)):
        xx, ww = x.to(dtype).clone().requires_grad_(), w.to(dtype).clone().requires_grad_()
        out = fn(xx, ww)
        out.backward(upstream.to(dtype))
        results[name] = [t.detach().double() for t in (out, xx.grad, ww.grad)]
    ref = results.pop("float64")
    err = {k: [float((a - b).abs().max() / b.abs().max()) for a, b in zip(v, ref, strict=True)]
           for k, v in results.items()}
    for i in range(3):  # output, input grad, weight grad (the weight grad sums ~1.5k-24k bf16 products)
        assert err["compiled"][i] <= 1.5 * err["torch"][i] + 1e-3, err
