"""``--opd-type sglang``: teacher log-probs from an engine server over SGLang's prompt-logprob request.

The server's log-probs must equal the training backend's teacher (``--opd-type megatron``; torch
on CPU) on the same weights, and a dead teacher must end a run with one line naming its URL.
"""

from __future__ import annotations

import asyncio
import random
import socket
import time
from pathlib import Path

import pytest
import torch

from relax.backends.config import TrainerConfig
from relax.backends.embedded.launch import EngineProcess
from relax.backends.torch.backend import TorchTrainBackend
from relax.backends.torch.batch import TrainSample, build_rollout_tensors
from relax.engine.rollout import opd_teacher
from relax.engine.rollout.teacher_config import TeacherConfig
from relax.utils.arguments import ConfigError, parse_args
from relax.utils.types import Sample


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from relax.models import build_model, load_tokenizer, save_hf

    out = tmp_path_factory.mktemp("teacher") / "hf"
    save_hf(build_model("tiny-qwen3", seed=999), load_tokenizer("tiny-qwen3"), out)
    return out


@pytest.fixture(scope="module")
def teacher_server(teacher_dir: Path):
    proc = EngineProcess.start(["--hf-checkpoint", str(teacher_dir), "--dtype", "float32"])
    yield proc
    proc.stop()


def _samples(vocab: int) -> list[Sample]:
    rng = random.Random(0)
    out = []
    for prompt_len, response_len in [(1, 1), (5, 1), (7, 12), (3, 30), (20, 4), (2, 0)]:
        tokens = [rng.randrange(vocab) for _ in range(prompt_len + response_len)]
        out.append(Sample(tokens=tokens, response_length=response_len, loss_mask=[1] * response_len))
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_server_teacher_log_probs_equal_training_backend_teacher(teacher_dir: Path, teacher_server: EngineProcess,
                                                                  temperature: float) -> None:
    args = parse_args(["--preset", "quickstart", "--use-opd", "--opd-type", "megatron", "--opd-teacher-load",
                       str(teacher_dir), "--rollout-temperature", str(temperature), "--micro-batch-size", "4"])
    backend = TorchTrainBackend(TrainerConfig.from_args(args), "cpu")
    samples = _samples(int(backend.teacher.config.vocab_size))
    train = [TrainSample(tokens=s.tokens, response_length=s.response_length, loss_mask=s.loss_mask, reward=0.0)
             for s in samples]
    batch = build_rollout_tensors(train)
    expected = backend._log_probs_no_grad(backend.teacher, batch)

    got = asyncio.run(opd_teacher.score(teacher_server.url, samples, temperature))
    assert [len(g) for g in got] == [s.response_length for s in samples]
    for i, (g, s) in enumerate(zip(got, samples, strict=True)):
        diff = (torch.tensor(g) - expected[i, : s.response_length]).abs()
        assert diff.numel() == 0 or float(diff.max()) < 1e-4, (i, float(diff.max()))
    assert any(abs(v) > 1.0 for g in got for v in g)  # real log-probs, not zeros


def test_prompt_logprob_request_follows_sglang(teacher_server: EngineProcess) -> None:
    """``logprob_start_len`` k returns entries for prompt tokens k..L-1 (None for token 0), ``max_new_tokens`` 0
    generates nothing, as SGLang does."""
    from relax.engine.rollout.engine_client import EngineClient

    ids = [3, 9, 4, 17, 22]

    async def call(start: int) -> dict:
        return await EngineClient(teacher_server.url).generate(
            {"input_ids": ids, "sampling_params": {"max_new_tokens": 0}, "return_logprob": True,
             "logprob_start_len": start})

    whole, tail = asyncio.run(call(0)), asyncio.run(call(3))
    assert whole["output_ids"] == [] and whole["meta_info"]["finish_reason"]["type"] == "length"
    entries = whole["meta_info"]["input_token_logprobs"]
    assert [e[1] for e in entries] == ids and entries[0][0] is None
    assert whole["meta_info"]["prompt_tokens"] == 3 + len(tail["meta_info"]["input_token_logprobs"])
    assert [e[0] for e in tail["meta_info"]["input_token_logprobs"]] == pytest.approx([e[0] for e in entries[3:]],
                                                                                      abs=1e-6)


def test_teacher_killed_mid_run_is_one_error_naming_its_url(teacher_dir: Path) -> None:
    proc = EngineProcess.start(["--hf-checkpoint", str(teacher_dir)])
    url = proc.url
    proc.kill()
    samples = _samples(100)[:2]
    start = time.monotonic()
    with pytest.raises(opd_teacher.TeacherError, match=url.replace(".", r"\.")):
        asyncio.run(opd_teacher.score(url, samples, 1.0))
    assert time.monotonic() - start < 15


def test_unreachable_teacher_url_fails_fast(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    args = parse_args(["--preset", "quickstart", "--use-opd", "--opd-type", "sglang", "--rm-url", f"{url}/generate"])
    start = time.monotonic()
    with pytest.raises(opd_teacher.TeacherError, match=f"OPD teacher server {url} is not reachable"):
        opd_teacher.start_teacher(TeacherConfig.from_args(args), "cpu")
    assert time.monotonic() - start < 15


@pytest.mark.parametrize("flags, message", [
    ([], "needs exactly one of --rm-url"),
    (["--rm-url", "http://127.0.0.1:1", "--opd-teacher-load", "x"], "needs exactly one of --rm-url"),
    (["--rm-url", "http://127.0.0.1:1", "--rm-type", "remote_rm"], "both use --rm-url"),
])
def test_sglang_teacher_flag_rules(flags: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args(["--preset", "quickstart", "--use-opd", "--opd-type", "sglang", *flags])
