"""A warm `relax train` driver that forks one process per run (the server half of tests/driver_forks.py).

Started once per test process with the environment its runs share. It imports what every driver imports
before it parses a flag (torch, transformers, Ray and relax's driver modules), then reads one JSON request a
line on stdin: ``argv``, ``env``, ``cwd``, ``path`` (the run's ``sys.path``) and the ``stdout`` /
``stderr`` files. For each it forks a child that takes that environment, working directory, path and
files and runs what ``python -m relax.cli`` runs (`relax.cli.run`: `main`, then ``os._exit``, so no
interpreter finalization is skipped that the real program would do). The reply is two lines on the original
stdout: ``{"pid": ...}`` when the child is forked and ``{"code": ...}`` when it ends (``-N`` for signal N, as
`subprocess` reports it).

Fork safety: the server refuses to serve unless it is single-threaded once imports are done (OpenBLAS starts
a thread pool unless ``OMP_NUM_THREADS=1``; the client always sets it).
"""

from __future__ import annotations

import gc
import json
import os
import sys
import traceback

# what a driver imports before its first flag check (relax/entrypoints/train.py, relax/utils/validation.py,
# relax/core/runtime.py and the actor classes it hands to Ray)
PRELOAD = (
    "torch", "transformers", "ray", "relax.cli", "relax.entrypoints.train", "relax.utils.arguments",
    "relax.utils.validation", "relax.core.elastic", "relax.core.runtime", "relax.core.restarts",
    "relax.distributed.actors", "relax.distributed.engine_actor", "relax.distributed.service_actors",
    "relax.models.registry",
)


def _child(req: dict, reply_fd: int) -> None:
    code = 70
    try:
        os.close(reply_fd)  # the reply channel is the server's: a run (or what it starts) must not hold it open
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        for fd, key in ((1, "stdout"), (2, "stderr")):
            out = os.open(req[key], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(out, fd)
            os.close(out)
        os.chdir(req["cwd"])
        os.environ.clear()
        os.environ.update(req["env"])
        sys.path[:] = req["path"]
        import relax.cli

        sys.argv = [relax.cli.__file__, *req["argv"]]
        gc.enable()
        relax.cli.run()  # ends the process (os._exit)
    except BaseException:  # noqa: BLE001 - whatever it is, it goes to the run's stderr
        traceback.print_exc()
        sys.stderr.flush()
    os._exit(code)


def main() -> None:
    sys.path.pop(0)  # this script's directory (tests/): a fresh `python -m relax.cli` does not have it
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything an import prints goes to stderr, not into the reply channel
    gc.disable()  # set-up only: the child turns collections back on
    for name in PRELOAD:
        __import__(name)
    threads = len(os.listdir("/proc/self/task"))
    if threads != 1:
        reply.write(json.dumps({"refused": f"{threads} threads after the imports: a fork would copy held locks"}) + "\n")
        return
    # a fresh interpreter's sys.path is [its script's dir or cwd, *PYTHONPATH, the rest]: the rest is shared
    own = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    reply.write(json.dumps({"ready": os.getpid(), "path": sys.path[len(own):]}) + "\n")
    for line in sys.stdin:
        req = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(req, reply.fileno())
        reply.write(json.dumps({"pid": pid}) + "\n")
        _, status = os.waitpid(pid, 0)
        reply.write(json.dumps({"code": os.waitstatus_to_exitcode(status)}) + "\n")


if __name__ == "__main__":
    main()
