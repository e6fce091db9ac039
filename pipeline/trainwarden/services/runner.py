"""Running one service as a process: its log, its metrics endpoint, its
signals. SIGTERM and SIGINT stop it; SIGHUP asks for a reload (rules,
subscriptions), carried out by the service loop between two iterations."""

from __future__ import annotations

import signal
import threading
from typing import Callable, Optional

from trainwarden.services.logs import ServiceLog
from trainwarden.services.loop import serve
from trainwarden.services.observability import Address, MetricsServer, Observer


class ServiceRun:
    def __init__(self, component: str, log_format: str = "text", metrics_address: Optional[Address] = None):
        """Raises OSError when the metrics address cannot be listened on."""
        self.log = ServiceLog(component, log_format)
        self.log.install()
        self.observer = Observer(component)
        self.server: Optional[MetricsServer] = None
        if metrics_address is not None:
            self.server = self.observer.serve_http(metrics_address)
        self._stopping = threading.Event()
        self._reload = threading.Event()
        # From now on a SIGHUP never stops the service, even while it starts
        # (the actuator reads its state topic first); SIGTERM still interrupts
        # a start at once (main's handler), and run() takes it over.
        signal.signal(signal.SIGHUP, lambda signum, frame: self._reload.set())

    def say(self, level: str, text: str, job_id: str = "") -> None:
        self.log(level, text, job_id)

    def run(self, service, label: str, reload: Optional[Callable[[], None]] = None) -> int:
        def stop(signum, frame) -> None:
            self._stopping.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, stop)
        if reload is None:
            signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nothing to reload is still no reason to stop
        where = f"; metrics on http://{self.server.address}/metrics" if self.server else ""
        self.say("info", f"running: {label}{where}")
        try:
            serve(service, self._stopping.is_set, self.say, observer=self.observer,
                  reload_requested=self._take_reload, reload=reload)
        finally:
            self.close()
        self.say("info", "stopped")
        return 0

    def close(self) -> None:
        if self.server is not None:
            self.server.close()
            self.server = None

    def _take_reload(self) -> bool:
        if not self._reload.is_set():
            return False
        self._reload.clear()
        return True
