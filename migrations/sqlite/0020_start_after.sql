-- When a queued background response may be started, in ms since the epoch (the database's clock): a replica that
-- found its key's or project's max_concurrent full when it was about to start one leaves it queued until then,
-- so that it waits for a place instead of running over the limit. NULL: at once.
ALTER TABLE responses ADD COLUMN start_after INTEGER;
