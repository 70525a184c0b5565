"""Where a rollout's generation time goes beyond the decode: the same batch through each layer of the path.

    python ci/bench_engine_paths.py [--batch 64] [--prompt 128] [--new 256] [--repeats 3] [--json OUT.json]
    python ci/bench_engine_paths.py --device cpu --model tiny-qwen3 --batch 4 --prompt 8 --new 8   # CPU smoke

Why: in a colocate GRPO step the engine generates 64 x 256 tokens in ~0.34 s by its own clock
(``meta_info.e2e_latency``), ~0.06 s more than ``ci/bench_engine.py``'s decode of the same tokens. This
bench runs one batched request of the GRPO bench's shape (bench-270m in bf16, the lean runner with CUDA
graphs and torch.compile, temperature 1, EOS ignored so every row decodes ``--new`` tokens) through, in
one process and one after the other:

* ``steps``: ``EmbeddedEngine.step`` until done (the decode and prefill alone), then the responses built
  (text detokenized, ``[logprob, id, text]`` entries): both timed apart;
* ``generate``: ``EmbeddedEngine.generate`` (both of the above);
* ``scheduler``: the continuous-batching `Scheduler` thread (what the engine server runs);
* ``http``: the engine's HTTP server (`EngineServer`, served from a thread as the Ray actor serves it)
  driven by the rollout's `EngineClient` with one SGLang batch request, orjson on both sides;
* ``http_after_release``: the same after ``/release_memory_occupation`` + ``/resume_memory_occupation``
  and a weight update (not timed), as each colocate step runs it (CUDA graphs captured again).

Each path: the median of ``--repeats`` runs after a warm-up, and the longest ``e2e_latency`` of the
responses. Ratios are against ``steps`` (decode only) of the same run. JSON with provenance.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ci.* when run as a script
from ci.bench_engine import engine_requests, timed, workload  # noqa: E402
from ci.provenance import provenance  # noqa: E402


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="bench-270m")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    ns = ap.parse_args(argv)
    if min(ns.batch, ns.prompt, ns.new, ns.repeats) < 1:
        ap.error("--batch, --prompt, --new and --repeats must be >= 1")
    return ns


def _requests(prompts: Any, new: int, seed0: int) -> list[dict]:
    reqs = engine_requests(prompts, new, seed0)
    for r in reqs:
        r["sampling_params"]["ignore_eos"] = True
    return reqs


def _longest_latency(responses: list[dict]) -> float:
    return max(float(r["meta_info"]["e2e_latency"]) for r in responses)


def measure(ns: argparse.Namespace) -> dict[str, Any]:
    import torch

    from relax.backends.embedded.engine import EmbeddedEngine
    from relax.backends.embedded.hosting import serve_in_thread
    from relax.backends.embedded.scheduler import Scheduler
    from relax.backends.embedded.server import EngineServer
    from relax.engine.rollout.engine_client import EngineClient
    from relax.engine.rollout.engine_pool import _batched
    from relax.models import load_tokenizer
    from relax.utils.http_utils import run_closing

    model, prompts = workload(ns, ns.batch)
    cuda = ns.device == "cuda"
    engine = EmbeddedEngine(model, eos_token_ids=[], device=ns.device, max_context_len=ns.prompt + ns.new + 8,
                            max_running_requests=ns.batch, tokenizer=load_tokenizer(ns.model), runner="lean",
                            cuda_graph=cuda, compile=cuda)
    reqs = _requests(prompts, ns.new, 0)
    engine.generate(reqs)  # warm-up: compile and graph capture
    rows: dict[str, dict[str, list[float]]] = {}

    def record(path: str, **values: float) -> None:
        for key, value in values.items():
            rows.setdefault(path, {}).setdefault(key, []).append(value)

    for _ in range(ns.repeats):
        objs = [engine.add_request(engine.make_request(r)) for r in reqs]

        def step_until_done(objs=objs) -> None:
            while not all(o.done for o in objs):
                engine.step()

        decode = timed(step_until_done, ns.device)
        start = time.perf_counter()
        responses = engine.responses(objs)
        record("steps", seconds=decode, respond_s=time.perf_counter() - start, e2e_latency=_longest_latency(responses))
    holder: dict[str, list[dict]] = {}
    for _ in range(ns.repeats):
        record("generate", seconds=timed(lambda: holder.update(out=engine.generate(reqs)), ns.device))
        record("generate", e2e_latency=_longest_latency(holder["out"]))
    scheduler = Scheduler(engine)
    for _ in range(ns.repeats):
        start = time.perf_counter()
        out = [f.result() for f in scheduler.submit_many(reqs)]
        record("scheduler", seconds=time.perf_counter() - start, e2e_latency=_longest_latency(out))
    served = serve_in_thread(EngineServer(scheduler, model_path=ns.model).app(), name="bench-engine-http")
    client = EngineClient(served.url, timeout=600)
    body = _batched(reqs)
    saved = {k: v.cpu() for k, v in model.state_dict().items()}
    for path in ("http", "http_after_release"):
        for _ in range(ns.repeats):
            if path == "http_after_release":
                run_closing(client.release_memory_occupation())
                run_closing(client.resume_memory_occupation())
                with scheduler.exclusive() as held:  # the sync that follows a resume (released without a backup)
                    held.update_weights_from_tensors(saved)
            start = time.perf_counter()
            out = run_closing(client.generate(body))
            record(path, seconds=time.perf_counter() - start, e2e_latency=_longest_latency(out))
    scheduler.close()
    medians = {path: {k: statistics.median(v) for k, v in values.items()} for path, values in rows.items()}
    base = medians["steps"]["seconds"]
    for m in medians.values():
        m["vs_steps"] = m["seconds"] / base
        m["tokens_per_s"] = ns.batch * ns.new / m["seconds"]
    if cuda:
        torch.cuda.synchronize()
    return medians


def main(argv: list[str] | None = None) -> int:
    ns = parse(argv)
    import torch

    if ns.device == "cuda" and not torch.cuda.is_available():
        print("bench_engine_paths: needs a CUDA GPU (torch.cuda.is_available() is False); --device cpu runs the "
              "smoke path", file=sys.stderr)
        return 1
    medians = measure(ns)
    print(f"bench_engine_paths: {ns.model}, batch {ns.batch}, prompt {ns.prompt}, {ns.new} new tokens, "
          f"median of {ns.repeats}")
    print("| path | seconds | vs steps | tok/s | longest e2e_latency | responses built |")
    print("|---|---:|---:|---:|---:|---:|")
    for path, m in medians.items():
        respond = f"{m['respond_s']:.4f}" if "respond_s" in m else "-"
        print(f"| {path} | {m['seconds']:.4f} | {m['vs_steps']:.3f} | {m['tokens_per_s']:,.0f} | "
              f"{m['e2e_latency']:.4f} | {respond} |")
    if ns.json:
        Path(ns.json).write_text(json.dumps({"provenance": provenance(), "setup": vars(ns), "paths": medians},
                                            indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
