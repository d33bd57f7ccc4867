"""Every operator knob in one typed object (kopf's ``OperatorSettings`` style).

Read from ``REVERSI_*`` environment variables (``REVERSI_NAMESPACES=shop,billing``,
``REVERSI_METRICS_PORT=8080``); the entry point's flags override them.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import NoDecode
from pydantic_settings import BaseSettings, SettingsConfigDict


class OperatorSettings(BaseSettings):
    """Operator settings. Times in seconds, ports on all interfaces unless a host is given."""

    model_config = SettingsConfigDict(env_prefix="REVERSI_", extra="ignore")

    namespaces: Annotated[list[str], NoDecode] = Field(
        default_factory=list, description="Namespaces to watch; empty: the whole cluster.")
    tick_seconds: float = Field(1.0, gt=0, le=60, description="How often a running request looks at its Jobs.")
    workers: int = Field(
        4, ge=1, le=64,
        description="Threads that run reconcile passes of RollbackRequests (a fixed pool fed by a keyed work queue; "
                    "however many requests are active, the operator runs this many passes at once at most).")
    handler_threads: int = Field(
        8, ge=1, le=64,
        description="Threads kopf runs the event and admission handlers in (settings.execution.max_workers); each "
                    "handler call is short and every API call it makes has a timeout.")
    admission_threads: int = Field(
        32, ge=1, le=256,
        description="Threads reversi-admission answers reviews in (its kopf handler threads): a review mostly waits "
                    "on the API server, so one replica answers this many at once.")
    malloc_arenas: int = Field(
        2, ge=0, le=64,
        description="glibc malloc arenas of the operator process (mallopt M_ARENA_MAX; 0: glibc's default of 8 per "
                    "core). Threads share them, so the resident memory does not grow with each thread's free lists; "
                    "the MALLOC_ARENA_MAX environment variable, when set, wins.")
    gauge_refresh_seconds: float = Field(30.0, gt=0, description="How often gauges are recomputed from the API.")
    run_status_quiet_seconds: float = Field(
        1.0, ge=0, le=300,
        description="A Run's observedGeneration and Ready are brought up to date once it has not changed for this "
                    "long (one status write per burst of edits).")
    job_ttl_seconds: int = Field(3600, ge=60, description="ttlSecondsAfterFinished of compensator and reader Jobs.")
    job_run_as_user: int = Field(65532, ge=1, description="Non-root user id of compensator and reader pods.")
    metrics_port: int = Field(8080, ge=0, le=65535, description="Prometheus /metrics port (0: off).")
    health_port: int = Field(
        0, ge=0, le=65535,
        description="kopf's liveness endpoint, http://0.0.0.0:<port>/healthz (0: off; the chart sets 8081).")
    api_timeout_seconds: float = Field(
        30.0, gt=0, le=600, description="Timeout of every API request the operator makes (reads, writes, lists).")
    webhook_port: int = Field(9443, ge=1, le=65535, description="Admission webhook HTTPS port.")
    webhook_host: str = Field("0.0.0.0", description="Address the webhook server listens on.")
    webhook_cert: str | None = Field(None, description="PEM serving certificate of the webhook server.")
    webhook_key: str | None = Field(None, description="PEM private key of the webhook server.")
    record_webhook: str = Field(
        "reversi.dev-record", min_length=1, max_length=253,
        description="Name of the recording webhook's ValidatingWebhookConfiguration, whose match condition the "
                    "operator keeps naming the users open Runs record (docs/concepts.md#recording-with-no-agent-code; "
                    "the chart's: <release>-record).")
    webhook_configure: bool = Field(
        False, description="Let the operator make its own certificate (unless webhook_cert is set) and "
        "webhook configurations pointing at webhook_url_host (local control plane, development).")
    webhook_url_host: str = Field("127.0.0.1", description="Host the API server calls when webhook_configure is on.")
    webhook_cert_dir: str | None = Field(
        None, description="Where webhook_configure writes its CA and serving certificate (default: a temp folder).")
    webhook_headers_seconds: float = Field(
        10.0, gt=0, le=300,
        description="A webhook connection's TLS handshake and request headers must arrive within this many seconds of "
                    "its accept, or it is dropped (reversi_webhook_connections_dropped_total{reason=\"headers\"}).")
    webhook_idle_seconds: float = Field(
        60.0, gt=0, le=3600,
        description="A kept-alive webhook connection is dropped when the next request's headers do not arrive within "
                    "this many seconds of the last answer (reason=\"idle\").")
    webhook_body_seconds: float = Field(
        30.0, gt=0, le=300,
        description="A review's body must arrive within this many seconds of its headers, or the connection is dropped "
                    "(reason=\"body\").")
    lease_name: str = Field(
        "reversi-operator", min_length=1, max_length=253,
        description="The coordination.k8s.io Lease the operator's replicas elect their one active replica with "
                    "(docs/operations.md#leader-election).")
    lease_namespace: str | None = Field(
        None, description="The Lease's namespace; unset: the pod's own namespace (its service account's), else "
                          "\"default\".")
    leader_identity: str | None = Field(
        None, max_length=128,
        description="This replica's name in the Lease (holderIdentity); the chart sets the pod's name. Unset: the "
                    "host name and the process id. Two running processes must never share one.")
    lease_seconds: float = Field(15.0, gt=0, le=300, description="How long a holder's Lease is valid after its last "
                                                                 "renewal was seen (leaseDurationSeconds).")
    renew_deadline_seconds: float = Field(
        10.0, gt=0, le=300, description="The holder stops acting when it could not renew the Lease for this long; "
                                        "must be below lease_seconds.")
    retry_period_seconds: float = Field(2.0, gt=0, le=60, description="How often every replica reads the Lease "
                                                                      "(and the holder renews it).")
    status_detail_limit: int = Field(
        200, ge=10, le=2000, description="Most per-step entries and plan actions kept in a request's status.")
    run_wait_seconds: float = Field(
        300.0, ge=0, le=86400, description="How long a RollbackRequest whose Run does not exist yet waits for it "
        "(phase Pending, reason RunNotFound) before it fails; it starts as soon as the Run is created.")
    run_settle_seconds: float = Field(
        2.0, ge=0, le=60, description="A request that waited for its Run plans this long after the Run's creation, "
        "so the steps created with the Run (one GitOps apply) are in.")
    journal_idle_seconds: float = Field(
        120.0, gt=0, description="A run's RunSteps are watched while requests read them; the run is dropped after this "
                                 "many seconds unread.")
    journal_sync_seconds: float = Field(
        30.0, gt=0, description="How long a pass waits for a run's RunSteps to be listed before it tries again.")
    retention_ttl_seconds: int | None = Field(
        None, ge=1, le=315_360_000,
        description="Retention's default: a Run is deleted with its steps this many seconds after its last activity, "
                    "once nothing about it is unfinished (docs/concepts.md#retention); a namespace's annotation "
                    "reversi.dev/retention-ttl-seconds and a Run's spec.retention override it. Unset: kept forever.")
    retention_deletes_per_second: float = Field(
        20.0, gt=0, le=1000,
        description="Most Runs retention deletes per second (each takes its steps with it through the garbage "
                    "collector): paced so agents recording at the same time keep their API server.")
    retention_workers: int = Field(2, ge=1, le=16, description="Threads that run retention passes.")
    archive_dsn: SecretStr | None = Field(
        None,
        description="The archive (docs/operations.md#the-archive): a PostgreSQL connection string or URL; when set, "
                    "retention writes each expired Run's record there and deletes the Run only after the write "
                    "committed, and a Run deleted by hand is written before it goes (its finalizer "
                    "reversi.dev/archive). Give it from a Secret (the chart's archive.existingSecret); it is never "
                    "logged.")
    archive_enabled: bool = Field(
        False,
        description="The archive is on (the chart's archive.enabled; read by the admission server, which has no "
                    "connection string): each new Run is created with the finalizer reversi.dev/archive, so a "
                    "person's delete waits for its record (docs/operations.md#a-run-deleted-by-hand).")
    message_limit: int = Field(300, ge=50, le=2000, description="Longest error text kept per step in status.")

    @field_validator("namespaces", mode="before")
    @classmethod
    def _split(cls, value):
        if isinstance(value, str):
            return [n.strip() for n in value.split(",") if n.strip()]
        return value
