"""The autoscaler without engines: the YAML schema's errors, the pure policy (with a hypothesis property over
random signal sequences), the step signals, and the loop over a fake fleet and a fake clock."""

from __future__ import annotations

import textwrap

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from relax.core.autoscaler import Autoscaler, AutoscalerFlags, step_signals
from relax.utils.autoscaler import config
from relax.utils.autoscaler.config import AutoscalerConfig
from relax.utils.autoscaler.policy import Action, LastScale, Signals, decide
from relax.utils.flag_types import ConfigError, ConfigErrors


def cfg(**kw) -> AutoscalerConfig:
    base = {"min_engines": 1, "max_engines": 3, "scale_out_cooldown_s": 10, "scale_in_cooldown_s": 20,
            "poll_interval_s": 1, "signals": {"rollout_share": {"scale_out_above": 0.7, "scale_in_below": 0.3}}}
    return config.parse({**base, **kw})


# ---------------------------------------------------------------------------------------------- the schema
def test_shipped_default_parses_and_documents_every_field():
    shipped = config.load(config.DEFAULT_PATH)
    raw = yaml.safe_load(config.DEFAULT_PATH.read_text())
    assert set(raw) == set(AutoscalerConfig.model_fields)  # every top-level field is in the file, with a comment
    assert set(raw["signals"]) == set(type(shipped.signals).model_fields)
    text = config.DEFAULT_PATH.read_text()
    for line in text.splitlines():
        if ":" in line and not line.lstrip().startswith("#") and not line.rstrip().endswith(":"):
            assert "#" in line, f"undocumented line in autoscaler.yaml: {line}"
    for name, info in AutoscalerConfig.model_fields.items():
        assert info.description, f"{name} has no description"


def test_bad_file_gives_one_line_per_problem_naming_the_field(tmp_path):
    path = tmp_path / "a.yaml"
    path.write_text(textwrap.dedent("""\
        min_engines: 0
        max_engines: many
        poll_interval_s: 0
        signals:
          rollout_share: {scale_out_above: 0.5, scale_in_below: 0.8}
          queue_depth: {scale_out_at_most: -1}
          wind_speed: {}
        """))
    with pytest.raises(ConfigErrors) as info:
        config.load(path)
    lines = str(info.value).splitlines()
    assert len(lines) == 6, lines
    for field in ("min_engines:", "max_engines:", "poll_interval_s:", "signals.rollout_share:",
                  "signals.queue_depth.scale_out_at_most:", "signals.wind_speed:"):
        assert sum(field in line for line in lines) == 1, (field, lines)
    assert all(line.startswith(f"--autoscaler-config {path}: ") for line in lines)


def test_one_problem_is_one_line_and_bounds_are_checked():
    with pytest.raises(ConfigError, match=r"^--autoscaler-config: \(top level\): Value error, min_engines \(3\) is "
                                          r"above max_engines \(2\)$"):
        config.parse({"min_engines": 3, "max_engines": 2})


def test_unreadable_and_non_yaml_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read"):
        config.load(tmp_path / "missing.yaml")
    (tmp_path / "b.yaml").write_text("min_engines: [1\n")
    with pytest.raises(ConfigError, match="not YAML"):
        config.load(tmp_path / "b.yaml")
    with pytest.raises(ConfigError, match=r"\(top level\)"):
        config.parse([1, 2])


def test_flag_slice_checks_the_file(tmp_path):
    from types import SimpleNamespace

    assert not AutoscalerFlags.from_args(SimpleNamespace(autoscaler_config=None)).enabled
    assert AutoscalerFlags.from_args(SimpleNamespace(autoscaler_config=str(config.DEFAULT_PATH))).load().max_engines == 4
    (tmp_path / "c.yaml").write_text("max_engines: 0\n")
    with pytest.raises(ConfigError, match="max_engines"):
        AutoscalerFlags.from_args(SimpleNamespace(autoscaler_config=str(tmp_path / "c.yaml")))


def test_parse_args_refuses_a_bad_file(tmp_path):
    from relax.utils.arguments import parse_args

    (tmp_path / "d.yaml").write_text("min_engines: 0\nmax_engines: 0\n")
    with pytest.raises(ConfigError) as info:
        parse_args(["--preset", "quickstart", "--autoscaler-config", str(tmp_path / "d.yaml")])
    assert "min_engines" in str(info.value) and "max_engines" in str(info.value)
    args = parse_args(["--preset", "quickstart", "--autoscaler-config", str(config.DEFAULT_PATH)])
    assert args.autoscaler_config == str(config.DEFAULT_PATH)


