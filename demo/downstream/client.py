"""A small typed client (urllib, stdlib only) for the demo downstream server (server.py).

The demo agent uses it for its forward calls; tests use the admin helpers.

    from demo.downstream.client import Client, DownstreamError
    ds = Client("http://127.0.0.1:8080", timeout=5)
    charge = ds.create_charge("o-4711", 700, "cus_9", idempotency_key="o-4711")
    capture = ds.capture(charge["id"], timeout=1.0)

Errors
  TimeoutError     no answer within the timeout: the effect is unknown (outcome ``uncertain``)
  ConnectionError  the server could not be reached or the connection broke
  DownstreamError  the server answered with an HTTP error (``.status``, ``.code``, ``.message``)

Every method takes ``timeout`` (seconds; default: the client's) and every POST takes
``idempotency_key`` (sent as the ``Idempotency-Key`` header; a repeat returns the first answer).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, TypedDict


class Charge(TypedDict):
    id: str
    order_id: str
    amount: int
    customer: str
    status: str            # "succeeded" | "refunded"
    refunded: bool
    amount_refunded: int
    captured: bool


class Refund(TypedDict):
    id: str
    charge_id: str
    amount: int
    status: str            # "succeeded"


class Capture(TypedDict):
    id: str
    charge_id: str
    amount: int
    status: str            # "captured" | "voided"


class Customer(TypedDict):
    id: str
    name: str
    email: str
    charges: list[str]


class Reservation(TypedDict):
    id: str
    sku: str
    qty: int
    order_id: str
    status: str            # "held" | "released"


class Stock(TypedDict):
    sku: str
    available: int
    held: int


class Email(TypedDict):
    id: str
    to: str
    subject: str
    body: str
    status: str            # "sent"


class DownstreamError(Exception):
    """The server answered with an HTTP error status."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"HTTP {status} {code}: {message}")
        self.status, self.code, self.message = status, code, message



class Client:
    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    # -- transport --------------------------------------------------------------------------

    def request(self, method: str, path: str, body: dict | None = None, *,
                idempotency_key: str | None = None, timeout: float | None = None) -> Any:
        headers = {"Accept": "application/json"}
        data = None
        if method == "POST":
            data = json.dumps(body or {}).encode()
            headers["Content-Type"] = "application/json"
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        req = urllib.request.Request(self.base_url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout if timeout is None else timeout) as resp:
                return json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as e:
            raw = e.read().decode(errors="replace")
            try:
                err = json.loads(raw)
                raise DownstreamError(e.code, err.get("code", "error"), err.get("error", raw)) from None
            except (ValueError, AttributeError):
                raise DownstreamError(e.code, "error", raw) from None
        except TimeoutError:
            raise TimeoutError(f"{method} {path}: no answer in time") from None
        except urllib.error.URLError as e:
            if isinstance(e.reason, TimeoutError):
                raise TimeoutError(f"{method} {path}: no answer in time") from None
            raise ConnectionError(f"{method} {path}: {e.reason}") from None
        except (ConnectionError, OSError) as e:
            raise ConnectionError(f"{method} {path}: {e}") from None

    def _post(self, path: str, body: dict | None, key: str | None, timeout: float | None) -> Any:
        return self.request("POST", path, body, idempotency_key=key, timeout=timeout)

    def _get(self, path: str, timeout: float | None) -> Any:
        return self.request("GET", path, timeout=timeout)

    @staticmethod
    def _q(value: str) -> str:
        return urllib.parse.quote(value, safe="")

    # -- payments ---------------------------------------------------------------------------

    def create_charge(self, order_id: str, amount: int, customer: str, *,
                      idempotency_key: str | None = None, timeout: float | None = None) -> Charge:
        return self._post("/payments/charges",
                          {"order_id": order_id, "amount": amount, "customer": customer},
                          idempotency_key, timeout)

    def get_charge(self, charge_id: str, *, timeout: float | None = None) -> Charge:
        return self._get(f"/payments/charges/{self._q(charge_id)}", timeout)

    def refund(self, charge_id: str, amount: int | None = None, *,
               idempotency_key: str | None = None, timeout: float | None = None) -> Refund:
        body: dict[str, Any] = {"charge_id": charge_id}
        if amount is not None:
            body["amount"] = amount
        return self._post("/payments/refunds", body, idempotency_key, timeout)

    def capture(self, charge_id: str, *, idempotency_key: str | None = None,
                timeout: float | None = None) -> Capture:
        return self._post("/payments/captures", {"charge_id": charge_id}, idempotency_key, timeout)

    def void_capture(self, capture_id: str, *, idempotency_key: str | None = None,
                     timeout: float | None = None) -> Capture:
        return self._post(f"/payments/captures/{self._q(capture_id)}/void", None,
                          idempotency_key, timeout)

    def get_capture(self, capture_id: str, *, timeout: float | None = None) -> Capture:
        return self._get(f"/payments/captures/{self._q(capture_id)}", timeout)

    def get_customer(self, customer_id: str, *, timeout: float | None = None) -> Customer:
        return self._get(f"/payments/customers/{self._q(customer_id)}", timeout)

    # -- inventory --------------------------------------------------------------------------

    def reserve(self, sku: str, qty: int, order_id: str, *, idempotency_key: str | None = None,
                timeout: float | None = None) -> Reservation:
        return self._post("/inventory/reservations",
                          {"sku": sku, "qty": qty, "order_id": order_id}, idempotency_key, timeout)

    def release(self, reservation_id: str, *, idempotency_key: str | None = None,
                timeout: float | None = None) -> Reservation:
        return self._post(f"/inventory/reservations/{self._q(reservation_id)}/release", None,
                          idempotency_key, timeout)

    def get_reservation(self, reservation_id: str, *, timeout: float | None = None) -> Reservation:
        return self._get(f"/inventory/reservations/{self._q(reservation_id)}", timeout)

    def get_stock(self, sku: str, *, timeout: float | None = None) -> Stock:
        return self._get(f"/inventory/stock/{self._q(sku)}", timeout)

    # -- email ------------------------------------------------------------------------------

    def send_email(self, to: str, subject: str, body: str = "", *,
                   idempotency_key: str | None = None, timeout: float | None = None) -> Email:
        return self._post("/email/send", {"to": to, "subject": subject, "body": body},
                          idempotency_key, timeout)

    def outbox(self, *, timeout: float | None = None) -> list[Email]:
        return self._get("/email/outbox", timeout)["messages"]

    # -- test hooks -------------------------------------------------------------------------

    def inject_fault(self, path_prefix: str, mode: str, times: int = 1, delay_s: float = 3.0) -> Any:
        """mode "timeout": effect happens, answer after delay_s; "error": 500, no effect."""
        return self._post("/_faults", {"path_prefix": path_prefix, "mode": mode, "times": times,
                                       "delay_s": delay_s}, None, None)

    def state(self) -> dict[str, Any]:
        return self._get("/_state", None)

    def reset(self, stock: dict[str, int] | None = None,
              customers: dict[str, dict[str, str]] | None = None) -> Any:
        body: dict[str, Any] = {}
        if stock is not None:
            body["stock"] = stock
        if customers is not None:
            body["customers"] = customers
        return self._post("/_reset", body, None, None)
