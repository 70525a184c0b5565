"""GenRM scenarios (scenarios/specs/genrm.yaml): a judge model's engines score the responses."""


def test_genrm_cpu(scenario):
    scenario("genrm-cpu").assert_ok()


def test_genrm_judge_kill_cpu(scenario):
    scenario("genrm-judge-kill-cpu").assert_ok()
