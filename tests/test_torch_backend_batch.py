"""The torch backend's padding and log-prob extraction against a naive per-sample forward."""

from __future__ import annotations

import torch
import transformers

from relax.backends.torch.batch import TrainSample, build_model_inputs, build_rollout_tensors
from relax.backends.torch.logprobs import response_log_probs


def _tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    cfg = transformers.Qwen3Config(
        vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64,
    )
    return transformers.Qwen3ForCausalLM(cfg).eval()


def _samples() -> list[TrainSample]:
    g = torch.Generator().manual_seed(1)
    out = []
    for prompt_len, resp_len in [(3, 4), (5, 1), (2, 6), (4, 0)]:
        tokens = torch.randint(1, 50, (prompt_len + resp_len,), generator=g).tolist()
        out.append(TrainSample(tokens=tokens, response_length=resp_len, loss_mask=[1] * resp_len, reward=0.0))
    return out


def test_log_probs_match_unpadded_forward() -> None:
    model = _tiny_model()
    samples = _samples()
    batch = build_rollout_tensors(samples)
    inputs = build_model_inputs(samples, batch.loss_mask.shape[1], pad_id=0, device="cpu")
    temperature = 0.7
    with torch.no_grad():
        lp, ent = response_log_probs(model, inputs, temperature=temperature, with_entropy=True)
    for i, s in enumerate(samples):
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([s.tokens])).logits[0].double() / temperature
        logp = torch.log_softmax(logits, -1)
        for t in range(batch.loss_mask.shape[1]):
            if t < s.response_length:
                pos = s.prompt_length - 1 + t
                expected = float(logp[pos, s.tokens[pos + 1]])
                expected_ent = float(-(logp[pos].exp() * logp[pos]).sum())
                assert abs(float(lp[i, t]) - expected) < 1e-5
                assert abs(float(ent[i, t]) - expected_ent) < 1e-5
            else:
                assert float(lp[i, t]) == 0.0 and float(ent[i, t]) == 0.0


def test_loss_mask_shape_mismatch_is_rejected() -> None:
    bad = TrainSample(tokens=[1, 2, 3], response_length=2, loss_mask=[1], reward=1.0)
    try:
        build_rollout_tensors([bad])
    except ValueError as exc:
        assert "loss_mask" in str(exc)
    else:
        raise AssertionError("expected ValueError")
