"""The web app's login: Gradio's `auth` callable, `(user, password) -> bool`, comparing in constant
time and refusing a client for a while after too many failures.

Gradio calls the callable without the request, so `ClientOfLogin`, a plain ASGI middleware that
`launch/app/ui.py` puts in front of Gradio's routes, tells it the client's address for each
`/login` request. Behind a reverse proxy every client is the proxy: then the limit is one for
all of them (still a limit, and a lockout an attacker can cause for everyone). No Gradio here.
"""

from __future__ import annotations

import contextlib
import contextvars
import hmac
import logging
import threading
import time

MAX_FAILURES = 5
"""failed logins from one client within WINDOW_S before it is locked out"""
WINDOW_S = 300.0
"""seconds over which failures count"""
LOCKOUT_S = 300.0
"""seconds a locked-out client is refused, right password or not"""

_CLIENT: contextvars.ContextVar[str] = contextvars.ContextVar("login_client", default="unknown")
log = logging.getLogger("homerl.app")


@contextlib.contextmanager
def client(address: str):
    """Attempts inside come from `address` (what ClientOfLogin does for each request)."""
    token = _CLIENT.set(address)
    try:
        yield
    finally:
        _CLIENT.reset(token)


class ClientOfLogin:
    """ASGI middleware: a `/login` request's client address, for LoginGuard."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        path = scope.get("path", "") if scope.get("type") == "http" else ""
        if not path.rstrip("/").endswith("/login"):
            return await self.app(scope, receive, send)
        with client(str((scope.get("client") or ("unknown",))[0])):
            return await self.app(scope, receive, send)


class LoginGuard:
    """`guard(user, password)`: True for the server's login, unless this client failed
    `max_failures` times within `window_s`; then False for `lockout_s`, whatever it sends."""

    def __init__(self, user: str, password: str, max_failures: int = MAX_FAILURES,
                 window_s: float = WINDOW_S, lockout_s: float = LOCKOUT_S):
        self._user, self._password = user.encode(), password.encode()
        self.max_failures, self.window_s, self.lockout_s = max_failures, window_s, lockout_s
        self._failures: dict[str, list[float]] = {}
        self._locked_until: dict[str, float] = {}
        self._lock = threading.Lock()

    def __call__(self, user: str, password: str) -> bool:
        who, now = _CLIENT.get(), time.monotonic()
        with self._lock:
            if self._locked_until.get(who, 0.0) > now:
                return False
            # both compared, in constant time, whichever is wrong
            ok = hmac.compare_digest(user.encode(), self._user) & hmac.compare_digest(
                password.encode(), self._password)
            if ok:
                self._failures.pop(who, None)
                return True
            recent = [t for t in self._failures.get(who, []) if now - t < self.window_s]
            recent.append(now)
            self._failures[who] = recent
            if len(recent) >= self.max_failures:
                self._locked_until[who] = now + self.lockout_s
                self._failures.pop(who)
                log.warning("login: %d failures from %s; refused for %.0f s", len(recent), who,
                            self.lockout_s)
            self._forget(now)
            return False

    def _forget(self, now: float) -> None:
        """Drop old entries, so that many clients cannot grow the tables without bound."""
        if len(self._failures) + len(self._locked_until) < 4096:
            return
        self._failures = {k: v for k, v in self._failures.items() if now - v[-1] < self.window_s}
        self._locked_until = {k: t for k, t in self._locked_until.items() if t > now}
