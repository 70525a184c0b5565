"""`SdpaCoreAttention` against megatron's unfused `DotProductAttention` on a GPU, in bf16.

The same bf16 weights and tokens go through the Megatron GPTModel built with the local spec's
unfused attention (``build_gpt_model(..., attention="unfused")``) and with SDPA (the default), and
through the HF model in fp32 on those weights (the reference). Measured numbers are printed and,
when ``RELAX_GPU_REPORT`` names a directory, written there as JSON.

Bounds. Both bf16 models compute the same function and differ only in rounding: the unfused path
rounds the QK^T scores and the probabilities to bf16, the flash kernel keeps the scores in fp32
and rounds only the probabilities (for the PV matmul). So the SDPA model must be at least as close
to the fp32 reference as the unfused one (mean logit error, loss error, relative gradient error,
each within 25% of the unfused model's own error plus a small absolute slack), and the two may
differ by bf16 noise only: the logits of this random-init model have a standard deviation of about
0.02 * sqrt(hidden) = 0.64 and a largest magnitude near 4, where one bf16 ulp is 2^-6 = 0.016;
residual-stream roundings through 4 layers move a logit by a few ulps, so the largest of the 8M
logit differences is bounded at 0.25 (16 ulps at the largest logits; a wrong mask, scale or GQA
head mapping shows up in the mean errors against fp32 first, and in the CPU tests exactly).
The loss (about ln 32000 = 10.4) averages 4k tokens of such noise: the two losses agree to 0.01.

The timing test runs fwd+bwd at sequence 2048 for both (prints ms per step, model TFLOP/s and MFU
at 989 TFLOP/s, peak memory; no timing assertion) and checks that torch's flash kernel is the one
SDPA runs (inside ``sdpa_kernel(FLASH_ATTENTION)`` any other dispatch is an error).
"""

from __future__ import annotations

import contextlib
import time

import pytest
import torch
import torch.nn.functional as F
import transformers as tf

from relax.backends.megatron.checks import module_available
from tests.gpu.test_megatron_gpu import _report

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.megatron,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not module_available("megatron.core"), reason="needs megatron-core"),
]

SEQ = 2048
# Qwen3 shapes (qk-norm, GQA 16 / 8 heads, head_dim 128 as bench-1b), fewer layers to stay quick
SMALL = dict(vocab_size=32000, hidden_size=1024, intermediate_size=3072, num_hidden_layers=4, num_attention_heads=16,
             num_key_value_heads=8, head_dim=128, max_position_embeddings=4096, tie_word_embeddings=False)
BENCH = SMALL | dict(hidden_size=2048, intermediate_size=6144)
LOGIT_MAX_DIFF = 0.25
LOSS_DIFF = 0.01


def _hf(cfg: dict) -> tf.PreTrainedModel:
    torch.manual_seed(0)
    return tf.Qwen3ForCausalLM(tf.Qwen3Config(**cfg))


def _built(hf_config, state: dict, attention: str):
    from relax.backends.megatron.config import McoreModelSpec
    from relax.backends.megatron.model import build_gpt_model
    from tests.megatron_helpers import load_hf_state

    built = build_gpt_model(McoreModelSpec.from_hf(hf_config), use_te=False, attention=attention)
    load_hf_state(built, state)
    return built


def _flash_only(attention: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel(SDPBackend.FLASH_ATTENTION) if attention == "sdpa" else contextlib.nullcontext()


def _next_token_loss(logits: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))


