"""Signals family: SIGINT / SIGTERM end a run cleanly, and a resume carries it on (scenarios/specs/signals.yaml)."""


def test_sigint_cpu(scenario):
    scenario("signals-sigint-cpu").assert_ok()


def test_double_sigint_cpu(scenario):
    scenario("signals-double-sigint-cpu").assert_ok()


def test_group_sigterm_mid_rollout_then_resume_cpu(scenario):
    scenario("signals-sigterm-rollout-cpu").assert_ok()


def test_group_sigterm_mid_train_then_resume_cpu(scenario):
    scenario("signals-sigterm-train-cpu").assert_ok()


def test_group_sigterm_mid_save_then_resume_cpu(scenario):
    scenario("signals-sigterm-save-cpu").assert_ok()
