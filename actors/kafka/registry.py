"""The schema registry of ``[kafka] format = "avro"``, over its Confluent-compatible REST API
(Confluent Schema Registry, Apicurio Registry's ``/apis/ccompat/v7``, Karapace, Redpanda).

Rules:

* Blocking calls (``urllib``), run in a worker thread by the sink; each request has the
  configured timeout. Basic auth and TLS (CA bundle, client certificate) as configured.
* ``register`` returns the schema's id under the subject (registering it when
  ``auto_register``; else looking it up, ``SchemaNotRegistered`` when absent). Before a
  subject's first registration its compatibility level is set when one is configured and
  the subject has none of its own (a level an operator set is kept).
* A 409 (the registry refuses the schema as incompatible) raises ``SchemaIncompatible`` with
  the subject's compatibility level; 401/403 raise ``RegistryRejected``; anything the
  network or a 5xx does raises ``RegistryUnavailable`` (the sink retries those).
* Messages name the registry by its URL without credentials.
"""

from __future__ import annotations

import base64
import json
import ssl
import urllib.parse

from router.errors import SinkError, SinkRejected, SinkUnavailable


class RegistryUnavailable(SinkUnavailable):
    """The registry did not answer (network, timeout, 5xx): retried."""


class RegistryRejected(SinkRejected):
    """The registry refused the request (authentication, permission, a bad schema)."""


class SchemaIncompatible(RegistryRejected):
    def __init__(self, message: str, *, subject: str, level: str):
        super().__init__(message)
        self.subject = subject
        self.level = level


class SchemaNotRegistered(RegistryRejected):
    """``auto_register = false`` and the subject does not hold the schema."""


def _where(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{host}{port}{parts.path}"


def _shown(location: str | None) -> str:
    """Where a redirect pointed, without credentials or query."""
    try:
        return _where(location or "") if urllib.parse.urlsplit(location or "").hostname \
            else (urllib.parse.urlsplit(location or "").path or "?")
    except ValueError:
        return "an invalid URL"


def _opener(context):
    """urllib's opener that follows no redirect (imported here: ``urllib.request`` and the
    HTTP and e-mail modules it loads are a router start's only for a route writing Avro)."""
    import urllib.request

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req, fp, code, msg, headers, newurl):
            return None
    return urllib.request.build_opener(NoRedirect, urllib.request.HTTPSHandler(context=context))


class RegistryClient:
    def __init__(self, cfg):
        """``cfg``: the ``[kafka.registry]`` table (``router.config.router.RegistryConfig``)."""
        self.base = cfg.url.rstrip("/")
        self.where = _where(self.base)
        self.timeout = cfg.timeout
        self.auto_register = cfg.auto_register
        self.compatibility = cfg.compatibility
        self._headers = {"Content-Type": "application/vnd.schemaregistry.v1+json",
                         "Accept": "application/vnd.schemaregistry.v1+json, application/json"}
        if cfg.username or cfg.password:
            token = base64.b64encode(f"{cfg.username}:{cfg.password}".encode()).decode()
            self._headers["Authorization"] = f"Basic {token}"
        self._context = None
        if self.base.startswith("https://"):
            self._context = ssl.create_default_context(cafile=cfg.ssl_ca_location or None)
            if cfg.ssl_certificate_location:
                self._context.load_cert_chain(cfg.ssl_certificate_location,
                                              cfg.ssl_key_location or None)
        self._configured: set[str] = set()
        # redirects are answers, never followed: urllib would send the Authorization header
        # on to whatever host the answer names (a login page's, a proxy's)
        self._opener = _opener(self._context)

    # -- HTTP -------------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: dict | None = None):
        """(status, decoded JSON body or None)."""
        import urllib.error
        import urllib.request

        url = self.base + path
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method, headers=self._headers)
        try:
            with self._opener.open(req, timeout=self.timeout) as r:
                return r.status, _json(r.read(), _content_type(r.headers))
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                raise RegistryRejected(
                    f"schema registry {self.where} answered {exc.code} to {method} {path}, "
                    f"redirecting to {_shown(exc.headers.get('Location'))} (not followed: "
                    "the credentials go only to the url configured; give the url the "
                    "registry answers at itself)") from None
            status, answer = exc.code, _json(exc.read(), _content_type(exc.headers))
            if status >= 500:
                raise RegistryUnavailable(f"schema registry {self.where} answered {status} to "
                                          f"{method} {path}: {_message(answer)}") from None
            if status in (401, 403):
                raise RegistryRejected(f"schema registry {self.where} refused the credentials "
                                       f"({status}): {_message(answer)}") from None
            return status, answer
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise RegistryUnavailable(f"schema registry {self.where} unreachable: "
                                      f"{reason}") from None

    # -- API --------------------------------------------------------------------------------

    def register(self, subject: str, schema: str) -> int:
        """The id of the Avro ``schema`` (JSON text) under ``subject``."""
        path = "/subjects/" + urllib.parse.quote(subject, safe="")
        if not self.auto_register:
            status, answer = self._call("POST", path, {"schema": schema, "schemaType": "AVRO"})
            if status == 200 and isinstance(answer, dict) and "id" in answer:
                return int(answer["id"])
            raise SchemaNotRegistered(
                f"subject {subject!r} of schema registry {self.where} does not hold the "
                "schema pgrouter writes and auto_register = false: register it first "
                f"({_message(answer)})")
        if self.compatibility and subject not in self._configured:
            self._configured.add(subject)
            config = "/config/" + urllib.parse.quote(subject, safe="")
            status, answer = self._call("GET", config)
            if status == 200:  # the subject has a level of its own: an operator's, kept
                status = None
            else:
                status, answer = self._call("PUT", config,
                                            {"compatibility": self.compatibility})
            if status not in (None, 200):
                raise RegistryRejected(f"schema registry {self.where} refused compatibility "
                                       f"{self.compatibility} for {subject!r}: "
                                       f"{_message(answer)}")
        status, answer = self._call("POST", path + "/versions",
                                    {"schema": schema, "schemaType": "AVRO"})
        if status == 200 and isinstance(answer, dict) and "id" in answer:
            return int(answer["id"])
        if status == 409:
            level = self.compatibility_of(subject)
            raise SchemaIncompatible(f"{_message(answer)}", subject=subject, level=level)
        raise RegistryRejected(f"schema registry {self.where} refused a schema for "
                               f"{subject!r} ({status}): {_message(answer)}")

    def compatibility_of(self, subject: str) -> str:
        """The subject's compatibility level (the registry's default when it has none)."""
        for path in ("/config/" + urllib.parse.quote(subject, safe="") + "?defaultToGlobal=true",
                     "/config"):
            try:
                status, answer = self._call("GET", path)
            except SinkError:
                return "unknown"
            if status == 200 and isinstance(answer, dict):
                level = answer.get("compatibilityLevel") or answer.get("compatibility")
                if level:
                    return level
        return "unknown"

    def latest(self, subject: str) -> str | None:
        """The subject's latest schema text (None when it has none or the registry does not
        say)."""
        try:
            status, answer = self._call("GET", "/subjects/" + urllib.parse.quote(
                subject, safe="") + "/versions/latest")
        except SinkError:
            return None
        if status == 200 and isinstance(answer, dict):
            return answer.get("schema")
        return None

    def schema(self, schema_id: int) -> str:
        """The schema text with this id (for readers: decode, apply, materialize)."""
        status, answer = self._call("GET", f"/schemas/ids/{int(schema_id)}")
        if status == 200 and isinstance(answer, dict) and "schema" in answer:
            return answer["schema"]
        raise RegistryRejected(f"schema registry {self.where} has no schema with id "
                               f"{schema_id} ({status}: {_message(answer)})")

    def ping(self) -> None:
        """Raises unless the registry answers as one: ``GET /subjects`` is a JSON list (a
        login page or a proxy's answer with status 200 is not a registry)."""
        status, answer = self._call("GET", "/subjects")
        hint = "is the url its Confluent-compatible API (Apicurio: /apis/ccompat/v7)?"
        if status != 200:
            raise RegistryRejected(f"schema registry {self.where} answered {status} to GET "
                                   f"/subjects: {_message(answer)}; {hint}")
        if not isinstance(answer, list):
            raise RegistryRejected(f"schema registry {self.where} answered 200 {_what(answer)} "
                                   f"to GET /subjects, not a list of subjects; {hint}")


