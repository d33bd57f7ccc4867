"""The API call layer's own logic (reversi.adapters.apicalls): which errors are retried for which
calls, paging with a continue token that expires, conflicts, deletes and creates repeated after a
transient error. The "API" here is a plain function standing for one kubernetes client method
that fails a given number of times: only the retry and paging rules are under test. Everything
that talks to Kubernetes is tested against the real control plane (tests/integration)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pytest
import tenacity
from kubernetes.client.rest import ApiException
from urllib3 import exceptions as http

from reversi.adapters import apicalls as calls

FAST = calls.Policy(attempts=3, first_wait=0.0, max_wait=0.0)


def api_error(status: int, *, message: str = "", name: str = "", kind: str = "runs",
              headers: dict | None = None) -> ApiException:
    err = ApiException(status=status, reason=f"HTTP {status}")
    body: dict[str, Any] = {"kind": "Status", "message": message or f"status {status}"}
    if name:
        body["details"] = {"name": name, "kind": kind}
    err.body = json.dumps(body)
    err.headers = headers or {}
    return err


def unsent_error() -> http.MaxRetryError:
    return http.MaxRetryError(None, "/apis", reason=http.NewConnectionError(None, "connection refused"))


def landed_maybe_error() -> http.ProtocolError:
    return http.ProtocolError("Connection aborted.", ConnectionResetError(104, "reset"))


class Flaky:
    """A client method that raises ``errors`` one by one, then returns ``answer``; it records
    every call's keyword arguments."""

    def __init__(self, *errors: BaseException, answer: Any = None):
        self.errors = list(errors)
        self.answer = {"ok": True} if answer is None else answer
        self.calls: list[dict[str, Any]] = []
        self.__name__ = "flaky"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        if self.errors:
            raise self.errors.pop(0)
        return self.answer


# --------------------------------------------------------------------------- which errors, which calls

@pytest.mark.parametrize("status", [429, 500, 502, 503, 504])
def test_a_read_is_retried_on_a_transient_status_and_passes(status: int) -> None:
    method = Flaky(api_error(status), api_error(status))
    assert calls.call(method, policy=FAST) == {"ok": True}
    assert len(method.calls) == 3


@pytest.mark.parametrize("status", [400, 401, 403, 404, 409, 410, 422])
def test_a_verdict_of_the_server_is_never_retried(status: int) -> None:
    method = Flaky(api_error(status))
    with pytest.raises(ApiException) as raised:
        calls.call(method, policy=FAST)
    assert raised.value.status == status and len(method.calls) == 1


def test_attempts_are_bounded_and_the_last_error_is_raised() -> None:
    method = Flaky(*(api_error(503) for _ in range(10)))
    with pytest.raises(ApiException) as raised:
        calls.call(method, policy=calls.Policy(attempts=4, first_wait=0, max_wait=0))
    assert raised.value.status == 503 and len(method.calls) == 4


def test_connection_errors_are_retried_for_reads() -> None:
    method = Flaky(unsent_error(), landed_maybe_error(), http.ReadTimeoutError(None, "/apis", "read timed out"))
    with pytest.raises(http.ReadTimeoutError):
        calls.call(method, policy=FAST)
    assert len(method.calls) == 3
    assert calls.call(Flaky(unsent_error(), landed_maybe_error()), policy=FAST) == {"ok": True}


@pytest.mark.parametrize("error", [api_error(500), api_error(503), api_error(504), landed_maybe_error(),
                                   http.ReadTimeoutError(None, "/apis", "read timed out")],
                         ids=["500", "503", "504", "reset", "read-timeout"])
def test_a_call_that_may_have_landed_is_not_repeated_when_unsent_only(error: BaseException) -> None:
    method = Flaky(error)
    with pytest.raises(type(error)):
        calls.call(method, repeat="unsent", policy=FAST)
    assert len(method.calls) == 1


NOT_CONFIGURED = ("runsteps.reversi.dev \"r-00000\" is forbidden: ValidatingAdmissionPolicy "
                  "'reversi.dev-runstep-halts' denied request: failed to configure policy: failed to find "
                  "resource referenced by paramKind: 'reversi.dev/v1alpha1, Kind=Halt'")
