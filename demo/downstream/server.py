#!/usr/bin/env python3
"""Downstream systems for the Reversi demo and integration tests: payments, inventory, email.

One stdlib HTTP server process (JSON in, JSON out) with real state, persisted to a JSON file
after every change (written to a temporary file, fsynced, then renamed over the old one), so a
restart keeps charges, reservations, the outbox and the idempotency keys.

Usage::

    python demo/downstream/server.py --port 0 --state /tmp/downstream.json [--host 127.0.0.1] [--quiet]

With ``--port 0`` a free port is picked. The first stdout line is always
``listening on http://HOST:PORT``. Request logs go to stderr (``--quiet`` silences them).
Without ``--state`` the state lives in memory only.

Endpoints (every success is HTTP 200 with a JSON object; errors are
``{"error": "<message>", "code": "<bad_request|not_found|conflict|injected_fault|...>"}``)

payments
  POST /payments/charges              {order_id, amount, customer}
                                      -> {id: "ch_…", status: "succeeded", amount, refunded: false,
                                          amount_refunded: 0, captured: false, order_id, customer}
                                      (an unknown customer is created on first charge)
  GET  /payments/charges/{id}         -> the charge
  POST /payments/refunds              {charge_id, amount?}  (amount defaults to the full charge)
                                      -> {id: "re_…", charge_id, amount, status: "succeeded"};
                                      the charge becomes refunded: true, status: "refunded".
                                      Refunding an already refunded charge: 409.
  POST /payments/captures             {charge_id} -> {id: "cap_…", charge_id, amount, status: "captured"}
                                      (409 if the charge is refunded or already has a standing capture)
  POST /payments/captures/{id}/void   -> the capture with status: "voided" (409 if already voided)
  GET  /payments/captures/{id}        -> the capture
  GET  /payments/customers/{id}       -> {id, name, email, charges: [charge ids]}

inventory
  POST /inventory/reservations        {sku, qty, order_id} -> {id: "res_…", sku, qty, order_id, status: "held"}
                                      (404 unknown sku, 409 not enough stock)
  POST /inventory/reservations/{id}/release
                                      -> the reservation with status: "released"; stock restored
                                      (409 if already released)
  GET  /inventory/reservations/{id}   -> the reservation
  GET  /inventory/orders/{order_id}/reservation -> the newest reservation for that order (404: none)
  GET  /inventory/stock/{sku}         -> {sku, available, held}

email (irreversible)
  POST /email/send                    {to, subject, body?} -> {id: "msg_…", to, subject, body, status: "sent"}
  GET  /email/outbox                  -> {messages: [...]}

Idempotency: every POST honours an ``Idempotency-Key`` header. Keys are scoped to the request
path. A repeat with a known key returns the first (successful) answer unchanged, with header
``Idempotent-Replayed: true``, and changes nothing. Only successful answers are stored, so a
refused or failed call can be retried with the same key.

Test hooks (never faulted themselves)
  POST /_faults  {path_prefix, mode: "timeout"|"hold"|"error", times: 1, delay_s: 3, skip: 0}
                 After ``skip`` matching calls pass untouched, the next ``times`` calls whose path
                 starts with ``path_prefix`` (any method):
                 ``timeout`` does the call (the effect happens) and answers only after
                 ``delay_s`` seconds; ``hold`` does the call and answers once a test releases it
                 (``POST /_release``), at the latest after ``delay_s`` seconds; ``error`` answers
                 500 without any effect. Faults are kept in memory only. -> {faults: [...]}
  POST /_release {path_prefix}  -> answers every call held by a ``hold`` fault of that prefix,
                 now and later (the fault's remaining calls are not held) -> {released: N}
  GET  /_state   -> every collection, the idempotency store, the pending faults and ``calls``:
                 every successful POST in order ({at, path, key, replayed}), so a test can
                 count how often an effect really happened
  POST /_reset   {stock?: {sku: qty}, customers?: {id: {name, email}}}  -> back to the seed state
                 (default seed below, or the given stock/customers); clears faults.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import secrets
import signal
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from collections.abc import Callable

DEFAULT_STOCK: dict[str, int] = {"sku-mug": 10, "sku-shirt": 5, "sku-poster": 1}
DEFAULT_CUSTOMERS: dict[str, dict[str, str]] = {
    "cus_9": {"name": "Ada Lovelace", "email": "ada@example.com"},
    "cus_1": {"name": "Grace Hopper", "email": "grace@example.com"},
}


class HTTPError(Exception):
    """A refusal with an HTTP status; raised by handlers, turned into a JSON error answer."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(6)}"


