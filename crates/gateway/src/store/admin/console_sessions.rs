//! Console sessions signed out before they expired: recorded by id, so that every replica refuses a copy of the
//! cookie that outlived its sign-out, and forgotten once the session would have expired anyway.

use crate::store::{Store, StoreError};

impl Store {
    /// Records that the console session `session` (its cookie's id), valid until `expires_at` (Unix seconds),
    /// was signed out. Signing out twice records it once.
    pub async fn sign_out_console_session(
        &self,
        session: &str,
        expires_at: i64,
    ) -> Result<(), StoreError> {
        with_pool!(self, |pool| sqlx::query(
            "INSERT INTO console_sign_outs (session, expires_at) VALUES ($1, $2)
             ON CONFLICT (session) DO NOTHING"
        )
        .bind(session)
        .bind(expires_at)
        .execute(pool)
        .await
        .map(drop))?;
        Ok(())
    }

    /// Whether the console session `session` was signed out.
    pub async fn console_session_signed_out(&self, session: &str) -> Result<bool, StoreError> {
        let found: Option<i32> = with_read_pool!(self, |pool| sqlx::query_scalar(
            "SELECT 1 FROM console_sign_outs WHERE session = $1"
        )
        .bind(session)
        .fetch_optional(pool)
        .await)?;
        Ok(found.is_some())
    }

    /// Forgets the sign-outs of sessions that expired before `now` (Unix seconds): their cookies are refused for
    /// their expiry alone. Answers how many it forgot.
    pub async fn prune_console_sign_outs(&self, now: i64) -> Result<u64, StoreError> {
        let done = with_pool!(self, |pool| sqlx::query(
            "DELETE FROM console_sign_outs WHERE expires_at <= $1"
        )
        .bind(now)
        .execute(pool)
        .await
        .map(|done| done.rows_affected()))?;
        Ok(done)
    }
}

#[cfg(test)]
mod tests {
    use crate::store::Store;
    use gateway_testkit::scratch::ScratchDatabase;

    #[tokio::test]
    async fn a_sign_out_is_kept_until_its_session_would_have_expired() {
        let db = ScratchDatabase::sqlite();
        let store = Store::connect(db.url(), 2).await.expect("store");
        store.migrate().await.expect("migrate");
        for (session, expires_at) in [("a", 100), ("b", 200), ("b", 200)] {
            store
                .sign_out_console_session(session, expires_at)
                .await
                .expect("signed out");
        }
        assert!(!store.console_session_signed_out("c").await.expect("read"));
        assert_eq!(store.prune_console_sign_outs(150).await.expect("pruned"), 1);
        assert!(!store.console_session_signed_out("a").await.expect("read"));
        assert!(store.console_session_signed_out("b").await.expect("read"));
    }
}
