"""sglang's wheelhouse tooling (ci/wheelhouse/): loads, chunks, manifest checks, repack and the lock. No network:
every wheel here is a small synthetic one built in a temp dir."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import random
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

WHEELHOUSE = Path(__file__).resolve().parents[1] / "ci" / "wheelhouse"


def _load(name: str):
    spec = importlib.util.spec_from_file_location(f"wheelhouse_{name}", WHEELHOUSE / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


loads = _load("wheel_loads")
repack = _load("repack")
closure = _load("sglang_closure")


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def make_wheel(out_dir: Path, files: dict[str, bytes], name: str = "toypkg", version: str = "1.0") -> Path:
    """A pure-Python wheel holding ``files`` (paths inside the wheel), with METADATA, WHEEL and RECORD."""
    info = f"{name}-{version}.dist-info"
    files = {**files, f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
             f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = [_record_line(n, d) for n, d in files.items()] + [f"{info}/RECORD,,"]
    path = out_dir / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for n, d in files.items():
            z.writestr(n, d)
        z.writestr(f"{info}/RECORD", "\n".join(record) + "\n")
    return path


def stage_all(out: Path, stage: Path) -> None:
    stage.mkdir()
    for load in sorted(out.glob("load*")):
        for f in load.iterdir():
            (stage / f.name).write_bytes(f.read_bytes())


@pytest.fixture
def wheel_dir(tmp_path: Path) -> Path:
    d = tmp_path / "wheels"
    d.mkdir()
    rng = random.Random(0)
    for i, size in enumerate([5000, 1200, 300, 2900]):  # random bytes: deflate cannot shrink them
        make_wheel(d, {f"pkg{i}/__init__.py": b"X = 1\n", f"pkg{i}/blob.bin": rng.randbytes(size)}, name=f"pkg{i}")
    return d


def test_chunks_reassemble_bit_for_bit(wheel_dir: Path, tmp_path: Path):
    manifest = loads.pack(wheel_dir, tmp_path / "out", load_bytes=3000, chunk_bytes=1000)
    big = next(e for e in manifest["wheels"] if e["wheel"].startswith("pkg0"))
    assert len(big["chunks"]) > 2 and [c["file"] for c in big["chunks"]] == sorted(c["file"] for c in big["chunks"])
    stage_all(tmp_path / "out", tmp_path / "stage")
    built = loads.assemble(tmp_path / "stage", tmp_path / "joined")
    assert sorted(p.name for p in built) == sorted(p.name for p in wheel_dir.glob("*.whl"))
    for p in built:
        assert p.read_bytes() == (wheel_dir / p.name).read_bytes()


def test_split_matches_split_b(tmp_path: Path):
    src = tmp_path / "f.whl"
    src.write_bytes(random.Random(1).randbytes(2500))
    parts = loads.split_file(src, tmp_path, 1000)
    assert [p.name for p in parts] == ["f.whl.part00", "f.whl.part01", "f.whl.part02"]
    assert [p.stat().st_size for p in parts] == [1000, 1000, 500]
    assert b"".join(p.read_bytes() for p in parts) == src.read_bytes()


def test_corrupted_chunk_is_named_in_one_line(wheel_dir: Path, tmp_path: Path):
    loads.pack(wheel_dir, tmp_path / "out", load_bytes=3000, chunk_bytes=1000)
    stage_all(tmp_path / "out", tmp_path / "stage")
    victim = sorted((tmp_path / "stage").glob("*.part01"))[0]
    data = bytearray(victim.read_bytes())
    data[10] ^= 0xFF
    victim.write_bytes(bytes(data))
    with pytest.raises(loads.ManifestError, match=re.escape(victim.name)):
        loads.assemble(tmp_path / "stage", tmp_path / "joined")
    run = subprocess.run([sys.executable, str(WHEELHOUSE / "wheel_loads.py"), "assemble", str(tmp_path / "stage"),
                          str(tmp_path / "joined2")], capture_output=True, text=True)
    assert run.returncode == 1
    assert run.stderr.strip().count("\n") == 0 and victim.name in run.stderr and "sha256 mismatch" in run.stderr


def test_missing_load_is_named_and_waits(wheel_dir: Path, tmp_path: Path):
    manifest = loads.pack(wheel_dir, tmp_path / "out", load_bytes=3000, chunk_bytes=1000)
    assert manifest["loads"] >= 2
    stage = tmp_path / "stage"
    stage.mkdir()
    for f in (tmp_path / "out" / "load1").iterdir():
        (stage / f.name).write_bytes(f.read_bytes())
    run = subprocess.run([sys.executable, str(WHEELHOUSE / "wheel_loads.py"), "assemble", str(stage),
                          str(tmp_path / "joined")], capture_output=True, text=True)
    assert run.returncode == loads.MISSING_EXIT
    assert "waiting for load(s) 2" in run.stdout
    assert not (tmp_path / "joined").exists()


def test_every_load_fits_and_holds_the_manifest(wheel_dir: Path, tmp_path: Path):
    manifest = loads.pack(wheel_dir, tmp_path / "out", load_bytes=3000, chunk_bytes=1000)
    dirs = sorted((tmp_path / "out").glob("load*"))
    assert len(dirs) == manifest["loads"]
    for d in dirs:
        assert (d / loads.MANIFEST).exists()
        assert sum(f.stat().st_size for f in d.iterdir() if f.name != loads.MANIFEST) <= 3000


@settings(max_examples=200, deadline=None)
@given(sizes=st.lists(st.integers(min_value=1, max_value=100), min_size=1, max_size=40),
       limit=st.integers(min_value=100, max_value=400))
def test_packer_never_exceeds_the_limit(sizes: list[int], limit: int):
    named = {f"f{i}": s for i, s in enumerate(sizes)}
    packed = loads.pack_loads(named, limit)
    assert sorted(n for load in packed for n in load) == sorted(named)
    assert all(sum(named[n] for n in load) <= limit for load in packed)
    assert len(packed) <= 2 * -(-sum(sizes) // limit)  # first-fit never leaves two loads both half empty


def test_packer_refuses_a_file_larger_than_a_load():
    with pytest.raises(ValueError, match="big"):
        loads.pack_loads({"big": 11, "small": 1}, 10)


def test_repack_drops_paths_and_the_result_installs_and_imports(tmp_path: Path):
    src = tmp_path / "src"
    src.mkdir()
    wheel = make_wheel(src, {"toypkg/__init__.py": b"from toypkg.core import VALUE\n",
                             "toypkg/core.py": b"VALUE = 42\n", "toypkg/flash_ops.abi3.so": b"\0" * 4000,
                             "toypkg/sm100/common_ops.abi3.so": b"\1" * 4000, "toypkg/sm90/common_ops.abi3.so": b"ok"})
    out = repack.repack(wheel, tmp_path / "out", ["toypkg/flash_ops.abi3.so", "toypkg/sm100/"])
    with zipfile.ZipFile(out) as z:
        names = set(z.namelist())
        record = z.read("toypkg-1.0.dist-info/RECORD").decode()
    assert "toypkg/flash_ops.abi3.so" not in names and not any(n.startswith("toypkg/sm100/") for n in names)
    assert "toypkg/sm90/common_ops.abi3.so" in names
    assert "flash_ops" not in record and "sm100" not in record and "toypkg/core.py" in record
    target = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                          "--target", str(target), str(out)], capture_output=True, text=True)
    if pip.returncode != 0 and "No module named pip" in pip.stderr:
        pytest.skip("this interpreter has no pip")
    assert pip.returncode == 0, pip.stderr
    assert not (target / "toypkg" / "flash_ops.abi3.so").exists() and not (target / "toypkg" / "sm100").exists()
    run = subprocess.run([sys.executable, "-c", "import toypkg; print(toypkg.VALUE)"], capture_output=True,
                         text=True, env={"PYTHONPATH": str(target)})
    assert run.stdout.strip() == "42", run.stderr


def _lock_pins() -> dict[str, str]:
    pins = {}
    for line in (WHEELHOUSE / "sglang.lock").read_text().splitlines():
        if line and not line.startswith("#"):
            m = re.fullmatch(r"([A-Za-z0-9._-]+)==(\S+) --hash=sha256:([0-9a-f]{64})", line)
            assert m, f"not a pinned, hashed requirement: {line}"
            pins[closure.norm(m.group(1))] = m.group(2)
    return pins


def test_lock_pins_sglang_and_leaves_out_what_it_says():
    pins = _lock_pins()
    assert pins["sglang"] == "0.5.14" and pins["sglang-kernel"] == "0.4.4" and pins["transformers"] == "5.8.1"
    assert not set(pins) & set(closure.EXCLUDED)
    assert set(closure.UNDECLARED) <= set(pins)


def test_lock_carries_a_machine_package_only_for_another_version():
    machine = closure.machine_packages(WHEELHOUSE / "gpu_machine_packages.txt")
    for name, version in _lock_pins().items():
        if name in machine:
            assert machine[name] is not None and str(machine[name]) != version, name


def test_closure_markers_follow_the_gpu_machine_and_the_named_extras():
    req = closure.Requirement
    assert closure.wanted(req('torchcodec==0.11.1; sys_platform == "linux" and platform_machine != "aarch64"'), set())
    assert not closure.wanted(req('decord2; platform_machine == "aarch64"'), set())
    assert closure.wanted(req('nvidia-cutlass-dsl[cu13]>=4.5; extra == "cu13"'), {"cu13"})
    assert not closure.wanted(req('cuda-python>=13; extra == "nvep"'), {"cu13"})
    assert not closure.wanted(req('numpy<2.4; python_version > "3.12"'), set())
