"""--web-config-file: TLS with a real certificate made here by the openssl CLI, client certificates, basic auth
with bcrypt hashes, the file's checks; real clients (Python's ssl, curl)."""

from __future__ import annotations

import base64
import http.client
import shutil
import socket
import ssl
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Optional

import pytest

from oomwatch.sinks.http import HttpSink
from oomwatch.sinks.webconfig import BasicAuth, WebConfigError, load_web_config, parse_web_config

BODY = b"# TYPE x gauge\nx 1.0\n"


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(d: Path, name: str) -> None:
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.crt", "-days", "2", "-subj", f"/CN={name}", cwd=d)


def make_cert(d: Path, name: str, ca: str, san: str, usage: str) -> None:
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", f"{name}.key",
            "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)
    (d / f"{name}.ext").write_text(f"subjectAltName={san}\nextendedKeyUsage={usage}\n")
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
            "-out", f"{name}.crt", "-days", "2", "-extfile", f"{name}.ext", cwd=d)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("pki")
    make_ca(d, "ca")
    make_ca(d, "other-ca")
    make_cert(d, "server", "ca", "IP:127.0.0.1,DNS:localhost", "serverAuth")
    make_cert(d, "prometheus", "ca", "DNS:prometheus.monitoring.svc", "clientAuth")
    make_cert(d, "intruder", "other-ca", "DNS:prometheus.monitoring.svc", "clientAuth")
    make_cert(d, "grafana", "ca", "DNS:grafana.monitoring.svc", "clientAuth")
    return d


class Store:
    def snapshot(self):
        class Snapshot:
            incidents = ()

        return Snapshot()


@contextmanager
def serving(config_text: str, directory: Path) -> Iterator[HttpSink]:
    path = directory / "web-config.yml"
    path.write_text(config_text)
    web, tls = load_web_config(str(path))
    sink = HttpSink("127.0.0.1:0", lambda accept: ("text/plain; version=0.0.4; charset=utf-8", [BODY]),
                    Store(), lambda: (True, {"kmsg": "ok"}), web=web, tls=tls)
    sink.start()
    try:
        yield sink
    finally:
        sink.stop()


def client_context(pki: Path, cert: Optional[str] = None, tls13: bool = True) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert:
        context.load_cert_chain(pki / f"{cert}.crt", pki / f"{cert}.key")
    if not tls13:
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    return context


def https_get(sink: HttpSink, path: str, context: ssl.SSLContext,
              headers: Optional[dict] = None) -> tuple[int, bytes, http.client.HTTPResponse]:
    conn = http.client.HTTPSConnection("127.0.0.1", sink.address[1], context=context, timeout=5)
    try:
        conn.request("GET", path, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read(), response
    finally:
        conn.close()


TLS = "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n"
MTLS = TLS + "  client_ca_file: ca.crt\n  client_auth_type: RequireAndVerifyClientCert\n"


def test_tls_with_a_real_certificate_and_real_clients(pki: Path) -> None:
    with serving(TLS, pki) as sink:
        status, body, _ = https_get(sink, "/metrics", client_context(pki))
        assert (status, body) == (200, BODY)
        curl = shutil.which("curl")
        assert curl, "curl is needed for this test"
        out = subprocess.run([curl, "-sS", "--cacert", str(pki / "ca.crt"), f"https://127.0.0.1:{sink.address[1]}/metrics"],
                             capture_output=True, timeout=10, check=False)
        assert out.returncode == 0 and out.stdout == BODY, out.stderr
        plain = socket.create_connection(sink.address, timeout=5)  # plain HTTP to the TLS port: no answer
        plain.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        try:
            assert b"HTTP/1.1" not in plain.recv(1000)
        except ConnectionResetError:
            pass
        plain.close()


def test_client_certificates_for_everything_but_healthz(pki: Path) -> None:
    with serving(MTLS, pki) as sink:
        anonymous = client_context(pki)
        assert https_get(sink, "/healthz", anonymous)[0] == 200  # the kubelet's probe has no certificate
        assert https_get(sink, "/metrics", anonymous)[0] == 403
        assert https_get(sink, "/incidents", anonymous)[0] == 403
        assert https_get(sink, "/metrics", client_context(pki, "prometheus"))[:2] == (200, BODY)
        with pytest.raises((ssl.SSLError, ConnectionResetError, BrokenPipeError)):
            https_get(sink, "/metrics", client_context(pki, "intruder"))  # signed by another CA
        url = f"https://127.0.0.1:{sink.address[1]}/metrics"
        base = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "--cacert", str(pki / "ca.crt")]
        with_cert = subprocess.run(base + ["--cert", str(pki / "prometheus.crt"), "--key", str(pki / "prometheus.key"),
                                           url], capture_output=True, text=True, timeout=10, check=False)
        assert with_cert.stdout == "200", with_cert.stderr
        without = subprocess.run(base + [url], capture_output=True, text=True, timeout=10, check=False)
        assert without.stdout == "403", without.stderr


