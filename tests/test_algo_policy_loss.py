"""Policy losses, KL, TIS/ICEPOP, OPSM and reductions against plain float64 references.

The reference (`_ref`) loops over lists and derives values and gradients by hand from the
formulas in docs/algorithms.md; it shares no code with relax.algorithms.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relax.algorithms import AlgorithmConfig, merge_metrics, policy_loss
from relax.algorithms.kl import kl_estimate
from tests.algo_refs import kl_ref, make_args, masked_rows, near, random_mask, random_matrix, reduce_ref, t

ESTIMATORS = ["grpo", "gspo", "sapo", "cispo"]


def _cfg(**kw) -> AlgorithmConfig:
    return AlgorithmConfig.from_args(make_args(**kw))


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def _data(seed: int, b: int = 6, t_len: int = 5, empty_rows: int = 1, spread: float = 0.4) -> dict:
    rng = random.Random(seed)
    lp = random_matrix(rng, b, t_len, -3, -0.01)
    old = near(rng, lp, spread)
    seq_adv = [rng.uniform(-2, 2) for _ in range(b)]
    return dict(
        lp=lp,
        old=old,
        rollout=near(rng, old, spread),
        ref=near(rng, lp, spread),
        adv=[[a + rng.uniform(-0.5, 0.5) * (seed % 2) for _ in range(t_len)] for a in seq_adv],
        ent=random_matrix(rng, b, t_len, 0.1, 2.0),
        mask=random_mask(rng, b, t_len, empty_rows=empty_rows),
    )


def _token_terms(o: dict, est: str, lp, beh, adv, mask):
    """Per-token (loss, d loss / d log p, clip indicator) for one row, from the paper formulas."""
    lo, hi, c = (
        1 - o.get("eps_clip", 0.2),
        1 + o.get("eps_clip_high", o.get("eps_clip", 0.2)),
        o.get("eps_clip_c"),
    )
    valid = [j for j in range(len(lp)) if mask[j]]
    s = math.exp(sum(lp[j] - beh[j] for j in valid) / max(len(valid), 1))
    out = []
    for j in range(len(lp)):
        a, r = adv[j], math.exp(lp[j] - beh[j])
        if est == "sapo":
            tau = o.get("sapo_tau_pos", 1.0) if a > 0 else o.get("sapo_tau_neg", 1.05)
            g = _sigmoid(tau * (r - 1))
            out.append((-a * 4 / tau * g, -a * 4 * g * (1 - g) * r, 0.0))
        elif est == "cispo":
            w = min(max(r, lo), hi)
            out.append((-w * a * lp[j], -w * a, float(w != r)))
        else:
            x = s if est == "gspo" else r
            unclipped, clipped = -a * x, -a * min(max(x, lo), hi)
            loss, grad = (clipped, 0.0) if clipped > unclipped else (unclipped, -a * x)
            if c is not None and a < 0 and -a * c < loss:
                loss, grad = -a * c, 0.0
            out.append((loss, grad, float(clipped > unclipped)))
    return out


def _ref(o: dict, est: str, d: dict, n_samples: int, n_tokens: int):
    """Reference loss, d loss / d log_probs, and metrics."""
    per_tok = o.get("calculate_per_token_loss", False)
    mask = d["mask"]
    beh = d["rollout"] if o.get("use_rollout_logprobs") else d["old"]
    red = lambda m: reduce_ref(m, mask, per_tok, n_samples, n_tokens)  # noqa: E731
    pg, dpg, clip, extra = [], [], [], {}
    tis_w, tis_c, keep = [], [], []
    for i in range(len(mask)):
        terms = _token_terms(o, est, d["lp"][i], beh[i], d["adv"][i], mask[i])
        ws, cs, ks = [], [], []
        n_valid = sum(mask[i])
        seq_kl = sum((beh[i][j] - d["lp"][i][j]) * mask[i][j] for j in range(len(mask[i]))) / max(n_valid, 1)
        for j, (loss, grad, cl) in enumerate(terms):
            r = math.exp(d["old"][i][j] - d["rollout"][i][j])
            lo, hi = o.get("tis_clip_low", 0.0), o.get("tis_clip", 2.0)
            if o.get("custom_tis_function_path"):  # icepop
                w, cflag = (r, 0.0) if lo <= r <= hi else (0.0, 1.0)
            else:
                w, cflag = min(max(r, lo), hi), float(r < lo or r > hi)
            if not o.get("use_tis"):
                w = 1.0
            k = (
                0.0
                if (o.get("use_opsm") and d["adv"][i][j] < 0 and seq_kl > o.get("opsm_delta", 1e-4))
                else 1.0
            )
            ws.append(w), cs.append(cflag), ks.append(k)
            terms[j] = (loss * w * k, grad * w * k, cl)
        (
            pg.append([x[0] for x in terms]),
            dpg.append([x[1] for x in terms]),
            clip.append([x[2] for x in terms]),
        )
        tis_w.append(ws), tis_c.append(cs), keep.append(ks)
    pg_loss = red(pg)
    if o.get("custom_pg_loss_reducer_function_path"):
        pg_loss = sum(sum(r) for r in masked_rows(pg, mask)) / n_samples
    metrics = {
        "pg_loss": pg_loss,
        "pg_clipfrac": red(clip),
        "ppo_kl": red(
            [[a - b for a, b in zip(ra, rb, strict=True)] for ra, rb in zip(d["old"], d["lp"], strict=True)]
        ),
    }
    loss = pg_loss - o.get("entropy_coef", 0.0) * red(d["ent"])
    metrics["entropy"] = red(d["ent"])
    kind, unbiased = o.get("kl_loss_type", "k1"), o.get("use_unbiased_kl", False)
    kl = []
    for i in range(len(mask)):
        row = []
        for a, b, bh in zip(d["lp"][i], d["ref"][i], beh[i], strict=True):
            k = kl_ref(a, b, "k3" if kind == "low_var_kl" else kind) * (math.exp(a - bh) if unbiased else 1.0)
            row.append(min(max(k, -10.0), 10.0) if kind == "low_var_kl" else k)
        kl.append(row)
    metrics["kl_loss"] = red(kl)
    if o.get("use_kl_loss"):
        loss += o["kl_loss_coef"] * metrics["kl_loss"]
    metrics["loss"] = loss
    if o.get("use_tis"):
        metrics["tis_weight"], metrics["tis_clipfrac"] = red(tis_w), red(tis_c)
    if o.get("use_opsm"):
        metrics["opsm_maskfrac"] = red([[1 - k for k in row] for row in keep])
    if o.get("get_mismatch_metrics"):
        diffs = [
            [a - b for a, b in zip(ra, rb, strict=True)]
            for ra, rb in zip(d["old"], d["rollout"], strict=True)
        ]
        metrics["mismatch_logprob_abs_diff"] = red([[abs(x) for x in row] for row in diffs])
        metrics["mismatch_k3_kl"] = red([[math.exp(x) - 1 - x for x in row] for row in diffs])
        ratios = [math.exp(x) for row in masked_rows(diffs, mask) for x in row]
        extra = {"mismatch_ratio_max": max(ratios), "mismatch_ratio_min": min(ratios)}
    # gradient of the pg part (entropy/KL terms are checked through their values)
    grad = []
    for i, row in enumerate(dpg):
        n_valid = sum(mask[i])
        scale = (1 / n_tokens) if per_tok else (1 / max(n_valid, 1) / n_samples)
        if o.get("custom_pg_loss_reducer_function_path"):
            scale = 1 / n_samples
        grad.append([g * scale * mask[i][j] for j, g in enumerate(row)])
    return metrics | extra, grad


def _run(o: dict, est: str, d: dict, n_samples: int, n_tokens: int, rows=slice(None)):
    cfg = _cfg(advantage_estimator=est, **o)
    lp = t(d["lp"][rows]).requires_grad_(True)
    loss, metrics = policy_loss(
        cfg,
        log_probs=lp,
        old_log_probs=t(d["old"][rows]),
        advantages=t(d["adv"][rows]),
        loss_mask=t(d["mask"][rows]),
        ref_log_probs=t(d["ref"][rows]),
        rollout_log_probs=t(d["rollout"][rows]),
        entropy=t(d["ent"][rows]),
        num_global_samples=n_samples,
        num_global_tokens=n_tokens,
    )
    loss.backward()
    return loss.detach(), metrics, lp.grad


OPTION_SETS = [
    {},
    {"calculate_per_token_loss": True},
    {"eps_clip": 0.1, "eps_clip_high": 0.28, "eps_clip_c": 2.0},
    {"entropy_coef": 0.01, "use_kl_loss": True, "kl_loss_coef": 0.3, "kl_loss_type": "k3"},
    {"use_kl_loss": True, "kl_loss_coef": 0.1, "kl_loss_type": "low_var_kl", "use_unbiased_kl": True},
    {"kl_loss_type": "k2", "use_rollout_logprobs": True},
    {"use_tis": True, "tis_clip": 1.3, "tis_clip_low": 0.8, "get_mismatch_metrics": True},
    {
        "use_tis": True,
        "tis_clip": 1.3,
        "tis_clip_low": 0.8,
        "custom_tis_function_path": "relax.algorithms.tis.icepop",
    },
    {"use_opsm": True, "opsm_delta": 0.01},
    {"custom_pg_loss_reducer_function_path": "tests.algo_plugins.sequence_sum_reducer"},
    {"sapo_tau_pos": 0.5, "sapo_tau_neg": 2.0, "calculate_per_token_loss": True},
]


@pytest.mark.parametrize("options", OPTION_SETS, ids=lambda o: ",".join(o) or "default")
@pytest.mark.parametrize("est", ESTIMATORS)
@pytest.mark.parametrize("seed", range(2))
def test_policy_loss_matches_reference(est: str, options: dict, seed: int) -> None:
    d = _data(seed + 10 * len(options))
    n_tokens = int(sum(map(sum, d["mask"])))
    loss, metrics, grad = _run(options, est, d, len(d["lp"]), n_tokens)
    ref_metrics, ref_grad = _ref(options, est, d, len(d["lp"]), n_tokens)
    assert set(ref_metrics) <= set(metrics)
    for key, value in ref_metrics.items():
        assert abs(float(metrics[key]) - value) < 1e-10, key
    assert abs(float(loss) - ref_metrics["loss"]) < 1e-10
    if not options.get("use_kl_loss") and not options.get("entropy_coef"):
        assert torch.allclose(grad, t(ref_grad), atol=1e-10, rtol=0)


@settings(deadline=None, max_examples=60)
@given(st.integers(0, 10_000), st.sampled_from(ESTIMATORS), st.booleans())
def test_ratio_one_is_vanilla_policy_gradient(seed: int, est: str, per_token: bool) -> None:
    """At ratio 1 every loss has the REINFORCE gradient -A * grad log p; ppo/gspo also have value -mean(A)."""
    d = _data(seed, empty_rows=2)
    d["old"] = d["lp"]
    n, n_tokens = len(d["lp"]), int(sum(map(sum, d["mask"])))
    _, m, grad = _run({"calculate_per_token_loss": per_token}, est, d, n, n_tokens)
    if est in ("grpo", "gspo"):
        assert abs(float(m["pg_loss"]) + reduce_ref(d["adv"], d["mask"], per_token, n, n_tokens)) < 1e-10
    for i, (arow, mrow) in enumerate(zip(d["adv"], d["mask"], strict=True)):
        scale = 1 / n_tokens if per_token else 1 / max(sum(mrow), 1) / n
        for j, (a, k) in enumerate(zip(arow, mrow, strict=True)):
            assert abs(float(grad[i, j]) + a * k * scale) < 1e-10
    assert float(m["ppo_kl"]) == 0.0 and float(m["pg_clipfrac"]) == 0.0


@settings(deadline=None, max_examples=60)
@given(st.floats(-5, 5), st.floats(-3, 3), st.floats(1.01, 10), st.sampled_from([0.1, 0.2, 0.3]))
def test_dual_clip_bounds_negative_advantage_loss(log_ratio: float, adv: float, c: float, eps: float) -> None:
    one = lambda x: t([[x]])  # noqa: E731
    loss, _ = policy_loss(
        _cfg(eps_clip=eps, eps_clip_c=c),
        log_probs=one(log_ratio),
        old_log_probs=one(0.0),
        advantages=one(-abs(adv)),
        loss_mask=one(1.0),
        num_global_samples=1,
        num_global_tokens=1,
    )
    assert float(loss) <= abs(adv) * c + 1e-12


@settings(deadline=None)
@given(
    st.lists(st.floats(-20, 0), min_size=4, max_size=4),
    st.lists(st.floats(-20, 0), min_size=4, max_size=4),
    st.sampled_from(["k1", "k2", "k3", "low_var_kl"]),
)
def test_kl_estimators(lp: list[float], ref: list[float], kind: str) -> None:
    got = kl_estimate(t(lp), t(ref), kind)
    for g, a, b in zip(got.tolist(), lp, ref, strict=True):
        expected = kl_ref(a, b, kind)
        assert abs(g - expected) <= 1e-9 * max(1.0, abs(expected))
        if kind != "k1":
            assert g >= 0


MICRO_OPTIONS = st.fixed_dictionaries(
    {},
    optional={
        "calculate_per_token_loss": st.just(True),
        "eps_clip_c": st.just(3.0),
        "entropy_coef": st.just(0.01),
        "use_tis": st.just(True),
        "use_opsm": st.just(True),
        "get_mismatch_metrics": st.just(True),
        "use_rollout_logprobs": st.just(True),
        "kl_loss_type": st.sampled_from(["k2", "low_var_kl"]),
        "use_unbiased_kl": st.just(True),
    },
)


@settings(deadline=None, max_examples=60)
@given(st.integers(0, 10_000), st.sampled_from(ESTIMATORS), st.sampled_from([1, 2, 3, 6]), MICRO_OPTIONS)
def test_micro_batches_sum_to_full_batch(seed: int, est: str, splits: int, options: dict) -> None:
    options = {"use_kl_loss": True, "kl_loss_coef": 0.05, **options}
    d = _data(seed, empty_rows=2)
    n, n_tokens = len(d["lp"]), int(sum(map(sum, d["mask"])))
    full_loss, full_m, full_g = _run(options, est, d, n, n_tokens)
    size, total, merged, grads = n // splits, 0.0, {}, []
    for s in range(0, n, size):
        part, m, g = _run(options, est, d, n, n_tokens, rows=slice(s, s + size))
        total += float(part)
        merged = merge_metrics(merged, m)
        grads.append(g)
    assert abs(total - float(full_loss)) < 1e-6
    assert set(merged) == set(full_m)
    for key in full_m:
        assert abs(float(merged[key]) - float(full_m[key])) < 1e-6, key
    assert torch.allclose(torch.cat(grads), full_g, atol=1e-6, rtol=0)


def test_empty_rows_do_not_produce_nan() -> None:
    d = _data(0, empty_rows=6)
    for per_token in (False, True):
        loss, m, g = _run(
            {
                "calculate_per_token_loss": per_token,
                "use_tis": True,
                "get_mismatch_metrics": True,
                "use_opsm": True,
            },
            "gspo",
            d,
            6,
            0,
        )
        assert float(loss) == 0.0 and all(torch.isfinite(v) for v in m.values()) and not g.any()
        assert "mismatch_ratio_max" not in m


def test_unbiased_kl_keeps_the_ratio_gradient() -> None:
    """d/dlp of r * k1 with r = exp(lp - old): r * (k1 + 1), so the ratio is not detached."""
    lp = t([[-1.0]]).requires_grad_(True)
    cfg = _cfg(use_kl_loss=True, kl_loss_coef=1.0, use_unbiased_kl=True)
    loss, m = policy_loss(
        cfg,
        log_probs=lp,
        old_log_probs=t([[-1.5]]),
        advantages=t([[0.0]]),
        loss_mask=t([[1.0]]),
        ref_log_probs=t([[-2.0]]),
        num_global_samples=1,
        num_global_tokens=1,
    )
    loss.backward()
    r = math.exp(0.5)
    assert abs(float(m["kl_loss"]) - r * 1.0) < 1e-12 and abs(float(lp.grad) - r * 2.0) < 1e-12


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"eps_clip_c": 0.5}, "--eps-clip-c must be > 1"),
        ({"kl_coef": 0.1, "use_kl_loss": True, "kl_loss_coef": 0.1}, "mutually exclusive"),
        ({"loss_type": "custom_loss"}, "requires --custom-loss-function-path"),
        ({"tis_clip_low": 3.0}, "exceeds --tis-clip"),
        ({"custom_tis_function_path": "relax.algorithms.tis.icepop"}, "without --use-tis"),
        ({"kl_loss_type": "k9"}, "unknown --kl-loss-type"),
        ({"sapo_tau_neg": 0.0}, "must be > 0"),
        ({"gamma": 1.5}, r"\[0, 1\]"),
    ],
)
def test_config_rejects_bad_combinations(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        _cfg(**kw)


def test_an_unknown_estimator_is_refused_naming_the_known_ones() -> None:
    from relax.algorithms.advantages import ESTIMATORS, compute_advantages

    with pytest.raises(ValueError, match="unknown --advantage-estimator 'nope'; known: " + ", ".join(ESTIMATORS)):
        compute_advantages(_cfg(advantage_estimator="nope"), rewards=torch.zeros(2), loss_mask=torch.ones(2, 3),
                           group_size=2)


def test_config_needs_parsed_args() -> None:
    from argparse import Namespace

    with pytest.raises(ValueError, match="args lacks advantage_estimator"):
        AlgorithmConfig.from_args(Namespace())


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"use_kl_loss": True, "kl_loss_coef": 0.1}, "reference log-probs"),
        ({"use_tis": True}, "rollout log-probs"),
        ({"use_rollout_logprobs": True}, "rollout log-probs"),
        ({"get_mismatch_metrics": True}, "rollout log-probs"),
    ],
)
def test_missing_inputs_are_named(kw: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        policy_loss(
            _cfg(**kw),
            log_probs=t([[0.0]]),
            old_log_probs=t([[0.0]]),
            advantages=t([[1.0]]),
            loss_mask=t([[1.0]]),
            num_global_samples=1,
            num_global_tokens=1,
        )