# ---------------------------------------------------------------------------------------------- the policy
def test_policy_votes_and_bounds():
    c = cfg()
    assert decide(c, Signals(rollout_share=0.9), 1, None, 0).action is Action.OUT
    assert decide(c, Signals(rollout_share=0.9), 3, None, 0).code == "at_max"
    assert decide(c, Signals(rollout_share=0.1), 2, None, 0).action is Action.IN
    assert decide(c, Signals(rollout_share=0.1), 1, None, 0).code == "at_min"
    assert decide(c, Signals(rollout_share=0.5), 2, None, 0).code == "in_band"
    assert decide(c, Signals(), 2, None, 0).code == "no_signal"
    assert decide(c, Signals(queue_depth=0), 2, None, 0).code == "no_signal"  # no thresholds: abstains
    below = decide(cfg(min_engines=2), Signals(rollout_share=0.5), 1, None, 0)
    assert (below.action, below.count, below.code) == (Action.OUT, 1, "below_min")


def test_policy_scale_in_needs_every_signal_and_out_needs_any():
    c = cfg(signals={"rollout_share": {"scale_out_above": 0.7, "scale_in_below": 0.3},
                     "utilisation": {"scale_out_above": 0.9, "scale_in_below": 0.2}})
    assert decide(c, Signals(rollout_share=0.1, utilisation=0.5), 2, None, 0).code == "in_band"
    assert decide(c, Signals(rollout_share=0.1, utilisation=0.1), 2, None, 0).action is Action.IN
    assert decide(c, Signals(rollout_share=0.1, utilisation=0.95), 2, None, 0).action is Action.OUT
    fa = cfg(signals={"queue_depth": {"scale_out_at_most": 0, "scale_in_at_least": 2}})
    assert decide(fa, Signals(queue_depth=0), 1, None, 0).action is Action.OUT
    assert decide(fa, Signals(queue_depth=2), 2, None, 0).action is Action.IN


def test_policy_cooldowns_and_steps():
    c = cfg(scale_out_step=5)
    out = decide(c, Signals(rollout_share=0.9), 1, None, 0)
    assert out.count == 2  # clamped at max_engines
    held = decide(c, Signals(rollout_share=0.1), 3, LastScale(Action.OUT, 100), 105)
    assert held.code == "cooldown" and "5.0 s" in held.reason
    assert decide(c, Signals(rollout_share=0.1), 3, LastScale(Action.OUT, 100), 110).action is Action.IN
    assert decide(c, Signals(rollout_share=0.9), 2, LastScale(Action.IN, 100), 119).code == "cooldown"
    assert decide(c, Signals(rollout_share=0.9), 2, LastScale(Action.IN, 100), 120).action is Action.OUT


configs = st.builds(
    lambda lo, span, so, si, co, ci: cfg(min_engines=lo, max_engines=lo + span, scale_out_step=so, scale_in_step=si,
                                         scale_out_cooldown_s=co, scale_in_cooldown_s=ci),
    st.integers(1, 4), st.integers(0, 4), st.integers(1, 3), st.integers(1, 3), st.floats(0, 30), st.floats(0, 30))
polls = st.lists(st.tuples(st.floats(0, 15), st.one_of(st.none(), st.floats(0, 1))), max_size=60)


@settings(max_examples=200, deadline=None)
@given(c=configs, start=st.integers(0, 4), seq=polls)
def test_policy_property_bounds_and_cooldowns(c, start, seq):
    """Applying the decisions over any signal sequence: the fleet never leaves [min, max] once in it (a fleet
    outside is only moved towards it), and two scales are never closer than the first one's cooldown."""
    engines = c.min_engines + start % (c.max_engines - c.min_engines + 1)
    now, last = 0.0, None
    for dt, share in seq:
        now += dt
        d = decide(c, Signals(rollout_share=share), engines, last, now)
        if d.action is Action.HOLD:
            assert d.count == 0
            continue
        if last is not None:
            cooldown = c.scale_out_cooldown_s if last.action is Action.OUT else c.scale_in_cooldown_s
            assert now - last.at >= cooldown
        assert d.count >= 1
        engines += d.count if d.action is Action.OUT else -d.count
        assert c.min_engines <= engines <= c.max_engines
        last = LastScale(d.action, now)