def test_client_allowed_sans(pki: Path) -> None:
    with serving(MTLS + "  client_allowed_sans: [prometheus.monitoring.svc]\n", pki) as sink:
        assert https_get(sink, "/metrics", client_context(pki, "prometheus"))[0] == 200
        assert https_get(sink, "/metrics", client_context(pki, "grafana"))[0] == 403


def test_min_version_refuses_older_clients(pki: Path) -> None:
    with serving(TLS + "  min_version: TLS13\n", pki) as sink:
        assert https_get(sink, "/metrics", client_context(pki))[0] == 200
        with pytest.raises((ssl.SSLError, ConnectionResetError)):
            https_get(sink, "/metrics", client_context(pki, tls13=False))


def test_basic_auth_with_bcrypt_hashes_and_response_headers(pki: Path) -> None:
    bcrypt = pytest.importorskip("bcrypt", reason="basic_auth_users needs bcrypt (pyproject dependency)")
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode().replace("$2b$", "$2y$", 1)  # htpasswd's prefix
    config = (TLS + f"basic_auth_users:\n  prometheus: '{hashed}'\n"
              "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n")
    with serving(config, pki) as sink:
        context = client_context(pki)

        def auth(user: str, password: str) -> dict:
            return {"Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()}

        status, body, response = https_get(sink, "/metrics", context, auth("prometheus", "s3cret"))
        assert (status, body) == (200, BODY)
        assert response.getheader("X-Content-Type-Options") == "nosniff"
        status, _, response = https_get(sink, "/metrics", context, auth("prometheus", "wrong"))
        assert status == 401 and response.getheader("WWW-Authenticate") == 'Basic realm="oomwatch"'
        assert https_get(sink, "/metrics", context, auth("nobody", "s3cret"))[0] == 401
        assert https_get(sink, "/incidents", context)[0] == 401
        assert https_get(sink, "/healthz", context)[0] == 200


def test_new_credentials_are_paced_per_client_and_only_successes_are_remembered() -> None:
    bcrypt = pytest.importorskip("bcrypt", reason="basic_auth_users needs bcrypt (pyproject dependency)")
    now = [0.0]
    checker = BasicAuth({"p": bcrypt.hashpw(b"pw", bcrypt.gensalt(4))}, per_client_per_second=1, burst=2,
                        clock=lambda: now[0])

    def header(password: str) -> str:
        return "Basic " + base64.b64encode(f"p:{password}".encode()).decode()

    assert checker.known(None) == "denied" and checker.known("Bearer x") == "denied"
    assert checker.known(header("pw")) is None  # never checked: needs a check
    assert checker.admit("10.0.0.1") and checker.verify(header("pw"))
    assert checker.known(header("pw")) == "ok"  # remembered: costs no check
    assert checker.admit("10.0.0.1") and not checker.verify(header("bad"))
    assert checker.known(header("bad")) is None  # a failure is not remembered: it costs a check every time
    assert not checker.admit("10.0.0.1")  # its two checks spent this second
    assert checker.admit("10.0.0.2")  # another client is not slowed by it
    now[0] = 1.0
    assert checker.admit("10.0.0.1")  # one more a second
    assert not checker.admit("10.0.0.1")


def test_the_dummy_hash_for_unknown_users_has_the_users_cost() -> None:
    checker = BasicAuth({"p": b"$2y$12$" + b"a" * 53, "q": b"$2b$05$" + b"b" * 53})
    assert checker.unknown_user_cost == 12
    assert BasicAuth({}).unknown_user_cost == 10


def test_pipelined_requests_over_tls_are_capped_too(pki: Path) -> None:
    with serving(TLS, pki) as sink:
        raw = socket.create_connection(sink.address, timeout=5)
        tls = client_context(pki).wrap_socket(raw, server_hostname="127.0.0.1")
        tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n" * 100)
        data = b""
        try:
            while chunk := tls.recv(65536):
                data += chunk
        except (ConnectionResetError, ssl.SSLError):
            pass
        tls.close()
        assert data.count(b"HTTP/1.1 200 OK\r\n") == sink.server.limits.max_pipelined
        assert https_get(sink, "/healthz", client_context(pki))[0] == 200


@pytest.mark.parametrize("doc, message", [
    ({"tls_server_config": {"cert_file": "a"}}, "needs both cert_file and key_file"),
    ({"tls_server_config": {"cert": "PEM", "key": "PEM"}}, "not supported"),
    ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_auth_type": "RequireAnyClientCert"}},
     "authenticates nobody"),
    ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_ca_file": "c"}}, "NoClientCert"),
    ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_auth_type": "RequireAndVerifyClientCert"}},
     "needs client_ca_file"),
    ({"tls_server_config": {"cert_file": "a", "key_file": "b", "client_allowed_sans": ["x"]}},
     "needs client_auth_type RequireAndVerifyClientCert"),
    ({"tls_server_config": {"cert_file": "a", "key_file": "b", "min_version": "TLS13", "max_version": "TLS12"}},
     "min_version is above max_version"),
    ({"tls_server_config": {"cert_file": "a", "key_file": "b", "min_version": "SSL3"}}, "is not one of"),
    ({"basic_auth_users": {"u": "plaintext"}}, "expected a bcrypt hash"),
    ({"rate_limit": {"interval": "1s"}}, "rate_limit is not supported"),
    ({"tls_config": {}}, "unknown key(s) in web config: tls_config"),
    ({"http_server_config": {"headers": {"Server": "x"}}}, "is not one of"),
    ([], "expected a mapping"),
])
def test_web_config_errors_name_the_problem(doc, message: str) -> None:
    with pytest.raises(WebConfigError) as raised:
        parse_web_config(doc, Path("/etc/oomwatch"))
    assert message in str(raised.value)


