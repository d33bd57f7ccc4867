"""What a finished Job's pod says, as the step's error: the runtime's reason when it says more
than an exit (OOMKilled), and why a container never ran (an image that cannot be pulled)."""

from __future__ import annotations

import datetime as dt

from hypothesis import given
from hypothesis import strategies as st

from reversi.adapters.kube import ended_message, never_ran, pod_trouble


def test_an_oom_kill_is_named_before_its_exit_code():
    assert ended_message(137, "OOMKilled", None) == "OOMKilled: exit code 137"
    assert ended_message(137, "OOMKilled", "partial write\n") == "OOMKilled: partial write"


def test_a_plain_exit_keeps_the_program_s_own_words():
    assert ended_message(3, "Error", "refund refused: 409\n") == "refund refused: 409"
    assert ended_message(3, "Error", "") == "exit code 3"
    assert ended_message(0, "Completed", None) == ""


@given(st.integers(min_value=1, max_value=255), st.sampled_from(["Error", "Completed", None]),
       st.one_of(st.none(), st.text(max_size=40)))
def test_a_failed_exit_never_reads_as_empty(code, reason, message):
    """A non-zero exit always leaves an error to report (never an empty one, read as no error)."""
    assert ended_message(code, reason, message).strip()


def test_a_container_waiting_on_its_image_says_so():
    waiting = [("ImagePullBackOff", 'Back-off pulling image "localhost/x:1"')]
    assert never_ran(waiting) == 'ImagePullBackOff: Back-off pulling image "localhost/x:1"'
    assert never_ran([("ContainerCreating", None)]) is None
    assert never_ran([]) is None


def test_a_pod_that_never_ran_says_its_newest_troubles_with_the_image_named():
    t0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    events = [("Failed", 'Failed to pull image "localhost/x:1": not found', t0),
              ("BackOff", 'Back-off pulling image "localhost/x:1"', t0 + dt.timedelta(seconds=5)),
              ("Failed", "Error: ImagePullBackOff", t0 + dt.timedelta(seconds=6)),
              ("BackOff", 'Back-off pulling image "localhost/x:1"', t0 + dt.timedelta(seconds=4))]
    assert pod_trouble(events) == 'Failed: Error: ImagePullBackOff; BackOff: Back-off pulling image "localhost/x:1"'
    assert pod_trouble(events[:1]) == 'Failed: Failed to pull image "localhost/x:1": not found'
    assert pod_trouble([("Failed", "undated", None)]) == "Failed: undated"
    assert pod_trouble([]) is None


# ------------------------------------------------ Kube.job_view on a fake API: pod truth and unknown effects

T0 = dt.datetime(2026, 12, 1, 10, 0, 0, tzinfo=dt.UTC)
JOB = "rv-abc-0-c1"
POD = f"{JOB}-x7k2p"


class FakeCore:
    """The CoreV1Api calls job_view makes: pods by ``job-name``, Events by field selector, logs;
    counts the LISTs."""

    def __init__(self, pods=(), events=(), log=b""):
        self.pods, self.events, self.log, self.lists = list(pods), list(events), log, 0

    def list_namespaced_pod(self, namespace, label_selector="", **_):
        from kubernetes import client

        self.lists += 1
        return client.V1PodList(items=list(self.pods))

    def list_namespaced_event(self, namespace, field_selector="", **_):
        from kubernetes import client

        self.lists += 1
        want = dict(part.split("=", 1) for part in field_selector.split(","))
        fields = {"involvedObject.kind": lambda e: e.involved_object.kind,
                  "involvedObject.name": lambda e: e.involved_object.name,
                  "reason": lambda e: e.reason, "type": lambda e: e.type}
        return client.CoreV1EventList(items=[e for e in self.events
                                             if all(fields[k](e) == v for k, v in want.items())])

    def read_namespaced_pod_log(self, name, namespace, **_):
        from types import SimpleNamespace

        return SimpleNamespace(data=self.log)


def _kube(core):
    from kubernetes import client

    from reversi.adapters.kube import Kube

    kube = Kube(client.ApiClient())
    kube.core = core
    return kube


def _job(condition="Complete", reason=None, role="compensator", failed=0, succeeded=0):
    from kubernetes import client

    return client.V1Job(
        metadata=client.V1ObjectMeta(name=JOB, namespace="shop", labels={"reversi.dev/role": role}),
        spec=client.V1JobSpec(active_deadline_seconds=60, template=client.V1PodTemplateSpec(spec=client.V1PodSpec(
            containers=[client.V1Container(name=role, image="localhost/tools:1")]))),
        status=client.V1JobStatus(start_time=T0, failed=failed, succeeded=succeeded, conditions=[client.V1JobCondition(
            type=condition, status="True", reason=reason, message="Job has reached the specified backoff limit"
            if reason == "BackoffLimitExceeded" else "Job was active longer than specified deadline" if reason
            else None, last_transition_time=T0 + dt.timedelta(seconds=30))]))


def _pod(state, disrupted=False, role="compensator"):
    from kubernetes import client

    conditions = [client.V1PodCondition(type="DisruptionTarget", status="True", reason="EvictionByEvictionAPI",
                                        message="Eviction API: evicting")] if disrupted else []
    return client.V1Pod(metadata=client.V1ObjectMeta(name=POD, namespace="shop", creation_timestamp=T0),
                        spec=client.V1PodSpec(containers=[client.V1Container(name=role, image="localhost/tools:1")]),
                        status=client.V1PodStatus(conditions=conditions, container_statuses=[client.V1ContainerStatus(
                            name=role, image="localhost/tools:1", image_id="", ready=False, restart_count=0,
                            state=state)]))


