"""Sample accounting: every sample that entered a step reaches a final fate; none is lost."""

from __future__ import annotations

from collections import defaultdict
from typing import Literal

from harness.checks.base import CheckContext, CheckParams, CheckResult, register

FINAL = {"trained", "filtered", "dropped"}
FATES = FINAL | {"recycled"}


@register("sample_accounting")
class SampleAccounting(CheckParams):
    kind: Literal["sample_accounting"] = "sample_accounting"
    run: str | None = None
    # samples entering each step; "config" = rollout_batch_size * n_samples_per_prompt from run.json
    expected_per_step: int | Literal["config"] | None = "config"
    allow_recycled_at_end: bool = True  # a sample recycled at the last step is still in the buffer

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
            if fate not in FATES:
                problems.append(f"step {rec.get('step')}: sample group {key[0]} index {key[1]} has unknown fate {fate!r}")
            if fate == "dropped" and not rec.get("reason"):
                problems.append(f"step {rec.get('step')}: sample group {key[0]} index {key[1]} dropped without a reason")
            history[key].append(rec)
            per_step[int(rec.get("step", -1))].add(key)
            group_size[(int(rec.get("step", -1)), key[0])].add(key[1])
        last_step = max(run.steps(), default=max(per_step))
        finals = 0
        for key, recs in history.items():
            # a "recycled" record returns the sample to the buffer and supersedes any earlier fate
            # (e.g. a step rolled back by a global restart), so only fates after the last one count
            last_recycle = max((i for i, r in enumerate(recs) if r.get("fate") == "recycled"), default=-1)
            final = [r for r in recs[last_recycle + 1 :] if r.get("fate") in FINAL]
            if len(final) > 1:
                steps = ", ".join(str(r.get("step")) for r in final)
                problems.append(f"sample group {key[0]} index {key[1]} has {len(final)} final fates (steps {steps})")
            last = recs[-1]
            if last.get("fate") == "recycled":
                if not (self.allow_recycled_at_end and last.get("step") == last_step):
                    problems.append(f"sample group {key[0]} index {key[1]} lost: recycled at step {last.get('step')} "
                                    "and never seen again")
            elif final:
                finals += 1
        expected = self._expected(run.run.get("config") or {})
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
        details = {"samples": len(history), "final": finals, "expected_per_step": expected, "problems": problems[:20]}
        if problems:
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            return self.result(False, problems[0] + more, details=details)
        return self.result(True, f"{len(history)} samples, every one with a final fate "
                                 f"({len(per_step)} steps)", details=details)