def test_relative_paths_are_taken_from_the_config_files_directory(pki: Path) -> None:
    settings = parse_web_config({"tls_server_config": {"cert_file": "server.crt", "key_file": "/abs/server.key"},
                                 "http_server_config": {"http2": True}}, pki)
    assert settings.tls.cert_file == pki / "server.crt"
    assert str(settings.tls.key_file) == "/abs/server.key"
    assert parse_web_config(None, pki).tls is None  # an empty file: plain HTTP, no auth


def test_unreadable_files_are_named(tmp_path: Path, pki: Path) -> None:
    with pytest.raises(WebConfigError, match="cannot read web config"):
        load_web_config(str(tmp_path / "missing.yml"))
    (tmp_path / "bad.yml").write_text("tls_server_config: [")
    with pytest.raises(WebConfigError, match="not valid YAML"):
        load_web_config(str(tmp_path / "bad.yml"))
    (tmp_path / "nocert.yml").write_text("tls_server_config:\n  cert_file: nope.crt\n  key_file: nope.key\n")
    with pytest.raises(WebConfigError, match="cannot load cert_file .*nope.crt"):
        load_web_config(str(tmp_path / "nocert.yml"))


def test_agent_option_and_environment_variable(tmp_path: Path, pki: Path) -> None:
    from click.testing import CliRunner

    import oomwatch.agent as agent_module
    from oomwatch import cli

    (pki / "web.yml").write_text(MTLS)
    seen = {}

    class FakeAgent:
        def __init__(self, config, early_pump=None):
            seen["config"] = config

        def run_until_signalled(self):
            return 0

    original, agent_module.Agent = agent_module.Agent, FakeAgent
    try:
        ok = CliRunner().invoke(cli.main, ["agent"], env={"OOMWATCH_WEB_CONFIG_FILE": str(pki / "web.yml")})
        (tmp_path / "bad.yml").write_text("basic_auth_users: {u: plain}\n")
        bad = CliRunner().invoke(cli.main, ["agent", "--web-config-file", str(tmp_path / "bad.yml")])
    finally:
        agent_module.Agent = original
    assert ok.exit_code == 0, ok.output
    assert seen["config"].web_config_file == str(pki / "web.yml")
    assert bad.exit_code == 2 and "--web-config-file" in bad.output and "bcrypt hash" in bad.output


