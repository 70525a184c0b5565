"""An elastic fleet (relax/core/elastic.py): engines joined and left a running job as asked.

* Every scale request the schedule made was answered 200 (``scale_answered`` events).
* The ``engine_joined``, ``engine_left`` and removed-by-policy counts are the expected ones.
* A joiner's first weights.jsonl record is at the version its ``engine_joined`` event names (the current one)
  and was written before it joined: it served only once equal (weight_equality judges the checksums).
* Membership: from its first record until it left (or the run ended) an engine has a record at every synced
  version; after it left, none.
* Joiners serve: each one still in the fleet at the end answered requests (``fleet_final``: the router's count).
* Scale-in with requests in flight: at least ``min_aborted`` were aborted at the drain deadline, and those
  samples came back: at least that many recycled fates whose sample was later trained.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Literal

from harness.checks.base import CheckContext, CheckParams, CheckResult, register

RETURNED = {"partial_rollout_abort", "engine_aborted"}


@register("elastic_fleet")
class ElasticFleet(CheckParams):
    kind: Literal["elastic_fleet"] = "elastic_fleet"
    run: str | None = None
    joined: int = 0
    left: int = 0
    removed: int = 0  # engines a scale-out started and its policy removed
    min_aborted: int = 0
    joiners_serve: bool = True

    def evaluate(self, ctx: CheckContext) -> CheckResult:
        run = ctx.run(self.run)
        problems: list[str] = []
        answers = run.events_named("scale_answered")
        problems += [f"scale {a.get('action')} answered {a.get('status')}: {a.get('answer')}"
                     for a in answers if a.get("status") != 200]
        joined, left = run.events_named("engine_joined"), run.events_named("engine_left")
        removed = [r for d in run.events_named("scale_out_decision") for r in d.get("removed", [])]
        for name, got, want in (("engine_joined", len(joined), self.joined), ("engine_left", len(left), self.left),
                                ("removed by policy", len(removed), self.removed)):
            if got != want:
                problems.append(f"{got} {name} (expected {want})")
        records: dict[str, list[dict]] = defaultdict(list)
        trainer_versions: set[int] = set()
        for rec in run.weights:
            side = str(rec.get("side"))
            if side == "trainer":
                trainer_versions.add(int(rec["version"]))
            elif side.startswith("engine:"):
                records[side].append(rec)
        for ev in joined:
            mine = records.get(ev["role"], [])
            if not mine:
                problems.append(f"{ev['role']} joined with no weights record")
                continue
            first = mine[0]
            if int(first["version"]) != int(ev["version"]):
                problems.append(f"{ev['role']} joined at version {ev['version']}; its first weights record is at "
                                f"version {first['version']}")
            if float(first.get("time", 0)) > float(ev.get("time", 0)):
                problems.append(f"{ev['role']} joined before its weights record was written")
        final = run.events_named("fleet_final")
        served = {w["url"]: int(w.get("served", 0)) for w in (final[-1].get("workers", []) if final else [])}
        for ev in joined if self.joiners_serve else []:
            if ev["url"] in served and not served[ev["url"]]:
                problems.append(f"{ev['role']} joined but the router sent it no request")
        left_at = {ev["role"]: float(ev.get("time", 0)) for ev in left}
        last = max(trainer_versions, default=-1)
        for side, mine in records.items():
            versions = {int(r["version"]) for r in mine}
            if side in left_at:
                late = [r for r in mine if float(r.get("time", 0)) > left_at[side]]
                if late:
                    problems.append(f"{side} left yet has a version {late[0]['version']} record after")
                end = max(versions)
            else:
                end = last
            missing = sorted(v for v in trainer_versions if min(versions) <= v <= end and v not in versions)
            if missing:
                problems.append(f"{side} has no record at version(s) {missing[:5]} while in the fleet")
        aborted = sum(int(ev.get("aborted") or 0) for ev in left)
        trained = {(s.get("group_index"), s.get("index")) for s in run.samples if s.get("fate") == "trained"}
        returned = [s for s in run.samples if s.get("fate") == "recycled" and s.get("reason") in RETURNED]
        back = sum((s.get("group_index"), s.get("index")) in trained for s in returned)
        if aborted < self.min_aborted:
            problems.append(f"{aborted} requests aborted at the drain deadline (expected >= {self.min_aborted})")
        if back < self.min_aborted:
            problems.append(f"only {back} aborted samples came back and trained (expected >= {self.min_aborted})")
        details = {"joined": [e["role"] for e in joined], "left": [e["role"] for e in left], "removed": removed,
                   "aborted": aborted, "returned_and_trained": back, "problems": problems[:20]}
        if problems:
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            return self.result(False, problems[0] + more, details=details)
        return self.result(True, f"{len(joined)} joined equal at their join version, {len(left)} left "
                                 f"({aborted} aborted, {back} returned and trained), {len(removed)} removed",
                           details=details)
