-- `item_reference` input items name a stored item by its id alone: the inputs of a project's responses are
-- looked up by item id. (Output items carry their response's id in theirs and need no index.)
CREATE INDEX response_input_items_item ON response_input_items (item_id);