def test_rotated_certificates_are_picked_up_by_new_connections(tmp_path: Path, pki: Path) -> None:
    from oomwatch.sinks.webconfig import RotatingTls

    for name in ("server.crt", "server.key"):
        shutil.copy(pki / name, tmp_path / name)
    now = [0.0]
    settings = parse_web_config({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key"}}, tmp_path)
    rotating = RotatingTls(settings.tls, clock=lambda: now[0])
    first = rotating()
    make_cert(pki, "server2", "ca", "IP:127.0.0.1", "serverAuth")
    shutil.copy(pki / "server2.crt", tmp_path / "server.crt.new")
    shutil.copy(pki / "server2.key", tmp_path / "server.key")
    (tmp_path / "server.crt.new").rename(tmp_path / "server.crt")  # replaced in place, as a Secret volume does
    assert rotating() is first  # looked at most once a second
    now[0] = 1.5
    second = rotating()
    assert second is not first
    sink = HttpSink("127.0.0.1:0", lambda accept: ("text/plain", [BODY]), Store(), lambda: (True, {}), tls=rotating)
    sink.start()
    try:
        with socket.create_connection(sink.address, timeout=5) as raw, \
                client_context(pki).wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            served = tls.getpeercert(binary_form=True)
        assert ssl.DER_cert_to_PEM_cert(served).strip() == (pki / "server2.crt").read_text().strip()
        (tmp_path / "server.key").write_text("garbage")  # a broken rotation keeps the working certificate
        now[0] = 3.0
        assert rotating() is second
    finally:
        sink.stop()


def test_the_agent_serves_its_metrics_over_mtls_with_its_web_config(tmp_path: Path, pki: Path) -> None:
    """The real agent, wired with --web-config-file: /metrics needs the client certificate, /healthz does not."""
    from oomwatch.agent import health_of
    from tests.conftest import SeqpacketKmsg, running_agent, wait_for
    from tests.test_agent import agent_config

    config_path = pki / "agent-web-config.yml"
    config_path.write_text(MTLS)
    config = agent_config(tmp_path, web_config_file=str(config_path))
    with running_agent(config, kmsg_factory=SeqpacketKmsg().factory) as agent:
        # ready once its kernel log's backlog is read and published (asked here: the port closes a client that
        # starts handshakes too fast)
        assert wait_for(lambda: health_of(agent)[0])
        status, body, _ = https_get(agent.http, "/metrics", client_context(pki, "prometheus"))
        assert status == 200 and b"oomwatch_build_info" in body
        assert https_get(agent.http, "/metrics", client_context(pki))[0] == 403
        assert https_get(agent.http, "/healthz", client_context(pki))[0] == 200


def test_a_client_starting_handshakes_too_fast_is_closed_before_its_handshake(pki: Path) -> None:
    """8,660 full handshakes in 15 s from one client took half a core of the agent: each client has
    tls_handshakes_per_client (here 2 a second after a burst of 4); beyond, its connection is closed unread."""
    from oomwatch.sinks.httpserver import Limits

    path = pki / "web-config.yml"
    path.write_text(TLS)
    web, tls = load_web_config(str(path))
    sink = HttpSink("127.0.0.1:0", lambda accept: ("text/plain; version=0.0.4; charset=utf-8", [BODY]), Store(),
                    lambda: (True, {}), web=web, tls=tls, limits=Limits(tls_handshakes_per_client=2))
    sink.start()
    try:
        context = client_context(pki)
        done = 0
        for _ in range(10):
            raw = socket.create_connection(sink.address, timeout=5, source_address=("127.0.0.2", 0))
            try:
                context.wrap_socket(raw, server_hostname="127.0.0.1").close()
                done += 1
            except (ssl.SSLError, ConnectionResetError, BrokenPipeError):
                raw.close()
        assert 4 <= done <= 6  # its burst, and what its rate gave it meanwhile
        assert https_get(sink, "/healthz", context)[0] == 200  # another client
    finally:
        sink.stop()
