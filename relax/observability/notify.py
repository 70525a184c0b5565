"""``--notify-urls URL[,URL]``: a notice when the run starts, and one when it finishes or fails, through apprise.

apprise is the optional extra ``notify`` (``pip install 'relax-harness[notify]'``); without it the flag is
refused at launch in one line. Each notice is ``apprise.Apprise().notify(title=..., body=...)`` over every URL
(apprise's own URL schemes: ``mailto://``, ``slack://``, ``json://``, ...). A notice that cannot be sent
never fails the run: it is one console line.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relax.utils.flag_slice import FlagSlice

INSTALL = "pip install 'relax-harness[notify]'"


@dataclass(frozen=True)
class NotifyConfig(FlagSlice):
    notify_urls: str | None
    output_dir: str
    tb_experiment_name: str | None

    @property
    def urls(self) -> list[str]:
        return [u.strip() for u in (self.notify_urls or "").split(",") if u.strip()]

    @property
    def run_name(self) -> str:
        return self.tb_experiment_name or Path(self.output_dir).resolve().name

    def validate(self) -> None:
        if self.notify_urls is not None and not self.urls:
            raise ValueError("--notify-urls names no URL")
        if self.urls and importlib.util.find_spec("apprise") is None:
            raise ValueError(f"--notify-urls needs apprise, which is not installed: {INSTALL}")


class Notifier:
    """Sends the run's notices to every URL; a no-op without URLs."""

    def __init__(self, cfg: NotifyConfig, warn: Any = print):
        self.cfg = cfg
        self.warn = warn
        self._apprise = None
        if cfg.urls:
            import apprise

            self._apprise = apprise.Apprise()
            for url in cfg.urls:
                if self._apprise.add(url) is False:
                    warn(f"--notify-urls: apprise does not accept {url!r}")

    def started(self, body: str) -> None:
        self._send("started", body)

    def finished(self, body: str) -> None:
        self._send("finished", body)

    def failed(self, body: str) -> None:
        self._send("failed", body)

    def _send(self, event: str, body: str) -> None:
        if self._apprise is None:
            return
        try:
            ok = self._apprise.notify(title=f"relax run {self.cfg.run_name} {event}", body=body)
        except Exception as exc:  # noqa: BLE001 - a notice never fails the run
            ok, why = False, f"{type(exc).__name__}: {exc}"
        else:
            why = "apprise reported a failure"
        if ok is False:
            self.warn(f"--notify-urls: the {event} notice was not sent ({why})")
