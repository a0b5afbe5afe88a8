-- Governance (SPEC 13): limits and budgets on keys and projects, expiring keys, prices on deployments, the key
-- a response was created with, usage recorded once per model call and tool call, and the shared counters that
-- hold limits across replicas.

ALTER TABLE api_keys ADD COLUMN expires_at INTEGER;
ALTER TABLE api_keys ADD COLUMN rpm_limit INTEGER;
ALTER TABLE api_keys ADD COLUMN tpm_limit INTEGER;
ALTER TABLE api_keys ADD COLUMN max_concurrent INTEGER;
ALTER TABLE api_keys ADD COLUMN budget_usd REAL;
ALTER TABLE api_keys ADD COLUMN budget_period TEXT CHECK (budget_period IN ('day', 'month', 'total'));

ALTER TABLE projects ADD COLUMN rpm_limit INTEGER;
ALTER TABLE projects ADD COLUMN tpm_limit INTEGER;
ALTER TABLE projects ADD COLUMN max_concurrent INTEGER;
ALTER TABLE projects ADD COLUMN budget_usd REAL;
ALTER TABLE projects ADD COLUMN budget_period TEXT CHECK (budget_period IN ('day', 'month', 'total'));

ALTER TABLE deployments ADD COLUMN input_per_mtok REAL;
ALTER TABLE deployments ADD COLUMN cached_input_per_mtok REAL;
ALTER TABLE deployments ADD COLUMN output_per_mtok REAL;

-- The key that created the response: its usage counts against that key (NULL for responses written before).
ALTER TABLE responses ADD COLUMN api_key_id TEXT;

-- One row per model call that returned usage (`tool_source` NULL) and per server tool call (`tool_source` set,
-- no tokens), written in the transaction of the step it belongs to; keyed by the step, so a write made again
-- after its reply was lost records it once. No foreign keys: usage outlives deleted responses, keys and projects.
CREATE TABLE usage_records (
    response_id       TEXT NOT NULL,
    seq               INTEGER NOT NULL,
    project_id        TEXT NOT NULL,
    api_key_id        TEXT,
    deployment        TEXT NOT NULL,
    provider_kind     TEXT NOT NULL,
    tool_source       TEXT,
    input_tokens      BIGINT NOT NULL,
    cached_tokens     BIGINT NOT NULL,
    output_tokens     BIGINT NOT NULL,
    reasoning_tokens  BIGINT NOT NULL,
    cost_usd          REAL NOT NULL,
    created_at        BIGINT NOT NULL,
    PRIMARY KEY (response_id, seq)
);
CREATE INDEX usage_records_project ON usage_records (project_id, created_at);
CREATE INDEX usage_records_key ON usage_records (api_key_id, created_at);

-- Shared counters of the limits, per scope ('key:<id>:rpm', 'project:<id>:tpm') and window start; a
-- `max_concurrent` scope ('key:<id>:running') has one row, at window 0, holding how many run now.
CREATE TABLE rate_windows (
    scope         TEXT NOT NULL,
    window_start  BIGINT NOT NULL,
    used          BIGINT NOT NULL,
    PRIMARY KEY (scope, window_start)
);

-- The part of each `max_concurrent` count that each replica holds: a replica whose lease lapsed has its part
-- taken back from the count.
CREATE TABLE running_counts (
    scope       TEXT NOT NULL,
    replica_id  TEXT NOT NULL,
    running     BIGINT NOT NULL,
    PRIMARY KEY (scope, replica_id)
);
