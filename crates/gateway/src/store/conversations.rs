//! Stored conversations (OpenAI's Conversations API): the row with its metadata, and its items in order. Every
//! read and write takes the project id: another project's conversation is not found.

use serde_json::Value;

use super::responses::Order;
use super::{Store, StoreError};

/// A conversation as stored.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ConversationRow {
    pub id: String,
    pub metadata: Value,
    pub created_at: i64,
}

/// An item to add to a conversation: its id and the item as stored (every field, encrypted reasoning included).
#[derive(Debug, Clone, PartialEq)]
pub struct NewConversationItem {
    pub id: String,
    pub item: Value,
}

/// What to do with an item whose id the conversation already holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnTakenId {
    /// Skip it: the same append made again (a response's ending retried, or resumed elsewhere).
    Skip,
    /// Refuse the whole append: a client added an item under an id the conversation holds.
    Refuse,
}

/// Why an append added nothing.
#[derive(Debug)]
pub enum AppendError {
    /// No such conversation in the project.
    NotFound,
    /// With [`OnTakenId::Refuse`]: the conversation already holds an item with this id.
    TakenId(String),
    Store(StoreError),
}

impl From<sqlx::Error> for AppendError {
    fn from(error: sqlx::Error) -> AppendError {
        AppendError::Store(StoreError::from(error))
    }
}

impl From<StoreError> for AppendError {
    fn from(error: StoreError) -> AppendError {
        AppendError::Store(error)
    }
}

impl Store {
    /// Creates a conversation of `project_id` holding `items`, in one transaction.
    pub async fn create_conversation(
        &self,
        project_id: &str,
        row: &ConversationRow,
        items: &[NewConversationItem],
    ) -> Result<(), StoreError> {
        let _timer = self.timed("create_conversation");
        with_pool!(self, |pool| {
            let mut tx = pool.begin().await?;
            sqlx::query(
                "INSERT INTO conversations (id, project_id, metadata, created_at, next_position)
                 VALUES ($1, $2, $3, $4, $5)",
            )
            .bind(&row.id)
            .bind(project_id)
            .bind(&row.metadata)
            .bind(row.created_at)
            .bind(items.len() as i64)
            .execute(&mut *tx)
            .await?;
            for (position, item) in items.iter().enumerate() {
                sqlx::query(
                    "INSERT INTO conversation_items (conversation_id, position, item_id, item, response_id, created_at)
                     VALUES ($1, $2, $3, $4, NULL, $5)",
                )
                .bind(&row.id)
                .bind(position as i64)
                .bind(&item.id)
                .bind(&item.item)
                .bind(row.created_at)
                .execute(&mut *tx)
                .await?;
            }
            tx.commit().await?;
            Ok(())
        })
    }

    /// A conversation of `project_id`.
    pub async fn load_conversation(
        &self,
        project_id: &str,
        id: &str,
    ) -> Result<Option<ConversationRow>, StoreError> {
        let _timer = self.timed("load_conversation");
        Ok(with_read_pool!(self, |pool| {
            sqlx::query_as::<_, ConversationRow>(
            "SELECT id, metadata, created_at FROM conversations WHERE id = $1 AND project_id = $2",
        )
        .bind(id)
        .bind(project_id)
        .fetch_optional(pool)
        .await?
        }))
    }

    /// Replaces a conversation's metadata; the conversation as it is now, or `None` when there is none.
    pub async fn update_conversation(
        &self,
        project_id: &str,
        id: &str,
        metadata: &Value,
    ) -> Result<Option<ConversationRow>, StoreError> {
        let _timer = self.timed("update_conversation");
        Ok(with_pool!(self, |pool| {
            sqlx::query_as::<_, ConversationRow>(
                "UPDATE conversations SET metadata = $3 WHERE id = $1 AND project_id = $2
             RETURNING id, metadata, created_at",
            )
            .bind(id)
            .bind(project_id)
            .bind(metadata)
            .fetch_optional(pool)
            .await?
        }))
    }

    /// Deletes a conversation and its items; whether there was one.
    pub async fn delete_conversation(
        &self,
        project_id: &str,
        id: &str,
    ) -> Result<bool, StoreError> {
        let _timer = self.timed("delete_conversation");
        self.delete_with_children(
            &[],
            "DELETE FROM conversations WHERE id = $1 AND project_id = $2",
            &["DELETE FROM conversation_items WHERE conversation_id = $1"],
            id,
            project_id,
        )
        .await
    }

    /// Every item of a conversation of `project_id`, in order, as stored; `None` when there is no such
    /// conversation.
    pub async fn conversation_items(
        &self,
        project_id: &str,
        id: &str,
    ) -> Result<Option<Vec<Value>>, StoreError> {
        let _timer = self.timed("conversation_items");
        if self.load_conversation(project_id, id).await?.is_none() {
            return Ok(None);
        }
        let items: Vec<Value> = with_read_pool!(self, |pool| {
            sqlx::query_scalar(
            "SELECT i.item FROM conversation_items i JOIN conversations c ON c.id = i.conversation_id
             WHERE i.conversation_id = $1 AND c.project_id = $2 ORDER BY i.position",
        )
        .bind(id)
        .bind(project_id)
        .fetch_all(pool)
        .await?
        });
        Ok(Some(items))
    }

