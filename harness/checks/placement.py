"""Placement: where a run's trainer ranks and engines ran, from ``events.jsonl``'s ``process_started`` events.

Each event names the actor's role (``trainer:<rank>``, ``engine:<i>``), its node and the GPU ids Ray gave
it. A multi-GPU layout is only what it claims when the ranks really sit one per GPU (NCCL refuses two
ranks of one group on one GPU), and "colocated" or "separate" engines really share, or avoid, their
ranks' GPUs. GPU ids are a node's own: a GPU is (node, id).
"""

from __future__ import annotations

from typing import Literal

from harness.checks.base import CheckContext, CheckParams, CheckResult, register


def _gpus(event: dict) -> set[tuple[str, str]]:
    return {(str(event.get("node_id")), str(g)) for g in event.get("gpu_ids") or []}


@register("placement")
class Placement(CheckParams):
    kind: Literal["placement"] = "placement"
    run: str | None = None
    trainers: int  # trainer ranks expected, one GPU each, no two on one GPU
    engines: int
    engines_share: Literal["colocated", "separate", "any"] = "any"  # engine i on rank i's GPU / on none of them
    nodes: int | None = None  # distinct nodes the trainers and engines span together

    def evaluate(self, ctx: CheckContext) -> CheckResult:
        started = {str(e.get("role")): e for e in ctx.run(self.run).events_named("process_started")}
        trainers = [started[r] for r in sorted(started) if r.startswith("trainer:")]
        engines = [started[r] for r in sorted(started) if r.startswith("engine:")]
        problems = []
        if len(trainers) != self.trainers or len(engines) != self.engines:
            problems.append(f"{len(trainers)} trainer rank(s) and {len(engines)} engine(s) started, expected "
                            f"{self.trainers} and {self.engines}")
        seen: dict[tuple[str, str], str] = {}
        for event in trainers:
            gpus = _gpus(event)
            if len(gpus) != 1:
                problems.append(f"{event['role']} holds {len(gpus)} GPUs, expected 1")
            for gpu in gpus:
                if gpu in seen:
                    problems.append(f"{event['role']} and {seen[gpu]} share GPU {gpu[1]} of node {gpu[0][:8]}")
                seen[gpu] = event["role"]
        trainer_gpus = {g for e in trainers for g in _gpus(e)}
        for index, event in enumerate(engines):
            gpus = _gpus(event)
            if self.engines_share == "colocated" and index < len(trainers) and gpus != _gpus(trainers[index]):
                problems.append(f"{event['role']} is not on trainer:{index}'s GPU")
            if self.engines_share == "separate" and gpus & trainer_gpus:
                problems.append(f"{event['role']} shares a GPU with a trainer rank")
        nodes = {str(e.get("node_id")) for e in (*trainers, *engines)}
        if self.nodes is not None and len(nodes) != self.nodes:
            problems.append(f"trainers and engines span {len(nodes)} node(s), expected {self.nodes}")
        layout = {e["role"]: [str(e.get("node_id"))[:8], *map(str, e.get("gpu_ids") or [])] for e in (*trainers, *engines)}
        if problems:
            return self.result(False, "; ".join(problems), details={"layout": layout})
        return self.result(True, f"{len(trainers)} trainer rank(s) on {len(trainer_gpus)} GPUs, {len(engines)} "
                                 f"engine(s) ({self.engines_share}), {len(nodes)} node(s)", details={"layout": layout})