NOT_SERVED = ("Resource kind reversi.dev/v1alpha1, Kind=RunStep not found. There can be a delay between when "
              "CustomResourceDefinitions are created and when they are available.")


@pytest.mark.parametrize("error", [api_error(429), unsent_error(), http.NewConnectionError(None, "refused"),
                                   api_error(403, message=NOT_CONFIGURED), api_error(503, message=NOT_SERVED)],
                         ids=["429", "max-retry-refused", "refused", "policy-param-not-discovered-yet",
                              "kind-not-served-yet"])
def test_a_call_that_surely_did_not_land_is_repeated_even_when_unsent_only(error: BaseException) -> None:
    method = Flaky(error)
    assert calls.call(method, repeat="unsent", policy=FAST) == {"ok": True}
    assert len(method.calls) == 2


def test_a_policys_own_refusal_is_a_verdict_not_a_kind_not_served_yet() -> None:
    """Only the API server's "not served yet" answers (an install moments ago) are repeated; a
    policy's rule refusing the write is final (docs/operations.md#api-calls-timeouts-paging-conflicts-retries)."""
    lock = api_error(403, message="Run shop/r: run is being rolled back by RollbackRequest u; it takes no new steps")
    method = Flaky(lock)
    with pytest.raises(ApiException):
        calls.call(method, repeat="unsent", policy=FAST)
    assert len(method.calls) == 1
    assert calls.not_yet_served(api_error(403, message=NOT_CONFIGURED))
    assert calls.not_yet_served(api_error(422, message=NOT_CONFIGURED))  # as a 422 too
    assert not calls.not_yet_served(api_error(404, message=NOT_CONFIGURED))
    # a binding whose param kind's informer has not synced yet (a control plane that just started)
    assert calls.not_yet_served(api_error(422, message=(
        "ValidatingAdmissionPolicy 'reversi.dev-runstep-clusterhalts' with binding 'reversi.dev-runstep-clusterhalts' "
        "denied request: failed to configure binding: paramKind kind `&ParamKind{APIVersion:reversi.dev/v1alpha1,"
        "Kind:ClusterHalt,}` not yet synced to use for admission")))


def test_every_call_carries_the_request_timeout() -> None:
    method = Flaky()
    calls.call(method)
    calls.call(method, timeout=4.5)
    calls.call(method, _request_timeout=(1, 2))
    assert [c["_request_timeout"] for c in method.calls] == [calls.TIMEOUT, 4.5, (1, 2)]


def test_a_429_retry_after_is_waited_up_to_the_cap() -> None:
    policy = calls.Policy(attempts=3, first_wait=0.1, max_wait=2.0)

    def waited(err: BaseException, attempt: int = 1) -> float:
        state = tenacity.RetryCallState(tenacity.Retrying(), None, (), {})
        state.attempt_number = attempt
        state.set_exception((type(err), err, None))
        return policy.wait(state)

    assert 1.5 <= waited(api_error(429, headers={"Retry-After": "1.5"})) <= 2.0
    assert waited(api_error(429, headers={"Retry-After": "60"})) == 2.0
    assert waited(api_error(503)) <= 0.1 * 1.25
    assert 0.4 <= waited(api_error(503), attempt=3) <= 0.5
    assert waited(api_error(503), attempt=30) == 2.0


# --------------------------------------------------------------------------- paging

class Pages:
    """A LIST method serving ``total`` items ``limit`` at a time; the continue token of
    ``expire_at`` (a page number) answers 410 Gone ``expirations`` times."""

    def __init__(self, total: int, *, expire_at: int | None = None, expirations: int = 1, typed: bool = False):
        self.total, self.expire_at, self.expirations, self.typed = total, expire_at, expirations, typed
        self.calls: list[dict[str, Any]] = []
        self.snapshot = 100
        self.__name__ = "list_pages"

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append(kwargs)
        start = int(kwargs.get("_continue") or 0)
        if start and start // kwargs["limit"] == self.expire_at and self.expirations:
            self.expirations -= 1
            self.snapshot += 1  # the next LIST is a new snapshot
            raise api_error(410, message="The provided continue parameter is too old")
        end = min(start + kwargs["limit"], self.total)
        items = [{"n": n} for n in range(start, end)]
        token = str(end) if end < self.total else None
        if self.typed:
            return SimpleNamespace(items=items, metadata=SimpleNamespace(_continue=token,
                                                                         resource_version=str(self.snapshot)))
        return {"items": items, "metadata": {"continue": token, "resourceVersion": str(self.snapshot)}}