# ---------------------------------------------------------------------------------------------- step signals
def test_step_signals_by_mode(monkeypatch):
    colocate = step_signals(0, {"perf/rollout_time_s": 3.0, "perf/step_time_s": 4.0, "rollout/staleness_max": 0.0})
    assert colocate == Signals(rollout_share=0.75)
    fa = step_signals(0, {"perf/rollout_time_s": 3.0, "perf/step_time_s": 4.0, "perf/queue_depth": 1.0,
                          "rollout/staleness_max": 1.0})
    assert fa == Signals(queue_depth=1.0, staleness=1.0)
    monkeypatch.setenv("RELAX_FAULT_AUTOSCALE_SIGNALS", '{"0": {"rollout_share": 0.95}, "3": {"rollout_share": 0.05}}')
    assert step_signals(2, {"perf/step_time_s": 1.0}).rollout_share == 0.95
    assert step_signals(3, {"perf/step_time_s": 1.0}).rollout_share == 0.05
    monkeypatch.setenv("RELAX_FAULT_AUTOSCALE_SIGNALS", "[1]")
    with pytest.raises(ValueError, match="RELAX_FAULT_AUTOSCALE_SIGNALS"):
        step_signals(0, {})


# ---------------------------------------------------------------------------------------------- the loop
class FakeFleet:
    def __init__(self, n=1, fail=None):
        self.live, self.busy, self.fail, self.calls = list(range(n)), 0, fail, []

    def engines(self):
        return list(self.live)

    def in_flight(self):
        return [self.busy] * len(self.live)

    def scale_out(self, count):
        self.calls.append(("out", count))
        if self.fail:
            raise RuntimeError(self.fail)
        new = list(range(max(self.live) + 1, max(self.live) + 1 + count))
        self.live += new
        return {"joined": new, "removed": []}

    def scale_in(self, indices):
        self.calls.append(("in", indices))
        self.live = [i for i in self.live if i not in indices]
        return {"left": indices}


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def loop(fleet, **kw):
    events, clock = [], Clock()
    scaler = Autoscaler(cfg(**kw), fleet, lambda name, **f: events.append({"event": name, **f}), clock=clock)
    return scaler, events, clock


def colocate_step(scaler, step, share):
    scaler.observe_step(step, {"perf/rollout_time_s": share, "perf/step_time_s": 1.0})


def test_loop_scales_out_then_in_and_reports_holds_only_when_they_change():
    fleet = FakeFleet(1)
    scaler, events, clock = loop(fleet)
    assert scaler.poll().code == "no_signal"
    assert scaler.poll().code == "no_signal"  # the same hold: no second event
    colocate_step(scaler, 0, 0.9)
    assert scaler.poll().action is Action.OUT and fleet.live == [0, 1]
    assert scaler.poll().code == "no_signal"  # the step signals were forgotten with the scale
    colocate_step(scaler, 1, 0.1)
    clock.t = 5
    assert scaler.poll().code == "cooldown"
    clock.t = 9
    assert scaler.poll().code == "cooldown"  # unchanged: not reported again
    clock.t = 10
    assert scaler.poll().action is Action.IN and fleet.live == [0]
    assert fleet.calls == [("out", 1), ("in", [1])]
    decisions = [(e["action"], e["code"]) for e in events if e["event"] == "autoscale_decision"]
    assert decisions == [("hold", "no_signal"), ("out", "signals"), ("hold", "no_signal"), ("hold", "cooldown"),
                         ("in", "signals")]
    results = [e for e in events if e["event"] == "autoscale_result"]
    assert [(r["action"], r["engines"]) for r in results] == [("out", 2), ("in", 1)]
    scale_in = [e for e in events if e["event"] == "autoscale_decision" and e["action"] == "in"][0]
    assert scale_in["signals"]["rollout_share"] == 0.1 and scale_in["last_scale"] == {"action": "out", "t": 0.0}
    assert scale_in["engines"] == 2 and scale_in["step"] == 1


def test_loop_scale_in_removes_the_newest_engines_and_records_errors():
    fleet = FakeFleet(3)
    scaler, events, _ = loop(fleet, scale_in_step=2)
    colocate_step(scaler, 0, 0.1)
    scaler.poll()
    assert fleet.calls == [("in", [1, 2])] and fleet.live == [0]
    broken = FakeFleet(1, fail="scale-out of GPU engines needs a placement\nmore")
    scaler, events, _ = loop(broken)
    colocate_step(scaler, 0, 0.9)
    assert scaler.poll().action is Action.OUT
    (result,) = [e for e in events if e["event"] == "autoscale_result"]
    assert result["error"] == "RuntimeError: scale-out of GPU engines needs a placement" and result["engines"] == 1
    assert scaler.last.action is Action.OUT  # a failed scale still starts its cooldown: no retry storm


