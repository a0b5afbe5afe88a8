-- Conversations (OpenAI's Conversations API): a project's ordered list of items, which a response created with
-- `conversation` starts from and appends its input and output to when it ends.
CREATE TABLE conversations (
    id            TEXT PRIMARY KEY,
    project_id    TEXT NOT NULL REFERENCES projects (id) ON DELETE CASCADE,
    metadata      JSONB NOT NULL,
    created_at    BIGINT NOT NULL,
    -- The position the next appended item takes: an append takes its positions by updating this row, which
    -- orders concurrent appends one after the other.
    next_position BIGINT NOT NULL DEFAULT 0
);
CREATE INDEX conversations_project ON conversations (project_id);

-- A conversation's items in order. An item id is unique within its conversation, so that an append made
-- again (a response's ending retried, or resumed on another replica) adds nothing twice.
CREATE TABLE conversation_items (
    conversation_id TEXT NOT NULL REFERENCES conversations (id) ON DELETE CASCADE,
    position        BIGINT NOT NULL,
    item_id         TEXT NOT NULL,
    item            JSONB NOT NULL,
    -- The response whose input or output the item was (NULL for items added through the items API).
    response_id     TEXT,
    created_at      BIGINT NOT NULL,
    PRIMARY KEY (conversation_id, position)
);
CREATE UNIQUE INDEX conversation_items_id ON conversation_items (conversation_id, item_id);
