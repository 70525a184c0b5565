"""``--megatron-to-hf-mode bridge``: the refusal without megatron-bridge, and relax's side of the AutoBridge contract.

megatron-bridge cannot be installed next to our transformers (relax/backends/megatron/bridge.py says
which versions work), so the contract is checked against a stand-in ``megatron.bridge`` module that
records the calls: loading goes through ``AutoBridge.from_hf_pretrained(dir).load_hf_weights([gpt])``,
the export groups ``export_hf_weights([gpt])``'s full tensors into buckets on rank 0.
"""

from __future__ import annotations

import sys
import types
from types import SimpleNamespace

import pytest
import torch

from relax.backends.megatron import bridge
from relax.backends.megatron.bridge import BridgeWeights, bridge_problem


def test_bridge_mode_is_refused_with_how_to_get_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(bridge, "module_available", lambda name: False)
    problem = bridge_problem(str(tmp_path))
    assert "needs megatron-bridge, which is not installed" in problem and "Python 3.12" in problem
    assert "transformers>=5.8,<=5.12.1" in problem and "--megatron-to-hf-mode raw" in problem
    monkeypatch.setattr(bridge, "module_available", lambda name: True)
    assert bridge_problem(str(tmp_path)) is None
    assert "is a preset" in bridge_problem("tiny-qwen3")


class _FakeAutoBridge:
    calls: list = []

    @classmethod
    def from_hf_pretrained(cls, path):
        cls.calls.append(("from_hf_pretrained", path))
        return cls()

    def load_hf_weights(self, models):
        self.calls.append(("load_hf_weights", models))

    def export_hf_weights(self, models, cpu, show_progress):
        self.calls.append(("export_hf_weights", models, cpu, show_progress))
        for i in range(5):
            yield f"t{i}", torch.zeros(10 if i != 2 else 40, dtype=torch.float32)  # 40 / 160 bytes


@pytest.fixture
def fake_bridge(monkeypatch):
    module = types.ModuleType("megatron.bridge")
    module.AutoBridge = _FakeAutoBridge
    monkeypatch.setitem(sys.modules, "megatron.bridge", module)
    _FakeAutoBridge.calls = []
    return _FakeAutoBridge


def test_bridge_weights_call_autobridge_and_bucket_its_export(fake_bridge) -> None:
    built = SimpleNamespace(gpt=object(), layout=SimpleNamespace(tie_word_embeddings=False))
    weights = BridgeWeights("/models/hf")
    weights.load(built)
    buckets = list(weights.buckets(built, bucket_bytes=100))
    assert fake_bridge.calls[0] == ("from_hf_pretrained", "/models/hf")
    assert fake_bridge.calls[1] == ("load_hf_weights", [built.gpt])
    assert fake_bridge.calls[2] == ("export_hf_weights", [built.gpt], False, False)
    assert [[name for name, _ in b] for b in buckets] == [["t0", "t1"], ["t2"], ["t3", "t4"]]  # 160 B: its own bucket


def test_tied_embedding_is_also_sent_as_lm_head_like_raw_mode(fake_bridge, monkeypatch) -> None:
    names = ["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"]
    monkeypatch.setattr(_FakeAutoBridge, "export_hf_weights",
                        lambda self, models, cpu, show_progress: ((n, torch.ones(4)) for n in names[:2]))
    built = SimpleNamespace(gpt=object(), layout=SimpleNamespace(tie_word_embeddings=True))
    sent = [pair for b in BridgeWeights("/models/hf").buckets(built, bucket_bytes=1 << 20) for pair in b]
    assert [n for n, _ in sent] == ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"]
    assert sent[1][1] is sent[0][1]
    monkeypatch.setattr(_FakeAutoBridge, "export_hf_weights",  # a bridge that exports the alias itself: once only
                        lambda self, models, cpu, show_progress: ((n, torch.ones(4)) for n in names))
    sent = [n for b in BridgeWeights("/models/hf").buckets(built, bucket_bytes=1 << 20) for n, _ in b]
    assert sent == ["model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"]
