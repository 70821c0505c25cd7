"""`--web-config-file`: TLS, client certificates and basic auth for the agent's port, in the file format of
Prometheus' exporter-toolkit (the `web-config.yml` that node_exporter reads), so one file can serve both.

The subset (anything else is refused at start, naming the key, as exporter-toolkit refuses unknown keys):

    tls_server_config:
      cert_file, key_file            # PEM; relative paths are relative to the config file's directory
      client_ca_file                 # CA bundle that signs the clients' certificates
      client_auth_type               # NoClientCert (default) | VerifyClientCertIfGiven | RequireAndVerifyClientCert
      client_allowed_sans            # with RequireAndVerifyClientCert: one of these SANs must be in the cert
      min_version, max_version       # TLS10 | TLS11 | TLS12 | TLS13 (default TLS12 .. TLS13)
    http_server_config:
      headers: {Content-Security-Policy, X-Frame-Options, X-Content-Type-Options, X-XSS-Protection,
                Strict-Transport-Security}
      http2                          # accepted and ignored: this server speaks HTTP/1.1
    basic_auth_users: {user: bcrypt hash}   # needs the `bcrypt` package

Not supported: inline `cert`/`key`/`client_ca`, `cipher_suites`, `curve_preferences`,
`prefer_server_cipher_suites`, `rate_limit`, and the client auth types that request a certificate without
verifying it (`RequestClientCert`, `RequireAnyClientCert`: they authenticate nobody, and Python's ssl cannot
ask for a certificate without checking it). Bearer tokens are not in exporter-toolkit's format and not offered:
Prometheus (and a ServiceMonitor's `basicAuth`) sends basic auth as readily, and a bcrypt hash keeps the secret
out of the config file.

One difference, on purpose: with RequireAndVerifyClientCert the handshake asks for a certificate without
refusing a client that has none, and every route but `/healthz` then refuses it (403). exporter-toolkit refuses
it in the handshake; that would also refuse the kubelet's probes, which present no certificate.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import ssl
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Optional

import yaml

from oomwatch.sinks.httpserver import PerClientRate

log = logging.getLogger(__name__)


class WebConfigError(ValueError):
    pass


CLIENT_AUTH_TYPES = ("NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert")
UNVERIFIED_AUTH_TYPES = ("RequestClientCert", "RequireAnyClientCert")
TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1, "TLS12": ssl.TLSVersion.TLSv1_2,
                "TLS13": ssl.TLSVersion.TLSv1_3}
RESPONSE_HEADERS = ("Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options", "X-XSS-Protection",
                    "Strict-Transport-Security")
_TLS_KEYS = {"cert_file", "key_file", "client_ca_file", "client_auth_type", "client_allowed_sans", "min_version",
             "max_version"}
_TLS_UNSUPPORTED = {"cert", "key", "client_ca", "cipher_suites", "curve_preferences", "prefer_server_cipher_suites"}


@dataclass(frozen=True)
class TlsSettings:
    cert_file: Path
    key_file: Path
    client_ca_file: Optional[Path] = None
    client_auth_type: str = "NoClientCert"
    client_allowed_sans: frozenset[str] = frozenset()
    min_version: str = "TLS12"
    max_version: str = "TLS13"


@dataclass(frozen=True)
class WebSettings:
    tls: Optional[TlsSettings] = None
    basic_auth_users: Mapping[str, bytes] = field(default_factory=dict)
    headers: tuple[tuple[str, str], ...] = ()

    @property
    def require_client_cert(self) -> bool:
        return self.tls is not None and self.tls.client_auth_type == "RequireAndVerifyClientCert"


def _mapping(value: Any, where: str) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WebConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise WebConfigError(f"{where}: expected a non-empty string")
    return value


def parse_web_config(doc: Any, base_dir: Path) -> WebSettings:
    """Validate a loaded web-config document; relative paths are taken from `base_dir` (exporter-toolkit's
    rule: the config file's directory)."""
    doc = _mapping(doc, "web config")
    unknown = set(doc) - {"tls_server_config", "http_server_config", "basic_auth_users"}
    if "rate_limit" in unknown:
        raise WebConfigError("rate_limit is not supported (the server runs one scrape at a time and shares it)")
    if unknown:
        raise WebConfigError(f"unknown key(s) in web config: {', '.join(sorted(unknown))}")
    tls = _parse_tls(_mapping(doc.get("tls_server_config"), "tls_server_config"), base_dir)
    http = _mapping(doc.get("http_server_config"), "http_server_config")
    if set(http) - {"headers", "http2"}:
        raise WebConfigError(f"unknown key(s) in http_server_config: {', '.join(sorted(set(http) - {'headers', 'http2'}))}")
    if "http2" in http and not isinstance(http["http2"], bool):
        raise WebConfigError("http_server_config.http2: expected true or false")
    headers = []
    for name, value in _mapping(http.get("headers"), "http_server_config.headers").items():
        if name not in RESPONSE_HEADERS:
            raise WebConfigError(f"http_server_config.headers: {name!r} is not one of {', '.join(RESPONSE_HEADERS)}")
        if value:
            text = _string(value, f"http_server_config.headers.{name}")
            if "\r" in text or "\n" in text:
                raise WebConfigError(f"http_server_config.headers.{name}: no line breaks")
            headers.append((name, text))
    users = {}
    for user, hashed in _mapping(doc.get("basic_auth_users"), "basic_auth_users").items():
        hashed = _string(hashed, f"basic_auth_users.{user}")
        if not isinstance(user, str) or not user or ":" in user:
            raise WebConfigError(f"basic_auth_users: {user!r} is not a valid user name")
        if not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise WebConfigError(f"basic_auth_users.{user}: expected a bcrypt hash ($2y$..., from "
                                 "`htpasswd -nBC 10 \"\" | tr -d ':\\n'`)")
        users[user] = hashed.encode()
    if users:
        try:
            import bcrypt  # noqa: F401 (only needed when basic auth is configured)
        except ImportError:
            raise WebConfigError("basic_auth_users needs the bcrypt package (pip install bcrypt)") from None
    return WebSettings(tls=tls, basic_auth_users=users, headers=tuple(headers))


def _parse_tls(section: dict, base_dir: Path) -> Optional[TlsSettings]:
    if not section:
        return None
    if set(section) & _TLS_UNSUPPORTED:
        raise WebConfigError(f"tls_server_config: {', '.join(sorted(set(section) & _TLS_UNSUPPORTED))} not supported "
                             "(use cert_file, key_file, client_ca_file)")
    if set(section) - _TLS_KEYS:
        raise WebConfigError(f"unknown key(s) in tls_server_config: {', '.join(sorted(set(section) - _TLS_KEYS))}")
    if "cert_file" not in section or "key_file" not in section:
        raise WebConfigError("tls_server_config needs both cert_file and key_file")

    def path(key: str) -> Path:
        return base_dir / _string(section[key], f"tls_server_config.{key}")

    auth = section.get("client_auth_type", "NoClientCert")
    if auth in UNVERIFIED_AUTH_TYPES:
        raise WebConfigError(f"client_auth_type {auth} accepts any certificate without verifying it, so it "
                             "authenticates nobody: use RequireAndVerifyClientCert with client_ca_file")
    if auth not in CLIENT_AUTH_TYPES:
        raise WebConfigError(f"client_auth_type: {auth!r} is not one of {', '.join(CLIENT_AUTH_TYPES)}")
    ca = path("client_ca_file") if section.get("client_ca_file") else None
    if ca is not None and auth == "NoClientCert":
        raise WebConfigError("client_ca_file is set but client_auth_type is NoClientCert: set "
                             "RequireAndVerifyClientCert (or VerifyClientCertIfGiven)")
    if ca is None and auth != "NoClientCert":
        raise WebConfigError(f"client_auth_type {auth} needs client_ca_file")
    sans = section.get("client_allowed_sans") or []
    if not isinstance(sans, list) or not all(isinstance(s, str) and s for s in sans):
        raise WebConfigError("client_allowed_sans: expected a list of strings")
    if sans and auth != "RequireAndVerifyClientCert":
        raise WebConfigError("client_allowed_sans needs client_auth_type RequireAndVerifyClientCert")
    versions = {}
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        versions[key] = section.get(key, default)
        if versions[key] not in TLS_VERSIONS:
            raise WebConfigError(f"tls_server_config.{key}: {versions[key]!r} is not one of {', '.join(TLS_VERSIONS)}")
    if TLS_VERSIONS[versions["min_version"]] > TLS_VERSIONS[versions["max_version"]]:
        raise WebConfigError("tls_server_config: min_version is above max_version")
    return TlsSettings(cert_file=path("cert_file"), key_file=path("key_file"), client_ca_file=ca,
                       client_auth_type=auth, client_allowed_sans=frozenset(sans), **versions)


def tls_context(settings: TlsSettings) -> ssl.SSLContext:
    """The server's SSLContext; reads the certificate, key and CA files (errors name the file)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = TLS_VERSIONS[settings.min_version]
    context.maximum_version = TLS_VERSIONS[settings.max_version]
    try:
        context.load_cert_chain(settings.cert_file, settings.key_file)
    except (OSError, ssl.SSLError) as exc:
        raise WebConfigError(f"cannot load cert_file {settings.cert_file} / key_file {settings.key_file}: "
                             f"{exc}") from None
    if settings.client_ca_file is not None:
        try:
            context.load_verify_locations(cafile=settings.client_ca_file)
        except (OSError, ssl.SSLError) as exc:
            raise WebConfigError(f"cannot load client_ca_file {settings.client_ca_file}: {exc}") from None
        # Optional in the handshake even for RequireAndVerifyClientCert: see the module's docstring.
        context.verify_mode = ssl.CERT_OPTIONAL
    return context


class RotatingTls:
    """The TLS context, rebuilt when the certificate, key or CA files change (cert-manager and Secret volumes
    replace them in place). Called for each new connection; looks at the files at most once a second, so an
    idle agent is not woken; a rebuild that fails keeps the previous context and logs why."""

    def __init__(self, settings: TlsSettings, clock: Callable[[], float] = time.monotonic) -> None:
        self._settings, self._clock = settings, clock
        self._stamp = self._stamps()
        self._context = tls_context(settings)
        self._checked = clock()

    def _stamps(self) -> tuple:
        out = []
        for path in (self._settings.cert_file, self._settings.key_file, self._settings.client_ca_file):
            try:
                st = path.stat() if path is not None else None
                out.append((st.st_ino, st.st_mtime_ns, st.st_size) if st else None)
            except OSError:
                out.append("missing")
        return tuple(out)

    def __call__(self) -> ssl.SSLContext:
        now = self._clock()
        if now - self._checked >= 1.0:
            self._checked = now
            stamp = self._stamps()
            if stamp != self._stamp:
                self._stamp = stamp
                try:
                    self._context = tls_context(self._settings)
                    log.info("TLS certificate files changed: reloaded")
                except WebConfigError as exc:
                    log.error("TLS certificate files changed but cannot be loaded, keeping the previous ones: %s",
                              exc)
        return self._context


def load_web_config(path: str) -> tuple[WebSettings, Optional[RotatingTls]]:
    """Read and check `--web-config-file`: the settings, and the TLS context source when it has a
    tls_server_config. Raises WebConfigError naming what is wrong."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise WebConfigError(f"cannot read web config {path}: {exc.strerror or exc}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise WebConfigError(f"web config {path} is not valid YAML: {exc}") from None
    settings = parse_web_config(doc, Path(path).resolve().parent)
    return settings, RotatingTls(settings.tls) if settings.tls else None


class BasicAuth:
    """Checks `Authorization: Basic` against bcrypt hashes without letting clients spend the agent's CPU or
    lock a scraper out.

    A bcrypt check costs about 50-100 ms at cost 10 and over a second at 14. The server asks for it as a
    `Check` (httpserver.py): it runs on the check thread, never on the one that answers `/healthz`, one at a
    time, the client whose last check is oldest first, and beyond each client's first check the checks take
    at most a quarter of one core (Limits.check_cpu_share) whatever the bcrypt cost. Here:
    - `known()`: credentials that passed are remembered (by their SHA-256, as exporter-toolkit caches them),
      so a scraper pays once. Failures are not remembered: a stranger cannot fill the memory and push the
      scraper's entry out, nor make a wrong password cheap to repeat.
    - `admit(client)`: new credentials are checked at most `per_client_per_second` times a second per client
      address (a burst of `burst`): one guessing client is answered 429 without a check and slows no other.
    - `verify()`: the bcrypt check itself (on the check thread)."""

    def __init__(self, users: Mapping[str, bytes], per_client_per_second: float = 1.0, burst: float = 4.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._users = dict(users)
        self._admitted = PerClientRate(per_client_per_second, burst, clock)
        self._passed: OrderedDict[bytes, None] = OrderedDict()  # SHA-256 of credentials that passed
        self._lock = threading.Lock()  # _passed: read on the server's loop, written on its check thread
        self._dummy: Optional[bytes] = None  # checked for unknown users, so timing does not reveal names
        costs = [int(h[4:6]) for h in self._users.values() if h[4:6].isdigit()]
        self._dummy_cost = max(costs, default=10)

    @property
    def unknown_user_cost(self) -> int:
        """The bcrypt cost of the hash checked for a user not in the file: the highest of the users' (10 without
        any), so that how long a check takes does not tell whether a name exists."""
        return self._dummy_cost

    @staticmethod
    def _digest(authorization: str) -> bytes:
        return hashlib.sha256(authorization[6:].strip().encode("latin-1", "replace")).digest()

    def known(self, authorization: Optional[str]) -> Optional[str]:
        """"ok" (passed before), "denied" (no basic credentials), or None: a check is needed. Cheap."""
        if not authorization or authorization[:6].lower() != "basic ":
            return "denied"
        digest = self._digest(authorization)
        with self._lock:
            if digest in self._passed:
                self._passed.move_to_end(digest)
                return "ok"
        return None

    def admit(self, client: str) -> bool:
        """Whether `client` may have new credentials checked now (spends one of its tokens)."""
        return self._admitted.admit(client)

    def verify(self, authorization: str) -> bool:
        """The bcrypt check (on the server's check thread); remembers the credentials when they pass."""
        ok = self._bcrypt(authorization[6:].strip())
        if ok:
            with self._lock:
                self._passed[self._digest(authorization)] = None
                while len(self._passed) > 256:
                    self._passed.popitem(last=False)
        return ok

    def _bcrypt(self, encoded: str) -> bool:
        import bcrypt

        try:
            user, sep, password = base64.b64decode(encoded, validate=True).decode("utf-8").partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        hashed = self._users.get(user) if sep else None
        if hashed is None and self._dummy is None:
            self._dummy = bcrypt.hashpw(b"-", bcrypt.gensalt(self._dummy_cost))
        try:
            ok = bcrypt.checkpw(password.encode(), hashed or self._dummy)
        except ValueError:
            ok = False
        return ok and hashed is not None
