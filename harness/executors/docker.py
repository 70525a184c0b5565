"""Docker executor: the engine in a container, through the docker SDK against a real engine.

Host networking only (``network_mode="host"``: all traffic stays on loopback, no bridges).
The scenario dir is bind-mounted at the same path, so artifacts land on the host where the
fault watcher and the checks read them. GPUs come from ``device_requests`` (gpu profile).
Logs are streamed to the launch's log file. The container is removed by id when the run ends,
times out or fails. Faults signal pids inside the container (``kill`` through exec).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path
from typing import Any

from harness.executors.base import EXECUTORS, Executor, Launch, RunHandle
from harness.profiles import Profile

DEFAULT_IMAGES = {Profile.CPU: "relax:cpu", Profile.GPU: "relax:gpu"}
ENGINE_CMD = ["python3", "-m", "relax.cli", "train"]
LABEL = "relax-harness"


def client_or_reason() -> tuple[Any, str | None]:
    """A docker client that answered ping, or the reason there is none."""
    try:
        import docker
    except ImportError:
        return None, "docker SDK not installed (pip install docker)"
    try:
        client = docker.from_env(timeout=10)
        client.ping()
    except Exception as exc:  # noqa: BLE001 - any failure means: no engine here
        return None, f"no Docker engine reachable ({type(exc).__name__}: {str(exc)[:120]})"
    return client, None


class DockerHandle(RunHandle):
    def __init__(self, container, log_path: Path):
        self.container = container
        self.container_id = container.id
        self.root_pid = None
        self._log_path = log_path
        self._exit: int | None = None
        self._attrs: dict[str, Any] = {}
        self._logs = threading.Thread(target=self._stream, name=f"logs-{container.short_id}", daemon=True)
        self._logs.start()

    def _stream(self) -> None:
        with open(self._log_path, "ab") as fh, contextlib.suppress(Exception):
            for chunk in self.container.logs(stream=True, follow=True):
                fh.write(chunk)
                fh.flush()

    def send_signal(self, pid: int | None, sig: int, *, group: bool = False) -> None:
        if pid is None and not group:
            self.container.kill(signal=int(sig))
            return
        target = "1" if pid is None else str(int(pid))
        where = f"-- -$(ps -o pgid= -p {target} | tr -d ' ')" if group else target
        result = self.container.exec_run(["sh", "-c", f"kill -{int(sig)} {where}"])
        if result.exit_code != 0:
            raise ProcessLookupError(f"kill -{int(sig)} {pid} in container: {result.output.decode(errors='replace')}")

    def poll(self) -> int | None:
        if self._exit is not None:
            return self._exit
        try:
            self.container.reload()
        except Exception:  # noqa: BLE001 - gone: treat as killed
            self._exit = -9
            return self._exit
        self._attrs = self.container.attrs
        state = self._attrs.get("State", {})
        if state.get("Status") in ("exited", "dead"):
            self._exit = int(state.get("ExitCode", -1))
        return self._exit

    def terminate(self, grace_s: float) -> None:
        with contextlib.suppress(Exception):
            self.container.stop(timeout=max(1, int(grace_s)))  # SIGTERM, then SIGKILL after the grace
        self.poll()

    def cleanup(self) -> list[int]:
        self.poll()
        with contextlib.suppress(Exception):
            self.container.remove(force=True, v=True)
        self._logs.join(timeout=5)
        return []

    def details(self) -> dict[str, Any]:
        host = self._attrs.get("HostConfig", {})
        return {"container_id": self.container_id, "network_mode": host.get("NetworkMode"),
                "image": self._attrs.get("Config", {}).get("Image")}


@EXECUTORS.register("docker")
class DockerExecutor(Executor):
    name = "docker"

    def __init__(self, image: str | None = None, engine_cmd: list[str] | None = None,
                 mounts: list[str | Path] | None = None, grace_s: float = 10.0, client: Any = None):
        self.image = image
        self.engine_cmd = list(engine_cmd or ENGINE_CMD)
        self.mounts = [Path(m).resolve() for m in (mounts or [])]
        self.grace_s = grace_s
        self._client = client

    @property
    def client(self):
        if self._client is None:
            self._client, reason = client_or_reason()
            if reason:
                raise RuntimeError(reason)
        return self._client

    def image_for(self, launch: Launch) -> str:
        return launch.image or self.image or DEFAULT_IMAGES[launch.profile]

    def unavailable(self, profile: Profile) -> str | None:
        client, reason = (self._client, None) if self._client is not None else client_or_reason()
        if reason:
            return reason
        self._client = client
        image = self.image or DEFAULT_IMAGES[profile]
        try:
            client.images.get(image)
        except Exception:  # noqa: BLE001
            return f"image {image!r} not built (containers/build_images.sh {profile.value})"
        return None

    def run_kwargs(self, launch: Launch) -> dict[str, Any]:
        import docker

        volumes = {str(p): {"bind": str(p), "mode": "rw"} for p in [launch.work_dir.resolve(), *self.mounts]}
        env = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1",
               "RELAX_RAY_TEMP_DIR": "/tmp/rh", **launch.env}
        kwargs: dict[str, Any] = {
            "command": [*self.engine_cmd, *launch.argv, "--output-dir", str(launch.output_dir)],
            "detach": True, "network_mode": "host", "environment": env, "volumes": volumes,
            "working_dir": str(launch.work_dir.resolve()), "nano_cpus": int(launch.resources.cpus * 1e9),
            "labels": {LABEL: "1", f"{LABEL}.scenario": launch.scenario, f"{LABEL}.run": launch.run},
            "shm_size": "1g",
        }
        if os.getuid() != 0:
            kwargs["user"] = f"{os.getuid()}:{os.getgid()}"
        if launch.resources.memory_gb:
            kwargs["mem_limit"] = f"{int(launch.resources.memory_gb * 1024)}m"
        if launch.resources.gpus:
            kwargs["device_requests"] = [docker.types.DeviceRequest(count=launch.resources.gpus,
                                                                    capabilities=[["gpu"]])]
        return kwargs

    def start(self, launch: Launch) -> DockerHandle:
        launch.output_dir.mkdir(parents=True, exist_ok=True)
        container = self.client.containers.run(self.image_for(launch), **self.run_kwargs(launch))
        time.sleep(0)
        return DockerHandle(container, launch.log_path)
