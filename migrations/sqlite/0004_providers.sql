-- Provider settings per deployment (SPEC 8, 10, 12): the deployments tried when it fails (a JSON array of names,
-- in order), what it does with tools it cannot serve, and Anthropic's max_tokens when a request sets none
-- (NULL: the gateway's default).
ALTER TABLE deployments ADD COLUMN fallbacks TEXT NOT NULL DEFAULT '[]';
ALTER TABLE deployments ADD COLUMN unsupported_tools TEXT NOT NULL DEFAULT 'ignore'
    CHECK (unsupported_tools IN ('ignore', 'reject'));
ALTER TABLE deployments ADD COLUMN max_tokens INTEGER;
