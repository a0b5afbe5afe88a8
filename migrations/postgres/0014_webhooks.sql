-- Webhook endpoints an operator registers per project, and the outbox of deliveries to them (SPEC 15).
CREATE TABLE webhook_endpoints (
    id          TEXT PRIMARY KEY,
    project_id  TEXT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    url         TEXT NOT NULL,
    -- The event types delivered, as a JSON array of strings.
    events      JSONB NOT NULL,
    -- Standard Webhooks' `whsec_<base64>` signing secret.
    secret      TEXT NOT NULL,
    created_at  BIGINT NOT NULL
);
CREATE INDEX webhook_endpoints_project ON webhook_endpoints (project_id);

-- One row per event and endpoint: written when a background response ends (before its ending, keyed by the event,
-- so an ending written again adds nothing), tried by one replica at a time (`locked_until`, the database's clock in
-- milliseconds) until it is delivered or its tries run out.
CREATE TABLE webhook_deliveries (
    id              TEXT PRIMARY KEY,
    endpoint_id     TEXT NOT NULL REFERENCES webhook_endpoints (id) ON DELETE CASCADE,
    project_id      TEXT NOT NULL,
    event_id        TEXT NOT NULL,
    event_type      TEXT NOT NULL,
    response_id     TEXT NOT NULL,
    payload         JSONB NOT NULL,
    status          TEXT NOT NULL CHECK (status IN ('pending', 'delivered', 'failed', 'superseded')),
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at BIGINT NOT NULL,
    locked_until    BIGINT,
    last_error      TEXT,
    last_status     INTEGER,
    created_at      BIGINT NOT NULL,
    delivered_at    BIGINT,
    UNIQUE (endpoint_id, event_id)
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (next_attempt_at) WHERE status = 'pending';