def _fp32_reference(hf: tf.PreTrainedModel, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Logits, next-token loss and gradients of ``hf`` in fp32 on its bf16-rounded weights: what the bf16
    variants are measured against (``hf`` is converted in place)."""
    hf.config._attn_implementation = "sdpa"
    ref32 = hf.to(torch.bfloat16).float().cuda()
    logits32 = ref32(input_ids=ids).logits
    loss32 = _next_token_loss(logits32, ids)
    loss32.backward()
    return logits32.detach(), loss32.detach(), {k: p.grad.detach() for k, p in ref32.named_parameters()}


def _hf_named_grads(built) -> dict[str, torch.Tensor]:
    """The GPTModel's gradients under HF names (the raw converter is a pure re-layout: qkv / fc1 splits)."""
    from relax.backends.megatron.convert import EXTRA_STATE_SUFFIX
    from relax.backends.megatron.convert import mcore_to_hf as to_hf

    params = built.gpt.state_dict(keep_vars=True)
    grads = {k: (p.grad if p.grad is not None else torch.zeros_like(p)).detach()
             for k, p in params.items() if not k.endswith(EXTRA_STATE_SUFFIX)}
    return {k: v.float() for k, v in to_hf(grads, built.layout).items()}


def _grad_errors(grads: dict[str, torch.Tensor], ref: dict[str, torch.Tensor]) -> dict[str, float]:
    diff2 = sum(float((grads[k] - g).pow(2).sum()) for k, g in ref.items())
    norm2 = sum(float(g.pow(2).sum()) for g in ref.values())
    cos = {k: float(F.cosine_similarity(grads[k].flatten(), g.flatten(), dim=0)) for k, g in ref.items()
           if float(g.norm()) > 0}
    worst = min(cos, key=cos.get)
    return {"relative": (diff2 / norm2) ** 0.5, "min_cosine": cos[worst], "min_cosine_tensor": worst}


def test_sdpa_and_unfused_attention_agree_in_bf16(mcore) -> None:
    hf = _hf(SMALL)
    state = {k: v.to(torch.bfloat16) for k, v in hf.state_dict().items()}
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(3, SMALL["vocab_size"], (2, SEQ), generator=g).cuda()
    pos = torch.arange(SEQ, device="cuda").unsqueeze(0).expand_as(ids)

    logits32, loss32, grads32 = _fp32_reference(hf, ids)
    del hf

    out = {}
    for attention in ("unfused", "sdpa"):
        built = _built(tf.Qwen3Config(**SMALL), state, attention)
        built.module.train()
        with _flash_only(attention):
            logits = built.module(input_ids=ids, position_ids=pos, attention_mask=None)
            loss = _next_token_loss(logits, ids)
            loss.backward()
        out[attention] = {"logits": logits.detach().float(), "loss": float(loss), "grads": _hf_named_grads(built)}
        assert set(out[attention]["grads"]) == set(grads32)
        del built, logits, loss
        torch.cuda.empty_cache()

    s, u = out["sdpa"], out["unfused"]
    d_su, e_s, e_u = (s["logits"] - u["logits"]).abs(), (s["logits"] - logits32).abs(), (u["logits"] - logits32).abs()
    grad_s, grad_u = _grad_errors(s["grads"], grads32), _grad_errors(u["grads"], grads32)
    results = {
        "logits_std": float(logits32.std()), "logits_absmax": float(logits32.abs().max()),
        "logits_sdpa_vs_unfused": {"max": float(d_su.max()), "mean": float(d_su.mean())},
        "logits_sdpa_vs_fp32": {"max": float(e_s.max()), "mean": float(e_s.mean())},
        "logits_unfused_vs_fp32": {"max": float(e_u.max()), "mean": float(e_u.mean())},
        "loss": {"fp32": float(loss32), "sdpa": s["loss"], "unfused": u["loss"]},
        "grads_vs_fp32": {"sdpa": grad_s, "unfused": grad_u},
    }
    _report("megatron_attention_parity", results)
    assert results["logits_sdpa_vs_unfused"]["max"] <= LOGIT_MAX_DIFF, results
    assert e_s.mean() <= 1.25 * e_u.mean() + 1e-4, results
    assert abs(s["loss"] - u["loss"]) <= LOSS_DIFF, results
    assert abs(s["loss"] - float(loss32)) <= 1.25 * abs(u["loss"] - float(loss32)) + 2e-3, results
    assert grad_s["relative"] <= 1.25 * grad_u["relative"] + 1e-3, results
    assert grad_s["min_cosine"] >= grad_u["min_cosine"] - 0.02, results


def test_fwd_bwd_time_at_seq_2048(mcore) -> None:
    """Prints fwd+bwd time of both attentions (LM loss, micro-batch 4 x 2048); asserts only that they ran."""
    from ci.bench_megatron import H100_SXM_BF16_TFLOPS, FlopModel
    from relax.backends.megatron.attention import native_gqa

    hf = _hf(BENCH)
    hf_config = hf.config
    state = {k: v.to(torch.bfloat16) for k, v in hf.state_dict().items()}
    del hf
    flops = FlopModel.from_hf_config(hf_config).train_flops_per_token(SEQ)
    ids = torch.randint(3, BENCH["vocab_size"], (4, SEQ), generator=torch.Generator().manual_seed(4)).cuda()
    pos = torch.arange(SEQ, device="cuda").unsqueeze(0).expand_as(ids)
    # the layout SdpaCoreAttention hands to SDPA: [b, heads, s, hn] views of [s, b, heads, hn]
    q = torch.randn(SEQ, 4, 16, 128, device="cuda", dtype=torch.bfloat16).permute(1, 2, 0, 3)
    kv = torch.randn(SEQ, 4, 8, 128, device="cuda", dtype=torch.bfloat16).permute(1, 2, 0, 3)
    assert native_gqa(q, kv, kv), "torch's flash kernel cannot take the bf16 GQA inputs (see can_use_flash_attention)"

    results = {}
    for attention in ("unfused", "sdpa"):
        built = _built(hf_config, state, attention)
        built.module.train()
        params = [p for p in built.module.parameters() if p.requires_grad]
        torch.cuda.reset_peak_memory_stats()

        def step(built=built, params=params, attention=attention) -> None:
            for p in params:
                p.grad = None
            with _flash_only(attention):
                built.module(input_ids=ids, position_ids=pos, attention_mask=None, labels=ids).float().mean().backward()

        for _ in range(2):
            step()
        torch.cuda.synchronize()
        times = []
        for _ in range(5):
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        sec = sorted(times)[len(times) // 2]
        tokens = ids.numel()
        results[attention] = {"ms_per_step": 1e3 * sec, "tokens_per_s": tokens / sec,
                              "model_tflops": flops * tokens / sec / 1e12,
                              "mfu_h100": flops * tokens / sec / (H100_SXM_BF16_TFLOPS * 1e12),
                              "peak_gib": torch.cuda.max_memory_allocated() / 2**30}
        del built, params, step
        torch.cuda.empty_cache()
    results["speedup"] = results["unfused"]["ms_per_step"] / results["sdpa"]["ms_per_step"]
    results["setup"] = {"layers": BENCH["num_hidden_layers"], "hidden": BENCH["hidden_size"], "seq": SEQ,
                        "micro_batch": 4, "device": torch.cuda.get_device_name(), "torch": torch.__version__}
    _report("megatron_attention_timing", results)
    assert all(r["ms_per_step"] > 0 for r in (results["unfused"], results["sdpa"]))
