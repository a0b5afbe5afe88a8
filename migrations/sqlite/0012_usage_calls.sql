-- How many calls a usage row sums: 1 for a row written with its step; the usage of unstored responses is
-- written summed, one row per project, key, deployment and tool source in each batch the writer flushes.
ALTER TABLE usage_records ADD COLUMN calls INTEGER NOT NULL DEFAULT 1;

-- Usage rows are only ever read by time range (then filtered by project, key or deployment): one index on the
-- time instead of two that every step write with usage had to update.
DROP INDEX usage_records_project;
DROP INDEX usage_records_key;
CREATE INDEX usage_records_time ON usage_records (created_at);
