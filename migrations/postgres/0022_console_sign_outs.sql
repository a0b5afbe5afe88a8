-- Console sessions signed out before they expired, by the random id their cookie carries: a cookie whose id is
-- here is refused by every replica, though its signature still verifies. A row goes once its session would have
-- expired anyway (`expires_at`, Unix seconds).
CREATE TABLE console_sign_outs (
    session     TEXT PRIMARY KEY,
    expires_at  BIGINT NOT NULL
);
