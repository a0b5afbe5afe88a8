-- A step may be the listing of a remote MCP server that a request names (SPEC 12), shown as `mcp_list_tools`.
-- SQLite cannot alter a CHECK constraint: the table is built again with the wider one, rows copied over.
CREATE TABLE steps_new (
    response_id TEXT NOT NULL REFERENCES responses (id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('model', 'tool', 'listing')),
    state       TEXT NOT NULL CHECK (state IN ('pending', 'running', 'succeeded', 'failed')),
    -- The step's data (model output, tool call and outcome, or a listing) as the core's types serialise it.
    body        TEXT NOT NULL CHECK (json_valid(body)),
    -- Tool steps: the call id and tool name, for audits and idempotency.
    call_id     TEXT,
    tool_name   TEXT,
    attempts    INTEGER NOT NULL DEFAULT 0,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (response_id, seq)
) STRICT;
INSERT INTO steps_new (response_id, seq, kind, state, body, call_id, tool_name, attempts, created_at, updated_at)
    SELECT response_id, seq, kind, state, body, call_id, tool_name, attempts, created_at, updated_at FROM steps;
DROP TABLE steps;
ALTER TABLE steps_new RENAME TO steps;
