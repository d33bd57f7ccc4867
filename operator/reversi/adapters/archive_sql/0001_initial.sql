-- The archive of deleted Runs, version 1 (docs/operations.md#the-archive).
-- Applied by reversi-operator at start (archive.enabled) in one transaction, under an advisory
-- lock, and recorded in reversi_archive_schema; never edit an applied migration: add the next one.
--
-- One row per Run, keyed by its uid: a retry of the same Run's write (the operator crashed
-- between the commit and the Run's delete) replaces the row and its children in one transaction,
-- so a Run is never written twice; `writes` counts how often it was written.

CREATE TABLE reversi_runs (
    uid             uuid PRIMARY KEY,
    namespace       text NOT NULL,
    name            text NOT NULL,
    principal       text,                 -- who created the run (stamped at admission)
    actor           text,                 -- spec.scope
    tenant          text,
    environment     text,
    parent          text,                 -- spec.parentRef.name (nested runs)
    created_at      timestamptz,
    last_activity   timestamptz,          -- what retention measured its TTL from
    deleted_reason  text NOT NULL,        -- why it was deleted: expired (retention)
    steps           integer NOT NULL,
    archived_at     timestamptz NOT NULL DEFAULT now(),
    writes          integer NOT NULL DEFAULT 1,
    run             jsonb NOT NULL        -- the Run object as the API server returned it
);
CREATE INDEX reversi_runs_by_name ON reversi_runs (namespace, name);
CREATE INDEX reversi_runs_by_principal ON reversi_runs (principal);
CREATE INDEX reversi_runs_by_created ON reversi_runs (created_at);

CREATE TABLE reversi_steps (
    run_uid      uuid NOT NULL REFERENCES reversi_runs (uid) ON DELETE CASCADE,
    index        integer NOT NULL,
    tool         text NOT NULL,
    outcome      text,
    principal    text,                    -- who recorded the call (stamped at admission)
    recorded_at  timestamptz,
    step         jsonb NOT NULL,          -- the RunStep object (call, snapshot, resolution, undo state)
    PRIMARY KEY (run_uid, index)
);
CREATE INDEX reversi_steps_by_tool ON reversi_steps (tool);

CREATE TABLE reversi_requests (
    run_uid       uuid NOT NULL REFERENCES reversi_runs (uid) ON DELETE CASCADE,
    uid           uuid NOT NULL,
    name          text NOT NULL,
    phase         text,
    created_at    timestamptz,
    completed_at  timestamptz,
    request       jsonb NOT NULL,         -- the RollbackRequest object: plan, per-step conditions, report
    PRIMARY KEY (run_uid, uid)
);

CREATE TABLE reversi_actions (
    run_uid  uuid NOT NULL REFERENCES reversi_runs (uid) ON DELETE CASCADE,
    seq      integer NOT NULL,
    at       timestamptz,
    actor    text,                        -- as the API server stamped it; null when it records none
    action   text NOT NULL,               -- recorded, resolved, requested, approved, denied, forced, cancelled, acknowledged
    step     integer,
    request  text,
    note     text,
    PRIMARY KEY (run_uid, seq)
);
CREATE INDEX reversi_actions_by_actor ON reversi_actions (actor);
