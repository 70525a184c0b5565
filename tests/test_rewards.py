"""Built-in graders, custom reward functions by dotted path, dict rewards."""

from __future__ import annotations

import asyncio
import sys
import uuid
from argparse import Namespace
from pathlib import Path

import pytest

from relax.engine.rewards import GRADERS, RewardConfig, compute_rewards, get_reward_fn
from relax.engine.rewards.graders import extract_answer, math_answer, to_number
from relax.utils.arguments import ConfigError
from relax.utils.plugins import PluginError
from relax.utils.types import Sample

GENRM_OFF = dict(genrm_model_path=None, genrm_num_gpus=1, genrm_num_gpus_per_engine=1, genrm_engine_config=None,
                 genrm_sampling_config=None)


def _s(response: str, label: object = None, index: int | None = None) -> Sample:
    return Sample(response=response, label=label, index=index)


def _args(**kw) -> Namespace:
    base = dict(custom_rm_path=None, rm_type="exact", reward_key=None, group_rm=False, hook_timeout=300.0, rm_url=None,
                **GENRM_OFF)
    base.update(kw)
    return Namespace(**base)


def _cfg(args: Namespace) -> RewardConfig:
    """The reward slice the driver would build from ``args`` (which the reward functions still get)."""
    return RewardConfig.from_args(args)


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Write a uniquely named module (the plug-in loader caches by path) and return its name."""
    monkeypatch.syspath_prepend(str(tmp_path))

    def write(source: str) -> str:
        name = f"relax_test_rm_{uuid.uuid4().hex[:8]}"
        (tmp_path / f"{name}.py").write_text(source)
        return name

    return write


@pytest.mark.parametrize("response, label, expected", [
    ("The answer is \\boxed{42}.", "42", 1.0),
    ("The answer is \\boxed{42}.", 42, 1.0),  # non-string labels (parquet ints)
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("\\boxed{\\dfrac{3}{4}}", "3/4", 1.0),
    ("\\boxed{-\\frac{1}{2}}", "-0.5", 1.0),
    ("\\boxed{x = \\frac{10}{4}}", "2.5", 1.0),
    ("so x = 1,000", "1000", 1.0),
    ("so x = 1000", "1,000", 1.0),
    ("\\boxed{1,234,567}", "1234567", 1.0),
    ("points (1,2) and 3", "3", 1.0),  # "1,2" is not a thousands group
    ("first 3 then -7", "-7", 1.0),
    ("first 3 then -7", "7", 0.0),
    ("\\boxed{{3}}", "\\boxed{3}", 1.0),  # redundant braces
    ("\\boxed{3}", "\\boxed{3}", 1.0),
    ("\\boxed{\\text{5}}", "5", 1.0),
    ("\\boxed{50\\%}", "50", 1.0),
    ("1/2", "0.5", 1.0),
    ("0.50", "1/2", 1.0),
    ("It is 42.", "42", 1.0),
    ("no number here", "1", 0.0),
    ("12", "13", 0.0),
    ("\\boxed{12} then 13", "12", 1.0),  # boxed beats the last number
    ("\\boxed{1} and later \\boxed{2}", "2", 1.0),  # last box wins
    ("\\boxed{\\sqrt{2}}", "\\sqrt{2}", 1.0),  # non-numeric: normalized string match
    ("\\boxed{\\sqrt{3}}", "\\sqrt{2}", 0.0),
    ("\\boxed{3", "3", 0.0),  # unbalanced box: no answer
    ("3", None, 0.0),
])
def test_math_grader(response: str, label: object, expected: float) -> None:
    assert math_answer(Namespace(), _s(response, label)) == expected


def test_math_helpers() -> None:
    assert extract_answer("a \\boxed{\\frac{a}{\\sqrt{b}}} b") == "\\frac{a}{\\sqrt{b}}"
    assert extract_answer("\\fbox{7}") == "7"
    assert extract_answer("nothing") is None
    assert to_number("1,000.5") == to_number("1000.5") == to_number("2001/2")
    assert to_number("\\frac{1}{0}") is None and to_number("abc") is None


def test_exact_grader() -> None:
    exact = get_reward_fn("exact")
    assert exact(Namespace(), _s(" 7 ", "7")) == 1.0
    assert exact(Namespace(), _s("7", 7)) == 1.0
    assert exact(Namespace(), _s("8", "7")) == 0.0
    assert exact(Namespace(), _s("77", "7")) == 0.0


def test_unknown_rm_type_lists_known() -> None:
    with pytest.raises(ValueError) as info:
        get_reward_fn("nope")
    assert isinstance(info.value, ConfigError)
    assert str(info.value) == f"unknown --rm-type 'nope'; known: {', '.join(sorted(GRADERS))}"
    assert {"exact", "math"} <= set(GRADERS)


def test_no_reward_configured() -> None:
    with pytest.raises(ConfigError, match="set --rm-type"):
        asyncio.run(compute_rewards(_cfg(_args(rm_type=None)), [_s("1")]))


def test_builtin_rewards_are_stored_on_samples() -> None:
    samples = [_s("1", "1"), _s("2", "1"), _s("\\boxed{1}", "1")]
    assert asyncio.run(compute_rewards(_cfg(_args()), samples)) == [1.0, 0.0, 0.0]
    assert [s.reward for s in samples] == [1.0, 0.0, 0.0]
    assert asyncio.run(compute_rewards(_cfg(_args(rm_type="math_lenient")), samples)) == [1.0, 0.0, 1.0]
    assert asyncio.run(compute_rewards(_cfg(_args(rm_type="math")), samples)) == [0.0, 0.0, 1.0]  # needs \\boxed{}


def test_async_custom_reward_dict_and_reward_key(module) -> None:
    name = module(
        "import asyncio\n"
        "async def reward(args, sample, **kw):\n"
        "    await asyncio.sleep(0)\n"
        "    return {'acc': float(sample.response == 'x'), 'len': float(len(sample.response))}\n"
    )
    samples = [_s("x"), _s("yy")]
    rewards = asyncio.run(compute_rewards(_cfg(_args(custom_rm_path=f"{name}.reward", reward_key="acc")), samples))
    assert rewards == [1.0, 0.0]
    assert samples[1].reward == {"acc": 0.0, "len": 2.0}  # the full dict stays for logging
    assert asyncio.run(compute_rewards(_cfg(_args(custom_rm_path=f"{name}.reward", reward_key="len")), samples)) == [1.0, 2.0]
    with pytest.raises(ValueError, match=r"--reward-key 'nope' not in reward dict \(keys: \['acc', 'len'\]\)"):
        asyncio.run(compute_rewards(_cfg(_args(custom_rm_path=f"{name}.reward", reward_key="nope")), samples))
    with pytest.raises(ValueError, match="set --reward-key"):
        asyncio.run(compute_rewards(_cfg(_args(custom_rm_path=f"{name}.reward")), samples))


def test_async_custom_rewards_run_concurrently(module) -> None:
    name = module(
        "import asyncio\n"
        "running = 0\n"
        "peak = 0\n"
        "async def reward(args, sample):\n"
        "    global running, peak\n"
        "    running += 1; peak = max(peak, running)\n"
        "    await asyncio.sleep(0.01)\n"
        "    running -= 1\n"
        "    return float(sample.index)\n"
    )
    samples = [_s("", index=i) for i in range(5)]
    assert asyncio.run(compute_rewards(_cfg(_args(custom_rm_path=f"{name}.reward")), samples)) == [0.0, 1.0, 2.0, 3.0, 4.0]
    import sys

    assert sys.modules[name].peak == 5


def test_sync_custom_reward_with_kwargs_signature(module) -> None:
    name = module("def reward_func(args, sample, **kwargs):\n    return len(sample.response)\n")
    samples = [_s("abc"), _s("")]
    assert asyncio.run(compute_rewards(_cfg(_args(custom_rm_path=f"{name}.reward_func")), samples)) == [3.0, 0.0]
    assert samples[0].reward == 3


def test_custom_reward_errors_name_the_function_and_sample(module) -> None:
    name = module("def bad(args, sample):\n    raise RuntimeError('boom')\n")
    with pytest.raises(RuntimeError, match="boom") as info:
        asyncio.run(compute_rewards(_cfg(_args(custom_rm_path=f"{name}.bad")), [_s("x", index=4)]))
    assert f"in reward function --custom-rm-path {name}.bad (sample index 4" in info.value.__notes__[0]


def test_custom_reward_bad_paths_name_flag_and_signature(module) -> None:
    with pytest.raises(PluginError, match="--custom-rm-path: cannot import module 'no_such_mod'.*reward_func\\(args, sample"):
        asyncio.run(compute_rewards(_cfg(_args(custom_rm_path="no_such_mod.fn")), [_s("x")]))
    name = module("def one(sample):\n    return 1.0\n")
    with pytest.raises(PluginError, match="takes 1 positional argument"):
        asyncio.run(compute_rewards(_cfg(_args(custom_rm_path=f"{name}.one")), [_s("x")]))


def test_remote_rm_against_a_local_http_server(tmp_path: Path) -> None:
    """--rm-type remote_rm POSTs prompt/response/label to --rm-url (a real local HTTP server)."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    seen = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            answer = json.dumps({"score": float(body["response"] == body["label"]), "len": len(body["response"])})
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(answer.encode())

        def log_message(self, *a) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        args = Namespace(custom_rm_path=None, rm_type="remote_rm", group_rm=False, reward_key="score",
                         rm_url=f"http://127.0.0.1:{server.server_port}/reward", hook_timeout=60.0,
                         http_proxy=None, **GENRM_OFF)
        rewards = asyncio.run(compute_rewards(_cfg(args), [_s("7", "7"), _s("3", "7")]))
    finally:
        server.shutdown()
    assert rewards == [1.0, 0.0]
    assert {b["response"] for b in seen} == {"7", "3"} and all(b["label"] == "7" for b in seen)


