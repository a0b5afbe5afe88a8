-- Durability (SPEC 9): replicas with heartbeats, each running response owned by one replica, a deadline that
-- survives a restart, and cancel requests. Times here are milliseconds of the database's clock, so that replicas
-- whose clocks disagree still agree on who is alive.

-- Every gateway process sharing this database, with the last time it proved alive. The responses of a replica
-- that has not beaten for a lease are taken over by another.
CREATE TABLE replicas (
    id            TEXT PRIMARY KEY,
    started_at    BIGINT NOT NULL,
    heartbeat_at  BIGINT NOT NULL
);

ALTER TABLE responses
    -- The replica driving the response while it runs; NULL for a queued response that no replica took yet, or
    -- one released by a replica that shut down.
    ADD COLUMN owner TEXT,
    -- When the whole-response deadline passes: a resumed response keeps the deadline it started with.
    ADD COLUMN deadline_at BIGINT,
    -- Set by a cancel (or the delete of a running response); the owner stops at its next step boundary.
    ADD COLUMN cancel_requested BOOLEAN NOT NULL DEFAULT FALSE,
    -- Nothing ever set it: a deleted response is deleted.
    DROP COLUMN deleted_at;

CREATE INDEX responses_owner ON responses (owner) WHERE status IN ('queued', 'in_progress');
