"""The loader's live figures over HTTP in Prometheus' text format (``/metrics``).

Figures are taken when scraped, from a function the loader gives: nothing is computed per
batch for a scraper that is not there.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["MetricsServer", "render"]

_QUANTILES = (("0.5", "p50"), ("0.99", "p99"), ("0.999", "p99.9"), ("0.9999", "p99.99"))
_GUARD = ("late", "deferred", "hedges", "hedge_wins", "inline")


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def render(record: dict[str, Any]) -> str:
    """Prometheus text for a loader record (an epoch or a live progress record)."""
    lines: list[str] = []

    def gauge(name: str, value: float, help_: str, labels: str = "") -> None:
        if not any(line.startswith(f"# TYPE tierfeed_{name} ") for line in lines):
            lines.append(f"# HELP tierfeed_{name} {help_}")
            lines.append(f"# TYPE tierfeed_{name} gauge")
        lines.append(f"tierfeed_{name}{labels} {float(value)!r}")

    gauge("epoch", record.get("epoch", 0), "Epoch being read.")
    gauge("epoch_samples", record.get("samples", 0), "Samples delivered in this epoch so far.")
    gauge("samples_per_second", record.get("samples_per_s", 0.0), "Throughput of this epoch.")
    gauge("stall_seconds", record.get("stall_s", 0.0), "Time the trainer waited for batches.")
    wait = record.get("batch_wait", {})
    lines.append("# HELP tierfeed_batch_wait_seconds Wait for each batch in this epoch.")
    lines.append("# TYPE tierfeed_batch_wait_seconds summary")
    for q, key in _QUANTILES:
        lines.append(f'tierfeed_batch_wait_seconds{{quantile="{q}"}} {float(wait.get(key, 0))!r}')
    count = float(wait.get("count", 0))
    lines.append(f"tierfeed_batch_wait_seconds_count {count!r}")
    lines.append(f"tierfeed_batch_wait_seconds_sum {float(wait.get('mean', 0)) * count!r}")
    for key in _GUARD:
        value = record.get("guard", {}).get(key, 0)
        gauge(f"guard_{key}", value, f"Deadline guard: {key.replace('_', ' ')} this epoch.")
    for tier, counters in sorted(record.get("tiers", {}).items()):
        for key, value in sorted(counters.items()):
            if isinstance(value, (int, float)):
                gauge(f"tier_{key}", value, f"Tier counter {key}.", f'{{tier="{_label(tier)}"}}')
    return "\n".join(lines) + "\n"


class MetricsServer:
    """``http://HOST:PORT/metrics`` on a named daemon thread; ``port=0`` picks a free port.

    Args:
        source: returns the current record when scraped.
        port: TCP port (0: any free one; read it back from ``port``).
        host: interface; loopback by default (figures are for this host's scraper).
    """

    def __init__(
        self, source: Callable[[], dict[str, Any]], port: int = 0, host: str = "127.0.0.1"
    ) -> None:
        self.source = source
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404, "only /metrics is served")
                    return
                body = render(server.source()).encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:  # no access log on stderr
                return

        self._httpd = ThreadingHTTPServer((host, port), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="tierfeed-metrics", daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        """The port it listens on."""
        return int(self._httpd.server_address[1])

    def close(self) -> None:
        """Stop serving and join the thread; idempotent."""
        if self._thread.is_alive():
            self._httpd.shutdown()
            self._thread.join()
        self._httpd.server_close()

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