def test_remote_rm_down_names_the_url() -> None:
    from relax.engine.rollout.engine_client import EngineError

    args = Namespace(custom_rm_path=None, rm_type="remote_rm", group_rm=False, reward_key=None,
                     rm_url="http://127.0.0.1:9/reward", hook_timeout=60.0, http_proxy=None, **GENRM_OFF)
    with pytest.raises(EngineError, match="127.0.0.1:9"):
        asyncio.run(compute_rewards(_cfg(args), [_s("7", "7")]))


def test_remote_rm_that_never_answers_is_bounded_by_hook_timeout() -> None:
    """A service that accepts the connection and never answers: one line naming the URL and the sample, within
    --hook-timeout (retries included), never a hang."""
    import socket
    import time

    from relax.engine.rollout.engine_client import EngineError

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # the kernel accepts; nobody reads or answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/reward"
        args = Namespace(custom_rm_path=None, rm_type="remote_rm", group_rm=False, reward_key=None, rm_url=url, **GENRM_OFF,
                         hook_timeout=0.5, http_proxy=None)
        start = time.monotonic()
        with pytest.raises(EngineError) as info:
            asyncio.run(compute_rewards(_cfg(args), [Sample(index=4, prompt="p", response="7", label="7")]))
    assert time.monotonic() - start < 5
    assert str(info.value).startswith(url) and "sample index 4" in str(info.value) and "\n" not in str(info.value)


