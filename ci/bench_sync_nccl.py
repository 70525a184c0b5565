"""Weight sync by NCCL to an engine on another GPU: seconds per GB, split by phase (issue "Many GPUs", run 4).

    python3 ci/bench_sync_nccl.py --json /tmp/out/sync_nccl.json          # bench-1b, GPU 0 -> GPU 1
    python3 ci/bench_sync_nccl.py --model bench-270m --repeats 3

The trainer side is this process: the preset's bf16 weights on GPU 0, pushed by `WeightPusher` (what the
trainer actor runs in ``relax train``) through ``/init_weights_update_group`` + ``/update_weights_from_distributed``
to an embedded engine server (``relax serve-engine``'s module) started on GPU 1 under its own
``CUDA_VISIBLE_DEVICES``, in ``--bucket-mb`` buckets (relax's ``--update-weight-buffer-size`` default, 512 MB).
Each push also computes both sides' per-tensor checksums, as every sync of a run does; the push is
bitwise only if the engine's equal the trainer's.

Phases (`PushReport.phases`): ``prepare`` (choose the transport, open the group: only the first push),
``transfer`` (pack each bucket, broadcast it, the engine copies it into its model; the trainer's checksums
overlap this), ``checksums`` (the engine's checksums over HTTP). 1 GB = 1e9 bytes of weights sent. The first
push (group creation, NCCL communicator set-up, kernel warm-up) is reported apart and left out of the medians.
Target: <= 0.02 s/GB (docs/DESIGN.md budgets).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TARGET_S_PER_GB = 0.02


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="bench-1b")
    ap.add_argument("--repeats", type=int, default=5, help="timed pushes after the first")
    ap.add_argument("--bucket-mb", type=int, default=512)
    ap.add_argument("--json", default=None)
    ns = ap.parse_args(argv)
    import torch

    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        print("bench_sync_nccl: needs 2 CUDA GPUs", file=sys.stderr)
        return 2
    from relax.backends.embedded.launch import EngineProcess
    from relax.engine.rollout.engine_client import EngineClient
    from relax.models import build_model
    from relax.utils.http_utils import run_closing
    from relax.weights.push import WeightPusher
    from relax.weights.transports import SyncTarget

    visible = os.environ.get("CUDA_VISIBLE_DEVICES", ",".join(str(i) for i in range(torch.cuda.device_count())))
    engine_gpu = visible.split(",")[1]
    engine = EngineProcess.start(["--hf-checkpoint", ns.model, "--device", "cuda", "--dtype", "bfloat16"],
                                 env={"CUDA_VISIBLE_DEVICES": engine_gpu}, timeout=300)
    pusher = WeightPusher(timeout_s=300)
    try:
        info = run_closing(EngineClient(engine.url).server_info())
        target = SyncTarget("engine:0", engine.url, info["relax_engine"]["device"])
        state = build_model(ns.model, dtype=torch.bfloat16, seed=5).to("cuda:0").state_dict()
        buckets, size, current = [[]], 0, 0
        for name, tensor in state.items():  # the trainer's bucketing: at most --bucket-mb per bucket
            nbytes = tensor.numel() * tensor.element_size()
            if buckets[-1] and current + nbytes > ns.bucket_mb * 2**20:
                buckets.append([])
                current = 0
            buckets[-1].append((name, tensor))
            current += nbytes
            size += nbytes
        gb = size / 1e9
        pushes = []
        for version in range(1 + ns.repeats):
            for tensor in state.values():  # an optimizer step: every push sends new values
                tensor.add_(1)
            torch.cuda.synchronize()
            start = time.perf_counter()
            report = pusher.push(buckets, [target], version, requested="distributed",
                                 weights_device=torch.device("cuda:0"))
            wall = time.perf_counter() - start
            equal = report.target_checksums.get("engine:0") == report.trainer_checksums
            pushes.append({"version": version, "wall_s": wall, "s_per_gb": wall / gb, "bitwise": equal,
                           "transports": report.transports, **report.phases})
            print(f"push {version}: {wall:.3f} s = {wall / gb:.4f} s/GB ({', '.join(f'{k} {v:.3f}' for k, v in report.phases.items())}); "
                  f"checksums {'equal' if equal else 'DIFFER'}", flush=True)
    finally:
        pusher.close()
        engine.stop()
    timed = pushes[1:]
    median = {key: statistics.median(p[key] for p in timed) for key in ("wall_s", "prepare_s", "transfer_s",
                                                                          "checksums_s")}
    s_per_gb = median["wall_s"] / gb
    met = s_per_gb <= TARGET_S_PER_GB
    summary = {"model": ns.model, "gb": gb, "tensors": len(state), "buckets": len(buckets), "bucket_mb": ns.bucket_mb,
               "gpus": [torch.cuda.get_device_name(0), engine_gpu], "median": median, "s_per_gb": s_per_gb,
               "s_per_gb_by_phase": {k.removesuffix("_s"): v / gb for k, v in median.items() if k != "wall_s"},
               "target_s_per_gb": TARGET_S_PER_GB, "met": met, "all_bitwise": all(p["bitwise"] for p in pushes),
               "first_push": pushes[0], "pushes": timed}
    print(f"bench_sync_nccl: {ns.model} {gb:.3f} GB in {len(buckets)} buckets, GPU 0 -> GPU {engine_gpu} by NCCL, "
          f"median of {len(timed)}: {median['wall_s']:.3f} s = {s_per_gb:.4f} s/GB (target <= {TARGET_S_PER_GB}: "
          f"{'met' if met else 'MISSED'}); transfer {median['transfer_s'] / gb:.4f}, checksums "
          f"{median['checksums_s'] / gb:.4f}, prepare {median['prepare_s'] / gb:.4f} s/GB; bitwise "
          f"{'yes' if summary['all_bitwise'] else 'NO'}")
    if ns.json:
        from ci.provenance import provenance

        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps({**summary, "provenance": provenance(sys.argv)}, indent=2))
    return 0 if summary["all_bitwise"] else 1


if __name__ == "__main__":
    sys.exit(main())
