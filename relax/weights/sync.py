"""The driver's record of a weight sync: weights.jsonl and the ``weights_synced`` event.

The trainer's rank 0 pushes the weights (`relax.weights.push`) and reports what it did; the driver
writes one weights.jsonl record per side (the trainer, each engine, the actor_fwd service) with
per-tensor checksums keyed by HF name, so weight-update equality is decidable from the artifacts
alone. A stock SGLang server's record holds SGLang's hashes of its own parameters (``"layout": "sglang"``),
matched by the trainer record's ``layouts["sglang"]``; a target whose checksums cannot be matched gets a
record that says why.
"""

from __future__ import annotations

import time

from relax.metrics.artifacts import RunArtifacts
from relax.weights.push import PushReport


def record_push(artifacts: RunArtifacts, report: PushReport, *, step: int, seconds: float, resync: bool = False) -> None:
    now = time.time()
    version = report.version
    trainer = {"version": version, "side": "trainer", "step": step, "time": now, "checksums": report.trainer_checksums}
    if report.trainer_layouts:
        trainer["layouts"] = report.trainer_layouts
    artifacts.weights.write(trainer)
    for side, sums in report.target_checksums.items():
        record = {"version": version, "side": side, "step": step, "time": now, "checksums": sums}
        if side in report.target_layouts:
            record["layout"] = report.target_layouts[side]
        if sums is None:
            record["unverified"] = report.unverified.get(side, "no checksums reported")
        artifacts.weights.write(record)
    sides = list(report.target_checksums)
    artifacts.event("weights_synced", version=version, step=step, buckets=report.buckets, bytes=report.bytes,
                    seconds=seconds, engines=[int(s.split(":")[1]) for s in sides if s.startswith("engine:")],
                    services=[s for s in sides if not s.startswith("engine:")],
                    transports=sorted(report.transports), **report.phases, **({"resync": True} if resync else {}))
