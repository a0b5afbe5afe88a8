-- Durability (SPEC 9): replicas with heartbeats, each running response owned by one replica, a deadline that
-- survives a restart, and cancel requests. Times here are milliseconds. The embedded store serves one process,
-- which takes over at start-up whatever an earlier process left unfinished.

-- Every gateway process that used this store, with the last time it proved alive.
CREATE TABLE replicas (
    id            TEXT NOT NULL PRIMARY KEY,
    started_at    INTEGER NOT NULL,
    heartbeat_at  INTEGER NOT NULL
) STRICT;

-- The replica driving the response while it runs; NULL for a queued response that no replica took yet.
ALTER TABLE responses ADD COLUMN owner TEXT;
-- When the whole-response deadline passes: a resumed response keeps the deadline it started with.
ALTER TABLE responses ADD COLUMN deadline_at INTEGER;
-- Set by a cancel (or the delete of a running response); the owner stops at its next step boundary.
ALTER TABLE responses ADD COLUMN cancel_requested INTEGER NOT NULL DEFAULT 0 CHECK (cancel_requested IN (0, 1));
-- Nothing ever set it: a deleted response is deleted.
ALTER TABLE responses DROP COLUMN deleted_at;

CREATE INDEX responses_owner ON responses (owner) WHERE status IN ('queued', 'in_progress');
