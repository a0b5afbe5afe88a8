-- A step may be the listing of a remote MCP server that a request names (SPEC 12), shown as `mcp_list_tools`.
ALTER TABLE steps DROP CONSTRAINT IF EXISTS steps_kind_check;
ALTER TABLE steps ADD CONSTRAINT steps_kind_check CHECK (kind IN ('model', 'tool', 'listing'));
