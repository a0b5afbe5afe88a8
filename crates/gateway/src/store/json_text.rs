//! A JSON column's value as its text: serialised once, straight from the typed value, and bound as it is (a
//! `jsonb` on Postgres, text on the embedded store), with no `serde_json::Value` tree built in between.

use std::borrow::Cow;

use serde::Serialize;
use serde_json::value::RawValue;
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgHasArrayType, PgTypeInfo, Postgres};
use sqlx::sqlite::{Sqlite, SqliteArgumentValue, SqliteTypeInfo};
use sqlx::types::Json;

/// A JSON value ready to bind.
#[derive(Debug, Clone)]
pub(crate) struct JsonText(Box<RawValue>);

impl JsonText {
    /// `value` written as JSON.
    pub(crate) fn of<T: Serialize + ?Sized>(value: &T) -> Result<JsonText, serde_json::Error> {
        serde_json::value::to_raw_value(value).map(JsonText)
    }

    pub(crate) fn as_str(&self) -> &str {
        self.0.get()
    }
}

impl sqlx::Type<Postgres> for JsonText {
    fn type_info() -> PgTypeInfo {
        <Json<()> as sqlx::Type<Postgres>>::type_info()
    }
}

impl PgHasArrayType for JsonText {
    fn array_type_info() -> PgTypeInfo {
        <Json<()> as PgHasArrayType>::array_type_info()
    }
}

impl sqlx::Encode<'_, Postgres> for JsonText {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        // `jsonb`'s binary form: its version (1), then the text.
        buf.push(1);
        buf.extend_from_slice(self.as_str().as_bytes());
        Ok(IsNull::No)
    }
}

impl sqlx::Type<Sqlite> for JsonText {
    fn type_info() -> SqliteTypeInfo {
        <str as sqlx::Type<Sqlite>>::type_info()
    }
}

impl<'q> sqlx::Encode<'q, Sqlite> for JsonText {
    fn encode_by_ref(
        &self,
        args: &mut Vec<SqliteArgumentValue<'q>>,
    ) -> Result<IsNull, BoxDynError> {
        args.push(SqliteArgumentValue::Text(Cow::Owned(
            self.as_str().to_owned(),
        )));
        Ok(IsNull::No)
    }
}
