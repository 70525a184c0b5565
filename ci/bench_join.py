"""How long a new engine takes to join a running ``relax train`` and serve: start, health, weight sync, first request.

    python3 ci/bench_join.py --json /tmp/out/bench_join.json                       # GPU: bench-270m, one GPU
    python3 ci/bench_join.py --device cpu --model tiny-qwen3 --prompt-len 8 --max-new 8 --prompts 2 \\
        --generations 4 --relax-steps 12 --join-at 3 --json /tmp/join.json          # CPU smoke (numbers mean nothing)

The run is ci/bench_grpo_e2e.py's GRPO workload (colocate, one engine, the lean runner on CUDA) with
``--fleet-control-addr``; at step ``--join-at`` this script posts ``/scale_out {"count": 1}`` to the run's control
endpoint (relax/core/elastic.py), as an operator or the autoscaler would. The phases come from the run's events:

* start: ``scale_out_start`` -> the joiner's ``process_started`` (its actor up: imports, model, KV cache, graphs);
* health: -> ``engine_healthy`` (its ``/health_generate`` answered 200);
* sync: -> ``engine_joined`` (the last sync's bytes pushed to it under the weights lock, then the router);
* first request: -> the router's ``first_request_at`` for it (``fleet_final``): the rollout's next request to it.

Reference, from the same run: the first engine's start (``placement`` -> its ``process_started``), the same work
at launch; the ratio is the joiner's start over it (a joiner also shares the GPU with a running job).
Exit status 0 when the engine joined and served, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from subprocess import STDOUT, Popen, TimeoutExpired

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ci.bench_grpo_e2e import build_parser, log, log_tail, relax_argv, subprocess_env, write_prompts  # noqa: E402
from ci.provenance import write_result  # noqa: E402

PHASES = ("start", "health", "sync", "first_request")
POLL_S = 0.2


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = build_parser()
    ap.description = __doc__.split("\n\n")[0]
    ap.add_argument("--join-at", type=int, default=3, help="the step at whose start one engine is asked to join")
    ns = ap.parse_args(argv)
    ns.steps = ns.steps or 8
    ns.relax_steps = ns.relax_steps or 30
    if not 0 < ns.join_at < ns.relax_steps:
        ap.error(f"--join-at must fall inside the run's {ns.relax_steps} steps, got {ns.join_at}")
    return ns


def read_events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]


def join_phases(events: list[dict]) -> dict:
    """Seconds of each phase of the first joiner, and the first engine's start: the figures of this benchmark."""
    def first(name: str, **match) -> dict | None:
        return next((e for e in events if e.get("event") == name and all(e.get(k) == v for k, v in match.items())), None)

    scale = first("scale_out_start")
    if scale is None:
        raise ValueError("no scale_out_start event: the run was never asked to scale out")
    role = scale["engines"][0]
    started, healthy, joined = first("process_started", role=role), first("engine_healthy", role=role), \
        first("engine_joined", role=role)
    if joined is None:
        failed = first("scale_out_engine_failed", role=role)
        raise ValueError(f"{role} did not join: {failed['reason'] if failed else 'no engine_joined event'}")
    final = first("fleet_final") or {}
    served = next((w for w in final.get("workers", []) if w.get("url") == joined["url"]), {})
    if not served.get("first_request_at"):
        raise ValueError(f"{role} joined but the router sent it no request before the run ended")
    marks = [scale["time"], started["time"], healthy["time"], joined["time"], served["first_request_at"]]
    phases = {p: b - a for p, a, b in zip(PHASES, marks[:-1], marks[1:], strict=True)}
    placement, first_engine = first("placement"), first("process_started", role="engine:0")
    reference = first_engine["time"] - placement["time"] if placement and first_engine else None
    return {"engine": role, "phases_s": phases, "total_s": marks[-1] - marks[0], "served": served.get("served"),
            "joined_version": joined.get("version"), "first_engine_start_s": reference,
            "start_over_first_engine_start": phases["start"] / reference if reference else None}


def post_scale_out(events_path: Path, join_at: int, proc: Popen, answers: list) -> None:
    """Wait for the control endpoint and step ``join_at``, then ask for one engine (the answer into ``answers``)."""
    url = None
    while proc.poll() is None:
        events = read_events(events_path)
        url = url or next((e["url"] for e in events if e.get("event") == "control_endpoint"), None)
        if url and any(e.get("event") == "step_start" and e.get("step") == join_at for e in events):
            req = urllib.request.Request(url + "/scale_out", data=json.dumps({"count": 1}).encode(),
                                         headers={"Content-Type": "application/json"}, method="POST")
            try:
                with urllib.request.urlopen(req, timeout=600) as resp:
                    answers.append(json.loads(resp.read() or b"null"))
            except OSError as exc:
                answers.append({"error": f"{type(exc).__name__}: {exc}"})
            return
        time.sleep(POLL_S)


def main(argv: list[str] | None = None) -> int:
    ns = parse(argv)
    with tempfile.TemporaryDirectory(prefix="bench_join_") as tmp:
        workdir = Path(ns.workdir or tmp).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        prompts = write_prompts(ns, workdir)
        out_dir, log_path = workdir / "run", workdir / "relax_train.log"
        cmd = [sys.executable, "-m", "relax.cli", "train",
               *relax_argv(ns, "torch", prompts, out_dir), "--fleet-control-addr", "127.0.0.1:0"]
        log(f"relax train, {ns.relax_steps} steps, one engine asked to join at step {ns.join_at} (log: {log_path})")
        answers: list = []
        with open(log_path, "w") as fh:
            proc = Popen(cmd, stdout=fh, stderr=STDOUT, env=subprocess_env(ns, tempfile.mkdtemp(prefix="rj", dir="/tmp")),
                         cwd=workdir)
            poster = threading.Thread(target=post_scale_out, args=(out_dir / "events.jsonl", ns.join_at, proc, answers),
                                      daemon=True)
            poster.start()
            try:
                code = proc.wait(timeout=ns.timeout)
            except TimeoutExpired:
                proc.kill()
                code = 124
        try:
            result = join_phases(read_events(out_dir / "events.jsonl"))
            status, note = ("ok", "") if code == 0 else ("failed", f"relax train exited {code}")
        except ValueError as exc:
            result, status, note = {}, "failed", str(exc)
        if status != "ok":
            print(log_tail(log_path), file=sys.stderr)
    if result:
        print(f"{'phase':<14} {'seconds':>8}")
        for phase, seconds in result["phases_s"].items():
            print(f"{phase:<14} {seconds:8.2f}")
        print(f"{'total':<14} {result['total_s']:8.2f}")
        ratio = result["start_over_first_engine_start"]
        print(f"joiner's start over the first engine's start in the same run ({result['first_engine_start_s']:.2f} s): "
              f"{ratio:.2f}x" if ratio else "no first-engine start to compare with")
    print(f"status: {status} {note}".rstrip())
    if ns.json:
        write_result(ns.json, model=ns.model, device=ns.device, join_at=ns.join_at, steps=ns.relax_steps,
                     scale_out_answer=answers[0] if answers else None, status=status, note=note, **result)
    return 0 if status == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