def _content_type(headers) -> str:
    return (headers.get("Content-Type") or "").partition(";")[0].strip()


class NotJson(str):
    """A body that is not JSON, as ``<content type>: <its start>`` on one line."""


def _json(raw: bytes, content_type: str = ""):
    try:
        return json.loads(raw) if raw else None
    except ValueError:
        start = " ".join(raw[:200].decode(errors="replace").split())
        return NotJson(f"{content_type or 'no content type'}: {start!r}")


def _what(answer) -> str:
    """What a 200 held instead of the expected JSON (its type, or the body's start)."""
    if isinstance(answer, NotJson) or answer is None:
        return f"({answer or 'an empty body'})"
    return f"(JSON {type(answer).__name__}: {_message(answer)[:100]})"


def _message(answer) -> str:
    if isinstance(answer, dict):
        return str(answer.get("message") or answer.get("detail") or answer)[:300]
    return str(answer)[:300]


class AvroDecoder:
    """pgrouter's Avro records as its JSON envelope (``router.formats.avro_read``), each schema
    fetched from the registry by id once. Values that are not Avro pass through as they are."""

    def __init__(self, client: RegistryClient):
        from router.formats.avro_read import AvroReader

        self.client = client
        self.reader = AvroReader()

    def _learn(self, value: bytes) -> None:
        from router.formats.avro_read import schema_id

        sid = schema_id(value)
        if not self.reader.knows(sid):
            self.reader.learn(sid, self.client.schema(sid))

    def envelope(self, value: bytes) -> dict:
        self._learn(value)
        return self.reader.envelope(value)

    def key(self, value: bytes) -> dict:
        self._learn(value)
        return self.reader.key(value)

    def unknown(self, values) -> set[int]:
        """Schema ids of the Avro ``values`` not fetched yet."""
        from router.formats.avro_read import is_avro, schema_id

        return {sid for sid in (schema_id(v) for v in values if is_avro(v))
                if not self.reader.knows(sid)}

    def fetch(self, ids) -> None:
        for sid in ids:
            self.reader.learn(sid, self.client.schema(sid))

    def to_json(self, value: bytes | None, *, updates: bool = False) -> bytes | None:
        """``value`` as pgrouter's JSON envelope (as it is when it is not Avro; None for
        the delete half of a key change with ``updates``)."""
        from router.formats.avro_read import is_avro

        if not is_avro(value):
            return value
        self._learn(value)
        return self.reader.to_json(value, updates=updates)


def decoder_for(registry_cfg) -> AvroDecoder | None:
    """The decoder readers use for ``[kafka.registry]`` (None when there is none)."""
    return None if registry_cfg is None else AvroDecoder(RegistryClient(registry_cfg))
