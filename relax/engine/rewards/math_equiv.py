"""Whether two final math answers are the same: the checks the public RL math graders use.

Written from the documented behaviour of the graders Relax/slime/verl recipes rely on (deepscaler's
``grade_answer``: Hendrycks' MATH normalisation, then a symbolic comparison), not copied:

* `mathd_normalize`: Hendrycks' MATH answer normalisation (``\\dfrac``, ``\\left``, units after
  ``\\text{ ``, degrees, ``\\%``, ``0.5`` -> ``\\frac{1}{2}``, ``a/b`` -> ``\\frac{a}{b}``, a short
  ``k =`` prefix, spaces); two answers with equal normal forms are the same.
* `sympy_equal`: a looser normal form (LaTeX to plain text, units and ``$``/``%`` dropped, case
  folded, integral floats as integers), then element-wise for tuples and intervals:
  unreduced fractions must match as written, an integer answer needs an integer, anything else is
  equal when sympy simplifies the difference to 0 (skipped for expressions sympy could hang on).
"""

from __future__ import annotations

import re

_BOX_COMMANDS = ("\\boxed", "\\fbox")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), honouring nested braces; None if unclosed."""
    start = max(text.rfind(cmd + "{") for cmd in _BOX_COMMANDS)
    if start < 0:
        return None
    open_at = text.index("{", start)
    depth = 0
    for j in range(open_at, len(text)):
        if text[j] == "{":
            depth += 1
        elif text[j] == "}":
            depth -= 1
            if depth == 0:
                return text[open_at + 1 : j]
    return None


def boxed_answer(text: str) -> str | None:
    """The last ``\\boxed{...}`` content only (what deepscaler and verl's math grader extract); None without one."""
    start = text.rfind("\\boxed")
    if start < 0 or not text.startswith("\\boxed{", start):
        return None
    return last_boxed(text[start:])


# ---------------------------------------------------------------------- Hendrycks' MATH normal form
def _braced_fracs(s: str) -> str:
    """``\\frac12`` -> ``\\frac{1}{2}``, ``\\frac1{72}`` -> ``\\frac{1}{72}``."""
    head, *parts = s.split("\\frac")
    out = head
    for part in parts:
        out += "\\frac"
        if part.startswith("{") or len(part) < 2:
            out += part
            continue
        a, b, rest = part[0], part[1], part[2:]
        out += "{" + a + "}" + (b + rest if b == "{" else "{" + b + "}" + rest)
    return out


def _slash_fraction(s: str) -> str:
    a, sep, b = s.partition("/")
    if sep and a.lstrip("-").isdigit() and b.isdigit() and "/" not in b and s == f"{int(a)}/{int(b)}":
        return "\\frac{" + a + "}{" + b + "}"
    return s


def mathd_normalize(answer: str | None) -> str | None:
    if answer is None:
        return None
    s = answer.strip()
    m = re.fullmatch(r"\\text\{(.+?)\}", s)
    if m:
        s = m.group(1).strip()
    s = s.replace("\n", "").replace("\\!", "").replace("\\\\", "\\").replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "").replace("^{\\circ}", "").replace("^\\circ", "")
    s = s.replace("\\$", "")
    if "\\text{ " in s:  # units on the right
        s = s.split("\\text{ ")[0]
    s = s.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if s.startswith("."):
        s = "0" + s
    lhs, eq, rhs = s.partition("=")
    if eq and "=" not in rhs and len(lhs) <= 2:
        s = rhs
    s = re.sub(r"\\sqrt([^{\\])", r"\\sqrt{\1}", s).replace(" ", "")
    s = _braced_fracs(s)
    if s == "0.5":
        s = "\\frac{1}{2}"
    return _slash_fraction(s)


# ---------------------------------------------------------------------- symbolic comparison
_UNITS = ("degree", "cm", "centimeter", "meter", "mile", "second", "minute", "hour", "day", "week", "month", "year",
          "foot", "feet", "inch", "yard")
_TUPLE_CHARS = "()[]"


def _matching(s: str, open_at: int) -> int:
    depth = 0
    for j in range(open_at, len(s)):
        depth += {"{": 1, "}": -1}.get(s[j], 0)
        if depth == 0:
            return j
    return -1


def _take_group(s: str, i: int) -> tuple[str, int]:
    """The braced group (or single character) starting at ``i``, and the index after it."""
    if i < len(s) and s[i] == "{":
        end = _matching(s, i)
        if end > 0:
            return s[i + 1 : end], end + 1
    return s[i : i + 1], i + 1


