"""Built-in rule-based graders for ``--rm-type``, registered by name in `GRADERS`.

Each grader is ``reward_fn(args, sample) -> float | dict`` (sync or async); its docstring is what
docs/rewards.md says about it (generated: ``python -m relax.engine.rewards.docs``). A grader that
returns a dict names its training key in `GRADER_REWARD_KEYS` (``--reward-key`` defaults to it).
``math``, ``deepscaler`` and ``dapo`` follow the public graders Relax recipes use
(relax/engine/rewards/reference_graders.py).
"""

from __future__ import annotations

import re
from argparse import Namespace
from collections.abc import Callable
from fractions import Fraction
from typing import Any

from relax.engine.rewards.math_equiv import last_boxed
from relax.utils.types import Sample

RewardFn = Callable[[Namespace, Sample], float]


# seed hook: seed 001 (reward_func(args, sample)), as a --rm-type grader
def exact(args: Namespace, sample: Sample) -> float:
    """1.0 when the stripped response equals the stripped label."""
    return float(sample.response.strip() == str(sample.label).strip())


# a number: thousands-grouped ("1,000,000.5"), plain/decimal/fraction ("-12", "3.5", "1/2"), or ".5"
_NUMBER = re.compile(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\d,])|-?\d+(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def extract_answer(response: str) -> str | None:
    """The final answer of a response: last ``\\boxed{}`` content, else the last number.

    An unclosed box (a truncated response) is no answer, not a fallback to the last number.
    """
    if any(cmd + "{" in response for cmd in ("\\boxed", "\\fbox")):
        return last_boxed(response)
    numbers = _NUMBER.findall(response)
    return numbers[-1] if numbers else None


_LATEX_NOISE = re.compile(r"\\left|\\right|\\!|\\,|\\;|\\:|\\ |\\displaystyle|\^\{?\\circ\}?|\\%|%|\$")
_TEXT_WRAPPER = re.compile(r"\\(?:text|mathrm|textbf|mathbf)\{([^{}]*)\}")
_FRAC = re.compile(r"^(-?)\\[dt]?frac\{(-?[\d.]+)\}\{(-?[\d.]+)\}$")


def _strip_braces(s: str) -> str:
    while s.startswith("{") and s.endswith("}") and last_boxed("\\boxed" + s) == s[1:-1]:
        s = s[1:-1].strip()
    return s


def normalize_answer(text: str) -> str:
    """Drop LaTeX spacing/sizing noise, text wrappers, redundant outer braces and a leading ``x =``."""
    s = _TEXT_WRAPPER.sub(r"\1", _LATEX_NOISE.sub("", str(text))).strip().rstrip(".").strip()
    s = _strip_braces(s)
    if "=" in s:
        s = s.rsplit("=", 1)[1].strip()
    return _strip_braces(s).replace(" ", "")


def to_number(text: str) -> Fraction | None:
    """An exact rational for a numeric answer (``"1,000"``, ``"-0.5"``, ``"3/4"``, ``"\\frac{1}{2}"``), else None."""
    s = normalize_answer(text)
    m = _FRAC.match(s)
    try:
        if m:
            value = Fraction(m.group(2)) / Fraction(m.group(3))
            return -value if m.group(1) else value
        if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s):
            s = s.replace(",", "")
        return Fraction(s)
    except (ValueError, ZeroDivisionError):
        return None


# seed hook: seed 001 (reward_func(args, sample)), as a --rm-type grader
def math_answer(args: Namespace, sample: Sample) -> float:
    """1.0 when the response's final answer (the last ``\\boxed{}``, else the last number) equals the label,
    numerically when both are numbers (``1/2``, ``0.5``, ``\\frac{1}{2}``, ``1,000``), else as normalized strings.
    Lenient: an unboxed answer counts (``math`` requires the box)."""
    if sample.label is None:
        return 0.0
    predicted = extract_answer(sample.response)
    if predicted is None:
        return 0.0
    label = _label_text(sample.label)
    a, b = to_number(predicted), to_number(label)
    if a is not None and b is not None:
        return float(a == b)
    return float(normalize_answer(predicted) == normalize_answer(label))


def _label_text(label: Any) -> str:
    text = str(label)
    boxed = last_boxed(text)
    return boxed if boxed is not None else text


from relax.engine.rewards.reference_graders import dapo, deepscaler, math_verl  # noqa: E402 - registered below
from relax.engine.rewards.remote import remote_rm  # noqa: E402

GRADERS: dict[str, RewardFn] = {"remote_rm": remote_rm, "exact": exact, "math": math_verl, "deepscaler": deepscaler,
                                "dapo": dapo, "math_lenient": math_answer}
GRADER_REWARD_KEYS: dict[str, str] = {"dapo": "score"}  # graders that return a dict: the key trained on
