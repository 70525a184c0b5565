"""The math graders seed 004 names (``--rm-type math | deepscaler | dapo``), as Relax/slime/verl define them.

Each follows the public grader's documented behaviour (our own code; tests/test_reference_graders.py
holds the reference cases):

* ``math`` (slime's ``grade_answer_verl``): the response's last ``\\boxed{}`` answer against the
  label (itself unboxed when boxed), equal by Hendrycks' normal form or symbolically. No boxed
  answer, or no label, scores 0. Scores 1 or 0.
* ``deepscaler`` (DeepScaleR's rule reward): only the part after the last ``</think>`` (or after
  ``###Response``) counts; a response with neither scores 0, so the format is rewarded too. Then as
  ``math``. Scores 1 or 0.
* ``dapo`` (DAPO's ``math_dapo``): the last ``Answer: ...`` line within the response's final 300
  characters, normalised like Minerva (text after the last ``=``, units, ``\\text{}``, ``\\boxed{}``,
  ``$``, thousands commas, chat end tokens dropped), equal to the label read as an integer (DAPO's
  answers are integers; a label that is not one is compared as its normal form). Returns
  ``{"score": 1.0 or -1.0, "acc": 1.0 or 0.0, "pred": the extracted answer}``; ``--reward-key``
  defaults to ``score`` with it, and ``acc`` is logged as ``rollout/reward_extra/acc``.
"""

from __future__ import annotations

import re
from argparse import Namespace
from typing import Any

from relax.engine.rewards.math_equiv import answers_equal, boxed_answer
from relax.utils.types import Sample


def _label(label: Any) -> str | None:
    if label is None or str(label) == "":
        return None
    text = str(label)
    return boxed_answer(text) if "\\boxed" in text else text


# seed hook: seed 001 (reward_func(args, sample)), as a --rm-type grader
def math_verl(args: Namespace, sample: Sample) -> float:
    """1.0 when the last boxed answer equals the label (normal form or symbolically), else 0.0."""
    truth = _label(sample.label)
    given = boxed_answer(sample.response) if "\\boxed" in sample.response else None
    return float(truth is not None and answers_equal(given, truth))


# seed hook: seed 001 (reward_func(args, sample)), as a --rm-type grader
def deepscaler(args: Namespace, sample: Sample) -> float:
    """``math`` on the part after the last ``</think>`` (or ``###Response``); 0.0 without either marker."""
    response = sample.response
    if "</think>" in response:
        solution = response.split("</think>")[-1]
    elif "###Response" in response:
        solution = response.split("###Response")[1]
    else:
        return 0.0
    truth = _label(sample.label)
    given = boxed_answer(solution) if "\\boxed" in solution else None
    return float(truth is not None and answers_equal(given, truth))


# Minerva's answer normalisation as DAPO uses it
_SUBSTITUTIONS = (("an ", ""), ("a ", ""), (".$", "$"), ("\\$", ""), ("\\ ", ""), (" ", ""), ("mbox", "text"),
                  (",\\text{and}", ","), ("\\text{and}", ","), ("\\text{m}", "\\text{}"))
_REMOVED = ("square", "ways", "integers", "dollars", "mph", "inches", "hours", "km", "units", "\\ldots", "sue",
            "points", "feet", "minutes", "digits", "cents", "degrees", "cm", "gm", "pounds", "meters", "meals",
            "edges", "students", "childrentickets", "multiples", "\\text{s}", "\\text{.}", "\\text{\ns}",
            "\\text{}^2", "\\text{}^3", "\\text{\n}", "\\text{}", r"\mathrm{th}", r"^\circ", r"^{\circ}", r"\;",
            r",\!", "{,}", '"', "\\dots", "<|im_end|>", "<|endoftext|>")
_ANSWER = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
DAPO_TAIL_CHARS = 300


def minerva_normalize(answer: str) -> str:
    s = str(answer).split("=")[-1]
    for before, after in _SUBSTITUTIONS:
        s = s.replace(before, after)
    for expr in _REMOVED:
        s = s.replace(expr, "")
    s = re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\\3$", s)
    for wrapper in ("text", "textbf", "overline"):
        s = re.sub(rf"(\\{wrapper}\{{)(.*?)(\}})", "\\2", s)
    s = re.sub(r"(\\boxed\{)(.*)(\})", "\\2", s)
    s = re.sub(r"(frac)([^{])(.)", "frac{\\2}{\\3}", s)
    s = re.sub(r"(sqrt)([^{])", "sqrt{\\2}", s).replace("$", "")
    if s.replace(",", "").isdigit():
        s = s.replace(",", "")
    return s.strip()


def _dapo_truth(label: Any) -> str:
    truth = minerva_normalize(str(label))
    try:
        return str(int(float(truth)))
    except ValueError:
        return truth  # DAPO's answers are integers; anything else is compared as its normal form


# seed hook: seed 001 (reward_func(args, sample)), as a --rm-type grader
def dapo(args: Namespace, sample: Sample) -> dict[str, Any]:
    """``score`` 1.0 when the last ``Answer:`` of the final 300 characters equals the label, else -1.0."""
    found = _ANSWER.findall(sample.response[-DAPO_TAIL_CHARS:])
    pred = minerva_normalize(found[-1]) if found else "[INVALID]"
    correct = sample.label is not None and pred == _dapo_truth(sample.label)
    return {"score": 1.0 if correct else -1.0, "acc": float(correct), "pred": pred}
