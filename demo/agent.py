"""The demo's checkout agent: eight real calls, each recorded through the SDK as a RunStep of its Run.

    python demo/agent.py --namespace reversi-demo --run order-4711 --downstream http://127.0.0.1:PORT

Calls (step: tool): 0 payments.get_customer (read), 1 payments.create_charge, 2 inventory.reserve
(dependsOn step 1: the mug is held for this charge), 3 payments.capture (requires the charge; its
undo needs approval), 4 inventory.reserve of a poster (times out: the effect is unknown, so the
step is recorded uncertain), 5 email.send (irreversible), 6 inventory.get_stock (read),
7 payments.create_charge of the shipping fee. Prints one line per call.

When a halt refuses a call, or the shop refuses one (an order id used before, no stock), the agent
stops with one line that says so (exit 1) and leaves the run as it is; a poster out of stock is
recorded as failed and the agent goes on. Anything else that stops it is one line too, naming the
log file that holds the traceback. The agent never rolls its own run back: it holds only the rights
of an agent that records (the chart's ``<fullname>-record`` role, docs/operations.md#an-agents-rights),
and the rollback of a failed run belongs to the on-call engineer (``kubectl reversi rollback``),
who sees what the agent did before deciding what to undo.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import traceback
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from demo.downstream.client import Client, DownstreamError
from reversi.sdk import Halted, RecordingRefused, Recorder


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--namespace", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--manifest", default="shop-tools")
    p.add_argument("--downstream", required=True)
    p.add_argument("--kubeconfig", default=None)
    p.add_argument("--order", default="o-4711", help="order id (use a new one for each run: the shop remembers keys)")
    p.add_argument("--log", type=Path, default=None,
                   help="where a failure's traceback goes (default: reversi-agent-RUN.log in the temp folder)")
    args = p.parse_args()
    log = args.log or Path(tempfile.gettempdir()) / f"reversi-agent-{args.run}.log"
    try:
        return record(args)
    except Exception as err:  # noqa: BLE001 - one line for a person, the traceback for the log
        log.write_text(traceback.format_exc())
        first = str(err).strip().splitlines()[0] if str(err).strip() else ""
        print(f"  agent  failed: {type(err).__name__}: {first} (traceback in {log}); the run is left as it is "
              f"for on call: kubectl reversi describe run {args.run} -n {args.namespace}", flush=True)
        return 1


def record(args: argparse.Namespace) -> int:
    """Open the run and make the calls; 0 when all were made, 1 when a refusal stopped them."""
    shop = Client(args.downstream, timeout=5)
    # an HTTP error answer means the shop refused the call: nothing happened (failed); anything
    # else going wrong (a timeout, a dropped connection) leaves the effect unknown (uncertain).
    try:
        rec = Recorder.open(args.namespace, args.run, manifest=args.manifest, kubeconfig=args.kubeconfig,
                            scope={"actor": "checkout-agent", "tenant": "acme", "environment": "prod"},
                            failed_errors=(DownstreamError,))
    except RecordingRefused as err:
        print(f"  agent  the API server refused to open the run: {err}", flush=True)
        return 1
    left = (f"the run is left for on call (kubectl reversi describe run {args.run} -n {args.namespace}; "
            "its rollback is theirs)")
    try:
        return checkout(rec, shop, args.order)
    except Halted as err:
        print(f"  agent  halted, no further calls: {err}; {left}", flush=True)
    except RecordingRefused as err:
        print(f"  agent  the API server refused to record the next call: {err}; {left}", flush=True)
    except DownstreamError as err:
        print(f"  agent  the shop refused a call ({err}), recorded as failed; use a new --order for a new run",
              flush=True)
    if rec.steps_recorded == 0:
        print(f"  agent  Run {args.namespace}/{args.run} recorded no call: delete it to use the name again "
              f"(kubectl delete run {args.run} -n {args.namespace}; an agent may not delete runs)", flush=True)
    return 1


def checkout(rec: Recorder, shop: Client, order: str) -> int:
    """The agent's eight calls, recorded through ``rec``."""
    def say(step: int, text: str) -> None:
        print(f"  agent  step {step}: {text}", flush=True)

    customer = rec.call("payments.get_customer", {"id": "cus_9"}, lambda a: shop.get_customer(a["id"]))
    say(0, f"read customer {customer['id']}")
    with rec.step("payments.create_charge", {"order_id": order, "amount": 4200, "customer": "cus_9"}) as step:
        step.result = charge = shop.create_charge(order, 4200, "cus_9", idempotency_key=order)
    charge_step = step.index  # the reservation below depends on this step
    say(1, f"charged {charge['amount']} ({charge['id']})")
    with rec.step("inventory.reserve", {"sku": "sku-mug", "qty": 2, "order_id": order},
                  depends_on=[charge_step]) as step:
        step.result = mug = shop.reserve("sku-mug", 2, order, idempotency_key=order + "-mug")
    say(2, f"reserved 2 mugs ({mug['id']}), depends on the charge")
    capture = rec.call("payments.capture", {"charge_id": charge["id"]},
                       lambda a: shop.capture(a["charge_id"], idempotency_key=order + "-capture"))
    say(3, f"captured the charge ({capture['id']})")
    try:
        poster = rec.call("inventory.reserve", {"sku": "sku-poster", "qty": 1, "order_id": order + "-poster"},
                          lambda a: shop.reserve(a["sku"], a["qty"], a["order_id"], idempotency_key=a["order_id"],
                                                 timeout=1.0))
        say(4, f"reserved a poster ({poster['id']})")
    except TimeoutError as err:
        say(4, f"reserving a poster timed out ({err}): recorded as uncertain")
    except DownstreamError as err:
        if err.status != 409 or "not enough stock" not in err.message:
            raise
        say(4, "no poster in stock: recorded as failed (nothing happened)")
    rec.call("email.send", {"to": "ada@example.com", "subject": f"Your order {order}"},
             lambda a: shop.send_email(a["to"], a["subject"]))
    say(5, "sent the order confirmation email")
    stock = rec.call("inventory.get_stock", {"sku": "sku-mug"}, lambda a: shop.get_stock(a["sku"]))
    say(6, f"read stock of mugs: {stock['available']} available")
    fee = rec.call("payments.create_charge", {"order_id": order + "-shipping", "amount": 500, "customer": "cus_9"},
                   lambda a: shop.create_charge(a["order_id"], a["amount"], a["customer"],
                                                idempotency_key=a["order_id"]))
    say(7, f"charged the shipping fee ({fee['id']})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
