"""A stand-in for ``relax train`` that writes contract-shaped artifacts: for testing the harness.

``python -m harness.fake_engine [relax flags] --output-dir DIR [--fake-* knobs]``. It starts
real child processes (roles ``trainer:0``, ``engine:<i>``) and logs their pids the way the engine
does, sleeps per step, and can hang, ignore SIGTERM, leave an escaped grandchild, fail, recover
from a killed engine, or claim a flag is "not supported yet". Each step is an "engine step" for the
planted-slowdown hook (``RELAX_FAULT_ENGINE_SLOWDOWN``, relax/utils/fault_hooks.py), read through the
same code as the embedded engine's, so the A/B gate can be tested in seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import relax
from relax.utils.fault_hooks import EngineHooks

SLEEPER = [sys.executable, "-c", "import time\nwhile True: time.sleep(1)"]


class Writer:
    def __init__(self, out: Path):
        out.mkdir(parents=True, exist_ok=True)
        self.out = out
        self.files = {n: open(out / f"{n}.jsonl", "a") for n in ("metrics", "weights", "events", "samples")}  # noqa: SIM115

    def write(self, name: str, rec: dict) -> None:
        self.files[name].write(json.dumps(rec) + "\n")
        self.files[name].flush()

    def event(self, name: str, **fields) -> None:
        self.write("events", {"time": time.time(), "event": name, **fields})

    def run_json(self, **info) -> None:
        (self.out / "run.json").write_text(json.dumps(info, indent=2))


def parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    p.add_argument("--output-dir", required=True)
    p.add_argument("--num-rollout", type=int, default=4)
    p.add_argument("--rollout-batch-size", type=int, default=2)
    p.add_argument("--n-samples-per-prompt", type=int, default=2)
    p.add_argument("--engines", type=int, default=1)
    p.add_argument("--load", default=None)
    p.add_argument("--fake-step-s", type=float, default=0.05)
    p.add_argument("--fake-hang", action="store_true")
    p.add_argument("--fake-ignore-term", action="store_true")
    p.add_argument("--fake-escape", action="store_true", help="start a grandchild in its own session")
    p.add_argument("--fake-recover", action="store_true", help="restart dead engines")
    p.add_argument("--fake-unsupported", default=None)
    p.add_argument("--fake-fail", default=None)
    p.add_argument("--fake-leave-children", action="store_true", help="exit without reaping children")
    p.add_argument("--fake-loss-offset", type=float, default=0.0)
    p.add_argument("--fake-reward-slope", type=float, default=0.1)
    args, _ = p.parse_known_args(argv)
    return args


def spawn(w: Writer, role: str, escape: bool = False) -> subprocess.Popen:
    proc = subprocess.Popen(SLEEPER, start_new_session=escape)
    w.event("process_started", role=role, pid=proc.pid, host="localhost")
    return proc


def main(argv: list[str] | None = None) -> int:
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.fake_unsupported:
        print(f"relax: not supported yet: {args.fake_unsupported}", file=sys.stderr)
        return 2
    if args.fake_ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    w = Writer(Path(args.output_dir))
    config = {"num_rollout": args.num_rollout, "rollout_batch_size": args.rollout_batch_size,
              "n_samples_per_prompt": args.n_samples_per_prompt}
    info = {"status": "running", "exit_code": None, "error": None, "config": config, "versions": {"relax": "fake", "relax_path": relax.__file__},
            "device": "cpu", "dtypes": {"trainer": "float32", "engine": "float32"},
            "seeds": {"seed": 1, "rollout_seed": 42}, "start_time": time.time(),
            "end_time": None, "output_dir": args.output_dir}
    w.run_json(**info)
    w.event("run_start")
    w.event("process_started", role="driver", pid=os.getpid(), host="localhost")
    children = {"trainer:0": spawn(w, "trainer:0")}
    children |= {f"engine:{i}": spawn(w, f"engine:{i}") for i in range(args.engines)}
    if args.fake_escape:
        children["escaped"] = spawn(w, "escaped", escape=True)
    if args.fake_hang:
        while True:
            time.sleep(1)
    restarts, per_step = 0, args.rollout_batch_size * args.n_samples_per_prompt
    raise_at = os.environ.get("RELAX_FAULT_REWARD_RAISE_AT_STEP")
    start = 0
    if args.load:
        start = args.num_rollout // 2
        w.event("resume", step=start, path=args.load)
    error = None
    hooks = EngineHooks.from_env()
    for step in range(start, args.num_rollout):
        started = time.perf_counter()
        w.event("step_start", step=step)
        for phase in ("rollout", "train", "sync"):
            w.event("phase", step=step, phase=phase)
            time.sleep(args.fake_step_s / 3)
            for role, proc in list(children.items()):
                if role.startswith("engine") and proc.poll() is not None:
                    w.event("fault_detected", role=role, reason=f"process exited {proc.returncode}")
                    if not args.fake_recover:
                        error = f"{role} died (exit {proc.returncode})"
                        break
                    restarts += 1
                    w.event("restart", role=role, count=restarts)
                    children[role] = spawn(w, role)
            if error:
                break
        if raise_at is not None and step == int(raise_at):
            error = f"reward function raised at step {step}: ValueError: injected"
        if error:
            break
        checksums = {"model.embed_tokens.weight": f"{step:04x}aa", "lm_head.weight": f"{step:04x}bb"}
        for side in ["trainer"] + [f"engine:{i}" for i in range(args.engines)]:
            w.write("weights", {"version": step + 1, "side": side, "step": step, "time": time.time(),
                                "checksums": checksums})
        hooks.after_step(started)
        ids = [(step * 100 + g, i) for g in range(args.rollout_batch_size) for i in range(args.n_samples_per_prompt)]
        for fate in ("trained", "consumed"):
            for g, i in ids:
                extra = {"attempts": 1} if fate == "trained" else {"passes": 1}
                w.write("samples", {"step": step, "group_index": g, "index": i, "fate": fate, "reason": None, **extra})
        w.write("metrics", {"step": step, "weight_version": step, "time": time.time(),
                            "rollout/reward_mean": 0.1 + args.fake_reward_slope * step,
                            "rollout/num_samples": per_step, "rollout/response_len_mean": 16.0,
                            "train/loss": 1.0 / (step + 1) + args.fake_loss_offset, "train/grad_norm": 0.5,
                            "train/ppo_kl": 0.0, "train/train_rollout_logprob_abs_diff": 1e-7,
                            "train/train_rollout_logprob_abs_diff_max": 1e-6, "train/train_rollout_kl": 0.0,
                            "perf/step_time_s": time.perf_counter() - started})
        w.event("step_end", step=step)
    if args.fake_fail:
        error = error or args.fake_fail
    for proc in children.values():
        if proc.poll() is None and not args.fake_leave_children:
            proc.kill()
            proc.wait()
    code = 1 if error else 0
    info.update(status="failed" if error else "completed", exit_code=code, error=error, end_time=time.time())
    w.run_json(**info)
    w.event("run_end", status=info["status"], exit_code=code)
    if error:
        print(f"relax: run failed: {error}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
