-- When each API key was last used (Unix seconds), written at most once a minute per key and replica.
ALTER TABLE api_keys ADD COLUMN last_used_at BIGINT;
