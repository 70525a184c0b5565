"""``--rm-type math | deepscaler | dapo`` against reference answers.

The cases follow the documented behaviour of the public graders Relax recipes migrate from:
slime's ``rm_hub`` (``grade_answer_verl`` for math, DeepScaleR's rule reward for deepscaler) and
verl/DAPO's ``math_dapo.compute_score`` (Minerva normalisation, ``Answer:`` extraction, +1/-1).
"""

from __future__ import annotations

from argparse import Namespace

import pytest

from relax.engine.rewards import get_reward_fn
from relax.engine.rewards.math_equiv import answers_equal, latex_to_text, mathd_normalize, sympy_equal
from relax.engine.rewards.reference_graders import minerva_normalize
from relax.utils.types import Sample


def _grade(rm_type: str, response: str, label) -> object:
    return get_reward_fn(rm_type)(Namespace(), Sample(response=response, label=label))


@pytest.mark.parametrize("response, label, expected", [
    ("The answer is \\boxed{42}.", "42", 1.0),
    ("The answer is 42.", "42", 0.0),  # no boxed answer: 0 (the lenient grader is math_lenient)
    ("\\boxed{\\dfrac{3}{4}}", "3/4", 1.0),  # a/b -> \frac{a}{b}, dfrac -> frac
    ("\\boxed{0.5}", "\\frac{1}{2}", 1.0),  # Hendrycks: 0.5 -> \frac{1}{2}
    ("\\boxed{50\\%}", "50", 1.0),
    ("\\boxed{90^\\circ}", "90", 1.0),
    ("\\boxed{5 \\text{ cm}}", "5", 1.0),  # units after "\text{ " dropped
    ("\\boxed{x = 3}", "3", 1.0),  # a short "x =" prefix dropped
    ("\\boxed{\\frac{\\sqrt{2}}{2}}", "\\frac{1}{\\sqrt{2}}", 1.0),  # symbolically equal
    ("\\boxed{x^2+2x+1}", "(x+1)^2", 1.0),
    ("\\boxed{(1, 2)}", "(1,2)", 1.0),  # tuples element-wise
    ("\\boxed{(1, 3)}", "(1,2)", 0.0),
    ("\\boxed{10.0}", "10", 1.0),  # an integral float is its integer
    ("\\boxed{2/4}", "1/2", 0.0),  # an unreduced fraction is not the answer
    ("\\boxed{3.5}", "7/2", 1.0),
    ("\\boxed{1,000}", "1000", 1.0),
    ("\\boxed{12} and \\boxed{13}", "13", 1.0),  # the last box
    ("\\boxed{13", "13", 0.0),  # unclosed box: no answer
    ("\\fbox{7}", "7", 0.0),  # only \boxed{} counts
    ("\\boxed{7}", "\\boxed{7}", 1.0),  # a boxed label is unboxed
    ("\\boxed{7}", "", 0.0),
    ("\\boxed{7}", None, 0.0),
    ("\\boxed{\\text{Monday}}", "monday", 1.0),  # text answers compare case-folded
    ("\\boxed{\\pi}", "3.14", 0.0),
])
def test_math(response: str, label, expected: float) -> None:
    assert _grade("math", response, label) == expected


@pytest.mark.parametrize("response, label, expected", [
    ("<think>2+2 is 4</think> So \\boxed{4}", "4", 1.0),
    ("So \\boxed{4}", "4", 0.0),  # no </think>: the format counts
    ("<think>\\boxed{5}</think> \\boxed{4}", "4", 1.0),  # only after the last </think>
    ("<think>\\boxed{4}</think> the end", "4", 0.0),  # the box in the thinking does not count
    ("###Response the answer is \\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("</think>\\boxed{\\sqrt{8}}", "2\\sqrt{2}", 1.0),
    ("</think>\\boxed{3}", "", 0.0),
])
def test_deepscaler(response: str, label, expected: float) -> None:
    assert _grade("deepscaler", response, label) == expected


@pytest.mark.parametrize("response, label, score, pred", [
    ("Reasoning...\nAnswer: 42", "42", 1.0, "42"),
    ("answer : 42", "42", 1.0, "42"),  # case-insensitive, spaces around the colon
    ("Answer: 1,000", "1000", 1.0, "1000"),  # thousands commas
    ("Answer: \\boxed{7}", "7", 1.0, "7"),
    ("Answer: $12$ dollars", "12", 1.0, "12"),  # $...$ and units
    ("Answer: x = 6", "6", 1.0, "6"),  # after the last "="
    ("Answer: 5<|im_end|>", "5", 1.0, "5"),  # chat end token
    ("Answer: 3\nthen Answer: 5", "5", 1.0, "5"),  # the last one
    ("Answer: 41", "42", -1.0, "41"),
    ("The result is 42", "42", -1.0, "[INVALID]"),  # no Answer: line
    ("Answer: 42", "42.0", 1.0, "42"),  # the label is read as an integer
    ("Answer: 42" + " filler" * 60, "42", -1.0, "[INVALID]"),  # beyond the last 300 characters
    ("Answer: \\frac{1}{2}", "\\frac{1}{2}", 1.0, "\\frac{1}{2}"),  # non-integer labels: normal forms
])
def test_dapo(response: str, label, score: float, pred: str) -> None:
    out = _grade("dapo", response, label)
    assert out == {"score": score, "acc": float(score > 0), "pred": pred}


def test_dapo_trains_on_score_by_default() -> None:
    from relax.utils.arguments import parse_args

    assert parse_args(["--preset", "quickstart", "--rm-type", "dapo"]).reward_key == "score"
    assert parse_args(["--preset", "quickstart", "--rm-type", "dapo", "--reward-key", "acc"]).reward_key == "acc"
    assert parse_args(["--preset", "quickstart"]).reward_key is None


def test_normal_forms() -> None:
    assert mathd_normalize("\\left( \\dfrac12 \\right)") == "(\\frac{1}{2})"
    assert mathd_normalize("\\sqrt3") == "\\sqrt{3}"
    assert mathd_normalize(".25") == "0.25" and mathd_normalize(".5") == "\\frac{1}{2}" and mathd_normalize("k = 7") == "7"
    assert latex_to_text("\\frac{a}{\\sqrt{b}}") == "((a)/(sqrt(b)))"
    assert minerva_normalize("\\textbf{12} units") == "12"
    assert sympy_equal("2\\sqrt{2}", "\\sqrt{8}") and not sympy_equal("2", "3")
    assert answers_equal("\\frac{1}{2}", "0.5") and not answers_equal(None, "1")


def test_rewards_doc_is_up_to_date() -> None:
    from pathlib import Path

    from relax.utils.hook_docs import render

    doc = Path(__file__).parents[1] / "docs" / "rewards.md"
    assert doc.read_text(encoding="utf-8") == render(), "regenerate: python -m relax.utils.hook_docs > docs/rewards.md"
