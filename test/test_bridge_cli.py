"""`omni-ros serve` as a real process: URL and metadata printed, openpi-client served, clean stop on SIGINT."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy

from helpers.bridge_util import aloha_obs, healthz, libero_obs, start_serve, stop_serve

HELPERS_PARENT = Path(__file__).resolve().parent
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _start(root: Path, *args: str) -> tuple[subprocess.Popen, str, dict]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(HELPERS_PARENT), os.environ.get("PYTHONPATH", "")])}
    return start_serve(root, *args, env=env, cli_options=("-vv",))


def test_serve_with_a_policy_factory(root):
    proc, url, metadata = _start(root, "--keymap", "libero", "--policy-factory", "helpers.bridge_policies:make_policy")
    try:
        assert metadata["keymap"]["name"] == "libero" and metadata["action_dim"] == 7
        assert metadata["camera_names"] == ["base", "wrist"]
        client = WebsocketClientPolicy(url)
        result = client.infer(libero_obs(np.random.default_rng(0)))
        assert result["actions"].shape == (10, 7)
        status, body = healthz(int(url.rsplit(":", 1)[1]))
        assert (status, body.splitlines()[0]) == (200, "OK")
    finally:
        code, out, err = stop_serve(proc)
    assert code == 0, err
    assert "stopped after 1 requests" in out
    assert re.search(r"DEBUG omni_ros.serve: client 127\.0\.0\.1:\d+ request 1: [0-9.]+ ms", err), err


def test_serve_the_configured_torch_policy(root, tmp_path):
    config = tmp_path / "serve.yaml"
    config.write_text("policy: {preset: tiny, num_threads: 1}\nserve: {keymap: aloha, batching: {enabled: true}}\n")
    proc, url, metadata = _start(root, "--config", str(config))
    try:
        assert metadata["backend"].startswith("torch") and metadata["action_dim"] == 14
        assert metadata["batching"]["enabled"] is True
        result = WebsocketClientPolicy(url).infer(aloha_obs(np.random.default_rng(1), cameras=("cam_high",)))
        assert result["actions"].shape == (metadata["action_horizon"], 14)
        assert np.all(np.isfinite(result["actions"]))
    finally:
        code, _out, err = stop_serve(proc)
    assert code == 0, err


def test_serve_reports_bad_config(root, tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "omni_ros.cli", "serve", "--keymap", "nope", "--port", "0"],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "key map 'nope' not found" in result.stderr