    /// The ids of every item of a conversation of `project_id`; `None` when there is no such conversation.
    pub async fn conversation_item_ids(
        &self,
        project_id: &str,
        id: &str,
    ) -> Result<Option<std::collections::HashSet<String>>, StoreError> {
        let _timer = self.timed("conversation_item_ids");
        if self.load_conversation(project_id, id).await?.is_none() {
            return Ok(None);
        }
        let ids: Vec<String> = with_read_pool!(self, |pool| sqlx::query_scalar(
            "SELECT item_id FROM conversation_items WHERE conversation_id = $1",
        )
        .bind(id)
        .fetch_all(pool)
        .await?);
        Ok(Some(ids.into_iter().collect()))
    }

    /// One page of a conversation's items: `limit` after the item `after` in `order`, and whether more follow.
    /// `Ok(None)` when `after` names no item of the conversation. The caller has checked the conversation is the
    /// project's.
    pub async fn conversation_items_page(
        &self,
        conversation_id: &str,
        after: Option<&str>,
        limit: i64,
        order: Order,
    ) -> Result<Option<(Vec<Value>, bool)>, StoreError> {
        let _timer = self.timed("conversation_items_page");
        let start = match after {
            None => None,
            Some(item_id) => {
                let position: Option<i64> = with_read_pool!(self, |pool| {
                    sqlx::query_scalar(
                    "SELECT position FROM conversation_items WHERE conversation_id = $1 AND item_id = $2",
                )
                .bind(conversation_id)
                .bind(item_id)
                .fetch_optional(pool)
                .await?
                });
                match position {
                    Some(position) => Some(position),
                    None => return Ok(None),
                }
            }
        };
        let query = match order {
            Order::Asc => {
                "SELECT item FROM conversation_items WHERE conversation_id = $1 AND position > COALESCE($2, -1)
                 ORDER BY position ASC LIMIT $3"
            }
            Order::Desc => {
                "SELECT item FROM conversation_items
                 WHERE conversation_id = $1 AND position < COALESCE($2, 9223372036854775807)
                 ORDER BY position DESC LIMIT $3"
            }
        };
        let mut items: Vec<Value> = with_read_pool!(self, |pool| sqlx::query_scalar(query)
            .bind(conversation_id)
            .bind(start)
            .bind(limit + 1)
            .fetch_all(pool)
            .await?);
        let has_more = items.len() as i64 > limit;
        items.truncate(limit as usize);
        Ok(Some((items, has_more)))
    }

    /// One item of a conversation (the caller has checked the conversation is the project's).
    pub async fn conversation_item(
        &self,
        conversation_id: &str,
        item_id: &str,
    ) -> Result<Option<Value>, StoreError> {
        let _timer = self.timed("conversation_item");
        Ok(with_read_pool!(self, |pool| sqlx::query_scalar(
            "SELECT item FROM conversation_items WHERE conversation_id = $1 AND item_id = $2",
        )
        .bind(conversation_id)
        .bind(item_id)
        .fetch_optional(pool)
        .await?))
    }

    /// Deletes one item of a conversation (the caller has checked the conversation is the project's); whether
    /// there was one.
    pub async fn delete_conversation_item(
        &self,
        conversation_id: &str,
        item_id: &str,
    ) -> Result<bool, StoreError> {
        let _timer = self.timed("delete_conversation_item");
        let deleted = with_pool!(self, |pool| sqlx::query(
            "DELETE FROM conversation_items WHERE conversation_id = $1 AND item_id = $2",
        )
        .bind(conversation_id)
        .bind(item_id)
        .execute(pool)
        .await?
        .rows_affected());
        Ok(deleted > 0)
    }

    /// Appends `items` to a conversation of `project_id` after every item it holds, in one transaction: the
    /// positions are taken by updating the conversation's row, so concurrent appends land one after the other,
    /// each whole. Answers the items added (a skipped one is not).
    pub async fn append_conversation_items(
        &self,
        project_id: &str,
        conversation_id: &str,
        items: &[NewConversationItem],
        response_id: Option<&str>,
        on_taken: OnTakenId,
        now: i64,
    ) -> Result<Vec<Value>, AppendError> {
        let _timer = self.timed("append_conversation_items");
        // The body's own `return`s leave the inner block, whose answer is the method's.
        with_pool!(self, |pool| {
            async {
            let mut tx = pool.begin().await?;
            let next: Option<i64> = sqlx::query_scalar(
                "UPDATE conversations SET next_position = next_position + $3
                 WHERE id = $1 AND project_id = $2 RETURNING next_position",
            )
            .bind(conversation_id)
            .bind(project_id)
            .bind(items.len() as i64)
            .fetch_optional(&mut *tx)
            .await?;
            let Some(next) = next else {
                return Err(AppendError::NotFound);
            };
            let first = next - items.len() as i64;
            let mut added = Vec::with_capacity(items.len());
            for (offset, item) in items.iter().enumerate() {
                let inserted = sqlx::query(
                    "INSERT INTO conversation_items (conversation_id, position, item_id, item, response_id, created_at)
                     VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
                )
                .bind(conversation_id)
                .bind(first + offset as i64)
                .bind(&item.id)
                .bind(&item.item)
                .bind(response_id)
                .bind(now)
                .execute(&mut *tx)
                .await?
                .rows_affected();
                match (inserted, on_taken) {
                    (0, OnTakenId::Refuse) => return Err(AppendError::TakenId(item.id.clone())),
                    (0, OnTakenId::Skip) => {}
                    _ => added.push(item.item.clone()),
                }
            }
            tx.commit().await?;
            Ok(added)
        }
        .await
        })
    }
}