def test_loop_utilisation_is_averaged_since_the_last_step():
    fleet = FakeFleet(2)
    scaler, events, _ = loop(fleet, signals={"utilisation": {"capacity": 10, "scale_out_above": 0.5}})
    fleet.busy = 4
    assert scaler.poll().code == "in_band"
    fleet.busy = 8  # mean (0.4 + 0.8) / 2 = 0.6
    assert scaler.poll().action is Action.OUT
    out = [e for e in events if e["event"] == "autoscale_decision" and e["action"] == "out"][0]
    assert out["signals"]["utilisation"] == pytest.approx(0.6)


def test_loop_thread_polls_and_stops():
    import time

    fleet = FakeFleet(1)
    events = []
    scaler = Autoscaler(cfg(poll_interval_s=0.01), fleet, lambda name, **f: events.append({"event": name, **f}))
    colocate_step(scaler, 0, 0.9)
    scaler.start()
    deadline = time.monotonic() + 5
    while not fleet.calls and time.monotonic() < deadline:
        time.sleep(0.01)
    scaler.stop()
    assert fleet.calls == [("out", 1)] and events[0]["event"] == "autoscaler_start"
    assert events[0]["config"]["max_engines"] == 3


# ---------------------------------------------------------------------------------------------- the harness check
def _check(events, **kw):
    from pathlib import Path

    from harness.artifacts import RunArtifacts
    from harness.checks import CheckContext, parse_check

    check = parse_check({"kind": "autoscale_policy", **kw})
    return check.evaluate(CheckContext(runs={"main": RunArtifacts(dir=Path("."), events=events)}))


def _recorded_run():
    """The loop over a fake fleet and a load that rises then falls, its events as events.jsonl would hold them."""
    fleet = FakeFleet(1)
    scaler, events, clock = loop(fleet)
    events.append({"event": "autoscaler_start", "config": scaler.cfg.model_dump()})
    for step, share in enumerate([0.9, 0.9, 0.9, 0.9, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1]):
        clock.t = step * 6.0
        colocate_step(scaler, step, share)
        scaler.poll()
    return events


def test_check_passes_a_run_that_follows_the_policy():
    events = _recorded_run()
    result = _check(events, min_out=2, min_in=1)
    assert result.passed, result.message
    assert "out" in result.message
    assert not _check(events, min_in=3).passed


@pytest.mark.parametrize("tamper, message", [
    (lambda d: d.update(count=5), "the policy says"),
    (lambda d: d.update(t=d["last_scale"]["t"] + 1.0, last_scale=d["last_scale"]), "the policy says"),
    (lambda d: d.update(last_scale=None), "saw previous scale"),
])
def test_check_catches_a_decision_off_policy(tamper, message):
    events = _recorded_run()
    scaled = [e for e in events if e.get("event") == "autoscale_decision" and e["action"] != "hold"]
    tamper(scaled[-1])
    result = _check(events)
    assert not result.passed and message in result.message


def test_check_catches_bounds_and_repeated_holds():
    events = _recorded_run()
    result = next(e for e in events if e.get("event") == "autoscale_result")
    result["engines"] = 9
    assert "left 9 engines" in _check(events).message
    events = _recorded_run()
    hold = next(e for e in events if e.get("event") == "autoscale_decision" and e["action"] == "hold")
    events.insert(events.index(hold) + 1, dict(hold))
    assert "reported twice" in _check(events).message
    assert "no autoscaler_start" in _check([]).message


@pytest.mark.parametrize("path", sorted(config.DEFAULT_PATH.parent.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_parses(path):
    assert config.load(path).min_engines >= 1


def test_autoscale_policy_scenario_names_a_shipped_config():
    from pathlib import Path

    from harness.placeholders import substitute
    from harness.runner import RELAX_AUTOSCALER
    from harness.spec import load_catalog

    catalog = load_catalog(Path(__file__).resolve().parents[1] / "scenarios" / "specs")
    spec = catalog["autoscale-policy"]
    flags = substitute(spec.runs[0].flags, {"relax_autoscaler": str(RELAX_AUTOSCALER)})
    config.load(flags[flags.index("--autoscaler-config") + 1])
    assert [f.kind for f in spec.faults] == ["autoscale_load"]
