"""GenRM (--genrm-*): the judge's request, the reward parse, the flags' effects, and a dead judge's one-line error.

A stand-in judge (a local HTTP server speaking SGLang's /generate) answers with a judgement chosen per prompt; the
judge engines themselves (relax/core/genrm_engines.py) run in the genrm-cpu scenario (scenarios/specs/genrm.yaml).
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

from relax.engine.rewards import RewardConfig, compute_rewards
from relax.engine.rewards.genrm import (
    UNPARSED_METRIC,
    GenRMError,
    genrm_metrics,
    parse_last_number,
    set_judges,
)
from relax.utils.arguments import ConfigError, parse_args
from relax.utils.types import Sample

BASE = ["--preset", "quickstart", "--genrm-model-path", "tiny-qwen3"]


class Judge:
    """A judge server: answers ``{"text": judgement}``, the judgement is ``answers(request)``; keeps the requests."""

    def __init__(self, answers):
        self.seen: list[dict] = []
        judge = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                judge.seen.append({"path": self.path, **body})
                out = json.dumps({"text": answers(body), "meta_info": {}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *a):
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.server.server_port}"


@pytest.fixture
def judges() -> Iterator[list[Judge]]:
    made: list[Judge] = []
    yield made
    for j in made:
        j.server.shutdown()
    set_judges([])


def _cfg(*flags: str) -> RewardConfig:
    return RewardConfig.from_args(parse_args([*BASE, *flags]))


def _samples(*responses: str) -> list[Sample]:
    return [Sample(index=i, prompt=f"q{i}", response=r, label="7") for i, r in enumerate(responses)]


@pytest.mark.parametrize("text, value", [("score: 0.75", 0.75), ("3 then 1", 1.0), ("-2", -2.0), ("x 1e-3.", 1e-3),
                                         ("no digits here", None), ("", None), ("ends .5", 0.5)])
def test_default_parse_is_the_last_number(text: str, value: float | None) -> None:
    assert parse_last_number(text) == value


def test_rewards_come_from_the_judgement_and_unparsed_ones_are_counted(judges) -> None:
    """Every flag reaches the judge: the template, the sampling config; the reward is the judgement's last number."""
    judges.append(Judge(lambda body: "verdict 1" if "R=7" in body["text"] else "garbage"))
    set_judges([judges[0].url])
    cfg = _cfg("--genrm-sampling-config", '{"temperature": 0.5, "max_response_len": 16, "top_k": 3}',
               "--genrm-engine-config", '{"prompt_template": "Q={prompt} R={response} L={label}", '
                                        '"unparsed_reward": -1}')
    samples = _samples("7", "3", "7")
    assert asyncio.run(compute_rewards(cfg, samples)) == [1.0, -1.0, 1.0]
    seen = sorted(judges[0].seen, key=lambda b: b["text"])
    assert [b["text"] for b in seen] == ["Q=q0 R=7 L=7", "Q=q1 R=3 L=7", "Q=q2 R=7 L=7"]
    assert {b["path"] for b in seen} == {"/generate"}
    assert seen[0]["sampling_params"] == {"temperature": 0.5, "top_p": 1.0, "top_k": 3, "max_new_tokens": 16}
    assert genrm_metrics(samples) == {UNPARSED_METRIC: pytest.approx(1 / 3)}
    assert samples[1].metadata == {"genrm_judgement": "garbage", "genrm_parsed": False}


def test_sampling_defaults_are_the_seeds() -> None:
    assert _cfg().genrm.sampling_params() == {"temperature": 0.1, "top_p": 1.0, "top_k": -1, "max_new_tokens": 4096}


def test_a_reward_parser_hook_replaces_the_default(judges, tmp_path, monkeypatch) -> None:
    (tmp_path / "my_genrm_parse.py").write_text(
        "def parse(judgement, sample):\n    return 1.0 if 'yes' in judgement else None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    judges.append(Judge(lambda body: "yes 5" if "R=a" in body["text"] else "no 5"))
    set_judges([judges[0].url])
    cfg = _cfg("--genrm-engine-config", '{"reward_parser": "my_genrm_parse.parse", "prompt_template": "R={response}"}')
    assert asyncio.run(compute_rewards(cfg, _samples("a", "b"))) == [1.0, 0.0]


def test_samples_are_spread_over_the_judge_engines(judges) -> None:
    judges.extend([Judge(lambda body: "1"), Judge(lambda body: "0")])
    set_judges([j.url for j in judges])
    cfg = _cfg("--genrm-num-gpus", "2")
    assert asyncio.run(compute_rewards(cfg, _samples("a", "b", "c", "d"))) == [1.0, 0.0, 1.0, 0.0]
    assert len(judges[0].seen) == len(judges[1].seen) == 2


def test_a_dead_judge_engine_ends_the_run_in_one_line_naming_it(judges) -> None:
    judges.append(Judge(lambda body: "1"))
    set_judges([judges[0].url, "http://127.0.0.1:9"])
    cfg = _cfg("--genrm-num-gpus", "2", "--hook-timeout", "3")
    with pytest.raises(GenRMError) as info:
        asyncio.run(compute_rewards(cfg, _samples("a", "b")))
    msg = str(info.value)
    assert "GenRM judge engine genrm:1 (http://127.0.0.1:9)" in msg and "sample index 1" in msg and "\n" not in msg


@pytest.mark.parametrize("flags, message", [
    (["--genrm-engine-config", '{"foo": 1}'], "unknown key"),
    (["--genrm-sampling-config", '{"temp": 1}'], "unknown key"),
    (["--genrm-sampling-config", '{"top_p": 0}'], "out of range"),
    (["--genrm-num-gpus-per-engine", "2"], "one GPU each"),
    (["--genrm-engine-config", '{"dp_size": 2}'], "dp_size 2"),
    (["--genrm-engine-config", '{"pp_size": 2}'], "pp_size 2"),
    (["--genrm-engine-config", '{"prompt_template": "{nope}"}'], "prompt_template"),
    (["--custom-rm-path", "a.b"], "drop --custom-rm-path"),
])
def test_bad_genrm_flags_are_refused(flags: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args([*BASE, *flags])


def test_judge_engines_get_the_judge_model_and_context() -> None:
    from relax.backends.embedded.config import EmbeddedEngineConfig
    from relax.core.genrm_engines import judge_engine_config

    args = parse_args([*BASE, "--genrm-model-path", "small-qwen3", "--genrm-engine-config",
                       '{"max_total_tokens": 256}'])
    cfg = judge_engine_config(RewardConfig.from_args(args).genrm, EmbeddedEngineConfig.from_args(args))
    assert (cfg.hf_checkpoint, cfg.rollout_max_context_len, cfg.true_on_policy_mode) == ("small-qwen3", 256, False)
    assert args.hf_checkpoint == "tiny-qwen3"  # the policy's model is untouched
