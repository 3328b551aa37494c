"""`omni-ros serve --ray` as a real process: its own cluster on 127.0.0.1, openpi-client served by 2 replicas,
Ctrl-C leaves no process behind; and a one-line error when Ray is not installed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.exceptions import InvalidStatus

from helpers.bridge_policies import EchoPolicy, expected_actions
from helpers.bridge_util import healthz, libero_obs, start_serve, stop_serve
from helpers.listening import listeners
from omni_ros.cluster import MARKER
from omni_ros.config import ConfigError
from omni_ros.observation import make_observation
from omni_ros.serving.keymap import load_keymap

TEST_DIR = Path(__file__).resolve().parent
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _cluster_processes() -> set[int]:
    """Every process that belongs to some LocalCluster (they carry its marker variable)."""
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if f"\0{MARKER}=".encode() in b"\0" + (entry / "environ").read_bytes():
                    found.add(int(entry.name))
            except OSError:
                continue
    return found


def _env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join(p for p in (str(TEST_DIR), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def test_serve_ray_with_two_replicas_and_a_clean_stop(root):
    before = _cluster_processes()
    proc, url, metadata = start_serve(
        root,
        "--ray", "--replicas", "2", "--keymap", "libero", "--api-key", "cli-key",
        "--policy-factory", "helpers.bridge_policies:make_policy", "--num-cpus", "0.5",
        env=_env(),
    )  # fmt: skip
    try:
        assert metadata["design"] == "fused" and metadata["keymap"]["name"] == "libero"
        assert url.startswith("ws://127.0.0.1:")
        ours = _cluster_processes() - before
        assert len(ours) >= 4  # GCS, raylet, Serve controller and proxy, replicas
        # Everything of the cluster listens on loopback only (Serve's replicas would open a gRPC port on every
        # interface if they were let; bind_replica_grpc_to_node_ip keeps it on the node IP, 127.0.0.1 here).
        ports = listeners(sorted(ours))
        assert ports and [p for p in ports if not p.loopback] == []
        with pytest.raises(InvalidStatus):
            WebsocketClientPolicy(url)
        keymap = load_keymap("libero")
        policy = EchoPolicy(keymap.camera_names, keymap.state_dim, keymap.action_dim)
        clients = [WebsocketClientPolicy(url, api_key="cli-key") for _ in range(6)]
        assert len({c.get_server_metadata()["replica"]["id"] for c in clients}) == 2
        obs = libero_obs(np.random.default_rng(0))
        expected = expected_actions(policy, make_observation(policy.spec, keymap.to_raw(obs)))
        for client in clients:
            np.testing.assert_array_equal(client.infer(obs)["actions"], expected)
        status, body = healthz(int(url.rsplit(":", 1)[1]))
        assert (status, body.splitlines()[0]) == (200, "OK")
    finally:
        code, out, err = stop_serve(proc)
    assert code == 0, err
    assert "stopped (Ray Serve application and cluster shut down)" in out
    # Ray itself took every process down (LocalCluster would have to kill leftovers and say so).
    assert "left after shutdown" not in err, err
    assert _cluster_processes() - before == set()


@pytest.mark.parametrize("command", [["serve", "--ray"], ["eval", "--ray", "some.mcap"]])
def test_without_ray_a_one_line_error(root, tmp_path, command):
    # A Python on which `import ray` finds nothing, as on a machine without the extra.
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class HideRay:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'ray' or name.startswith('ray.'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}')\n"
        "sys.meta_path.insert(0, HideRay())\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "omni_ros.cli", *command],
        cwd=root,
        env={**os.environ, "PYTHONPATH": str(tmp_path)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "needs Ray, which is not installed: pip install 'ray[serve]" in lines[0], lines


def test_the_shipped_serve_config_is_valid_and_builds(root):
    import yaml
    from ray.serve.schema import ServeDeploySchema

    from omni_ros.serving.ray_serve import spec_from_args

    data = yaml.safe_load((root / "config" / "ray" / "serve.yaml").read_text())
    schema = ServeDeploySchema.model_validate(data)
    assert schema.http_options.host == "127.0.0.1"
    (app,) = schema.applications
    assert app.import_path == "omni_ros.serving.ray_serve:build" and app.route_prefix == "/"
    spec = spec_from_args(app.args)
    assert (spec.replicas, spec.design, spec.serve.keymap, spec.serve.batching.enabled) == (2, "fused", "droid", True)
    with pytest.raises(ConfigError, match="unknown argument"):
        spec_from_args({"replica": 2})


def test_serve_ray_refuses_tls_before_starting_a_cluster(root, capsys):
    from omni_ros.cli import main

    assert main(["serve", "--ray", "--tls-cert", "cert.pem", "--tls-key", "key.pem"]) == 2
    err = capsys.readouterr().err
    assert "wss:// is served by `omni-ros serve` itself" in err