@pytest.mark.parametrize("typed", [False, True], ids=["dict", "typed"])
def test_a_list_is_read_page_by_page(typed: bool) -> None:
    method = Pages(1203, typed=typed)
    items, version = calls.list_all(method, page=500, policy=FAST)
    assert [i["n"] for i in items] == list(range(1203))
    assert version == "100"
    assert [(c["limit"], c.get("_continue")) for c in method.calls] == [(500, None), (500, "500"), (500, "1000")]
    assert all(c["_request_timeout"] == calls.TIMEOUT for c in method.calls)


def test_keep_keeps_a_projection_of_each_item_and_drops_none() -> None:
    method = Pages(1203)
    items, _ = calls.list_all(method, page=500, policy=FAST, keep=lambda i: i["n"] * 2 if i["n"] % 100 == 0 else None)
    assert items == [n * 2 for n in range(0, 1203, 100)]
    assert len(method.calls) == 3  # still every page


def test_an_expired_continue_token_lists_again_from_the_start() -> None:
    method = Pages(1203, expire_at=2)
    items, version = calls.list_all(method, page=500, policy=FAST)
    assert [i["n"] for i in items] == list(range(1203))  # no page twice, none missing
    assert version == "101"  # the snapshot of the LIST that completed
    assert [c.get("_continue") for c in method.calls] == [None, "500", "1000", None, "500", "1000"]


def test_relists_are_bounded() -> None:
    method = Pages(1203, expire_at=1, expirations=100)
    with pytest.raises(ApiException) as raised:
        calls.list_all(method, page=500, policy=FAST, relists=2)
    assert raised.value.status == 410
    assert [c.get("_continue") for c in method.calls] == [None, "500"] * 3


def test_a_410_on_the_first_page_is_not_a_continue_expiry() -> None:
    method = Flaky(api_error(410, message="too old resource version"))
    with pytest.raises(ApiException):
        calls.list_all(method, page=10, policy=FAST, resource_version="5")
    assert len(method.calls) == 1


def test_a_page_failing_on_the_way_is_retried_without_starting_over() -> None:
    pages = Pages(30)
    failures = [api_error(503)]

    def method(*args: Any, **kwargs: Any) -> Any:
        if kwargs.get("_continue") == "10" and failures:
            raise failures.pop()
        return pages(*args, **kwargs)

    items, _ = calls.list_all(method, page=10, policy=FAST)
    assert [i["n"] for i in items] == list(range(30))
    assert [c.get("_continue") for c in pages.calls] == [None, "10", "20"]


def test_resource_version_applies_to_the_first_page_only() -> None:
    method = Pages(25)
    calls.list_all(method, page=10, policy=FAST, resource_version="0", resource_version_match="NotOlderThan")
    assert method.calls[0]["resource_version"] == "0"
    assert all("resource_version" not in c and "resource_version_match" not in c for c in method.calls[1:])


def test_a_raw_answer_is_parsed() -> None:
    raw = SimpleNamespace(data=json.dumps({"items": [{"n": 1}], "metadata": {"resourceVersion": "7"}}).encode())
    assert calls.list_all(Flaky(answer=raw), policy=FAST) == ([{"n": 1}], "7")


# --------------------------------------------------------------------------- custom objects

class Custom:
    """The CustomObjectsApi methods the helpers call, each a :class:`Flaky`."""

    def __init__(self, **methods: Flaky):
        for name in ("get_namespaced_custom_object", "get_cluster_custom_object", "create_namespaced_custom_object",
                     "create_cluster_custom_object", "patch_namespaced_custom_object",
                     "patch_namespaced_custom_object_status", "patch_cluster_custom_object",
                     "patch_cluster_custom_object_status", "delete_namespaced_custom_object",
                     "delete_cluster_custom_object"):
            setattr(self, name, methods.get(name) or Flaky())


