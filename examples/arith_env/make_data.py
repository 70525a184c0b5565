"""Write the running-sum task as a verl RL dataset (what seed 004's migration starts from).

    python3 -m examples.arith_env.make_data DATA_DIR/arith_verl.parquet
    relax convert-data DATA_DIR/arith_verl.parquet DATA_DIR/arith.parquet
"""

from __future__ import annotations

import sys


def verl_rows() -> list[dict]:
    rows = []
    for a in range(10):
        for b in range(10):
            c = (a * 3 + b * 7) % 10
            rows.append({"data_source": "arith", "prompt": [{"role": "user", "content": f"{a}+{b}="}],
                         "ability": "arithmetic",
                         "reward_model": {"style": "rule", "ground_truth": f"{(a + b) % 10},{(a + b + c) % 10}"},
                         "extra_info": {"index": len(rows), "addends": [c]}})
    return rows


def main(path: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(verl_rows()), path)


if __name__ == "__main__":
    main(sys.argv[1])
