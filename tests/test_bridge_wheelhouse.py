"""megatron-bridge's wheelhouse (ci/wheelhouse/bridge_closure.py, bridge.lock, build_bridge.sh, install_bridge.sh)
and bridge mode's version check. No network: wheels here are small synthetic ones built in a temp dir.

The round trip through the staged target (AutoBridge load into relax's GPTModel and export back, bit for bit, then
one optimizer step of relax's Megatron backend in bridge mode against raw mode, ci/bridge_run.py --device cpu) needs
Python 3.12 (megatron-core 0.19 and megatron-bridge 0.6.2 are cp312 / Requires-Python 3.12): it runs when
RELAX_BRIDGE_PYTHON names a Python 3.12 with torch and RELAX_BRIDGE_PYTHONPATH the staged dirs (megatron-bridge's
--target dir first, then megatron-core's and the GPU machine's other packages), and is skipped otherwise.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from relax.backends.megatron import bridge
from tests.test_sglang_wheelhouse import WHEELHOUSE, _load, make_wheel

closure = _load("bridge_closure")
loads = _load("wheel_loads")
ROOT = WHEELHOUSE.parents[1]


def _lock_pins() -> dict[str, str]:
    pins = {}
    for line in (WHEELHOUSE / "bridge.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            m = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+) --hash=sha256:([0-9a-f]{64})", line)
            assert m, f"not a pinned, hashed requirement: {line}"
            pins[closure.norm(m.group(1))] = m.group(2)
    return pins


def test_lock_pins_the_bridge_and_the_transformers_it_needs():
    assert _lock_pins() == {"megatron-bridge": "0.6.2", "transformers": "5.12.1", "tokenizers": "0.22.2",
                            "omegaconf": "2.4.0"}


def test_lock_carries_a_machine_package_only_for_another_version():
    machine = closure.machine_packages(WHEELHOUSE / "gpu_machine_packages.txt")
    for name, version in _lock_pins().items():
        assert name not in closure.PROVIDED
        if name in machine:
            assert machine[name] is not None and str(machine[name]) != version, name


def test_every_exclusion_has_its_reason_in_the_lock():
    header = (WHEELHOUSE / "bridge.lock").read_text()
    assert not set(_lock_pins()) & set(closure.EXCLUDED)
    for name, why in closure.EXCLUDED.items():
        assert len(why) > 30, name
        assert f"#   {name}: {why}" in header
    assert "#   megatron-core 0.19.2: any (from megatron-bridge)" in header  # relax's own wheelhouse


def _lora_wheel(out_dir: Path) -> Path:
    lora = (b"# Copyright\n\nimport math\nfrom typing import Optional\n\nimport torch\n"
            b"import transformer_engine.pytorch as te\n\n\nclass LoRA:\n"
            b"    def branch(self) -> te.ops.Sequential:\n        return te.ops.Sequential()\n\nX = math.pi\n")
    return make_wheel(out_dir, {"megatron/bridge/peft/lora_layers.py": lora, "megatron/bridge/other.py": b"Y = 1\n"},
                      name="megatron_bridge", version="0.6.2")


def test_patch_makes_transformer_engine_optional_and_keeps_the_record_true(tmp_path: Path):
    wheel = _lora_wheel(tmp_path)
    out = closure.patch(wheel, tmp_path / "out")
    with zipfile.ZipFile(out) as z:
        text = z.read(closure.LORA).decode()
        record = z.read("megatron_bridge-0.6.2.dist-info/RECORD").decode()
        assert z.read("megatron/bridge/other.py") == b"Y = 1\n"
    assert "except ImportError:\n    te = None\n" in text and text.count("from __future__ import annotations") == 1
    repack = _load("repack")
    assert repack._record_line(closure.LORA, text.encode()) in record.splitlines()
    namespace: dict = {}
    exec(compile(text, closure.LORA, "exec"), namespace)  # no transformer_engine here: the import must be optional
    assert namespace["te"] is None and namespace["X"] > 3


def test_patch_refuses_a_wheel_whose_source_moved(tmp_path: Path):
    wheel = make_wheel(tmp_path, {closure.LORA: b"import math\n"}, name="megatron_bridge", version="0.6.2")
    with pytest.raises(SystemExit, match="0 copies of 'import transformer_engine"):
        closure.patch(wheel, tmp_path / "out")


def test_install_loads_waits_for_every_load_then_installs_once(tmp_path: Path):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for i in range(3):
        make_wheel(wheels, {f"pkg{i}/__init__.py": f"X = {i}\n".encode(), f"pkg{i}/blob": os.urandom(3000)},
                   name=f"pkg{i}")
    loads.pack(wheels, tmp_path / "out", load_bytes=5000, chunk_bytes=2000)
    assert len(list((tmp_path / "out").glob("load*"))) >= 2
    site, stage = tmp_path / "site", tmp_path / "stage"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}

    def install(load: str) -> str:
        run = subprocess.run(["bash", str(WHEELHOUSE / "install_loads.sh"), "toy", str(tmp_path / "out" / load),
                              str(stage), str(site), "python3 -c 'import pkg0, pkg2; print(pkg2.X)'"],
                             capture_output=True, text=True, env=env)
        assert run.returncode == 0, run.stderr
        return run.stdout

    assert "waiting for load(s) 2" in install("load1") and not site.exists()
    rest = [install(d.name) for d in sorted((tmp_path / "out").glob("load*"))[1:]]
    assert rest[-1].strip().endswith("2") and (site / ".toy.installed").exists()
    assert "already installed" in install("load1")


def _fake_dist(root: Path, name: str, version: str, requires: list[str]) -> None:
    info = root / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    info.joinpath("METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                         + "".join(f"Requires-Dist: {r}\n" for r in requires))


def test_bridge_problem_names_the_conflicting_packages_and_versions(tmp_path: Path, monkeypatch):
    _fake_dist(tmp_path, "megatron-bridge", "0.6.2", ["transformers<=5.12.1,>=5.8", "wandb==0.29.0",
                                                      "peft>=99", 'nemo-run; extra == "recipes"'])
    _fake_dist(tmp_path, "peft", "0.17.0", [])
    _fake_dist(tmp_path, "transformers", "5.17.0", ["tokenizers<=0.23.0,>=0.22.0"])
    _fake_dist(tmp_path, "tokenizers", "0.23.2", [])
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(bridge, "module_available", lambda name: True)
    problem = bridge.bridge_problem(str(tmp_path))
    assert problem.count("\n") == 0
    assert "transformers 5.17.0 (megatron-bridge 0.6.2 needs transformers<=5.12.1,>=5.8)" in problem
    assert "tokenizers 0.23.2 (transformers 5.17.0 needs tokenizers<=0.23.0,>=0.22.0)" in problem
    assert "wandb" not in problem and "/tmp/bridgesite" in problem  # not installed: not checked
    assert "peft" not in problem  # installed, but bridge mode never imports it


@pytest.mark.skipif(not (os.environ.get("RELAX_BRIDGE_PYTHON") and os.environ.get("RELAX_BRIDGE_PYTHONPATH")),
                    reason="needs RELAX_BRIDGE_PYTHON (Python 3.12 with torch) and RELAX_BRIDGE_PYTHONPATH (the "
                           "staged megatron-bridge target first)")
def test_autobridge_round_trip_from_the_staged_target_on_cpu(tmp_path: Path):
    env = {**os.environ, "PYTHONPATH": f"{os.environ['RELAX_BRIDGE_PYTHONPATH']}:{ROOT}", "OMP_NUM_THREADS": "1"}
    run = subprocess.run([os.environ["RELAX_BRIDGE_PYTHON"], str(ROOT / "ci" / "bridge_run.py"), "--model",
                          "small-qwen3", "--device", "cpu", "--workdir", str(tmp_path), "--json",
                          str(tmp_path / "out.json")], capture_output=True, text=True, env=env, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    result = json.loads((tmp_path / "out.json").read_text())
    assert result["versions"]["transformers"] == "5.12.1" and result["versions"]["megatron-bridge"] == "0.6.2"
    assert result["roundtrip"]["bitwise"] and not result["roundtrip"]["export_unequal"]
    step = result["backend_step"]  # one optimizer step in bridge mode and in raw mode: the same synced weights
    assert step["same_names"] and step["unequal_after_step"] == [] and step["moved"] == step["tensors"]
