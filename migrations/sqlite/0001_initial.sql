-- The embedded store's schema: the same tables, keys and constraints as migrations/postgres/0001_initial.sql.
-- STRICT tables check column types as Postgres would; JSON is TEXT checked by json_valid, booleans are
-- INTEGER 0/1, times are Unix seconds. Foreign keys are enforced per connection (the store turns them on).

CREATE TABLE projects (
    id          TEXT NOT NULL PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    created_at  INTEGER NOT NULL
) STRICT;

CREATE TABLE api_keys (
    id          TEXT NOT NULL PRIMARY KEY,
    project_id  TEXT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    name        TEXT NOT NULL,
    -- SHA-256 of the whole key, hex; the key itself is never stored.
    key_hash    TEXT NOT NULL UNIQUE,
    -- First characters of the key, to tell keys apart in listings.
    key_prefix  TEXT NOT NULL,
    created_at  INTEGER NOT NULL,
    revoked_at  INTEGER
) STRICT;
CREATE INDEX api_keys_project ON api_keys (project_id);

CREATE TABLE deployments (
    id              TEXT NOT NULL PRIMARY KEY,
    name            TEXT NOT NULL UNIQUE,
    provider_kind   TEXT NOT NULL CHECK (provider_kind IN ('openai_chat', 'anthropic', 'openai_responses')),
    base_url        TEXT NOT NULL,
    upstream_model  TEXT NOT NULL,
    api_key         TEXT,
    created_at      INTEGER NOT NULL
) STRICT;

CREATE TABLE deployment_groups (
    id          TEXT NOT NULL PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    created_at  INTEGER NOT NULL
) STRICT;

CREATE TABLE tool_sources (
    id          TEXT NOT NULL PRIMARY KEY,
    name        TEXT NOT NULL UNIQUE,
    description TEXT NOT NULL DEFAULT '',
    parameters  TEXT NOT NULL CHECK (json_valid(parameters)),
    url         TEXT NOT NULL,
    timeout_ms  INTEGER NOT NULL,
    secret      TEXT,
    strict      INTEGER NOT NULL DEFAULT 0 CHECK (strict IN (0, 1)),
    created_at  INTEGER NOT NULL
) STRICT;

CREATE TABLE group_deployments (
    group_id      TEXT NOT NULL REFERENCES deployment_groups (id) ON DELETE CASCADE,
    deployment_id TEXT NOT NULL REFERENCES deployments (id) ON DELETE CASCADE,
    PRIMARY KEY (group_id, deployment_id)
) STRICT;

CREATE TABLE group_projects (
    group_id    TEXT NOT NULL REFERENCES deployment_groups (id) ON DELETE CASCADE,
    project_id  TEXT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    PRIMARY KEY (group_id, project_id)
) STRICT;
CREATE INDEX group_projects_project ON group_projects (project_id);

CREATE TABLE group_tool_sources (
    group_id        TEXT NOT NULL REFERENCES deployment_groups (id) ON DELETE CASCADE,
    tool_source_id  TEXT NOT NULL REFERENCES tool_sources (id) ON DELETE CASCADE,
    PRIMARY KEY (group_id, tool_source_id)
) STRICT;

-- One row per response. `params` holds the normalised request (instructions, client tools, sampling...);
-- `server_tools` the tool sources resolved when it was created, so a resumed loop runs what it started with.
CREATE TABLE responses (
    id                    TEXT NOT NULL PRIMARY KEY,
    project_id            TEXT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    deployment_id         TEXT REFERENCES deployments (id) ON DELETE SET NULL,
    model                 TEXT NOT NULL,
    status                TEXT NOT NULL CHECK (status IN ('queued', 'in_progress', 'completed', 'incomplete', 'failed', 'cancelled')),
    params                TEXT NOT NULL CHECK (json_valid(params)),
    server_tools          TEXT NOT NULL CHECK (json_valid(server_tools)),
    previous_response_id  TEXT,
    store                 INTEGER NOT NULL CHECK (store IN (0, 1)),
    background            INTEGER NOT NULL CHECK (background IN (0, 1)),
    handed_back           INTEGER NOT NULL DEFAULT 0 CHECK (handed_back IN (0, 1)),
    error_code            TEXT,
    error_message         TEXT,
    incomplete_reason     TEXT,
    usage                 TEXT CHECK (usage IS NULL OR json_valid(usage)),
    created_at            INTEGER NOT NULL,
    updated_at            INTEGER NOT NULL,
    completed_at          INTEGER,
    deleted_at            INTEGER,
    -- The client's `Idempotency-Key` header, if it sent one: a repeated create answers this response.
    idempotency_key       TEXT
) STRICT;
CREATE INDEX responses_project ON responses (project_id, created_at);
CREATE UNIQUE INDEX responses_idempotency ON responses (project_id, idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX responses_unfinished ON responses (status) WHERE status IN ('queued', 'in_progress');

-- The full context a response saw (previous context and outputs, then its own input), in order.
CREATE TABLE response_input_items (
    response_id TEXT NOT NULL REFERENCES responses (id) ON DELETE CASCADE,
    position    INTEGER NOT NULL,
    item_id     TEXT NOT NULL,
    item        TEXT NOT NULL CHECK (json_valid(item)),
    PRIMARY KEY (response_id, position)
) STRICT;
CREATE UNIQUE INDEX response_input_items_id ON response_input_items (response_id, item_id);

-- The loop's steps: written before their side effect, updated after it.
CREATE TABLE steps (
    response_id TEXT NOT NULL REFERENCES responses (id) ON DELETE CASCADE,
    seq         INTEGER NOT NULL,
    kind        TEXT NOT NULL CHECK (kind IN ('model', 'tool')),
    state       TEXT NOT NULL CHECK (state IN ('pending', 'running', 'succeeded', 'failed')),
    -- The step's data (model output, or tool call and outcome) as the core's types serialise it.
    body        TEXT NOT NULL CHECK (json_valid(body)),
    -- Tool steps: the call id and tool name, for audits and idempotency.
    call_id     TEXT,
    tool_name   TEXT,
    attempts    INTEGER NOT NULL DEFAULT 0,
    created_at  INTEGER NOT NULL,
    updated_at  INTEGER NOT NULL,
    PRIMARY KEY (response_id, seq)
) STRICT;
