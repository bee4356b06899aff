"""Where a subscription's notifications go: ``notification.http``, ``httpCustom``, ``mqtt``
or ``mqttCustom``, validated as Orion does (ngsi-v2.md section 3) into a :class:`Channel`.

- ``http``: ``url`` (an http(s) URL to a host of the allow-list), ``timeout``;
- ``httpCustom``: the same plus ``method``, ``headers``, ``qs`` and one body template of
  ``payload``, ``json`` or ``ngsi`` (:mod:`broker.ngsi.templates`); macros in the URL's path
  and query, the header and ``qs`` values, and the body;
- ``mqtt``: ``url`` (``mqtt://host[:port]``, no path; its host in the allow-list), ``topic``
  (required, not empty, without ``+`` or ``#``), ``qos`` (0, 1 or 2; 0 by default),
  ``retain`` (false by default), ``user`` and ``passwd`` (both or neither);
- ``mqttCustom``: the same plus one body template, as httpCustom's; macros in ``topic`` and
  the body (``url``, ``qos``, ``retain``, ``user`` and ``passwd`` are taken as they are).

GET shows ``http`` / ``httpCustom`` as given, and ``mqtt`` / ``mqttCustom`` as Orion does
(:meth:`Channel.shown`): ``url``, ``topic``, ``qos``, ``retain``, then ``user`` and
``passwd`` as ``*****`` when given, then the body template.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from broker.errors import InvalidSubscription
from broker.ngsi.allow import AllowList
from broker.ngsi.errors import NotServed
from broker.ngsi.http_client import check_header
from broker.ngsi.templates import compile_json, compile_ngsi, compile_text, has_macro

__all__ = [
    "CHANNELS",
    "DEFAULT_TIMEOUT_MS",
    "HIDDEN",
    "MAX_TIMEOUT_MS",
    "Channel",
    "Mqtt",
    "checked_object",
    "checked_text",
    "parse_channel",
]

MAX_TIMEOUT_MS = 1_800_000
DEFAULT_TIMEOUT_MS = 5_000
HIDDEN = "*****"  # what GET shows of an MQTT passwd (Orion's)
CHANNELS = ("http", "httpCustom", "mqtt", "mqttCustom", "kafka", "kafkaCustom")
_HTTP = frozenset({"url", "timeout"})
_CUSTOM = frozenset({"url", "headers", "qs", "method", "timeout", "payload", "json", "ngsi"})
_MQTT = frozenset({"url", "topic", "qos", "retain", "user", "passwd"})
_MQTT_CUSTOM = _MQTT | {"payload", "json", "ngsi"}
_BODIES = ("payload", "json", "ngsi")  # the templates of a custom body: one at most
_METHODS = frozenset({"GET", "POST", "PUT", "PATCH", "DELETE"})


@dataclass(frozen=True, slots=True)
class Mqtt:
    """An ``mqtt`` / ``mqttCustom`` channel's MQTT fields (``topic`` may hold macros in
    mqttCustom)."""

    topic: str
    qos: int = 0
    retain: bool = False
    user: str | None = None
    passwd: str | None = None

    def to_list(self) -> list[Any]:
        """The fields as the delivery worker's pipe carries them."""
        return [self.topic, self.qos, self.retain, self.user, self.passwd]

    @classmethod
    def from_list(cls, data: list[Any]) -> Mqtt:
        """The fields from the pipe."""
        topic, qos, retain, user, passwd = data
        return cls(topic, int(qos), bool(retain), user, passwd)


