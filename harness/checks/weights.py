"""Weight-update equality: after every sync every engine holds exactly the trainer's tensors.

The ``reset_tensors`` variant of the scenario asks the engine to randomize its weights before
the first sync; the check is the same (a tensor the sync skipped keeps its random checksum).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Literal

from harness.checks.base import CheckContext, CheckParams, CheckResult, register

# Other holders of the policy that a sync updates (the fully-async actor_fwd service): judged like an
# engine against the trainer, not counted as engines.
POLICY_COPY_SIDES = ("actor_fwd:",)


def _short(digest: Any) -> str:
    s = str(digest)
    return s[:12] + ("…" if len(s) > 12 else "")


def compare_records(version: int, side: str, trainer: dict[str, Any], engine: dict[str, Any]) -> list[str]:
    problems = []
    for name in sorted(set(trainer) | set(engine)):
        if name not in engine:
            problems.append(f"version {version}: {side} lacks tensor {name!r} (trainer has it)")
        elif name not in trainer:
            problems.append(f"version {version}: {side} has tensor {name!r} the trainer did not send")
        elif str(engine[name]) != str(trainer[name]):
            problems.append(f"version {version}: {side} tensor {name!r} checksum {_short(engine[name])} "
                            f"!= trainer {_short(trainer[name])}")
    return problems


def _judge(version: int, side: str, trainer: dict[str, Any], engine: dict[str, Any]) -> list[str]:
    """An engine record against the trainer's: in the engine's own layout when it has one (a stock SGLang
    server's hashes of its parameters: the trainer record's ``layouts``), else relax's HF-named checksums."""
    if engine.get("checksums") is None and engine.get("unverified"):
        return [f"version {version}: {side} unverified: {engine['unverified']}"]
    layout = engine.get("layout")
    if layout is None:
        return compare_records(version, side, trainer.get("checksums") or {}, engine.get("checksums") or {})
    expected = (trainer.get("layouts") or {}).get(layout)
    if expected is None:
        return [f"version {version}: {side} reports {layout} checksums; the trainer record has none of that layout"]
    return compare_records(version, side, expected, engine.get("checksums") or {})


@register("weight_equality")
class WeightEquality(CheckParams):
    kind: Literal["weight_equality"] = "weight_equality"
    run: str | None = None
    engines: int | None = None  # expected engine sides per version; None: every side seen anywhere
    elastic: bool = False  # engines join and leave: who must have a record at each version is elastic_fleet's check
    min_versions: int = 1

    def evaluate(self, ctx: CheckContext) -> CheckResult:
        records = ctx.run(self.run).weights
        if not records:
            return self.result(False, "weights.jsonl has no records: no sync was recorded")
        problems: list[str] = []
        last_trainer: dict[int, dict[str, Any]] = {}
        engine_sides: dict[int, set[str]] = defaultdict(set)
        trainer_versions: set[int] = set()
        all_sides: set[str] = set()
        pending: list[tuple[int, str, dict[str, Any]]] = []
        tensors = 0
        for rec in records:  # file order: an engine record is judged against the latest trainer record
            version, side = int(rec.get("version", -1)), str(rec.get("side", "?"))
            checksums = rec.get("checksums") or {}
            if side == "trainer":
                last_trainer[version] = rec
                trainer_versions.add(version)
                tensors = max(tensors, len(checksums))
                if not checksums:
                    problems.append(f"version {version}: trainer record has no checksums")
            elif side.startswith(("engine:", *POLICY_COPY_SIDES)):
                if side.startswith("engine:"):
                    all_sides.add(side)
                    engine_sides[version].add(side)
                if version in last_trainer:
                    problems += _judge(version, side, last_trainer[version], rec)
                else:
                    pending.append((version, side, rec))
            else:
                problems.append(f"version {version}: unknown side {side!r}")
        for version, side, rec in pending:  # engine wrote before the trainer (concurrent writers)
            if version in last_trainer:
                problems += _judge(version, side, last_trainer[version], rec)
        expected = self.engines if self.engines is not None else len(all_sides)
        for version in sorted(trainer_versions | set(engine_sides)):
            sides = engine_sides.get(version, set())
            if version not in trainer_versions:
                problems.append(f"version {version}: {', '.join(sorted(sides))} synced but no trainer record")
            elif not sides:
                problems.append(f"version {version}: no engine record (trainer synced, no engine reported)")
            elif len(sides) < expected and not self.elastic:
                want = sorted(all_sides) if self.engines is None else [f"engine:{i}" for i in range(expected)]
                missing = sorted(set(want) - sides) or [f"{expected - len(sides)} engine(s)"]
                problems.append(f"version {version}: missing engine record(s) {', '.join(missing)}")
        versions = sorted(trainer_versions)
        details = {"versions": len(versions), "engine_sides": sorted(all_sides), "tensors": tensors,
                   "problems": problems[:20]}
        if problems:
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            return self.result(False, problems[0] + more, details=details)
        if len(versions) < self.min_versions:
            return self.result(False, f"only {len(versions)} synced versions (need {self.min_versions})",
                               details=details)
        return self.result(True, f"{len(versions)} versions x {len(all_sides)} engine(s) x {tensors} tensors: "
                                 "every engine checksum equals the trainer's", details=details)
