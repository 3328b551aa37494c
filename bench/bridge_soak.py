"""Soak of the OpenPI bridge: 16 real openpi-clients for 60 s while a fuzzer attacks other connections.

    nice -n 10 .venv/bin/python bench/bridge_soak.py [--clients 16] [--seconds 60] [--preset tiny] [--out FILE]

The server (`omni-ros serve`'s PolicyServer, DROID key map, the `tiny` torch policy with a fixed sampling seed)
runs in its own process on 127.0.0.1. In this process, `clients` threads each drive an unmodified
`openpi_client.WebsocketClientPolicy` with one fixed observation of their own, over and over; a fuzzer thread
opens other connections and sends, round after round: truncated msgpack, random bytes, random msgpack values,
text frames, object dtypes, byte counts that do not match the shape, huge shape claims, huge msgpack length
claims, deep nesting, NaN state, a 20 MB frame (above the 16 MiB cap), a valid request followed by a disconnect
before the reply, and half-open handshakes (TCP connections that send part of an HTTP upgrade and then
nothing). Each fuzz case has an expected outcome (an error text frame then close 1011, or close 1009, or the
server closing a stalled handshake).

Pass (all must hold): zero client errors; every client gets identical actions for its identical observation
throughout; every fuzz case gets its expected outcome; `/healthz` answers 200 after; server RSS growth over
the measured period <= 5%. RSS is sampled every few seconds; the growth is measured from the end of the first
round of every fuzz case (allocator arenas and caches warmed) to the end.
"""

from __future__ import annotations

import argparse
import collections
import http.client
import multiprocessing as mp
import os
import platform
import random
import socket
import sys
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgpack
import numpy as np
from common import emit

MAX_MESSAGE_BYTES = 16 * 1024 * 1024


# ----- the server process ---------------------------------------------------------------------------------------