def test_get_is_none_on_404_and_read_raises_it() -> None:
    custom = Custom(get_namespaced_custom_object=Flaky(api_error(503), api_error(404, name="r")))
    assert calls.get(custom, "runs", "r", "ns", policy=FAST) is None  # type: ignore[arg-type]
    with pytest.raises(ApiException):
        calls.read(Custom(get_cluster_custom_object=Flaky(api_error(404))), "clusterhalts", "h",  # type: ignore[arg-type]
                   policy=FAST)


@pytest.mark.parametrize("error", [api_error(409), api_error(422, message=calls.FAILED_TEST)], ids=["409", "test"])
def test_a_lost_race_is_a_conflict(error: ApiException) -> None:
    custom = Custom(patch_namespaced_custom_object_status=Flaky(error))
    with pytest.raises(calls.Conflict) as raised:
        calls.patch(custom, "runs", "r", {"status": {}}, "ns", status=True, policy=FAST)  # type: ignore[arg-type]
    assert raised.value.error is error


def test_a_validation_error_is_not_a_conflict() -> None:
    custom = Custom(patch_namespaced_custom_object=Flaky(api_error(422, message="spec.mode: Unsupported value")))
    with pytest.raises(ApiException):
        calls.patch(custom, "runs", "r", [], "ns", json_patch=True, policy=FAST)  # type: ignore[arg-type]
    assert custom.patch_namespaced_custom_object.calls[0]["_content_type"] == calls.JSON_PATCH  # type: ignore[attr-defined]


def test_a_patch_repeated_after_it_landed_is_a_conflict_for_the_caller_to_read_again() -> None:
    custom = Custom(patch_namespaced_custom_object_status=Flaky(api_error(504), api_error(409)))
    with pytest.raises(calls.Conflict):
        calls.patch(custom, "runs", "r", {"metadata": {"resourceVersion": "1"}}, "ns", status=True,  # type: ignore[arg-type]
                    policy=FAST)
    unsent_only = Custom(patch_namespaced_custom_object=Flaky(api_error(504)))
    with pytest.raises(ApiException):
        calls.patch(unsent_only, "halts", "h", {}, "ns", repeat="unsent", policy=FAST)  # type: ignore[arg-type]
    assert len(unsent_only.patch_namespaced_custom_object.calls) == 1  # type: ignore[attr-defined]


def test_delete() -> None:
    gone = Custom(delete_namespaced_custom_object=Flaky(api_error(404, name="r")))
    assert calls.delete(gone, "runs", "r", "ns", policy=FAST) is False  # type: ignore[arg-type]
    landed = Custom(delete_namespaced_custom_object=Flaky(api_error(503), api_error(404, name="r")))
    assert calls.delete(landed, "runs", "r", "ns", policy=FAST) is True  # type: ignore[arg-type]
    assert calls.delete(Custom(), "clusterhalts", "h", policy=FAST) is True  # type: ignore[arg-type]
    no_kind = Custom(delete_namespaced_custom_object=Flaky(api_error(404)))  # the CRD is not installed
    with pytest.raises(ApiException):
        calls.delete(no_kind, "runs", "r", "ns", policy=FAST)  # type: ignore[arg-type]


def test_a_create_is_repeated_only_when_exists_means_done_or_it_surely_did_not_land() -> None:
    landed = Custom(create_namespaced_custom_object=Flaky(api_error(503), api_error(409, name="r")))
    assert calls.create(landed, "runs", {}, "ns", exists_ok=True, policy=FAST) is None  # type: ignore[arg-type]
    assert len(landed.create_namespaced_custom_object.calls) == 2  # type: ignore[attr-defined]

    once = Custom(create_namespaced_custom_object=Flaky(api_error(503)))
    with pytest.raises(ApiException):
        calls.create(once, "runsteps", {}, "ns", policy=FAST)  # type: ignore[arg-type]
    assert len(once.create_namespaced_custom_object.calls) == 1  # type: ignore[attr-defined]

    throttled = Custom(create_cluster_custom_object=Flaky(api_error(429), unsent_error(), answer={"kind": "X"}))
    assert calls.create(throttled, "clusterhalts", {}, policy=FAST) == {"kind": "X"}  # type: ignore[arg-type]

    taken = Custom(create_namespaced_custom_object=Flaky(api_error(409, name="r")))
    with pytest.raises(ApiException):
        calls.create(taken, "runsteps", {}, "ns", policy=FAST)  # type: ignore[arg-type]


