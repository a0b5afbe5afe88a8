-- Tool sources grow a kind (`http` or `mcp`) and a per-source policy (SPEC 2, 7, 10, 12). A NULL policy column
-- means "the gateway's default": no bound on calls in flight, 1 MiB of output, a breaker after 5 consecutive
-- failures that stays open 30 s.
ALTER TABLE tool_sources ADD COLUMN kind TEXT NOT NULL DEFAULT 'http';
ALTER TABLE tool_sources ADD COLUMN max_in_flight BIGINT;
ALTER TABLE tool_sources ADD COLUMN max_output_bytes BIGINT;
ALTER TABLE tool_sources ADD COLUMN breaker_failures BIGINT;
ALTER TABLE tool_sources ADD COLUMN breaker_cooldown_ms BIGINT;
-- Progress-note templates over the call's arguments (and its result).
ALTER TABLE tool_sources ADD COLUMN note_on_request TEXT;
ALTER TABLE tool_sources ADD COLUMN note_on_result TEXT;
-- The hosted tool type (`web_search`, ...) this source serves, if any.
ALTER TABLE tool_sources ADD COLUMN hosted_type TEXT;
-- `mcp` sources: which of the server's tools are offered (NULL: all) and the prefix of their names.
ALTER TABLE tool_sources ADD COLUMN allowed_tools JSONB;
ALTER TABLE tool_sources ADD COLUMN name_prefix TEXT;
