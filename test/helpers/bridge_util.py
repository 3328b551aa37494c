"""Observations in openpi layouts, and small clients, for the OpenPI bridge tests."""

from __future__ import annotations

import http.client
import inspect
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from websockets.sync.client import ClientConnection, connect

from helpers.bridge_policies import EchoPolicy
from omni_ros.serving.config import ServeConfig
from omni_ros.serving.keymap import KeyMap, load_keymap
from omni_ros.serving.msgpack_numpy import unpackb
from omni_ros.serving.server import ServerThread

_LEGACY = {"legacy": True} if "legacy" in inspect.signature(connect).parameters else {}


def droid_obs(rng: np.random.Generator, prompt: str = "pick up the cup") -> dict[str, Any]:
    """What openpi's examples/droid/main.py sends."""
    return {
        "observation/exterior_image_1_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/wrist_image_left": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/joint_position": rng.normal(size=7),
        "observation/gripper_position": rng.uniform(size=1),
        "prompt": prompt,
    }


def libero_obs(rng: np.random.Generator, prompt: str = "put the bowl on the plate") -> dict[str, Any]:
    """What openpi's examples/libero/main.py sends."""
    return {
        "observation/image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 256, (224, 224, 3), dtype=np.uint8),
        "observation/state": rng.normal(size=8).astype(np.float32),
        "prompt": prompt,
    }


def aloha_obs(
    rng: np.random.Generator,
    prompt: str = "transfer the cube",
    cameras: tuple[str, ...] = ("cam_high", "cam_low", "cam_left_wrist", "cam_right_wrist"),
) -> dict[str, Any]:
    """What openpi's ALOHA examples send: nested images, CHW uint8."""
    return {
        "images": {name: rng.integers(0, 256, (3, 224, 224), dtype=np.uint8) for name in cameras},
        "state": rng.normal(size=14).astype(np.float32),
        "prompt": prompt,
    }


OBS_MAKERS: dict[str, Callable[..., dict[str, Any]]] = {"droid": droid_obs, "libero": libero_obs, "aloha": aloha_obs}
ACTION_DIMS = {"droid": 8, "libero": 7, "aloha": 14}


def echo_server(keymap_name: str = "droid", **config: Any) -> tuple[ServerThread, EchoPolicy, KeyMap]:
    """An EchoPolicy shaped for the key map, behind a server on a free port (not started)."""
    keymap = load_keymap(keymap_name)
    policy = EchoPolicy(
        keymap.camera_names, keymap.state_dim, keymap.action_dim or 8, required_cameras=keymap.required_cameras
    )
    config.setdefault("port", 0)
    batching = config.pop("batching", None)
    serve_config = ServeConfig(**config)
    if batching is not None:
        serve_config.batching = batching
    return ServerThread(policy, serve_config, keymap), policy, keymap


def healthz(port: int, timeout: float = 5.0, path: str = "/healthz") -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode()
    finally:
        conn.close()


def raw_client(url: str, **kwargs: Any) -> tuple[ClientConnection, dict[str, Any]]:
    """A bare websockets client that has read the metadata frame."""
    ws = connect(url, compression=None, max_size=None, proxy=None, **_LEGACY, **kwargs)
    return ws, unpackb(ws.recv(timeout=10))


def wait_for(predicate: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.005)


def start_serve(
    root: Path, *args: str, env: dict[str, str] | None = None, cli_options: tuple[str, ...] = ()
) -> tuple[subprocess.Popen, str, dict]:
    """`omni-ros [CLI_OPTIONS] serve --port 0 ARGS` as a process: (process, its URL, the metadata it printed)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "omni_ros.cli", *cli_options, "serve", "--port", "0", *args],
        cwd=root,
        env=env or dict(os.environ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines = []
    for line in proc.stdout:  # type: ignore[union-attr]
        lines.append(line)
        if line.startswith("}"):
            break
    text = "".join(lines)
    match = re.search(r"listening on (ws://127\.0\.0\.1:\d+)", text)
    if match is None:
        proc.kill()
        raise AssertionError(f"no URL printed:\n{text}\n{proc.stderr.read()}")  # type: ignore[union-attr]
    return proc, match.group(1), json.loads(text[text.index("{") :])


def stop_serve(proc: subprocess.Popen) -> tuple[int, str, str]:
    """SIGINT, as Ctrl-C would: (exit status, stdout, stderr)."""
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=30)
    return proc.returncode, out, err
