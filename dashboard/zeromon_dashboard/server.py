"""Serving the dashboard: the bearer-token rule of the agents' endpoint, a path prefix whether or not
the reverse proxy strips it, and a threaded WSGI server whose start-up errors are the user's to read
(a port in use, an address that is not this machine's), not a traceback.

Token: when one is set (``--token`` or ZEROMON_TOKEN), every request needs it, as
``Authorization: Bearer <token>`` (the scheme in any case) or as the ``zeromon_token`` cookie. A
browser cannot send a header from an address bar, so ``?token=<token>`` on any page sets the cookie
(HttpOnly, SameSite=Strict, for the prefix) and redirects to the same page without it.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
import socket
from collections.abc import Callable, Iterable
from http.cookies import SimpleCookie
from typing import Any
from urllib.parse import parse_qsl, urlencode

COOKIE = "zeromon_token"
Environ = dict[str, Any]
StartResponse = Callable[..., Any]
Wsgi = Callable[[Environ, StartResponse], Iterable[bytes]]


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class PrefixMiddleware:
    """Serves ``app`` under ``prefix`` ('/user/x/proxy/8050/'): a request whose path starts with it has it
    removed (a proxy that passes the whole path), one without it is served as it is (a proxy that strips
    it, as jupyter-server-proxy does). Dash is told the prefix for the URLs it writes into the page."""

    def __init__(self, app: Wsgi, prefix: str) -> None:
        self.app = app
        self.prefix = "/" + prefix.strip("/") if prefix.strip("/") else ""

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "") or "/"
        if self.prefix and (path == self.prefix or path.startswith(self.prefix + "/")):
            environ["PATH_INFO"] = path[len(self.prefix):] or "/"
            environ["SCRIPT_NAME"] = environ.get("SCRIPT_NAME", "") + self.prefix
        return self.app(environ, start_response)


class TokenMiddleware:
    def __init__(self, app: Wsgi, token: str, cookie_path: str = "/") -> None:
        self.app = app
        self.token = token
        self.cookie_path = cookie_path

    def _ok(self, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), self.token.encode())

    def __call__(self, environ: Environ, start_response: StartResponse) -> Iterable[bytes]:
        query = parse_qsl(environ.get("QUERY_STRING", ""), keep_blank_values=True)
        given_in_query = next((v for k, v in query if k == "token"), None)
        if given_in_query is not None and self._ok(given_in_query):
            rest = urlencode([(k, v) for k, v in query if k != "token"])
            location = environ.get("SCRIPT_NAME", "") + (environ.get("PATH_INFO") or "/") + (f"?{rest}" if rest else "")
            cookie = f"{COOKIE}={self.token}; Path={self.cookie_path}; HttpOnly; SameSite=Strict"
            start_response("303 See Other", [("Location", location), ("Set-Cookie", cookie),
                                             ("Content-Length", "0")])
            return [b""]
        scheme, _, credentials = environ.get("HTTP_AUTHORIZATION", "").partition(" ")
        if scheme.lower() == "bearer" and self._ok(credentials.strip()):
            return self.app(environ, start_response)
        cookies = SimpleCookie(environ.get("HTTP_COOKIE", ""))
        if COOKIE in cookies and self._ok(cookies[COOKIE].value):
            return self.app(environ, start_response)
        body = json.dumps({"error": "this zeromon dashboard requires a token: open it once with ?token=<token>, "
                                    "or send Authorization: Bearer <token>"}).encode()
        start_response("401 Unauthorized", [("Content-Type", "application/json"), ("Content-Length", str(len(body))),
                                            ("WWW-Authenticate", 'Bearer realm="zeromon"')])
        return [body]


def wsgi_app(app: Any, prefix: str, token: str | None) -> Wsgi:
    """The Dash app's server wrapped: the token checked first, then the prefix."""
    inner: Wsgi = PrefixMiddleware(app.server.wsgi_app, prefix)
    if token:
        cookie_path = "/" + prefix.strip("/") if prefix.strip("/") else "/"
        inner = TokenMiddleware(inner, token, cookie_path)
    return inner


def make_server(app: Any, host: str, port: int, prefix: str = "/", token: str | None = None) -> Any:
    """A threaded werkzeug server, bound (OSError if it cannot be); ``serve_forever()`` runs it."""
    from werkzeug.serving import WSGIRequestHandler
    from werkzeug.serving import make_server as werkzeug_server

    class QuietHandler(WSGIRequestHandler):
        """No line per request (a live page posts a few a second); errors are still printed."""

        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            if str(code).startswith("5"):
                super().log_request(code, size)

    return werkzeug_server(host, port, wsgi_app(app, prefix, token), threaded=True, request_handler=QuietHandler)


def describe_bind_error(host: str, port: int, exc: OSError) -> str:
    import errno

    if exc.errno == errno.EADDRINUSE:
        return f"--port {port}: already in use on {host} (another dashboard?); give another port, or 0 for any free one"
    if isinstance(exc, socket.gaierror) or exc.errno == errno.EADDRNOTAVAIL:
        return f"--host {host}: not an address of this machine ({exc.strerror or exc})"
    return f"--host {host} --port {port}: cannot listen there ({exc.strerror or exc})"
