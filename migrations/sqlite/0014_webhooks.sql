-- Webhook endpoints an operator registers per project, and the outbox of deliveries to them (SPEC 15).
CREATE TABLE webhook_endpoints (
    id          TEXT NOT NULL PRIMARY KEY,
    project_id  TEXT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    url         TEXT NOT NULL,
    -- The event types delivered, as a JSON array of strings.
    events      TEXT NOT NULL CHECK (json_valid(events)),
    -- Standard Webhooks' `whsec_<base64>` signing secret.
    secret      TEXT NOT NULL,
    created_at  INTEGER NOT NULL
) STRICT;
CREATE INDEX webhook_endpoints_project ON webhook_endpoints (project_id);

-- One row per event and endpoint: written when a background response ends (before its ending, keyed by the event,
-- so an ending written again adds nothing), tried by one replica at a time (`locked_until`, the database's clock in
-- milliseconds) until it is delivered or its tries run out.
CREATE TABLE webhook_deliveries (
    id              TEXT NOT NULL PRIMARY KEY,
    endpoint_id     TEXT NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    project_id      TEXT NOT NULL,
    event_id        TEXT NOT NULL,
    event_type      TEXT NOT NULL,
    response_id     TEXT NOT NULL,
    payload         TEXT NOT NULL CHECK (json_valid(payload)),
    status          TEXT NOT NULL CHECK (status IN ('pending', 'delivered', 'failed', 'superseded')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at INTEGER NOT NULL,
    locked_until    INTEGER,
    last_error      TEXT,
    last_status     INTEGER,
    created_at      INTEGER NOT NULL,
    delivered_at    INTEGER,
    UNIQUE (endpoint_id, event_id)
) STRICT;
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
