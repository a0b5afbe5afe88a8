-- The claim epoch under which a step was last written as started (`running`): a write that starts it again under
-- the same epoch, while it is stored running, is the same start made again after a lost reply, and counts no new
-- attempt; one under a later epoch (a takeover that sends it again) does. NULL for steps written before.
ALTER TABLE steps ADD COLUMN started_epoch INTEGER;
