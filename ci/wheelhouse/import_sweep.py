"""Import every module of a package from an installed wheelhouse and group what fails by the missing module.

    PYTHONPATH=SITE python3.12 ci/wheelhouse/import_sweep.py sglang.srt
    PYTHONPATH=BRIDGE_SITE:MACHINE_SITE python3.12 ci/wheelhouse/import_sweep.py megatron.bridge

How sglang_closure.py's EXCLUDED and UNDECLARED lists were checked on the CPU box (Python 3.12 with torch 2.11.0
and the GPU machine's packages, the lock installed with ``pip install --no-index --no-deps --target SITE``): a
module missing here must be one that only an excluded feature imports. A GPU-less box also stops at
``import sgl_kernel`` (its common_ops needs libcuda.so.1), so modules that import it at top level fail with
ImportError there, not on the GPU machine.

bridge_closure.py's EXCLUDED list was checked the same way (megatron.bridge: every module not under SKIP; the
models, conversion and utils subpackages that AutoBridge reaches import with the lock alone).
"""

from __future__ import annotations

import collections
import importlib
import pathlib
import sys

SKIP = {
    "sglang.srt": (".test", "hardware_backend.npu", ".ascend", "musa", ".xpu", "_npu", "hip", "aiter", "mlx", ".tpu"),
    "megatron.bridge": (".tests", ".recipes", ".perf_recipes"),  # training recipes: nemo-run, datasets, ...
}


def main() -> None:
    package = sys.argv[1] if len(sys.argv) > 1 else "sglang.srt"
    root = importlib.import_module(package)
    top = pathlib.Path(root.__path__[0])
    base = top.parents[package.count(".")]
    names = sorted(".".join(f.relative_to(base).with_suffix("").parts).removesuffix(".__init__")
                   for f in top.rglob("*.py"))
    missing: dict[str, list[str]] = collections.defaultdict(list)
    other: dict[str, list[str]] = collections.defaultdict(list)
    ok = 0
    for name in names:
        if any(s in name for s in SKIP.get(package, ())):
            continue
        try:
            importlib.import_module(name)
            ok += 1
        except ModuleNotFoundError as e:
            missing[(e.name or str(e)).split(".")[0]].append(name)
        except BaseException as e:  # noqa: BLE001 - a sweep reports every failure and goes on
            first = str(e).strip().splitlines()[0][:90] if str(e).strip() else ""
            other[f"{type(e).__name__}: {first}"].append(name)
    print(f"imported {ok} of {len(names)} {package} modules")
    for mod, where in sorted(missing.items(), key=lambda kv: -len(kv[1])):
        print(f"missing {mod}: {len(where)} modules, e.g. {where[:3]}")
    for err, where in sorted(other.items(), key=lambda kv: -len(kv[1])):
        print(f"{err}: {len(where)} modules, e.g. {where[:3]}")


if __name__ == "__main__":
    main()
