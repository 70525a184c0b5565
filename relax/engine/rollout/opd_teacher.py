"""Teacher log-probs from an engine server: on-policy distillation with ``--opd-type sglang``.

Where the teacher runs:

* ``--rm-url URL``: a server you started that speaks SGLang's ``/generate`` (a real SGLang
  server, or ``relax serve-engine``). This is slime's OPD convention (``--rm-url
  http://HOST:PORT/generate``); the URL may or may not end in ``/generate``.
* otherwise ``--opd-teacher-load PATH``: the run starts an embedded engine server over that
  checkpoint (fp32, the run's ``--seed`` for a random-init preset) as a subprocess bound to
  127.0.0.1 and stops it with the run.

Each sample's response tokens are scored with SGLang's prompt-logprob request: the whole
sequence (prompt + response) as ``input_ids``, ``max_new_tokens`` 0, ``return_logprob`` and
``logprob_start_len`` = prompt length - 1; the last ``response_length`` entries of
``meta_info.input_token_logprobs`` are the teacher's log-probs. ``temperature`` is
``--rollout-temperature``: the embedded engine divides the logits by it, exactly as the
trainer does for student log-probs (`relax.backends.torch.logprobs`); real SGLang scores
prompt tokens on raw logits, which is the same at temperature 1.

A teacher that is down or unreachable ends the run with one `TeacherError` line naming its
URL: at start-up after at most ``HEALTH_TIMEOUT_S``, later after the HTTP client's connect or
request timeout.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from relax.engine.rollout.engine_client import EngineClient, EngineError
from relax.engine.rollout.teacher_config import TeacherConfig
from relax.utils.http_utils import close_session
from relax.utils.types import Sample

HEALTH_TIMEOUT_S = 30.0  # a start-up /health check; a refused connection fails at once
REQUEST_TIMEOUT_S = 600.0  # one scoring request (a long sequence on a busy server)


class TeacherError(RuntimeError):
    """The OPD teacher server could not score a batch (down, unreachable, or a malformed answer)."""


@dataclass
class TeacherServer:
    """The teacher's address, the temperature it scores at, and the embedded server process when the run started it."""

    url: str
    temperature: float = 1.0  # --rollout-temperature
    process: Any = None  # relax.backends.embedded.launch.EngineProcess
    proxy: str | None = None  # --http-proxy, for a --rm-url server

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None


_ACTIVE: TeacherServer | None = None


def base_url(url: str) -> str:
    """``http://h:p/generate`` or ``h:p`` -> ``http://h:p``."""
    url = url.strip().rstrip("/").removesuffix("/generate")
    return url if "://" in url else f"http://{url}"


def start_teacher(cfg: TeacherConfig, device: str, log_dir: str | None = None) -> TeacherServer:
    """Connect to ``--rm-url`` or launch the embedded teacher; check it answers; make it the active teacher."""
    global _ACTIVE
    if cfg.rm_url:
        teacher = TeacherServer(base_url(cfg.rm_url), cfg.rollout_temperature, proxy=cfg.http_proxy)
    else:
        from relax.backends.embedded.launch import EngineProcess

        server_args = ["--hf-checkpoint", cfg.opd_teacher_load, "--seed", str(cfg.seed), "--device", device,
                       "--dtype", "float32", "--host", "127.0.0.1"]
        try:
            process = EngineProcess.start(server_args, timeout=120.0, log_dir=log_dir)
        except RuntimeError as exc:
            raise TeacherError(f"OPD teacher server over --opd-teacher-load {cfg.opd_teacher_load} did not start: "
                               f"{str(exc).splitlines()[0]}") from None
        teacher = TeacherServer(process.url, cfg.rollout_temperature, process)
    if not asyncio.run(_healthy(teacher.url, teacher.proxy)):
        teacher.stop()
        raise TeacherError(f"OPD teacher server {teacher.url} is not reachable (no answer to /health within "
                           f"{HEALTH_TIMEOUT_S:.0f} s); start it or fix --rm-url")
    _ACTIVE = teacher
    return teacher


async def _healthy(url: str, proxy: str | None = None) -> bool:
    try:
        return await EngineClient(url, proxy=proxy).health(timeout=HEALTH_TIMEOUT_S)
    finally:
        await close_session()  # each asyncio.run is its own loop: close its pooled session


def stop_teacher() -> None:
    global _ACTIVE
    if _ACTIVE is not None:
        _ACTIVE.stop()
    _ACTIVE = None


def teacher_request(sample: Sample, temperature: float) -> dict[str, Any]:
    """SGLang's prompt-logprob request for ``sample``'s response tokens."""
    prompt_len = len(sample.tokens) - sample.response_length
    return {
        "input_ids": list(sample.tokens),
        "sampling_params": {"max_new_tokens": 0, "temperature": temperature, "skip_special_tokens": False},
        "return_logprob": True,
        "logprob_start_len": max(prompt_len - 1, 0),
    }


def response_log_probs(response: dict[str, Any], response_length: int, url: str) -> list[float]:
    """The last ``response_length`` values of ``meta_info.input_token_logprobs``."""
    if response_length == 0:
        return []
    try:
        entries = response["meta_info"]["input_token_logprobs"]
        values = [float(e[0]) for e in entries[len(entries) - response_length:]]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise TeacherError(f"OPD teacher server {url}: no usable meta_info.input_token_logprobs in its answer "
                           f"({type(exc).__name__}: {exc})") from None
    if len(values) != response_length:
        raise TeacherError(f"OPD teacher server {url} returned {len(values)} prompt log-probs for "
                           f"{response_length} response tokens")
    return values


async def score(url: str, samples: list[Sample], temperature: float, proxy: str | None = None) -> list[list[float]]:
    client = EngineClient(url, timeout=REQUEST_TIMEOUT_S, proxy=proxy)
    try:
        answers = await client.generate([teacher_request(s, temperature) for s in samples])
    except EngineError as exc:
        raise TeacherError(f"OPD teacher server {exc}") from None
    finally:
        await close_session()
    return [response_log_probs(a, s.response_length, client.base_url) for a, s in zip(answers, samples, strict=True)]


def attach_teacher_log_probs(samples: list[Sample]) -> None:
    """Fill ``sample.teacher_log_probs`` for every sample from the active teacher server (at its temperature)."""
    if _ACTIVE is None:
        raise RuntimeError("--opd-type sglang: no teacher server is running (start_teacher was not called)")
    values = asyncio.run(score(_ACTIVE.url, samples, _ACTIVE.temperature, _ACTIVE.proxy))
    for s, lp in zip(samples, values, strict=True):
        s.teacher_log_probs = lp