def latex_to_text(expr: str) -> str:
    """Enough LaTeX to plain math for sympy: fractions, roots, products, pi, text wrappers."""
    s = re.sub(r"\\(left|right|displaystyle|!|,|;|:)", "", expr).replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = re.sub(r"\\(text|mathrm|textbf|mathbf|operatorname)\{([^{}]*)\}", r"\2", s)
    for cmd, fmt in (("\\frac", "(({0})/({1}))"), ("\\sqrt", "sqrt({0})")):
        while cmd in s:
            i = s.index(cmd)
            a, j = _take_group(s, i + len(cmd))
            if cmd == "\\frac":
                b, j = _take_group(s, j)
                s = s[:i] + fmt.format(a, b) + s[j:]
            else:
                s = s[:i] + fmt.format(a) + s[j:]
    for latex, plain in (("\\cdot", "*"), ("\\times", "*"), ("\\div", "/"), ("\\pi", "pi"), ("\\infty", "oo")):
        s = s.replace(latex, plain)
    return re.sub(r"\\[a-zA-Z]+", "", s).replace("{", "(").replace("}", ")").strip()


def _is_float(s: str) -> bool:
    try:
        float(s)
        return True
    except ValueError:
        return False


def _strip_thousands(s: str) -> str:
    previous = None
    while previous != s:
        previous, s = s, re.sub(r"(\d),(\d\d\d)($|\D)", r"\1\2\3", s)
    return s


def _int_text(s: str) -> str | None:
    try:
        x = float(_strip_thousands(s))
    except ValueError:
        return None
    return str(int(round(x))) if abs(x - round(x)) <= 1e-7 else None


def sympy_normalize(expr: str | None) -> str | None:
    if expr is None:
        return None
    m = re.fullmatch(r"\\text\{(.+?)\}", expr)
    s = m.group(1) if m else expr
    s = s.replace("\\%", "%").replace("\\$", "$").replace("$", "").replace("%", "")
    s = s.replace(" or ", " , ").replace(" and ", " , ")
    s = s.replace("million", "*10^6").replace("billion", "*10^9").replace("trillion", "*10^12")
    for unit in _UNITS:
        s = re.sub(unit + r"(es)?(s)? *(\^[0-9]+)?", "", s)
    s = re.sub(r"\^ *\\circ", "", s)
    if len(s) > 1 and s[0] == "{" and s[-1] == "}":
        s = s[1:-1]
    s = re.sub(r",\\! *", "", s)
    if _is_float(s) and _int_text(s) is not None:
        s = _int_text(s)
    if "\\" in s:
        s = latex_to_text(s)
    s = re.sub(r"- *", "-", s)
    s = re.sub(r"([0-9]) +([0-9])", r"\1+\2", s).replace(" ", "")  # 7 3/4 -> 7+3/4
    s = s.replace("{", "").replace("}", "").lower()
    return _int_text(s) or s


def _sympy_zero(difference: str) -> bool:
    letters = {c for c in difference.replace("sqrt", "").replace("frac", "") if c.isalpha()}
    if len(letters) > 2 or "^{" in difference or "^(" in difference or re.search(r"\^[0-9]+\^|\^[0-9][0-9]+", difference):
        return False  # expressions sympy may never finish simplifying
    from sympy import simplify
    from sympy.parsing.sympy_parser import (
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )

    try:
        value = parse_expr(difference.replace("^", "**"),
                           transformations=(*standard_transformations, implicit_multiplication_application))
        return simplify(value) == 0
    except Exception:  # noqa: BLE001 - anything sympy cannot read is simply not equal
        return False


def _elements(s: str) -> list[str]:
    s = _strip_thousands(s)
    if len(s) > 2 and s[0] in _TUPLE_CHARS and s[-1] in _TUPLE_CHARS and not any(c in s[1:-1] for c in _TUPLE_CHARS):
        return [e.strip() for e in s[1:-1].split(",")]
    return [s] if s else []


def _is_fraction(s: str) -> bool:
    return bool(re.fullmatch(r"-?[0-9]+.?/0*[1-9][0-9]*.?", s))


def sympy_equal(given: str | None, truth: str | None) -> bool:
    g, t = sympy_normalize(given), sympy_normalize(truth)
    if g is None or t is None:
        return False
    if g == t:
        return True
    if not g:
        return False
    ge, te = _elements(g), _elements(t)
    if len(te) > 1 and (t[0] != g[0] or t[-1] != g[-1]) or len(ge) != len(te):
        return False
    for a, b in zip(ge, te, strict=True):
        if _is_fraction(a) and _is_fraction(b):
            same = a == b  # an unreduced fraction is not the answer
        elif (_int_text(a) is not None) != (_int_text(b) is not None):
            same = False  # an integer answer needs an integer
        else:
            same = _sympy_zero(f"({b})-({a})")
        if not same:
            return False
    return True


def answers_equal(given: str | None, truth: str | None) -> bool:
    """deepscaler's ``grade_answer``: equal Hendrycks normal forms, or symbolically equal."""
    if given is None or truth is None:
        return False
    return mathd_normalize(given) == mathd_normalize(truth) or sympy_equal(given, truth)