@dataclass(frozen=True, slots=True)
class Channel:
    """Where and how notifications go. ``url``, the header and ``qs`` values (httpCustom)
    or the topic (mqttCustom) may hold macros (:mod:`broker.ngsi.templates`); ``body`` is a
    custom channel's template of the body, if it has one: ``("payload", text or None)``,
    ``("json", object or array)`` or ``("ngsi", entity fragment)``, as given; ``mqtt`` is
    set for an MQTT channel (its ``timeout`` is then the default one)."""

    custom: bool
    url: str
    timeout: float  # seconds
    method: str = "POST"
    headers: tuple[tuple[str, str], ...] = ()
    qs: tuple[tuple[str, str], ...] = ()
    body: tuple[str, Any] | None = None
    mqtt: Mqtt | None = None

    @property
    def kind(self) -> str:
        """Its field in the notification: http, httpCustom, mqtt or mqttCustom."""
        name = "http" if self.mqtt is None else "mqtt"
        return f"{name}Custom" if self.custom else name

    def templated(self) -> bool:
        """Tell whether the URL, a header or a ``qs`` value (HTTP), or the topic
        (mqttCustom), holds a macro: the request's line and headers, or the topic, are then
        made per notification, not once."""
        if self.mqtt is not None:
            return self.custom and has_macro(self.mqtt.topic)
        texts = (self.url, *(v for _k, v in self.headers), *(v for _k, v in self.qs))
        return any(has_macro(t) for t in texts)

    def shown(self, given: dict[str, Any]) -> dict[str, Any]:
        """The channel as GET shows it, from the fields ``given``: HTTP ones as given, MQTT
        ones as Orion shows them (defaults filled, the password hidden)."""
        mqtt = self.mqtt
        if mqtt is None:
            return given
        out: dict[str, Any] = {
            "url": self.url,
            "topic": mqtt.topic,
            "qos": mqtt.qos,
            "retain": mqtt.retain,
        }
        if mqtt.user is not None:
            out["user"] = mqtt.user
            out["passwd"] = HIDDEN
        if self.body is not None:
            out[self.body[0]] = self.body[1]
        return out


def checked_object(value: Any, what: str, keys: frozenset[str]) -> dict[str, Any]:
    """``value`` if it is a JSON object of ``keys`` only (InvalidSubscription otherwise)."""
    if not isinstance(value, dict):
        raise InvalidSubscription(f"{what} must be a JSON object")
    unknown = set(value) - keys
    if unknown:
        raise InvalidSubscription(f"{what}: unrecognized field {sorted(unknown)[0]!r}")
    return value


def checked_text(value: Any, what: str) -> str:
    """``value`` if it is a string (InvalidSubscription otherwise)."""
    if not isinstance(value, str):
        raise InvalidSubscription(f"{what} must be a string")
    return value


def parse_channel(notification: dict[str, Any], allow: AllowList) -> Channel:
    """The channel of a ``notification`` object (InvalidSubscription, or NotServed for
    Kafka)."""
    given = [k for k in notification if k in CHANNELS]
    if len(given) != 1:
        raise InvalidSubscription(
            "notification needs exactly one of http, httpCustom, mqtt and mqttCustom"
        )
    kind = given[0]
    if kind in ("kafka", "kafkaCustom"):
        raise NotServed(f"{kind} notifications are not served by Silbo")
    if kind in ("mqtt", "mqttCustom"):
        return _mqtt(notification[kind], kind, allow)
    if kind == "http":
        http = checked_object(notification["http"], "notification.http", _HTTP)
        url = checked_text(http.get("url"), "notification.http.url")
        allow.check_url(url, "notification.http.url")
        return Channel(False, url, _timeout(http.get("timeout"), "notification.http.timeout"))
    return _http_custom(notification["httpCustom"], allow)


def _http_custom(value: Any, allow: AllowList) -> Channel:
    custom = checked_object(value, "notification.httpCustom", _CUSTOM)
    url = checked_text(custom.get("url"), "notification.httpCustom.url")
    _url_template(url, "notification.httpCustom.url")
    allow.check_url(url, "notification.httpCustom.url")
    method = checked_text(custom.get("method", "POST"), "notification.httpCustom.method").upper()
    if method not in _METHODS:
        raise InvalidSubscription(f"notification.httpCustom.method {method!r} is not a method")
    headers = _headers(custom.get("headers"), "notification.httpCustom.headers")
    qs = _pairs(custom.get("qs"), "notification.httpCustom.qs")
    for key, text in headers:
        compile_text(text, f"notification.httpCustom.headers.{key}")
    for key, text in qs:
        compile_text(text, f"notification.httpCustom.qs.{key}")
    return Channel(
        True,
        url,
        _timeout(custom.get("timeout"), "notification.httpCustom.timeout"),
        method,
        headers,
        qs,
        _body(custom, "httpCustom"),
    )