def test_group_rm_scores_whole_groups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_group_rm.py").write_text(
        "def reward(args, samples):\n"
        "    best = max(len(s.response) for s in samples)\n"
        "    return [float(len(s.response) == best) for s in samples]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    args = Namespace(custom_rm_path="my_group_rm.reward", rm_type=None, group_rm=True, reward_key=None, rm_url=None,
                     hook_timeout=300.0, **GENRM_OFF)
    samples = [Sample(response=r, group_index=g) for r, g in [("a", 0), ("bb", 0), ("ccc", 1), ("c", 1)]]
    assert asyncio.run(compute_rewards(_cfg(args), samples)) == [0.0, 1.0, 1.0, 0.0]
    sys.modules.pop("my_group_rm", None)
    with pytest.raises(ConfigError, match="--group-rm needs --custom-rm-path"):
        asyncio.run(compute_rewards(_cfg(_args(group_rm=True)), samples))


def test_a_reward_function_that_never_returns_fails_the_run_naming_it(tmp_path, monkeypatch) -> None:
    """--hook-timeout bounds each call of a user reward function, sync or async, and names it and the sample."""
    import threading

    (tmp_path / "stuck_rm.py").write_text(
        "import asyncio, threading\n"
        "forever = threading.Event()\n"
        "def sync_reward(args, sample, **kw):\n    forever.wait()\n"
        "async def async_reward(args, sample, **kw):\n    await asyncio.sleep(3600)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from relax.utils.plugins import HookTimeout

    for name in ("sync_reward", "async_reward"):
        args = _args(custom_rm_path=f"stuck_rm.{name}", rm_type=None, hook_timeout=0.2)
        with pytest.raises(HookTimeout, match=rf"--custom-rm-path stuck_rm.{name} \(sample index 4, group None\) did "
                                              r"not return within --hook-timeout 0.2 s"):
            asyncio.run(compute_rewards(_cfg(args), [_s("7", "7", index=4)]))
    assert any(t.name == "relax-sync_reward" and t.daemon for t in threading.enumerate())  # left, harmlessly
