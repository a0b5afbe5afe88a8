-- What a create that sets a parameter the deployment's provider kind cannot honour gets: 'ignore' (the parameter
-- is left out and listed under metadata.gateway_ignored_params) or 'reject' (400 naming it).
ALTER TABLE deployments ADD COLUMN unsupported_params TEXT NOT NULL DEFAULT 'ignore'
    CHECK (unsupported_params IN ('ignore', 'reject'));
