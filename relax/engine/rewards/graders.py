"""Built-in rule-based graders for ``--rm-type`` (registered by name)."""

from __future__ import annotations

import re
from argparse import Namespace
from collections.abc import Callable
from fractions import Fraction

from relax.utils.types import Sample

RewardFn = Callable[[Namespace, Sample], float]


def exact(args: Namespace, sample: Sample) -> float:
    """1.0 when the stripped response equals the stripped label."""
    return float(sample.response.strip() == str(sample.label).strip())


_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


def _boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}``, honouring nested braces."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 0, start + len("\\boxed")
    for j in range(i, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
    return None


def _to_number(text: str) -> Fraction | None:
    cleaned = text.strip().strip("$").replace(",", "").replace(" ", "")
    m = re.fullmatch(r"\\frac\{(-?\d+)\}\{(\d+)\}", cleaned)
    if m:
        return Fraction(int(m.group(1)), int(m.group(2)))
    try:
        return Fraction(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def extract_answer(response: str) -> str | None:
    boxed = _boxed(response)
    if boxed is not None:
        return boxed
    numbers = _NUMBER.findall(response)
    return numbers[-1] if numbers else None


def math_answer(args: Namespace, sample: Sample) -> float:
    """Final-answer match: the last ``\\boxed{}`` (else the last number) equals the label numerically."""
    predicted = extract_answer(sample.response)
    label = str(sample.label)
    label = _boxed(label) or label
    if predicted is None:
        return 0.0
    a, b = _to_number(predicted), _to_number(label)
    if a is not None and b is not None:
        return float(a == b)
    return float(predicted.strip() == label.strip())


GRADERS: dict[str, RewardFn] = {"exact": exact, "math": math_answer}