def _server_main(preset: str, pipe, stop) -> None:
    import logging

    # The fuzzer makes thousands of expected warnings; count them instead of printing them.
    counts: collections.Counter = collections.Counter()

    class Count(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            counts[record.levelname] += 1

    logging.getLogger("omni_ros").addHandler(Count())
    logging.getLogger("omni_ros").propagate = False
    logging.getLogger("websockets").setLevel(logging.CRITICAL)

    from omni_ros.backends.factory import load_policy
    from omni_ros.config import PolicyConfig
    from omni_ros.serving.config import ServeConfig
    from omni_ros.serving.keymap import load_keymap
    from omni_ros.serving.server import ServerThread

    keymap = load_keymap("droid")
    policy = load_policy(
        PolicyConfig(preset=preset, seed=0, num_threads=1),
        camera_names=keymap.camera_names,
        state_dim=keymap.state_dim,
        action_dim=keymap.action_dim,
    )
    config = ServeConfig(port=0, max_message_bytes=MAX_MESSAGE_BYTES)
    with ServerThread(policy, config, keymap) as server:
        pipe.send(server.port)
        stop.wait()
        stats = {
            "requests_served": server.server.requests_served,
            "abandoned": server.server.abandoned,
            "log_records": dict(counts),
        }
    pipe.send(stats)


class ServerProcess:
    def __init__(self, preset: str) -> None:
        ctx = mp.get_context("spawn")
        self._parent, child = ctx.Pipe()
        self._stop = ctx.Event()
        self.proc = ctx.Process(target=_server_main, args=(preset, child, self._stop), daemon=True)
        self.port = 0
        self.stats: dict[str, Any] = {}

    def start(self) -> ServerProcess:
        self.proc.start()
        if not self._parent.poll(300):
            raise RuntimeError("soak server did not start")
        self.port = self._parent.recv()
        return self

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
        return float("nan")

    def stop(self) -> None:
        self._stop.set()
        if self._parent.poll(60):
            self.stats = self._parent.recv()
        self.proc.join(30)
        if self.proc.is_alive():
            self.proc.kill()


# ----- observations and clients ---------------------------------------------------------------------------------


def droid_obs(rng: np.random.Generator, prompt: str) -> dict[str, Any]:
    return {
        "observation/exterior_image_1_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/wrist_image_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/joint_position": rng.normal(size=7),
        "observation/gripper_position": rng.uniform(size=1),
        "prompt": prompt,
    }


class ClientStats:
    def __init__(self) -> None:
        self.requests = 0
        self.errors: list[str] = []
        self.mismatches = 0
        self.latencies_ms: list[float] = []


def client_loop(index: int, url: str, deadline: float, stats: ClientStats) -> None:
    from openpi_client.websocket_client_policy import WebsocketClientPolicy

    obs = droid_obs(np.random.default_rng(index), prompt=f"soak client {index}")
    reference: np.ndarray | None = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        client = WebsocketClientPolicy(url)
    while time.monotonic() < deadline:
        start = time.perf_counter()
        try:
            actions = np.array(client.infer(obs)["actions"])
        except Exception as exc:  # any failure is a client error; reconnect and go on
            stats.errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", DeprecationWarning)
                client = WebsocketClientPolicy(url)
            continue
        stats.latencies_ms.append((time.perf_counter() - start) * 1e3)
        stats.requests += 1
        if reference is None:
            reference = actions
        elif not np.array_equal(actions, reference):
            stats.mismatches += 1


# ----- the fuzzer -----------------------------------------------------------------------------------------------


def _pack(obj: Any) -> bytes:
    from openpi_client import msgpack_numpy

    return msgpack_numpy.packb(obj)


def _with_array(dtype: str, data: bytes, shape: list) -> bytes:
    frame = msgpack.unpackb(_pack(droid_obs(np.random.default_rng(7), "fuzz")), raw=False, strict_map_key=False)
    frame["observation/joint_position"] = {b"__ndarray__": True, b"data": data, b"dtype": dtype, b"shape": shape}
    return msgpack.packb(frame)


def _random_value(rng: random.Random, depth: int = 0) -> Any:
    kind = rng.randrange(8 if depth < 4 else 5)
    if kind == 0:
        return rng.randint(-(2**63), 2**63 - 1)
    if kind == 1:
        return rng.random() * 10 ** rng.randint(-5, 5)
    if kind == 2:
        return "".join(chr(rng.randrange(32, 0x2FF)) for _ in range(rng.randrange(20)))
    if kind == 3:
        return rng.randbytes(rng.randrange(64))
    if kind == 4:
        return rng.choice([None, True, False])
    if kind == 5:
        return [_random_value(rng, depth + 1) for _ in range(rng.randrange(6))]
    keys = ["observation/joint_position", "prompt", "observation/wrist_image_left", b"__ndarray__", "x", 3]
    return {rng.choice(keys): _random_value(rng, depth + 1) for _ in range(rng.randrange(6))}


def fuzz_frames(rng: random.Random) -> dict[str, tuple[str | bytes, str]]:
    """name -> (frame, what the error text must contain)."""
    good = _pack(droid_obs(np.random.default_rng(8), "fuzz"))
    nan_state = droid_obs(np.random.default_rng(9), "fuzz")
    nan_state["observation/joint_position"] = np.full(7, np.nan)
    return {
        "truncated msgpack": (good[: rng.randrange(1, len(good) - 1)], "invalid request"),
        "random bytes": (rng.randbytes(rng.randrange(1, 4096)), "invalid request"),
        "random msgpack": (msgpack.packb(_random_value(rng), use_bin_type=True), "invalid request"),
        "text frame": ("{'observation/joint_position': [0, 0]}", "expected a binary msgpack frame"),
        "object dtype": (_with_array("|O", b"\x00" * 56, [7]), "refused array dtype"),
        "size mismatch": (_with_array("<f8", b"\x00" * 8, [7]), "needs 56 bytes"),
        "huge shape claim": (_with_array("<f8", b"\x00" * 8, [2**40, 2**40, 2**40]), "needs"),
        "huge msgpack length claim": (b"\xdd\xff\xff\xff\xff" + b"\x00" * 16, "invalid request"),
        "deep nesting": (b"\x91" * 5000 + b"\x00", "invalid request"),  # [[[...[0]...]]], 5000 levels
        "nan state": (_pack(nan_state), "non-finite"),
        "wrong state size": (
            _pack({**droid_obs(np.random.default_rng(10), "fuzz"), "observation/joint_position": np.zeros(6)}),
            "must hold 7 numbers",
        ),
    }


class Fuzzer:
    def __init__(self, url: str, port: int, seed: int = 0) -> None:
        self.url, self.port = url, port
        self.rng = random.Random(seed)
        self.outcomes: collections.Counter = collections.Counter()
        self.unexpected: list[str] = []
        self.rounds = 0
        self.first_round_done = threading.Event()

    def _connect(self):
        from websockets.sync.client import connect

        ws = connect(self.url, compression=None, max_size=None, proxy=None, open_timeout=10)
        ws.recv(timeout=10)  # the metadata frame
        return ws

    def _expect_refusal(self, name: str, frame: str | bytes, reason: str) -> None:
        from websockets.exceptions import ConnectionClosed

        ws = self._connect()
        try:
            ws.send(frame)
            reply = ws.recv(timeout=30)
            if not (isinstance(reply, str) and reason in reply):
                self._bad(name, f"reply {str(reply)[:120]!r} lacks {reason!r}")
                return
            try:
                ws.recv(timeout=10)
                self._bad(name, "connection stayed open after the error frame")
            except ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd is not None else None
                if code != 1011:
                    self._bad(name, f"closed with {code}, expected 1011")
                    return
            self.outcomes[f"{name}: error frame + 1011"] += 1
        except Exception as exc:
            self._bad(name, f"{type(exc).__name__}: {exc}")
        finally:
            ws.close()

    def _oversized(self) -> None:
        from websockets.exceptions import ConnectionClosed

        name = "20 MB frame"
        ws = self._connect()
        try:
            try:
                ws.send(b"\x00" * (20 * 1024 * 1024))
                ws.recv(timeout=30)
                self._bad(name, "got a reply")
            except ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd is not None else None
                if code == 1009:
                    self.outcomes[f"{name}: close 1009"] += 1
                else:
                    self._bad(name, f"closed with {code}, expected 1009")
        finally:
            ws.close()

    def _disconnect_mid_request(self) -> None:
        ws = self._connect()
        ws.send(_pack(droid_obs(np.random.default_rng(11), "fuzz")))
        ws.socket.close()  # no closing handshake: the TCP connection just ends
        self.outcomes["disconnect mid-request: sent"] += 1

    def _half_open(self, hold_s: float = 20.0) -> None:
        """Part of an upgrade request, then silence: the server must drop the connection itself."""
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
        sock.sendall(b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n")
        sock.settimeout(hold_s)
        start = time.monotonic()
        try:
            data = sock.recv(65536)
            while data:  # whatever the server says (an HTTP error) ends with it closing
                data = sock.recv(65536)
            self.outcomes["half-open handshake: closed by the server"] += 1
        except TimeoutError:
            self._bad("half-open handshake", f"still open after {time.monotonic() - start:.1f} s")
        except ConnectionResetError:
            self.outcomes["half-open handshake: reset by the server"] += 1
        finally:
            sock.close()

    def _bad(self, name: str, what: str) -> None:
        self.outcomes[f"{name}: UNEXPECTED"] += 1
        if len(self.unexpected) < 50:
            self.unexpected.append(f"{name}: {what}")

    def run(self, deadline: float) -> None:
        half_open: list[threading.Thread] = []
        while time.monotonic() < deadline:
            cases: list[tuple[str, Callable[[], None]]] = [
                (name, lambda n=name, f=frame, r=reason: self._expect_refusal(n, f, r))
                for name, (frame, reason) in fuzz_frames(self.rng).items()
            ]
            cases += [("20 MB frame", self._oversized), ("disconnect", self._disconnect_mid_request)]
            self.rng.shuffle(cases)
            if len([t for t in half_open if t.is_alive()]) < 4:
                thread = threading.Thread(target=self._half_open, daemon=True)
                thread.start()
                half_open.append(thread)
            for name, case in cases:
                if time.monotonic() >= deadline:
                    break
                try:
                    case()
                except Exception as exc:
                    self._bad(name, f"{type(exc).__name__}: {exc}")
            self.rounds += 1
            self.first_round_done.set()
        for thread in half_open:
            thread.join(20)


def healthz(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status
    finally:
        conn.close()


# ----- main -----------------------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--preset", default="tiny", help="torch preset served (random weights, seed 0)")
    parser.add_argument("--out")
    args = parser.parse_args()

    server = ServerProcess(args.preset).start()
    url = f"ws://127.0.0.1:{server.port}"
    print(f"[soak] server pid {server.proc.pid} on {url}; {args.clients} clients + fuzzer for {args.seconds:g} s",
          file=sys.stderr, flush=True)  # fmt: skip
    rss: list[tuple[float, float]] = [(0.0, server.rss_mb())]
    start = time.monotonic()
    deadline = start + args.seconds
    stats = [ClientStats() for _ in range(args.clients)]
    threads = [
        threading.Thread(target=client_loop, args=(i, url, deadline, stats[i]), daemon=True)
        for i in range(args.clients)
    ]
    fuzzer = Fuzzer(url, server.port)
    fuzz_thread = threading.Thread(target=fuzzer.run, args=(deadline,), daemon=True)
    for t in [*threads, fuzz_thread]:
        t.start()
    baseline: tuple[float, float] | None = None
    while any(t.is_alive() for t in threads) or fuzz_thread.is_alive():
        time.sleep(2.0)
        rss.append((round(time.monotonic() - start, 1), server.rss_mb()))
        if baseline is None and fuzzer.first_round_done.is_set():
            baseline = rss[-1]
    for t in [*threads, fuzz_thread]:
        t.join(60)
    health = healthz(server.port)
    end_rss = server.rss_mb()
    server.stop()

    baseline = baseline or rss[0]
    growth = (end_rss - baseline[1]) / baseline[1] * 100.0
    latencies = [x for s in stats for x in s.latencies_ms]
    errors = [e for s in stats for e in s.errors]
    report = {
        "benchmark": "bridge_soak",
        "machine": {"cpus": os.cpu_count(), "processor": platform.processor() or platform.machine()},
        "load_average_end": [round(x, 2) for x in os.getloadavg()],
        "seconds": args.seconds,
        "policy": f"{args.preset} torch policy, DROID key map, seed 0, 1 torch thread",
        "clients": {
            "count": args.clients,
            "requests": sum(s.requests for s in stats),
            "requests_per_s": round(sum(s.requests for s in stats) / args.seconds, 1),
            "round_trip_ms_p50": round(float(np.percentile(latencies, 50)), 2) if latencies else None,
            "round_trip_ms_p95": round(float(np.percentile(latencies, 95)), 2) if latencies else None,
            "errors": len(errors),
            "error_examples": errors[:5],
            "action_mismatches": sum(s.mismatches for s in stats),
        },
        "fuzzer": {
            "rounds": fuzzer.rounds,
            "cases": sum(fuzzer.outcomes.values()),
            "outcomes": dict(sorted(fuzzer.outcomes.items())),
            "unexpected": fuzzer.unexpected,
        },
        "server": {
            **server.stats,
            "healthz_after": health,
            "rss_mb_start": round(rss[0][1], 1),
            "rss_mb_baseline": round(baseline[1], 1),
            "rss_baseline_at_s": baseline[0],
            "rss_mb_end": round(end_rss, 1),
            "rss_growth_pct": round(growth, 2),
            "rss_samples_mb": [[t, round(v, 1)] for t, v in rss],
        },
    }
    report["targets"] = {
        "zero_client_errors": not errors,
        "identical_actions": report["clients"]["action_mismatches"] == 0,
        "every_fuzz_case_as_expected": not fuzzer.unexpected,
        "healthz_after": health == 200,
        "rss_growth_within_5pct": growth <= 5.0,
    }
    emit(report, args.out)
    return 0 if all(report["targets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
