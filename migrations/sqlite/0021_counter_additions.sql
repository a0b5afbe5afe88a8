-- The additions to counted windows (`rate_windows`) that were applied, by the token their replica gave each: an
-- addition whose reply was lost is sent again under its token, and the store adds it only if its token is not
-- here, so that a count is never added twice. Tokens are UUIDv7 text, which sorts by the time it was made; rows
-- older than a day are pruned with the ended windows.
CREATE TABLE counter_additions (
    token TEXT PRIMARY KEY
) STRICT, WITHOUT ROWID;
