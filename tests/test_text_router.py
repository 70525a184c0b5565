"""The text router (--use-slime-router) and its middlewares (--slime-router-middleware-paths), against an embedded
engine server and the run's router, both in this process (tests/router_middlewares.py holds the middlewares)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from relax.backends.embedded.hosting import serve_in_thread
from relax.engine.rollout.config import RolloutConfig
from relax.engine.router.in_process import RouterConfig, RouterThread
from relax.utils.arguments import parse_args
from relax.utils.http_utils import run_closing
from tests import router_middlewares

REPO = Path(__file__).resolve().parents[1]
MW = "tests.router_middlewares"


@pytest.fixture(scope="module")
def engine_url() -> str:
    """An embedded engine server (tiny-qwen3, which tokenizes text) served from a thread of this process."""
    from relax.backends.embedded import server
    from relax.backends.embedded.scheduler import Scheduler

    ns = server.parse_args(["--hf-checkpoint", "tiny-qwen3", "--seed", "5", "--num-threads", "1"])
    scheduler = Scheduler(server.build_engine(ns))
    served = serve_in_thread(server.EngineServer(scheduler, model_path="tiny-qwen3").app(), name="test-engine")
    yield served.url
    scheduler.close()


def _args(*flags: str):
    return parse_args(["--preset", "quickstart", "--use-slime-router", *flags])


def _router(urls: list[str], *paths: str) -> RouterThread:
    flags = ["--slime-router-middleware-paths", *(f"{MW}.{p}" for p in paths)] if paths else []
    return RouterThread(urls, RouterConfig.from_args(_args(*flags)))


async def _post(url: str, body) -> tuple[int, dict, dict]:
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
        return resp.status, await resp.json(content_type=None), dict(resp.headers)


def test_middlewares_run_in_the_given_order_around_a_text_request(engine_url: str) -> None:
    router = _router([engine_url], "Recorder", "ShortAnswers")
    router_middlewares.SEEN.clear()
    body = {"text": "3+4=", "return_logprob": True, "sampling_params": {"max_new_tokens": 8, "temperature": 0.0}}
    status, answer, headers = run_closing(_post(f"{router.url}/generate", body))
    assert status == 200, answer
    assert len(answer["output_ids"]) == 2  # ShortAnswers, the inner one, rewrote max_new_tokens
    assert headers["X-Chain"] == "recorder,short"  # the outer one saw the inner one's answer
    [seen] = router_middlewares.SEEN
    assert seen["order"] == ["recorder", "short"] and seen["body"]["text"] == "3+4=" and "input_ids" not in seen["body"]
    assert seen["worker"] == engine_url and seen["answer"]["output_ids"] == answer["output_ids"]

    batch = {"text": ["3+4=", "1+1="], "sampling_params": [{"max_new_tokens": 5}, {"max_new_tokens": 5}]}
    status, answers, _ = run_closing(_post(f"{router.url}/generate", batch))  # SGLang's batch of texts
    assert status == 200 and [len(a["output_ids"]) for a in answers] == [2, 2]


def test_bad_requests_and_a_raising_middleware_answer_in_one_line(engine_url: str) -> None:
    router = _router([engine_url], "RefuseEmpty", "Raises")
    for body, status, text in ([1, 2], 400, "must be a JSON object"), ({"text": ""}, 400, "empty text"), (
            {"text": "3+4="}, 500, f"--slime-router-middleware-paths {MW}.Raises raised KeyError: 'no such thing'"):
        got, answer, _ = run_closing(_post(f"{router.url}/generate", body))
        assert got == status and text in answer["error"]["message"] and "\n" not in answer["error"]["message"]


def test_engine_headers_reach_the_engine_and_a_routing_key_stays_sticky() -> None:
    seen: list[dict] = []

    def worker(name: str):
        async def generate(request: web.Request) -> web.Response:
            seen.append({"who": name, "headers": dict(request.headers), "body": await request.json()})
            return web.json_response({"text": "", "output_ids": [], "meta_info": {}})

        async def health(_request: web.Request) -> web.Response:
            return web.json_response({})

        app = web.Application()
        app.router.add_post("/generate", generate)
        app.router.add_get("/health", health)
        return serve_in_thread(app, name=f"worker-{name}")

    router = _router([worker("a").url, worker("b").url], "Recorder")
    for _ in range(4):
        status, _, _ = run_closing(_post(f"{router.url}/generate", {"text": "x", "routing_key": "s1"}))
        assert status == 200
    assert all(s["headers"]["X-Order"] == "recorder" and s["body"] == {"text": "x"} for s in seen)
    assert len(seen) == 4 and len({s["who"] for s in seen}) == 1  # the key pinned one worker


def test_the_default_rollout_sends_text_and_trains_on_the_engines_ids(engine_url: str) -> None:
    from relax.engine.rollout import sglang_rollout
    from relax.engine.rollout.data_source import RolloutDataSourceWithBuffer
    from relax.engine.rollout.engine_client import EngineClient
    from relax.engine.rollout.engine_pool import HttpEnginePool
    from relax.models import load_tokenizer

    router = _router([engine_url], "Recorder")
    flags = ["--rollout-max-response-len", "6", "--n-samples-per-prompt", "2", "--rollout-batch-size", "2",
             "--rollout-temperature", "1.0", "--global-batch-size", "4", "--micro-batch-size", "4"]
    tokenizer = load_tokenizer("tiny-qwen3")

    def rollout(text: bool):
        args = parse_args(["--preset", "quickstart", *flags, *(["--use-slime-router"] if text else [])])
        cfg = RolloutConfig.from_args(args)
        state = sglang_rollout.GenerateState.install(cfg, tokenizer=tokenizer,
                                                     pool=HttpEnginePool(EngineClient(router.url)))
        samples = [s for g in RolloutDataSourceWithBuffer(args, tokenizer=tokenizer).get_samples(2) for s in g]
        prompts = [list(s.tokens) for s in samples]
        router_middlewares.SEEN.clear()
        run_closing(sglang_rollout._batch_generate(cfg, 0, state, samples))
        return samples, prompts, list(router_middlewares.SEEN)

    samples, prompts, seen = rollout(text=True)
    assert seen and all("text" in s["body"] and "input_ids" not in s["body"] for s in seen)
    assert all(s["body"]["return_prompt_token_ids"] for s in seen)
    answers = [a for s in seen for a in (s["answer"] if isinstance(s["answer"], list) else [s["answer"]])]
    sent = [t for s in seen for t in (s["body"]["text"] if isinstance(s["body"]["text"], list) else [s["body"]["text"]])]
    assert sorted(sent) == sorted(s.prompt for s in samples)
    by_prompt = {}
    for text, answer in zip(sent, answers, strict=True):
        by_prompt.setdefault(text, []).append(answer)
    for s, prompt in zip(samples, prompts, strict=True):
        answer = next(a for a in by_prompt[s.prompt] if a["output_ids"] == s.response_tokens)
        assert s.tokens == answer["prompt_token_ids"] + answer["output_ids"]  # what is trained is what ran
        assert s.tokens[: s.prompt_length] == prompt  # the engine tokenized the text as the data layer did
        assert s.rollout_log_probs == [e[0] for e in answer["meta_info"]["output_token_logprobs"]]
        assert s.loss_mask == [1] * s.response_length and 0 < s.response_length == len(answer["output_ids"])

    tokens, _, seen = rollout(text=False)  # the same samples by token ids: the same training data
    assert all("input_ids" in s["body"] and "text" not in s["body"] for s in seen)
    assert [(t.tokens, t.rollout_log_probs) for t in tokens] == [(s.tokens, s.rollout_log_probs) for s in samples]


def test_launch_refuses_a_bad_middleware_path_naming_it(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "relax.cli", "train", "--preset", "quickstart", "--use-slime-router",
         "--slime-router-middleware-paths", f"{MW}.Recorder", f"{MW}.NoConfig", f"{MW}.not_a_class",
         "--output-dir", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=120, cwd=tmp_path, env={"PYTHONPATH": str(REPO), "PATH": ""})
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("relax:")]
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 2 and f"'{MW}.NoConfig'.__init__ takes 1 argument" in lines[0], lines
    assert f"'{MW}.not_a_class' is a function, not a class" in lines[1]


def test_middlewares_need_the_text_router() -> None:
    from relax.utils.arguments import ConfigError

    with pytest.raises(ConfigError, match="--slime-router-middleware-paths needs --use-slime-router"):
        parse_args(["--preset", "quickstart", "--slime-router-middleware-paths", f"{MW}.Recorder"])
    assert parse_args(["--preset", "quickstart", "--use-slime-router", "--partial-rollout"]).partial_rollout  # built


def test_a_run_with_the_text_router_trains_on_what_the_engine_generated(tmp_path: Path, monkeypatch) -> None:
    """``relax train --use-slime-router``: every generation request reaching the router carries text, and every
    trained sample's tokens are an engine answer's prompt_token_ids + output_ids."""
    from relax.utils.types import Sample
    from tests.e2e_helpers import FAST_FLAGS, assert_ok, read_jsonl, run_relax

    log = tmp_path / "router.jsonl"
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "1", "--use-slime-router", "--slime-router-middleware-paths",
                      f"{MW}.FileRecorder", "--save-debug-rollout-data", str(tmp_path / "rollout_{rollout_id}.json"),
                      "--output-dir", str(tmp_path / "run")], tmp_path, env={"RELAX_TEST_ROUTER_LOG": str(log)})
    assert_ok(proc)
    records = read_jsonl(log)
    assert records and all("text" in r["body"] and "input_ids" not in r["body"] for r in records)
    generated = {tuple(a["prompt_token_ids"] + a["output_ids"]) for r in records
                 for a in (r["answer"] if isinstance(r["answer"], list) else [r["answer"]])}
    saved = json.loads((tmp_path / "rollout_0.json").read_text())["groups"]
    trained = [Sample.from_dict(s) for group in saved for s in group]
    assert len(trained) == 32 and all(tuple(s.tokens) in generated for s in trained)
    assert read_jsonl(tmp_path / "run" / "metrics.jsonl")[0]["step"] == 0


def test_the_router_flags_configure_the_text_router() -> None:
    args = _args("--slime-router-timeout", "7", "--slime-router-max-connections", "3",
                 "--slime-router-health-check-failure-threshold", "2", "--slime-router-middleware-paths",
                 f"{MW}.Recorder", f"{MW}.ShortAnswers")
    router = RouterThread([], RouterConfig.from_args(args)).router
    assert (router.request_timeout, router.max_connections, router.failure_threshold) == (7.0, 3, 2)
    assert [path for path, _ in router.middlewares] == [f"{MW}.Recorder", f"{MW}.ShortAnswers"]
    assert router.middlewares[0][1].config.args is args


def test_evaluation_sends_text_too(engine_url: str) -> None:
    from relax.engine.rewards.config import RewardConfig
    from relax.engine.rollout import sglang_rollout
    from relax.engine.rollout.data_source import RolloutDataSourceWithBuffer
    from relax.engine.rollout.engine_client import EngineClient
    from relax.engine.rollout.engine_pool import HttpEnginePool
    from relax.engine.rollout.eval_config import EvalConfig
    from relax.engine.rollout.evaluation import EvalSet, run_eval
    from relax.models import load_tokenizer

    router = _router([engine_url], "Recorder")
    args = _args("--eval-max-response-len", "4", "--n-samples-per-eval-prompt", "2")
    tokenizer = load_tokenizer("tiny-qwen3")
    cfg = RolloutConfig.from_args(args)
    sglang_rollout.GenerateState.install(cfg, tokenizer=tokenizer, pool=HttpEnginePool(EngineClient(router.url)))
    prompts = [g[0] for g in RolloutDataSourceWithBuffer(args, tokenizer=tokenizer).get_samples(2)]
    router_middlewares.SEEN.clear()
    data: dict = {}
    metrics = run_eval(EvalConfig.from_args(args), cfg, RewardConfig.from_args(args), 0, [EvalSet("t", prompts)], data)
    assert "eval/t/reward_mean" in metrics and router_middlewares.SEEN
    assert all("text" in s["body"] and "input_ids" not in s["body"] for s in router_middlewares.SEEN)
    answers = [a for s in router_middlewares.SEEN for a in (s["answer"] if isinstance(s["answer"], list) else [s["answer"]])]
    assert sorted(tuple(s.tokens) for s in data["t"]["samples"]) == sorted(
        tuple(a["prompt_token_ids"] + a["output_ids"]) for a in answers)


def test_the_standalone_router_takes_middlewares_and_refuses_a_bad_one() -> None:
    from relax.engine.router.__main__ import parse_args as router_args

    assert router_args(["--slime-router-middleware-paths", f"{MW}.Recorder"]).slime_router_middleware_paths == [
        f"{MW}.Recorder"]
    proc = subprocess.run([sys.executable, "-m", "relax.engine.router", "--slime-router-middleware-paths",
                           f"{MW}.SyncCall"], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert proc.returncode == 2 and f"'{MW}.SyncCall' has no async __call__" in proc.stderr.splitlines()[-1]
