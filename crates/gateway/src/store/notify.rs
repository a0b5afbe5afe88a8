//! The notifications replicas send each other through the store (Postgres `NOTIFY`/`LISTEN`): one enum with a
//! typed payload per kind, its channel and payload on the wire, and the listener that hears them.

use std::time::Duration;

use sqlx::postgres::{PgListener, PgPool, PgPoolOptions};

use super::{Backend, Store, StoreError};

/// What one replica tells the others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notification {
    /// Response `.0` progressed: followers read its stored events again.
    Progress(String),
    /// A cancel, or the delete of running response `.0`: its owner stops it.
    Cancel(String),
    /// A response waits for a replica: replicas with room claim it at once.
    Work,
    /// An admin write: every replica forgets its cached tenancy answers.
    Tenancy,
    /// Somebody waits for response `.0`'s progress: its owner notifies `Progress` for a while.
    Follow(String),
}

/// The wire names of the notifications, one channel per kind; changing one breaks a mixed-version fleet.
mod channel {
    pub const PROGRESS: &str = "gateway_progress";
    pub const CANCEL: &str = "gateway_cancel";
    pub const WORK: &str = "gateway_work";
    pub const TENANCY: &str = "gateway_tenancy";
    pub const FOLLOW: &str = "gateway_follow";
    pub const ALL: [&str; 5] = [PROGRESS, CANCEL, WORK, TENANCY, FOLLOW];
}

impl Notification {
    /// The channel it is sent on.
    pub fn channel(&self) -> &'static str {
        match self {
            Notification::Progress(_) => channel::PROGRESS,
            Notification::Cancel(_) => channel::CANCEL,
            Notification::Work => channel::WORK,
            Notification::Tenancy => channel::TENANCY,
            Notification::Follow(_) => channel::FOLLOW,
        }
    }

    /// Its payload on the wire: the response id, or nothing.
    pub fn payload(&self) -> &str {
        match self {
            Notification::Progress(id) | Notification::Cancel(id) | Notification::Follow(id) => id,
            Notification::Work | Notification::Tenancy => "",
        }
    }

    /// The notification sent on `channel` with `payload`; `None` for a channel the gateway does not use.
    pub fn parse(channel: &str, payload: &str) -> Option<Notification> {
        let id = || payload.to_owned();
        Some(match channel {
            channel::PROGRESS => Notification::Progress(id()),
            channel::CANCEL => Notification::Cancel(id()),
            channel::WORK => Notification::Work,
            channel::TENANCY => Notification::Tenancy,
            channel::FOLLOW => Notification::Follow(id()),
            _ => return None,
        })
    }
}

/// Hears the notifications of every replica, on a connection of its own outside the store's pool (so that it
/// takes none of the pool's places), reconnecting when it drops.
pub struct Listener {
    own: PgPool,
    /// The connection listening, once made; the listener reconnects it by itself after a failed receive.
    connected: Option<PgListener>,
}

/// How long the listener waits before connecting again after a failure.
const RECONNECT_WAIT: Duration = Duration::from_secs(1);

/// How long the listener waits after a failed receive before the next.
const RECEIVE_WAIT: Duration = Duration::from_millis(200);

impl Listener {
    /// The next notification, waiting as long as it takes. Notifications sent while the connection is down are
    /// lost: the polls (the sweep, the beat's cancel check, followers' timeouts) make up for them.
    pub async fn next(&mut self) -> Notification {
        loop {
            if self.connected.is_none() {
                match listen_all(&self.own).await {
                    Ok(listener) => self.connected = Some(listener),
                    Err(e) => {
                        tracing::warn!(error = %e, "could not listen for notifications; trying again");
                        tokio::time::sleep(RECONNECT_WAIT).await;
                        continue;
                    }
                }
            }
            let Some(listener) = self.connected.as_mut() else {
                continue;
            };
            match listener.recv().await {
                Ok(heard) => {
                    if let Some(notification) =
                        Notification::parse(heard.channel(), heard.payload())
                    {
                        return notification;
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "notification listener failed");
                    tokio::time::sleep(RECEIVE_WAIT).await;
                }
            }
        }
    }
}

/// A connection of `own` listening on every channel of the gateway.
async fn listen_all(own: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(own).await?;
    listener.listen_all(channel::ALL).await?;
    Ok(listener)
}

impl Store {
    /// Tells every replica listening (Postgres `NOTIFY`; nothing on the embedded store, whose one process tells
    /// itself directly).
    pub async fn notify(&self, notification: &Notification) -> Result<(), StoreError> {
        if let Backend::Postgres(pool) = &self.backend {
            answered!(self, {
                sqlx::query("SELECT pg_notify($1, $2)")
                    .bind(notification.channel())
                    .bind(notification.payload())
                    .execute(pool)
                    .await?
            });
        }
        Ok(())
    }

    /// A listener for the other replicas' notifications, on a connection of its own; `None` on the embedded
    /// store, which one process serves.
    pub fn listen(&self) -> Option<Listener> {
        match &self.backend {
            Backend::Postgres(pool) => Some(Listener {
                own: PgPoolOptions::new()
                    .max_connections(1)
                    .max_lifetime(None)
                    .idle_timeout(None)
                    .connect_lazy_with((*pool.connect_options()).clone()),
                connected: None,
            }),
            Backend::Sqlite(_) => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Notification;

    #[test]
    fn every_notification_reads_back_from_its_channel_and_payload() {
        let all = [
            Notification::Progress("resp_1".into()),
            Notification::Cancel("resp_2".into()),
            Notification::Work,
            Notification::Tenancy,
            Notification::Follow("resp_3".into()),
        ];
        for notification in all {
            assert_eq!(
                Notification::parse(notification.channel(), notification.payload()),
                Some(notification)
            );
        }
    }

    #[test]
    fn the_wire_names_are_those_older_replicas_use() {
        let cases = [
            (Notification::Progress("r".into()), "gateway_progress"),
            (Notification::Cancel("r".into()), "gateway_cancel"),
            (Notification::Work, "gateway_work"),
            (Notification::Tenancy, "gateway_tenancy"),
            (Notification::Follow("r".into()), "gateway_follow"),
        ];
        for (notification, channel) in cases {
            assert_eq!(notification.channel(), channel);
        }
        assert_eq!(Notification::parse("another_channel", ""), None);
    }
}
