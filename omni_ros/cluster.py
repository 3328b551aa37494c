"""A private Ray cluster on this machine, for `serve --ray`, `eval --ray`, the tests and the benchmarks.

    with LocalCluster(num_cpus=4):
        ...  # ray.* and serve.* calls

What it takes care of (each verified with Ray 2.60, DESIGN.md section 12):
- everything on 127.0.0.1: node IP, GCS, raylet and, with `serve_http_options`, the Serve proxy;
- no usage statistics sent anywhere (`RAY_USAGE_STATS_ENABLED=0`);
- token auth on, with a fresh token of this cluster's own in the environment the cluster's processes
  inherit, so nothing is written to ~/.ray/auth_token (Ray's default when it starts a cluster);
- a fresh temp dir per cluster (a stale `<temp>/ray_current_cluster` makes `ray.init()` join a dead one);
- on stop: `serve.shutdown()`, `ray.shutdown()`, then any process of this cluster still alive is killed,
  and the temp dir removed, so nothing is left behind.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import secrets
import shutil
import signal
import socket
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from omni_ros.typed_config import ConfigError

logger = logging.getLogger("omni_ros.cluster")

INSTALL_HINT = "pip install 'ray[serve]>=2.60' (or the omni_ros extra: pip install -e '.[ray]')"

# Set before ray.init, so every process of the cluster inherits them.
CLUSTER_ENV = {
    "RAY_USAGE_STATS_ENABLED": "0",
    # With the default (1 on Linux) Ray replaces a loopback node IP by the interface address.
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
}
# Serve kills its HTTP/WebSocket proxy after three 5 s readiness checks: on a robot computer busy with other
# work (measured: 2 cores while a model loads) the proxy needs longer to start. A variable the user set wins.
PATIENT_PROXY_ENV = {
    "RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": "60",
    "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": "30",
}
# Serve's direct ingress: each ingress replica serves HTTP/WebSocket on a 127.0.0.1 port of its own, so the
# Python proxy's hop (+5 ms a message) can be skipped by a TCP balancer in front (serving/balancer.py).
# Serve then keeps a stopping replica's port open for at least its draining period (default 30 s), for
# external balancers; ours follows the controller, so the deployment's graceful shutdown is enough.
DIRECT_INGRESS_ENV = {
    "RAY_SERVE_ENABLE_DIRECT_INGRESS": "1",
    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0",
}
# Every process of a LocalCluster inherits this variable (its value: the cluster's temp dir), which is how
# `stop()` finds them: Ray renames its workers' command lines, not their environment.
MARKER = "OMNI_ROS_RAY_CLUSTER"


def check_ray(what: str = "--ray") -> None:
    """A one-line ConfigError saying how to install Ray when it is missing (without importing it)."""
    try:
        found = importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise ConfigError(f"{what} needs Ray, which is not installed: {INSTALL_HINT}")


# One token per process: Ray caches the token it read, so every cluster this process starts shares it.
_TOKEN = secrets.token_hex(32)


def _import_ray() -> ModuleType:
    """`import ray` after CLUSTER_ENV is in the environment. Ray reads some of it once (the node-IP rule on
    import, the auth mode and token on first use); when Ray was imported earlier (a test module, say), the
    same settings are refreshed the way Ray itself does when it turns token auth on."""
    import ray
    from ray._private import ray_constants

    # Both exist in the compiled module; ray/_raylet.pyi declares only the ID classes.
    from ray._raylet import AuthenticationTokenLoader, Config  # type: ignore[attr-defined]

    ray_constants.ENABLE_RAY_CLUSTER = os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") != "0"
    Config.initialize("")
    AuthenticationTokenLoader.instance().reset_cache()
    return ray


# What Serve's proxy raises (inside a RayTaskError) when its port is taken.
BIND_FAILURE = "Failed to bind to address"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (Serve's proxy cannot take port 0)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LocalCluster:
    """Starts a one-node Ray cluster bound to 127.0.0.1 and tears all of it down again."""

    def __init__(
        self,
        num_cpus: int | None = None,
        num_gpus: int | None = None,
        env: dict[str, str] | None = None,
        log_to_driver: bool = True,
    ) -> None:
        self.num_cpus = num_cpus
        self.num_gpus = num_gpus
        patient = {k: v for k, v in PATIENT_PROXY_ENV.items() if k not in os.environ}
        self.env = {**CLUSTER_ENV, **patient, **(env or {})}
        self.log_to_driver = log_to_driver
        self.temp_dir: Path | None = None
        self._saved_env: dict[str, str | None] = {}
        self._serve_started = False
        # PIDs that were still alive after ray.shutdown() (and were killed); empty when Ray cleaned up.
        self.leftovers: list[int] = []

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def start(self) -> LocalCluster:
        check_ray()
        if "ray" in sys.modules and sys.modules["ray"].is_initialized():
            raise RuntimeError("Ray is already initialised in this process; stop that cluster first")
        # Short, fresh and ours: Ray puts Unix sockets under it (path length limit 107).
        self.temp_dir = Path(tempfile.mkdtemp(prefix="omni-ray-", dir="/tmp" if os.path.isdir("/tmp") else None))
        env = {**self.env, MARKER: str(self.temp_dir)}
        if "RAY_AUTH_MODE" not in os.environ and "RAY_AUTH_MODE" not in env:
            env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=_TOKEN)
        for key, value in env.items():
            self._saved_env.setdefault(key, os.environ.get(key))
            os.environ[key] = value
        try:
            ray = _import_ray()
            ray.init(
                address="local",
                num_cpus=self.num_cpus,
                num_gpus=self.num_gpus,
                include_dashboard=False,
                _node_ip_address="127.0.0.1",
                _temp_dir=str(self.temp_dir),
                log_to_driver=self.log_to_driver,
                logging_level=logging.WARNING,
            )
        except BaseException:
            self.stop()
            raise
        # The cluster's processes have it now; processes this one starts later are not the cluster's.
        os.environ.pop(MARKER, None)
        logger.info("Ray cluster up on 127.0.0.1 (temp dir %s)", self.temp_dir)
        return self

    def start_serve(self, port: int | None = None, attempts: int = 3, **options: Any) -> int:
        """Serve's controller and HTTP proxy, listening on 127.0.0.1 only; returns the proxy's port.

        Serve's proxy cannot bind port 0, so without `port` a free one is picked, and picked again when something
        took it before the proxy bound it (the cluster's own processes open ephemeral ports while it starts:
        measured once in ~50 CI runs). An explicit `port` that is taken is an error.
        """
        from ray import serve

        # Serve's driver-side INFO lines ("Started Serve", "Connecting to existing Serve app") are noise here.
        logging.getLogger("ray.serve").setLevel(logging.WARNING)
        tries = 1 if port is not None else attempts
        for attempt in range(1, tries + 1):
            chosen = port if port is not None else free_port(options.get("host", "127.0.0.1"))
            try:
                serve.start(
                    http_options={"host": "127.0.0.1", "port": chosen, **options},
                    proxy_location="HeadOnly",
                    logging_config={"log_level": "WARNING", "enable_access_log": False},
                )
            except Exception as exc:
                if attempt == tries or BIND_FAILURE not in str(exc):
                    raise
                logger.warning("Serve's proxy could not bind 127.0.0.1:%d (taken meanwhile); trying another", chosen)
                serve.shutdown()  # the controller keeps the first HTTP options; a retry needs a fresh one
                continue
            self._serve_started = True
            return chosen
        raise AssertionError("unreachable")

    def stop(self) -> None:
        """Serve, then Ray, then whatever of this cluster still runs; idempotent."""
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():
            if self._serve_started:
                from ray import serve

                # Deleting the applications drains their replicas (open connections are closed with 1001);
                # ray.shutdown then takes the controller and proxy down. (serve.shutdown() would do both,
                # but leaves Ray printing a failed-task line for its controller.)
                with contextlib.suppress(Exception):
                    for name in serve.status().applications:
                        serve.delete(name)
                self._serve_started = False
            ray.shutdown()
        if self.temp_dir is not None:
            self.leftovers = kill_processes_under(self.temp_dir)
            if self.leftovers:
                logger.warning("killed %d Ray process(es) left after shutdown: %s", len(self.leftovers), self.leftovers)
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env.clear()

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def processes_under(temp_dir: str | Path) -> list[int]:
    """PIDs of the processes of the LocalCluster in `temp_dir` (other than this one)."""
    needle = f"{MARKER}={temp_dir}".encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes() + b"\0"
        except OSError:
            continue
        if needle in environ:
            found.append(int(entry.name))
    return found


def kill_processes_under(temp_dir: str | Path, grace_s: float = 3.0) -> list[int]:
    """SIGTERM, then SIGKILL after `grace_s`, every process of the cluster in `temp_dir`; returns what was alive."""
    alive = processes_under(temp_dir)
    if not alive:
        return []
    deadline = time.monotonic() + grace_s
    for pid in alive:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    while time.monotonic() < deadline and processes_under(temp_dir):
        time.sleep(0.05)
    for pid in processes_under(temp_dir):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return alive


class RemoteCluster:
    """A running Ray cluster this process joins to deploy on, and leaves again (deleting its application)."""

    def __init__(self, address: str, app_name: str = "omni_ros") -> None:
        self.address = address
        self.app_name = app_name
        self._deployed = False

    def start(self) -> RemoteCluster:
        check_ray()
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        _import_ray().init(address=self.address, logging_level=logging.WARNING)
        return self

    def start_serve(self, port: int, **options: Any) -> int:
        """Serve on the cluster; its HTTP options apply only when Serve is not running there yet."""
        from ray import serve

        serve.start(http_options={"host": "127.0.0.1", "port": port, **options})
        self._deployed = True
        return port

    def stop(self) -> None:
        ray = sys.modules.get("ray")
        if ray is None or not ray.is_initialized():
            return
        if self._deployed:
            from ray import serve

            with contextlib.suppress(Exception):
                serve.delete(self.app_name)
            self._deployed = False
        ray.shutdown()
