-- Fencing by epoch (SPEC 9): every claim of a running response raises its epoch, and every write of a run is
-- fenced on (owner, epoch). The embedded store serves one process, which takes over at start-up what an earlier
-- one left; the epoch keeps that process's own runs apart from the runs it resumes.
ALTER TABLE responses ADD COLUMN claim_epoch INTEGER NOT NULL DEFAULT 0;
