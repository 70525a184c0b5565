"""What a user reads to see that a custom reward ran: samples.jsonl fields, reward_extra metrics, console
columns; and ``relax convert-data`` for verl datasets."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from relax.metrics.console import step_line
from relax.metrics.sample_records import RESPONSE_CHARS, reward_extras, sample_fields
from relax.utils.types import Sample


def test_sample_fields_carry_reward_length_and_cut_text() -> None:
    s = Sample(response="x" * 300, response_length=7, loss_mask=[1, 1, 0, 0, 0, 1, 1], reward={"score": 0.5, "acc": 1})
    assert sample_fields(s, "score") == {"reward": 0.5, "response_length": 7, "loss_tokens": 4,
                                         "response": "x" * RESPONSE_CHARS, "response_truncated": True}
    assert sample_fields(Sample(response="7", response_length=1, reward=1.0), None)["reward"] == 1.0
    assert sample_fields(Sample(reward=None), None)["reward"] is None


def test_extra_reward_keys_become_mean_metrics() -> None:
    samples = [Sample(reward={"score": 1.0, "acc": 1.0, "len": 4, "pred": "7"}),
               Sample(reward={"score": 0.0, "acc": 0.0, "len": 6}), Sample(reward=0.3)]
    assert reward_extras(samples, "score") == {"rollout/reward_extra/acc": 0.5, "rollout/reward_extra/len": 5.0}


def test_console_columns_are_labelled_and_name_the_kl_they_show() -> None:
    metrics = {"step": 2, "rollout/reward_mean": 0.25, "rollout/response_len_mean": 5.0, "train/loss": -0.01,
               "train/ppo_kl": 3e-5, "train/kl_loss": 2e-3, "train/grad_norm": 0.5, "perf/rollout_time_s": 1.0,
               "perf/train_time_s": 0.5, "perf/sync_time_s": 0.1}
    assert step_line(metrics, 10) == ("step    3/10  reward 0.250  resp_len 5.0  loss -0.0100  ppo_kl 3.0e-05  "
                                      "kl_ref 2.0e-03  gnorm 0.500  | rollout 1.00s train 0.50s sync 0.10s")
    del metrics["train/kl_loss"]  # no KL loss: no reference-KL column
    assert "kl_ref" not in step_line(metrics, 10) and " kl " not in step_line(metrics, 10)


def _verl(path: Path, rows: list[dict]) -> Path:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def test_convert_data_maps_verl_columns(tmp_path: Path) -> None:
    from relax.data.dataset import read_records

    src = _verl(tmp_path / "verl.parquet", [
        {"data_source": "gsm8k", "prompt": [{"role": "user", "content": "1+1?"}], "ability": "math",
         "reward_model": {"style": "rule", "ground_truth": "2"}, "extra_info": {"split": "train", "index": 0}},
        {"data_source": "gsm8k", "prompt": [{"role": "user", "content": "2+2?"}], "ability": "math",
         "reward_model": {"style": "rule", "ground_truth": "4"}, "extra_info": {"split": "train", "index": 1}},
    ])
    for out in (tmp_path / "out.parquet", tmp_path / "out.jsonl"):
        proc = subprocess.run([sys.executable, "-m", "relax.cli", "convert-data", str(src), str(out)],
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0 and "converted 2 rows" in proc.stdout, proc.stderr
        rows = read_records(out)
        assert rows[1]["prompt"] == [{"role": "user", "content": "2+2?"}] and rows[1]["label"] == "4"
        assert rows[1]["extra_info"] == {"split": "train", "index": 1, "data_source": "gsm8k"}
        assert rows[0]["data_source"] == "gsm8k"


def test_convert_data_errors_name_the_row_and_its_keys(tmp_path: Path) -> None:
    from relax.data.convert_verl import convert
    from relax.data.dataset import DataError

    src = _verl(tmp_path / "v.parquet", [{"prompt": "hi", "reward_model": {"style": "rule", "ground_truth": "1"}},
                                         {"prompt": "hi", "answer": "1"}])
    with pytest.raises(DataError, match=r"v\.parquet:2: no reward_model.ground_truth \(the row has keys: prompt, "
                                        r"reward_model; reward_model is None\)"):
        convert(src, tmp_path / "o.parquet")
    with pytest.raises(DataError, match="must end in .parquet or .jsonl"):
        convert(src, tmp_path / "o.csv")
