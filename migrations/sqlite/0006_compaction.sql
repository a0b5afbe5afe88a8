-- The key that seals compaction items when the config sets none (`compaction.key`): generated once by the first
-- replica that needs it, so that every replica seals and opens with the same key. Stored base64-encoded.
CREATE TABLE compaction_keys (
    name TEXT PRIMARY KEY,
    key_base64 TEXT NOT NULL,
    created_at BIGINT NOT NULL
);