def test_not_found_names_the_object() -> None:
    assert calls.not_found(api_error(404, name="r"), "r")
    assert not calls.not_found(api_error(404), "r")
    assert not calls.not_found(api_error(404, name="r", kind="namespaces"), "r")
    assert not calls.not_found(api_error(403, name="r"), "r")


# --------------------------------------------------------------------------- an admission gap

WEBHOOK_DOWN = ('Internal error occurred: failed calling webhook "mutate-runstep.reversi.dev": failed to call '
                'webhook: Post "https://127.0.0.1:9443/mutate-runstep?timeout=10s": dial tcp 127.0.0.1:9443: '
                'connect: connection refused')


def test_a_write_refused_because_no_webhook_answered_never_landed_and_is_tried_again():
    """The API server refuses a write it could not send to an admission webhook (500, "failed
    calling webhook"): it never reached storage, so even a create whose repetition could record
    twice ("unsent") is tried again; a webhook's refusal by a rule, or another 500, is not."""
    gap = api_error(500, message=WEBHOOK_DOWN)
    assert calls.admission_unreachable(gap) and calls.unsent(gap)
    assert not calls.admission_unreachable(api_error(500, message="etcdserver: request timed out"))
    assert not calls.unsent(api_error(500, message="etcdserver: request timed out"))
    assert not calls.admission_unreachable(api_error(403, message='admission webhook "x" denied the request: '
                                                                  "kill switch: stop"))
    create = Flaky(gap, gap, answer={"created": True})
    assert calls.call(create, repeat="unsent", policy=FAST) == {"created": True} and len(create.calls) == 3


def test_the_recording_policy_bounds_an_admission_gap_by_time_not_attempts():
    """RECORDING waits out a gap of up to 30 s (many short waits, at most 1 s each), then raises
    the last refusal: a gap costs the agent latency, within a bound."""
    policy = calls.RECORDING
    assert policy.deadline == 30.0 and policy.max_wait <= 1.0 and policy.attempts >= policy.deadline / policy.max_wait
    short = calls.Policy(attempts=1000, first_wait=0.01, max_wait=0.01, deadline=0.2)
    always_down = Flaky(*[api_error(500, message=WEBHOOK_DOWN)] * 1000)
    with pytest.raises(ApiException):
        calls.call(always_down, repeat="unsent", policy=short)
    assert 5 < len(always_down.calls) < 100, "stopped by the deadline, not by the attempts"


class Discovery:
    """A stand-in for ``CustomObjectsApi.get_api_resources``: serves ``served`` (group/version ->
    resource names) from the ``after``-th call on; before that the API server is down."""

    def __init__(self, served: dict[str, list[str]], after: int = 0):
        self.served, self.after, self.asked = served, after, 0

    def get_api_resources(self, group: str, version: str, **_: Any) -> Any:
        self.asked += 1
        if self.asked <= self.after:
            raise http.NewConnectionError(None, "connection refused")
        names = self.served.get(f"{group}/{version}")
        if names is None:
            raise api_error(404)
        return SimpleNamespace(resources=[SimpleNamespace(name=n) for n in names])


WATCHED = (("batch", "v1", "jobs"), ("reversi.dev", "v1alpha1", "rollbackrequests"))


def test_the_operator_starts_its_watches_only_once_the_api_server_serves_what_it_watches() -> None:
    """kopf resolves the kinds it watches once, at start (docs/operations.md): a start while the API
    server is down or its discovery incomplete waits until every watched kind is served."""
    late = Discovery({"batch/v1": ["jobs"], "reversi.dev/v1alpha1": ["runs", "rollbackrequests"]}, after=3)
    assert calls.wait_until_served(late, 10, WATCHED) == []
    assert late.asked > 3
    incomplete = Discovery({"batch/v1": ["jobs"], "reversi.dev/v1alpha1": ["runs"]})
    assert calls.wait_until_served(incomplete, 0.6, WATCHED) == ["rollbackrequests.reversi.dev/v1alpha1"]
    assert calls.wait_until_served(Discovery({"batch/v1": ["jobs"]}), 0.1, WATCHED) == [
        "rollbackrequests.reversi.dev/v1alpha1"]