def _mqtt(value: Any, kind: str, allow: AllowList) -> Channel:
    """An ``mqtt`` or ``mqttCustom`` channel (Orion's checks and words)."""
    custom = kind == "mqttCustom"
    fields = checked_object(value, f"notification.{kind}", _MQTT_CUSTOM if custom else _MQTT)
    what = f"notification.{kind}"
    if "url" not in fields:
        raise InvalidSubscription(f"{what}: mandatory mqtt field /url/")
    url = checked_text(fields["url"], f"{what}.url")
    _mqtt_url(url, f"{what}.url", allow)
    if "topic" not in fields:
        raise InvalidSubscription(f"{what}: mandatory mqtt field /topic/")
    topic = checked_text(fields["topic"], f"{what}.topic")
    if not topic:
        raise InvalidSubscription(f"{what}: empty mqtt field /topic/")
    if "+" in topic or "#" in topic:
        raise InvalidSubscription(f"{what}: + and # are not allowed in mqtt field /topic/")
    if custom:
        compile_text(topic, f"{what}.topic")  # in mqtt, a ${...} is sent as it is (Orion)
    qos = fields.get("qos", 0)
    if isinstance(qos, bool) or qos not in (0, 1, 2):
        raise InvalidSubscription(f"{what}: mqtt qos field must be an integer in the 0 to 2 range")
    retain = fields.get("retain", False)
    if not isinstance(retain, bool):
        raise InvalidSubscription(f"{what}.retain must be true or false")
    user, passwd = fields.get("user"), fields.get("passwd")
    if (user is None) != (passwd is None):
        raise InvalidSubscription(f"{what}: you must use user and passwd fields simultaneously")
    if user is not None:
        checked_text(user, f"{what}.user")
        checked_text(passwd, f"{what}.passwd")
    body = _body(fields, kind) if custom else None
    mqtt = Mqtt(topic, int(qos), retain, user, passwd)
    return Channel(custom, url, DEFAULT_TIMEOUT_MS / 1000, body=body, mqtt=mqtt)


def _mqtt_url(url: str, what: str, allow: AllowList) -> None:
    """Check an MQTT broker's URL: ``mqtt://host[:port]``, its host allowed."""
    try:
        parts = urlsplit(url)
        host, _port = parts.hostname, parts.port  # ValueError for a port that is no number
    except ValueError:
        raise InvalidSubscription(f"{what}: invalid mqtt /url/ {url!r}") from None
    if parts.scheme.lower() in ("http", "https"):
        raise InvalidSubscription(f"{what}: http or https URL cannot be used in mqtt notifications")
    if parts.scheme.lower() != "mqtt" or not host:
        raise InvalidSubscription(f"{what}: invalid mqtt /url/ {url!r} (mqtt://host:port)")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise InvalidSubscription(f"{what}: path cannot be used in mqtt url, use topic instead")
    if not allow.allows(host):
        raise InvalidSubscription(
            f"{what} host {host!r} is not in the notification allow-list "
            "(loopback unless the connection point is started with --notify-allow)"
        )


def _timeout(value: Any, what: str) -> float:
    if value is None:
        return DEFAULT_TIMEOUT_MS / 1000
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TIMEOUT_MS:
        raise InvalidSubscription(f"{what} must be a whole number of ms from 0 to {MAX_TIMEOUT_MS}")
    return (value or DEFAULT_TIMEOUT_MS) / 1000


def _pairs(value: Any, what: str) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
        raise InvalidSubscription(f"{what} must be an object of strings")
    return tuple(value.items())


def _headers(value: Any, what: str) -> tuple[tuple[str, str], ...]:
    pairs = _pairs(value, what)
    for name, text in pairs:
        try:
            check_header(name, text)
        except ValueError as exc:
            raise InvalidSubscription(f"{what}: {exc}") from None
    return pairs


def _url_template(url: str, what: str) -> None:
    """Check the macros of a URL: plain names, and none before its path (the allow-list
    judges the host when the subscription is created: a macro there could send the
    notifications anywhere)."""
    if not has_macro(url):
        return
    compile_text(url, what)
    scheme_end = url.find("://")
    start = scheme_end + 3 if scheme_end >= 0 else 0
    ends = [i for i in (url.find(c, start) for c in "/?#") if i >= 0]
    authority_end = min(ends) if ends else len(url)
    if url.find("${") < authority_end:
        raise InvalidSubscription(
            f"{what}: a macro cannot be in the URL's scheme, host or port (only in its path "
            "and query), so that the notification allow-list can judge the host"
        )


def _body(custom: dict[str, Any], kind: str) -> tuple[str, Any] | None:
    """A custom channel's template of the body (validated, as given), or None (the normal
    body)."""
    given = [k for k in _BODIES if k in custom]
    if len(given) > 1:
        raise InvalidSubscription(
            f"only one of payload, json or ngsi fields accepted at the same time in {kind}"
        )
    if not given:
        return None
    body = given[0]
    value = custom[body]
    what = f"notification.{kind}.{body}"
    if body == "payload":
        if value is not None:
            compile_text(checked_text(value, what), what)
    elif body == "json":
        compile_json(value, what)
    else:
        compile_ngsi(value, what)
    return body, value