def _ended(code, reason="Error", message=None, at=10):
    from kubernetes import client

    return client.V1ContainerState(terminated=client.V1ContainerStateTerminated(
        exit_code=code, reason=reason, message=message, started_at=T0, finished_at=T0 + dt.timedelta(seconds=at)))


def _waiting(reason, message):
    from kubernetes import client

    return client.V1ContainerState(waiting=client.V1ContainerStateWaiting(reason=reason, message=message))


def _event(kind, name, reason, message, etype="Normal", field_path=None):
    from kubernetes import client

    return client.CoreV1Event(metadata=client.V1ObjectMeta(name=f"{name}.{reason}"), reason=reason, message=message,
                              type=etype, last_timestamp=T0, involved_object=client.V1ObjectReference(
                                  kind=kind, name=name, field_path=field_path))


CREATED = _event("Job", JOB, "SuccessfulCreate", f"Created pod: {POD}")


def test_an_evicted_compensator_whose_job_is_complete_did_not_answer():
    """docs/guarantees.md#c-evicted: the Job is Complete, its evicted pod exited 0 on SIGTERM. Pod truth
    reads the pod (one LIST) and does not count it done: a failed attempt with no answer, whose
    call may or may not have taken effect (docs/guarantees.md#c-evicted)."""
    core = FakeCore(pods=[_pod(_ended(0, "Completed"), disrupted=True)])
    view = _kube(core).job_view(_job(), reader=False)
    assert view.state == "failed" and view.lost and view.effect_unknown
    assert "EvictionByEvictionAPI" in view.message and "may or may not have taken effect" in view.message
    assert core.lists == 1


def test_a_complete_compensator_that_nothing_stopped_succeeded_after_one_list():
    core = FakeCore(pods=[_pod(_ended(0, "Completed"))])
    view = _kube(core).job_view(_job(), reader=False)
    assert view.state == "succeeded" and not view.effect_unknown and core.lists == 1


def test_a_complete_compensator_whose_pod_is_gone_is_judged_by_the_kubelets_killing_event():
    """The evicted pod is deleted once the Job controller counted it: the kubelet's ``Killing``
    Event says it stopped the container before the exit 0. No such Event: the Job is trusted."""
    stopped = FakeCore(events=[CREATED, _event("Pod", POD, "Killing", "Stopping container compensator")])
    view = _kube(stopped).job_view(_job(succeeded=1), reader=False)
    assert view.state == "failed" and view.lost and view.effect_unknown
    assert "Stopping container compensator" in view.message
    quiet = FakeCore(events=[CREATED, _event("Pod", POD, "Started", "Started container compensator")])
    assert _kube(quiet).job_view(_job(succeeded=1), reader=False).state == "succeeded"


def test_a_complete_check_or_reader_keeps_its_jobs_verdict():
    """Only a compensator's exit 0 is its answer: a verifyCommand check is not read at all, and a
    reader is judged by what it printed."""
    check = FakeCore(pods=[_pod(_ended(0, "Completed"), disrupted=True)])
    assert _kube(check).job_view(_job(role="check"), reader=False).state == "succeeded" and check.lists == 0
    reader = FakeCore(pods=[_pod(_ended(0, "Completed"), disrupted=True, role="reader")], log=b'{"refunded": true}')
    view = _kube(reader).job_view(_job(role="reader"), reader=True)
    assert view.state == "succeeded" and view.output == '{"refunded": true}'


def test_a_failed_compensator_is_unknown_only_when_its_program_ran_and_did_not_answer():
    deadline = _kube(FakeCore(pods=[_pod(_ended(143, at=61))])).job_view(
        _job("Failed", "DeadlineExceeded", failed=1), reader=False)
    assert deadline.state == "failed" and deadline.effect_unknown and deadline.message.startswith("DeadlineExceeded")
    oom = _kube(FakeCore(pods=[_pod(_ended(137, "OOMKilled"))])).job_view(
        _job("Failed", "BackoffLimitExceeded", failed=1), reader=False)
    assert oom.effect_unknown and not oom.lost and "OOMKilled" in oom.message
    answered = _kube(FakeCore(pods=[_pod(_ended(1, message="refund refused: 409"))])).job_view(
        _job("Failed", "BackoffLimitExceeded", failed=1), reader=False)
    assert not answered.effect_unknown and not answered.lost and answered.message == "refund refused: 409"


def test_a_compensator_that_never_ran_is_not_unknown():
    """Its image could not be pulled, whether its pod is still there or gone (its Warning
    Events say why), or the Job made no pod at all: nothing ran, the effect remains (failed)."""
    pulling = FakeCore(pods=[_pod(_waiting("ErrImagePull", 'pull "localhost/tools:1": not found'))])
    view = _kube(pulling).job_view(_job("Failed", "DeadlineExceeded"), reader=False)
    assert view.lost and not view.effect_unknown and "ErrImagePull" in view.message
    gone = FakeCore(events=[CREATED, _event("Pod", POD, "Failed", "Error: ErrImagePull", "Warning",
                                            "spec.containers{compensator}")])
    view = _kube(gone).job_view(_job("Failed", "DeadlineExceeded", failed=1), reader=False)
    assert view.lost and not view.effect_unknown and "never ran: Failed: Error: ErrImagePull" in view.message
    no_pod = _kube(FakeCore()).job_view(_job("Failed", "DeadlineExceeded"), reader=False)
    assert no_pod.lost and not no_pod.effect_unknown


def test_a_failed_compensator_whose_pod_is_gone_with_nothing_saying_it_never_ran_may_have_acted():
    view = _kube(FakeCore(events=[CREATED])).job_view(_job("Failed", "DeadlineExceeded", failed=1), reader=False)
    assert view.lost and view.effect_unknown
