-- A stored response writes its steps and its context items in the same statement as its row (or, later, under
-- that row's lock), so the foreign keys from them to `responses` checked nothing the write does not already
-- guarantee, at the price of one trigger and one locking lookup per inserted row on the hot path. Deleting a
-- response or a project deletes its steps and items explicitly, in the same transaction.
ALTER TABLE steps DROP CONSTRAINT steps_response_id_fkey;
ALTER TABLE response_input_items DROP CONSTRAINT response_input_items_response_id_fkey;