def _require(body: dict, name: str, kind: type | tuple[type, ...] = str) -> Any:
    value = body.get(name)
    if value is None:
        raise HTTPError(400, "bad_request", f"missing field {name!r}")
    if not isinstance(value, kind) or isinstance(value, bool):
        raise HTTPError(400, "bad_request", f"field {name!r} has the wrong type")
    return value


def _positive_int(body: dict, name: str) -> int:
    value = _require(body, name, int)
    if value <= 0:
        raise HTTPError(400, "bad_request", f"field {name!r} must be a positive integer")
    return value


def seed_state(stock: dict[str, int] | None = None,
               customers: dict[str, dict[str, str]] | None = None) -> dict[str, Any]:
    """The state of a fresh server."""
    stock = DEFAULT_STOCK if stock is None else stock
    customers = DEFAULT_CUSTOMERS if customers is None else customers
    return {
        "charges": {},
        "refunds": {},
        "captures": {},
        "customers": {cid: {"id": cid, "name": c.get("name", cid), "email": c.get("email", ""),
                            "charges": []} for cid, c in customers.items()},
        "reservations": {},
        "stock": {sku: {"sku": sku, "available": int(n), "held": 0} for sku, n in stock.items()},
        "outbox": [],
        "idempotency": {},
    }


class Store:
    """All state, guarded by one lock, saved atomically after each change."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self.lock = threading.RLock()
        self.faults: list[dict[str, Any]] = []
        #: path prefix of a ``hold`` fault -> set once a test releases its calls
        self.holds: dict[str, threading.Event] = {}
        self.state = seed_state()
        if path and os.path.exists(path):
            with open(path, encoding="utf-8") as f:
                self.state = json.load(f)

    def save(self) -> None:
        if not self.path:
            return
        directory = os.path.dirname(os.path.abspath(self.path))
        fd, tmp = tempfile.mkstemp(prefix=".downstream-", suffix=".json", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(self.state, f, indent=1, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise

    def take_fault(self, path: str) -> dict[str, Any] | None:
        """Consume one pending fault matching ``path``, if any."""
        with self.lock:
            for fault in self.faults:
                if path.startswith(fault["path_prefix"]) and fault["times"] > 0:
                    if fault.get("skip", 0) > 0:  # let this many matching calls through first
                        fault["skip"] -= 1
                        return None
                    fault["times"] -= 1
                    self.faults = [f for f in self.faults if f["times"] > 0]
                    return dict(fault)
        return None

    # -- lookups ----------------------------------------------------------------------------

    def _get(self, collection: str, key: str, what: str) -> dict[str, Any]:
        item = self.state[collection].get(key)
        if item is None:
            raise HTTPError(404, "not_found", f"{what} {key} not found")
        return item

    def reservation_of(self, order_id: str) -> dict[str, Any]:
        """The newest reservation made for ``order_id`` (a lookup by what the caller sent)."""
        found = [r for r in self.state["reservations"].values() if r.get("order_id") == order_id]
        if not found:
            raise HTTPError(404, "not_found", f"no reservation for order {order_id}")
        return max(found, key=lambda r: r.get("created", 0))

    # -- payments ---------------------------------------------------------------------------

    def create_charge(self, body: dict) -> dict:
        order_id = _require(body, "order_id")
        amount = _positive_int(body, "amount")
        customer = _require(body, "customer")
        customers = self.state["customers"]
        if customer not in customers:
            customers[customer] = {"id": customer, "name": customer, "email": "", "charges": []}
        charge = {"id": _new_id("ch"), "order_id": order_id, "amount": amount,
                  "customer": customer, "status": "succeeded", "refunded": False,
                  "amount_refunded": 0, "captured": False, "created": time.time()}
        self.state["charges"][charge["id"]] = charge
        customers[customer]["charges"].append(charge["id"])
        return charge

    def refund(self, body: dict) -> dict:
        charge = self._get("charges", _require(body, "charge_id"), "charge")
        amount = charge["amount"] if body.get("amount") is None else _positive_int(body, "amount")
        if charge["refunded"]:
            raise HTTPError(409, "conflict", f"charge {charge['id']} is already refunded")
        if amount > charge["amount"]:
            raise HTTPError(400, "bad_request",
                            f"refund amount {amount} exceeds charge amount {charge['amount']}")
        refund = {"id": _new_id("re"), "charge_id": charge["id"], "amount": amount,
                  "status": "succeeded", "created": time.time()}
        self.state["refunds"][refund["id"]] = refund
        charge.update(refunded=True, status="refunded", amount_refunded=amount)
        return refund

    def capture(self, body: dict) -> dict:
        charge = self._get("charges", _require(body, "charge_id"), "charge")
        if charge["refunded"]:
            raise HTTPError(409, "conflict", f"charge {charge['id']} is refunded")
        if charge["captured"]:
            raise HTTPError(409, "conflict", f"charge {charge['id']} is already captured")
        capture = {"id": _new_id("cap"), "charge_id": charge["id"], "amount": charge["amount"],
                   "status": "captured", "created": time.time()}
        self.state["captures"][capture["id"]] = capture
        charge["captured"] = True
        return capture

    def void_capture(self, capture_id: str) -> dict:
        capture = self._get("captures", capture_id, "capture")
        if capture["status"] == "voided":
            raise HTTPError(409, "conflict", f"capture {capture_id} is already voided")
        capture["status"] = "voided"
        charge = self.state["charges"].get(capture["charge_id"])
        if charge is not None:
            charge["captured"] = False
        return capture

    # -- inventory --------------------------------------------------------------------------

    def reserve(self, body: dict) -> dict:
        sku = _require(body, "sku")
        qty = _positive_int(body, "qty")
        order_id = _require(body, "order_id")
        stock = self._get("stock", sku, "sku")
        if stock["available"] < qty:
            raise HTTPError(409, "conflict",
                            f"not enough stock for {sku}: {stock['available']} available, {qty} asked")
        stock["available"] -= qty
        stock["held"] += qty
        reservation = {"id": _new_id("res"), "sku": sku, "qty": qty, "order_id": order_id,
                       "status": "held", "created": time.time()}
        self.state["reservations"][reservation["id"]] = reservation
        return reservation

    def release(self, reservation_id: str) -> dict:
        reservation = self._get("reservations", reservation_id, "reservation")
        if reservation["status"] == "released":
            raise HTTPError(409, "conflict", f"reservation {reservation_id} is already released")
        reservation["status"] = "released"
        stock = self.state["stock"][reservation["sku"]]
        stock["available"] += reservation["qty"]
        stock["held"] -= reservation["qty"]
        return reservation

    # -- email ------------------------------------------------------------------------------

    def send_email(self, body: dict) -> dict:
        message = {"id": _new_id("msg"), "to": _require(body, "to"),
                   "subject": _require(body, "subject"), "body": body.get("body", ""),
                   "status": "sent", "created": time.time()}
        self.state["outbox"].append(message)
        return message


# Routes: (method, path regex, handler(store, path groups, body) -> answer, mutates state).
Route = tuple[str, "re.Pattern[str]", Callable[[Store, tuple, dict], dict], bool]
ROUTES: list[Route] = [
    ("POST", re.compile(r"/payments/charges"), lambda s, g, b: s.create_charge(b), True),
    ("GET", re.compile(r"/payments/charges/([^/]+)"),
     lambda s, g, b: s._get("charges", g[0], "charge"), False),
    ("POST", re.compile(r"/payments/refunds"), lambda s, g, b: s.refund(b), True),
    ("POST", re.compile(r"/payments/captures"), lambda s, g, b: s.capture(b), True),
    ("POST", re.compile(r"/payments/captures/([^/]+)/void"),
     lambda s, g, b: s.void_capture(g[0]), True),
    ("GET", re.compile(r"/payments/captures/([^/]+)"),
     lambda s, g, b: s._get("captures", g[0], "capture"), False),
    ("GET", re.compile(r"/payments/customers/([^/]+)"),
     lambda s, g, b: s._get("customers", g[0], "customer"), False),
    ("POST", re.compile(r"/inventory/reservations"), lambda s, g, b: s.reserve(b), True),
    ("POST", re.compile(r"/inventory/reservations/([^/]+)/release"),
     lambda s, g, b: s.release(g[0]), True),
    ("GET", re.compile(r"/inventory/reservations/([^/]+)"),
     lambda s, g, b: s._get("reservations", g[0], "reservation"), False),
    ("GET", re.compile(r"/inventory/orders/([^/]+)/reservation"),
     lambda s, g, b: s.reservation_of(g[0]), False),
    ("GET", re.compile(r"/inventory/stock/([^/]+)"),
     lambda s, g, b: s._get("stock", g[0], "sku"), False),
    ("POST", re.compile(r"/email/send"), lambda s, g, b: s.send_email(b), True),
    ("GET", re.compile(r"/email/outbox"), lambda s, g, b: {"messages": s.state["outbox"]}, False),
]


class Handler(BaseHTTPRequestHandler):
    _held: str | None = None  # the path prefix of the hold fault this request took, if any
    server_version = "reversi-downstream/1"
    store: Store  # set on the subclass made by make_server
    quiet = False

    def do_GET(self) -> None:
        self._handle("GET")

    def do_POST(self) -> None:
        self._handle("POST")

    def log_message(self, format: str, *args: Any) -> None:  # stdlib signature
        if not self.quiet:
            super().log_message(format, *args)

    # -- plumbing ---------------------------------------------------------------------------

    def _send(self, status: int, body: dict, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (headers or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the caller gave up (e.g. a client timeout during an injected delay)

    def _read_body(self) -> dict:
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if not raw.strip():
            return {}
        try:
            body = json.loads(raw)
        except ValueError:
            raise HTTPError(400, "bad_request", "body is not valid JSON") from None
        if not isinstance(body, dict):
            raise HTTPError(400, "bad_request", "body must be a JSON object")
        return body

    def _handle(self, method: str) -> None:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        try:
            body = self._read_body() if method == "POST" else {}
            if path.startswith("/_"):
                self._send(200, self._admin(method, path, body))
                return
            status, answer, headers, delay = self._route(method, path, body)
        except HTTPError as e:
            self._send(e.status, {"error": e.message, "code": e.code})
            return
        held = self.store.holds.get(self._held) if self._held else None
        if held is not None:
            held.wait(delay)
        elif delay:
            time.sleep(delay)
        self._send(status, answer, headers)

    def _route(self, method: str, path: str, body: dict) -> tuple[int, dict, dict, float]:
        store = self.store
        for route_method, pattern, fn, mutates in ROUTES:
            match = pattern.fullmatch(path)
            if not match:
                continue
            if route_method != method:
                continue
            fault = store.take_fault(path)
            self._held = fault["path_prefix"] if fault and fault["mode"] == "hold" else None
            if fault and fault["mode"] == "error":
                raise HTTPError(500, "injected_fault", f"injected fault on {path}")
            delay = float(fault["delay_s"]) if fault else 0.0
            key = self.headers.get("Idempotency-Key") if method == "POST" else None
            with store.lock:
                calls = store.state.setdefault("calls", [])
                if key:
                    stored = store.state["idempotency"].get(f"{path} {key}")
                    if stored is not None:
                        calls.append({"at": time.time(), "path": path, "key": key, "replayed": True})
                        store.save()
                        return stored["status"], stored["body"], {"Idempotent-Replayed": "true"}, delay
                answer = copy.deepcopy(fn(store, match.groups(), body))
                if mutates:
                    calls.append({"at": time.time(), "path": path, "key": key, "replayed": False})
                    if key:
                        store.state["idempotency"][f"{path} {key}"] = {"status": 200, "body": answer}
                    store.save()
            return 200, answer, {}, delay
        if any(p.fullmatch(path) for _, p, _, _ in ROUTES):
            raise HTTPError(405, "method_not_allowed", f"{method} not allowed on {path}")
        raise HTTPError(404, "not_found", f"no endpoint {method} {path}")

    def _admin(self, method: str, path: str, body: dict) -> dict:
        store = self.store
        with store.lock:
            if (method, path) == ("GET", "/_state"):
                return {**copy.deepcopy(store.state), "faults": copy.deepcopy(store.faults)}
            if (method, path) == ("POST", "/_faults"):
                mode = body.get("mode")
                if mode not in ("timeout", "hold", "error"):
                    raise HTTPError(400, "bad_request", "mode must be 'timeout', 'hold' or 'error'")
                if mode == "hold":
                    store.holds[str(body.get("path_prefix", "/"))] = threading.Event()
                store.faults.append({"path_prefix": str(body.get("path_prefix", "/")),
                                     "mode": mode, "times": int(body.get("times", 1)),
                                     "delay_s": float(body.get("delay_s", 3)),
                                     "skip": int(body.get("skip", 0))})
                return {"faults": copy.deepcopy(store.faults)}
            if (method, path) == ("POST", "/_release"):
                event = store.holds.get(str(body.get("path_prefix", "/")))
                if event is not None:
                    event.set()
                return {"released": int(event is not None)}
            if (method, path) == ("POST", "/_reset"):
                store.state = seed_state(body.get("stock"), body.get("customers"))
                store.faults = []
                for event in store.holds.values():
                    event.set()
                store.holds = {}
                store.save()
                return {"reset": True}
        raise HTTPError(404, "not_found", f"no endpoint {method} {path}")


def make_server(host: str, port: int, state_path: str | None, quiet: bool = False) -> ThreadingHTTPServer:
    """Build (not start) a server; handy for in-process use."""
    store = Store(state_path)
    handler = type("BoundHandler", (Handler,), {"store": store, "quiet": quiet})
    server = ThreadingHTTPServer((host, port), handler)
    server.daemon_threads = True
    if state_path and not os.path.exists(state_path):
        store.save()
    return server


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=0, help="port; 0 picks a free one (default 0)")
    parser.add_argument("--state", help="JSON file the state is kept in (default: memory only)")
    parser.add_argument("--quiet", action="store_true", help="no request logs on stderr")
    args = parser.parse_args(argv)
    server = make_server(args.host, args.port, args.state, args.quiet)
    host, port = server.server_address[:2]
    print(f"listening on http://{host}:{port}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
