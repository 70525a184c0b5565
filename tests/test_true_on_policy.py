"""--true-on-policy-mode (issue 41): rollout log-probs are the trainer's own, bitwise, on every response token.

The end-to-end proof over 5 steps is the `true-on-policy-cpu` scenario (scenarios/specs/colocate.yaml); these
tests hold the pieces: the engine's log-probs are the trainer's per-sample computation, a run without the mode
does differ (so an exact-0 check can fail), --use-rollout-logprobs then trains exactly as the trainer's own
log-probs do, and the combinations the mode cannot keep exact are refused in one line.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from relax.backends.embedded.engine import EmbeddedEngine
from relax.backends.torch.batch import build_model_inputs
from relax.backends.torch.logprobs import response_log_probs
from relax.models import build_model
from relax.utils.arguments import ConfigError, parse_args
from tests.e2e_helpers import assert_ok, pretend_gpu_machine, read_jsonl, run_relax

RUN = ["--preset", "quickstart", "--rollout-max-response-len", "12", "--micro-batch-size", "1", "--num-rollout", "3"]
MAX_KEY = "train/train_rollout_logprob_abs_diff_max"


class _Sample:
    def __init__(self, tokens: list[int], response_length: int):
        self.tokens, self.response_length = tokens, response_length


def _engine_logprobs(train_identical: bool) -> tuple[list[list[int]], list[list[int]], list[list[float]], torch.nn.Module]:
    """Four prompts, 30 sampled tokens each: enough decode steps that the decode path's last bits differ from the
    full forward's somewhere, whatever the CPU's kernels (one 10-token answer matched bitwise on some CPUs)."""
    model = build_model("tiny-qwen3", seed=3)
    engine = EmbeddedEngine(model, eos_token_ids=[], train_identical_logprobs=train_identical)
    prompts = [list(range(5 + i, 17 + i)) for i in range(4)]
    outs = engine.generate([{"input_ids": prompt, "return_logprob": True, "sampling_params": {
        "max_new_tokens": 30, "temperature": 1.0, "ignore_eos": True, "sampling_seed": i}}
        for i, prompt in enumerate(prompts)])
    return (prompts, [o["output_ids"] for o in outs],
            [[e[0] for e in o["meta_info"]["output_token_logprobs"]] for o in outs], model)


def test_the_engine_reports_the_trainers_per_sample_log_probs_bitwise() -> None:
    prompts, outputs, reported, model = _engine_logprobs(train_identical=True)
    trainer = model.train()  # the trainer's forward: train mode, gradients on
    for prompt, output, got in zip(prompts, outputs, reported, strict=True):
        inputs = build_model_inputs([_Sample(prompt + output, len(output))], len(output), 0, torch.device("cpu"))
        expected, _ = response_log_probs(trainer, inputs, temperature=1.0, with_entropy=False)
        assert got == expected[0].tolist()  # bitwise, every token
    _, outputs_fast, fast, _ = _engine_logprobs(train_identical=False)
    assert outputs_fast == outputs  # the mode changes what is reported, not what is sampled
    assert fast != reported  # the decode path's own log-probs differ in the last bits somewhere


def test_a_run_with_the_mode_has_zero_mismatch_and_rollout_log_probs_train_identically(tmp_path: Path) -> None:
    runs = {}
    for name, flags in (("off", []), ("on", ["--true-on-policy-mode"]),
                        ("on_rollout_lp", ["--true-on-policy-mode", "--use-rollout-logprobs"])):
        (tmp_path / name).mkdir()
        assert_ok(run_relax([*RUN, *flags, "--output-dir", str(tmp_path / name / "run")], tmp_path / name))
        runs[name] = read_jsonl(tmp_path / name / "run" / "metrics.jsonl")
    assert max(m[MAX_KEY] for m in runs["off"]) > 0  # without the mode the engine's decode differs
    for m in runs["on"]:
        assert m[MAX_KEY] == 0.0 and m["train/train_rollout_kl"] == 0.0 and m["train/ppo_kl"] == 0.0
        assert m["rollout/response_len_mean"] > 4  # multi-token responses: the KV-cache decode path ran
    for a, b in zip(runs["on"], runs["on_rollout_lp"], strict=True):
        assert a["train/pg_loss"] == b["train/pg_loss"] and a["train/grad_norm"] == b["train/grad_norm"]


@pytest.mark.parametrize("flags, line", [
    (["--train-backend", "megatron", "--device", "cuda"],
     "not supported yet: --true-on-policy-mode with --train-backend megatron"),
    (["--rollout-backend", "sglang"], "not supported yet: --true-on-policy-mode with --rollout-backend sglang"),
    (["--micro-batch-size", "4"], "give --micro-batch-size 1, not 4"),
    (["--use-dynamic-batch-size", "--max-tokens-per-gpu", "512"], "drop --use-dynamic-batch-size"),
])
def test_what_the_mode_cannot_keep_exact_is_refused_in_one_line(flags: list[str], line: str, monkeypatch) -> None:
    pretend_gpu_machine(monkeypatch)
    base = ["--preset", "quickstart", "--true-on-policy-mode", "--micro-batch-size", "1"]
    with pytest.raises(ConfigError) as err:
        parse_args([*base, *flags])
    assert line in str(err.value)
