-- The pending deliveries of a response, found when it is deleted: an event queued for an ending that was never
-- written (its replica died in between) is superseded then, rather than sent for a response that never ended.
CREATE INDEX webhook_deliveries_pending_by_response ON webhook_deliveries (response_id) WHERE status = 'pending';
