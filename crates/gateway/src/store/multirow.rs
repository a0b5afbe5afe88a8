//! Multi-row statements for the embedded store: a list of rows bound as `VALUES` lists of a few kept sizes. Each
//! statement is a round trip to the connection's worker thread, so one statement per row made a batch of sixty
//! writes cost hundreds of them; one statement of any length was prepared anew for each batch.

use sqlx::sqlite::{Sqlite, SqliteConnection};
use sqlx::QueryBuilder;

use super::governance::UsageRecord;

/// The most values bound in one statement (SQLite refuses more than 32,766).
const MAX_BOUND: usize = 32_000;

/// The most rows of one statement. A batch's rows are written in parts of a power of two rows up to this, so that
/// each statement has one of a few shapes and stays prepared on the writer's connection: preparing a statement
/// anew for each batch (SQLite parses and compiles every `VALUES` row) cost more than running it.
const MOST_ROWS: usize = 64;

/// The parts a batch of `rows` is written in, `columns` values bound per row: powers of two rows, largest first,
/// none larger than [`MOST_ROWS`] nor binding more than [`MAX_BOUND`] values.
pub(super) fn parts<T>(rows: &[T], columns: usize) -> impl Iterator<Item = &[T]> {
    let most = MOST_ROWS.min(MAX_BOUND / columns.max(1)).max(1);
    let mut rest = rows;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let size = rest.len().min(most);
        // The largest power of two that fits: 37 rows are written as 32, 4 and 1.
        let size = 1 << size.ilog2();
        let (part, after) = rest.split_at(size);
        rest = after;
        Some(part)
    })
}

/// Runs `build` for each part of `rows` (see [`parts`]), each a statement kept prepared.
pub(super) async fn in_statements<'q, T>(
    tx: &mut SqliteConnection,
    rows: &'q [T],
    columns: usize,
    mut build: impl FnMut(&mut QueryBuilder<'q, Sqlite>, &'q [T]),
) -> Result<(), sqlx::Error> {
    for part in parts(rows, columns) {
        let mut query = QueryBuilder::new("");
        build(&mut query, part);
        query.build().execute(&mut *tx).await?;
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

#[cfg(test)]
mod tests {
    use super::{parts, MAX_BOUND, MOST_ROWS};

    fn sizes(rows: usize, columns: usize) -> Vec<usize> {
        let rows: Vec<usize> = (0..rows).collect();
        let parts: Vec<&[usize]> = parts(&rows, columns).collect();
        // Every row once, in order.
        assert_eq!(parts.concat(), rows);
        parts.iter().map(|part| part.len()).collect()
    }

    #[test]
    fn a_batch_is_written_in_parts_of_a_few_sizes_in_order() {
        assert_eq!(sizes(0, 10), Vec::<usize>::new());
        assert_eq!(sizes(1, 10), [1]);
        assert_eq!(sizes(37, 10), [32, 4, 1]);
        assert_eq!(sizes(64, 10), [64]);
        assert_eq!(sizes(150, 10), [64, 64, 16, 4, 2]);
        // Each part binds fewer values than SQLite accepts, however wide the row.
        let wide = MAX_BOUND / 100;
        assert!(sizes(300, wide).iter().all(|&n| n * wide <= MAX_BOUND));
        assert!(sizes(300, MAX_BOUND * 2).iter().all(|&n| n == 1));
        assert!(sizes(1000, 3)
            .iter()
            .all(|&n| n <= MOST_ROWS && n.is_power_of_two()));
    }
}
