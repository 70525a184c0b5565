"""Sample accounting from both ends.

The rollout side: every sample that entered a step reaches a final fate (trained, filtered, dropped), and
none is lost. The trainer side: the trainer's own ``consumed`` records (the samples whose rows went
through its loss, docs/artifacts.md) name exactly the samples the rollout side says it trained, at the
same step, each the same number of passes. A sample the trainer silently dropped, or one it trained that
the rollout never handed over, fails the check by name.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Literal

from harness.checks.base import CheckContext, CheckParams, CheckResult, register

FINAL = {"trained", "filtered", "dropped"}
FATES = FINAL | {"recycled"}
CONSUMED = "consumed"  # the trainer's report: not a fate decision


@register("sample_accounting")
class SampleAccounting(CheckParams):
    kind: Literal["sample_accounting"] = "sample_accounting"
    run: str | None = None
    # samples entering each step; "config" = rollout_batch_size * n_samples_per_prompt from run.json
    expected_per_step: int | Literal["config"] | None = "config"
    allow_recycled_at_end: bool = True  # a sample recycled at the last step is still in the buffer
    trainer_report: bool = True  # compare the trainer's consumed records with the trained fates

    def _expected(self, run_config: dict) -> int | None:
        if self.expected_per_step != "config":
            return self.expected_per_step
        try:
            return int(run_config["rollout_batch_size"]) * int(run_config.get("n_samples_per_prompt") or 1)
        except (KeyError, TypeError, ValueError):
            return None

    def evaluate(self, ctx: CheckContext) -> CheckResult:
        run = ctx.run(self.run)
        if not run.samples:
            return self.result(False, "samples.jsonl is empty: no sample has a recorded fate")
        problems: list[str] = []
        history: dict[tuple, list[dict]] = defaultdict(list)
        per_step: dict[int, set[tuple]] = defaultdict(set)
        group_size: dict[tuple[int, int], set] = defaultdict(set)
        for rec in run.samples:
            key = (rec.get("group_index"), rec.get("index"))
            fate = rec.get("fate")
            history[key].append(rec)
            if fate == CONSUMED:
                continue
            if fate not in FATES:
                problems.append(f"step {rec.get('step')}: sample group {key[0]} index {key[1]} has unknown fate {fate!r}")
            if fate == "dropped" and not rec.get("reason"):
                problems.append(f"step {rec.get('step')}: sample group {key[0]} index {key[1]} dropped without a reason")
            per_step[int(rec.get("step", -1))].add(key)
            group_size[(int(rec.get("step", -1)), key[0])].add(key[1])
        last_step = max(run.steps(), default=max(per_step, default=-1))
        finals, consumed_steps, trainer_side = 0, set(), []
        for key, recs in history.items():
            # a "recycled" record returns the sample to the buffer and supersedes any earlier fate
            # (e.g. a step rolled back by a global restart), so only records after the last one count
            last_recycle = max((i for i, r in enumerate(recs) if r.get("fate") == "recycled"), default=-1)
            live = recs[last_recycle + 1 :]
            final = [r for r in live if r.get("fate") in FINAL]
            if len(final) > 1:
                steps = ", ".join(str(r.get("step")) for r in final)
                problems.append(f"sample group {key[0]} index {key[1]} has {len(final)} final fates (steps {steps})")
            fates = [r for r in recs if r.get("fate") != CONSUMED]
            last = fates[-1] if fates else None
            if last is not None and last.get("fate") == "recycled":
                if not (self.allow_recycled_at_end and last.get("step") == last_step):
                    problems.append(f"sample group {key[0]} index {key[1]} lost: recycled at step {last.get('step')} "
                                    "and never seen again")
            elif final:
                finals += 1
            if self.trainer_report:
                trainer_side += self._trainer_side(key, live, consumed_steps)
        if self.trainer_report and run.steps() and not consumed_steps:
            trainer_side = ["no consumed records: the trainer reported no sample it trained on"]
        problems += self._per_step(run, per_step, group_size) + trainer_side
        details = {"samples": len(history), "final": finals, "expected_per_step": self._expected(run.run.get("config") or {}),
                   "trainer_report_steps": len(consumed_steps), "problems": problems[:20]}
        if problems:
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            return self.result(False, problems[0] + more, details=details)
        side = f"; the trainer consumed exactly the trained ones ({len(consumed_steps)} steps)" if self.trainer_report else ""
        return self.result(True, f"{len(history)} samples, every one with a final fate ({len(per_step)} steps){side}",
                           details=details)

    @staticmethod
    def _trainer_side(key: tuple, live: list[dict], consumed_steps: set[int]) -> list[str]:
        """One sample's records since its last recycle: trained at step s <=> consumed at step s (passes > 0)."""
        trained = [r.get("step") for r in live if r.get("fate") == "trained"]
        consumed = [r for r in live if r.get("fate") == CONSUMED]
        consumed_steps.update(r.get("step") for r in consumed)
        name = f"sample group {key[0]} index {key[1]}"
        if trained and not consumed:
            return [f"step {trained[0]}: {name} trained by the rollout's record, but the trainer never consumed it"]
        if consumed and not trained:
            return [f"step {consumed[0].get('step')}: the trainer consumed {name}, which the rollout never recorded as "
                    "trained"]
        out = []
        for rec in consumed:
            if rec.get("step") not in trained:
                out.append(f"step {rec.get('step')}: the trainer consumed {name}, which was trained at step {trained}")
            if not isinstance(rec.get("passes"), int) or rec["passes"] < 1:
                out.append(f"step {rec.get('step')}: {name} consumed with passes={rec.get('passes')!r}")
        return out

    def _per_step(self, run, per_step: dict[int, set[tuple]], group_size: dict[tuple[int, int], set]) -> list[str]:
        expected = self._expected(run.run.get("config") or {})
        problems = []
        passes: dict[int, set[int]] = defaultdict(set)
        for rec in run.samples:
            if rec.get("fate") == CONSUMED:
                passes[int(rec.get("step", -1))].add(rec.get("passes"))
        for step, seen in sorted(passes.items()):
            if len(seen) > 1:
                problems.append(f"step {step}: the trainer consumed samples unevenly (passes {sorted(map(str, seen))})")
        for step in run.steps():
            got = len(per_step.get(step, ()))
            if got == 0:
                problems.append(f"step {step}: trained (in metrics.jsonl) but no sample has a fate")
            elif expected is not None and got < expected:
                sizes = {g: len(ix) for (s, g), ix in group_size.items() if s == step}
                full = max(sizes.values())
                short = [f"group {g} ({n}/{full})" for g, n in sorted(sizes.items()) if n < full]
                where = f"; short groups: {', '.join(short[:5])}" if short else ""
                problems.append(f"step {step}: {got} of {expected} samples have a fate, {expected - got} lost{where}")
        return problems
