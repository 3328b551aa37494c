"""wss:// with a configured certificate (a self-signed one made here, on 127.0.0.1) for the real openpi-client and
our RemotePolicy; and the warning when the server is exposed without an API key."""

from __future__ import annotations

import datetime
import http.client
import ipaddress
import logging
import ssl

import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.exceptions import InvalidMessage

from helpers.bridge_policies import expected_actions
from helpers.bridge_util import droid_obs, echo_server
from omni_ros.backends.remote import RemotePolicy, RemotePolicyError
from omni_ros.config import ConfigError, load_config
from omni_ros.observation import make_observation
from omni_ros.serving.config import ServeConfig
from omni_ros.serving.server import PolicyServer, is_loopback

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _self_signed(tmp_path, name: str = "server") -> tuple[str, str]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "omni_ros test")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = tmp_path / f"{name}.crt", tmp_path / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return str(cert_path), str(key_path)


@pytest.fixture
def tls_server(tmp_path):
    cert, key = _self_signed(tmp_path)
    server, policy, keymap = echo_server("droid", tls_cert=cert, tls_key=key, api_key="k3y")
    with server:
        yield server, policy, keymap, cert


def test_openpi_client_over_wss(tls_server, monkeypatch):
    server, policy, keymap, cert = tls_server
    assert server.url.startswith("wss://127.0.0.1:")
    # The unmodified client uses Python's default TLS context: it refuses a certificate nobody vouches for, and
    # trusting ours is the environment's job (SSL_CERT_FILE), as with any self-signed deployment.
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    with pytest.raises(ssl.SSLCertVerificationError):
        WebsocketClientPolicy(server.url, api_key="k3y")
    monkeypatch.setenv("SSL_CERT_FILE", cert)
    client = WebsocketClientPolicy(server.url, api_key="k3y")
    assert client.get_server_metadata()["server"] == "omni_ros"
    for i in range(2):
        obs = droid_obs(np.random.default_rng(i))
        expected = expected_actions(policy, make_observation(policy.spec, keymap.to_raw(obs)))
        np.testing.assert_array_equal(client.infer(obs)["actions"], expected)
    # /healthz is served over TLS too.
    conn = http.client.HTTPSConnection("127.0.0.1", server.port, context=ssl.create_default_context(cafile=cert))
    conn.request("GET", "/healthz")
    assert conn.getresponse().status == 200
    conn.close()


def test_untrusted_or_plain_clients_are_turned_away_and_the_server_keeps_serving(tls_server, tmp_path):
    server, policy, _keymap, cert = tls_server
    other_cert, _ = _self_signed(tmp_path, "other")
    for ca_file in (other_cert, None):  # another certificate, the system's CAs
        with pytest.raises(RemotePolicyError, match="certificate is not trusted"):
            RemotePolicy(server.url, api_key="k3y", ca_file=ca_file)
    with pytest.raises((InvalidMessage, ConnectionError, EOFError, OSError)):
        WebsocketClientPolicy(server.url.replace("wss://", "ws://"), api_key="k3y")
    remote = RemotePolicy(server.url, api_key="k3y", ca_file=cert)
    images = {"exterior_1_left": np.zeros((224, 224, 3), np.uint8), "wrist_left": np.full((8, 8, 3), 9, np.uint8)}
    raw = {"images": images, "state": np.arange(8.0), "prompt": "p"}
    np.testing.assert_array_equal(
        remote.infer(raw)["actions"], expected_actions(policy, make_observation(policy.spec, raw))
    )
    remote.close()


def test_tls_config_is_checked(tmp_path):
    cert, key = _self_signed(tmp_path)
    server, _policy, _keymap = echo_server("droid")
    policy = server.server.policy
    with pytest.raises(ConfigError, match=r"tls_key is needed too"):
        ServeConfig(tls_cert=cert)
    half = ServeConfig()
    half.tls_cert = cert  # as `omni-ros serve --tls-cert` sets it, after the config checked itself
    with pytest.raises(ConfigError, match=r"needs both serve\.tls_cert and serve\.tls_key"):
        PolicyServer(policy, half)
    with pytest.raises(ConfigError, match=r"serve\.tls_key: file not found"):
        PolicyServer(policy, ServeConfig(tls_cert=cert, tls_key=str(tmp_path / "nope.key")))
    (tmp_path / "junk.pem").write_text("not a certificate\n")
    with pytest.raises(ConfigError, match="cannot load"):
        PolicyServer(policy, ServeConfig(tls_cert=str(tmp_path / "junk.pem"), tls_key=key))
    # Relative paths in a config file mean "next to the file".
    (tmp_path / "c.yaml").write_text("serve: {tls_cert: server.crt, tls_key: server.key}\n")
    serve = load_config(tmp_path / "c.yaml").serve
    assert (serve.tls_cert, serve.tls_key) == (cert, key)


def test_exposed_without_an_api_key_is_a_loud_warning(caplog, monkeypatch):
    monkeypatch.delenv("OMNI_ROS_API_KEY", raising=False)
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost") and is_loopback("127.0.0.2")
    assert not is_loopback("0.0.0.0") and not is_loopback("") and not is_loopback("192.168.1.20")
    server, _policy, _keymap = echo_server("droid")
    policy = server.server.policy
    # Checked without binding anything beyond loopback: the warning is decided from the configuration.
    cases = {
        "0.0.0.0": (ServeConfig(host="0.0.0.0"), "WITHOUT AN API KEY"),
        "key over ws": (ServeConfig(host="0.0.0.0", api_key="k"), "clear text"),
        "loopback": (ServeConfig(host="127.0.0.1"), None),
    }
    for name, (config, expected) in cases.items():
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="omni_ros.serve"):
            PolicyServer(policy, config)._warn_if_exposed()
        messages = " ".join(r.getMessage() for r in caplog.records)
        if expected is None:
            assert not messages, name
        else:
            assert expected in messages, (name, messages)
