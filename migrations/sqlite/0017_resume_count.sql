-- How many times a running response was started from its stored steps (a takeover, a resume after a hand-over,
-- a queued response's start): past durability.max_resumes it ends failed instead of running again.
ALTER TABLE responses ADD COLUMN resumes INTEGER NOT NULL DEFAULT 0;
