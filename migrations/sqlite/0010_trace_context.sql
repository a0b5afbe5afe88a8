-- Traces (SPEC 14): the W3C trace context a response was created in, so that a replica that resumes it continues
-- the same trace.
ALTER TABLE responses ADD COLUMN trace_context TEXT;
