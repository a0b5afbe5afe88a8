//! Multi-row statements for the embedded store: a list of rows bound as one `VALUES` list, in as many statements
//! as SQLite's limit on bound values requires. Each statement is a round trip to the connection's worker thread,
//! so one statement per row made a batch of sixty writes cost hundreds of them.

use sqlx::sqlite::{Sqlite, SqliteConnection};
use sqlx::QueryBuilder;

use super::governance::UsageRecord;

/// The most values bound in one statement (SQLite refuses more than 32,766): a batch with more rows of a
/// kind writes them in several statements.
pub(super) const MAX_BOUND: usize = 32_000;

/// Statements of at most this many rows are kept prepared on the connection (the sizes a light load
/// repeats); larger ones are prepared for the one batch, so that they never crowd the statement cache.
pub(super) const KEPT_PREPARED_ROWS: usize = 4;

/// Runs `build` for each part of `rows` small enough for one statement (`columns` values bound per row).
pub(super) async fn in_statements<'q, T>(
    tx: &mut SqliteConnection,
    rows: &'q [T],
    columns: usize,
    mut build: impl FnMut(&mut QueryBuilder<'q, Sqlite>, &'q [T]),
) -> Result<(), sqlx::Error> {
    for part in rows.chunks((MAX_BOUND / columns).max(1)) {
        let mut query = QueryBuilder::new("");
        build(&mut query, part);
        query
            .build()
            .persistent(part.len() <= KEPT_PREPARED_ROWS)
            .execute(&mut *tx)
            .await?;
    }
    Ok(())
}

/// `VALUES (…), (…)`: one row of bound values per element of `rows`, written by `row`.
pub(super) fn values<'q, T>(
    query: &mut QueryBuilder<'q, Sqlite>,
    rows: &'q [T],
    mut row: impl FnMut(&mut sqlx::query_builder::Separated<'_, 'q, Sqlite, &'static str>, &'q T),
) {
    query.push("VALUES ");
    for (i, element) in rows.iter().enumerate() {
        if i > 0 {
            query.push(", ");
        }
        query.push("(");
        let mut separated = query.separated(", ");
        row(&mut separated, element);
        query.push(")");
    }
}

/// Usage records; a record already there is left as it is.
pub(super) async fn insert_usage(
    tx: &mut SqliteConnection,
    usage: &[&UsageRecord],
) -> Result<(), sqlx::Error> {
    in_statements(tx, usage, 14, |query, part| {
        query.push(
            "INSERT INTO usage_records (response_id, seq, project_id, api_key_id, deployment, provider_kind,
                tool_source, input_tokens, cached_tokens, output_tokens, reasoning_tokens, cost_usd, created_at,
                calls) ",
        );
        values(query, part, |row, record| {
            row.push_bind(&record.response_id)
                .push_bind(record.seq)
                .push_bind(&record.project_id)
                .push_bind(&record.api_key_id)
                .push_bind(&record.deployment)
                .push_bind(&record.provider_kind)
                .push_bind(&record.tool_source)
                .push_bind(record.input_tokens)
                .push_bind(record.cached_tokens)
                .push_bind(record.output_tokens)
                .push_bind(record.reasoning_tokens)
                .push_bind(record.cost_usd)
                .push_bind(record.created_at)
                .push_bind(record.calls);
        });
        query.push(" ON CONFLICT DO NOTHING");
    })
    .await
}
