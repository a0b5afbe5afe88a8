-- Fencing by epoch (SPEC 9): every claim of a running response raises its epoch, and every write of a run is
-- fenced on (owner, epoch), so that a run that lost its response writes nothing even when the response later
-- comes back to the same replica.
--
-- Rolling upgrades: adding a column with a constant default is a catalogue change on Postgres 11 and later (no
-- table rewrite, a brief ACCESS EXCLUSIVE lock only), and replicas of the previous version, which never read or
-- write the column, keep working beside the new ones (see docs/upgrading.md).
ALTER TABLE responses ADD COLUMN claim_epoch BIGINT NOT NULL DEFAULT 0;
