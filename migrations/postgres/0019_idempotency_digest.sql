-- The SHA-256 (hex) of the request body a keyed create came with: a repeat under the same Idempotency-Key with
-- another body is refused rather than answered with a response to a different request. NULL for rows written
-- before it, and for creates without a key.
ALTER TABLE responses ADD COLUMN idempotency_digest TEXT;
