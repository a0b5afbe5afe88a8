//! The notifications replicas send each other through the store (Postgres `NOTIFY`/`LISTEN`): one enum with a
//! typed payload per kind, its channel and payload on the wire, and the listener that hears them.

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgListener, PgNotification, PgPool, PgPoolOptions};

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
/// takes none of the pool's places), connecting again, within a bound, when it drops or fails, and when it falls
/// silent: a connection whose database vanished without closing it (a restart behind a partition, a machine lost)
/// would otherwise keep it waiting for ever, deaf to the other replicas.
pub struct Listener {
    /// The pool of the listening connection (one place), made afresh whenever the listener connects again: a
    /// connection given up goes back to its pool (sqlx tells it `UNLISTEN *` first), which would hold its one
    /// place for as long as that connection takes to fail.
    own: PgPool,
    /// How `own` connects.
    options: PgConnectOptions,
    /// The connection listening, once made.
    connected: Option<PgListener>,
    /// How long the listener waits to connect, how long it stays quiet before it proves its connection alive, and
    /// how long it waits to hear that proof (`database.reply_timeout_ms`).
    reply_wait: Duration,
    /// Whether the listener was connected before: notifications sent while it connected again were lost.
    was_connected: bool,
}

/// How long the listener waits before connecting again after a failure to.
const RECONNECT_WAIT: Duration = Duration::from_secs(1);

/// What a wait on the listening connection ended with.
enum Heard {
    /// A notification.
    Message(PgNotification),
    /// The connection was lost (closed, reset) or the receive failed.
    Lost(String),
    /// Nothing came, and the connection did not answer the listener's own question: it fell silent.
    Silent,
}

impl Listener {
    /// The next notification, waiting as long as it takes. Notifications sent while the listener is not connected
    /// are lost: the polls (the sweep, the beat's cancel check, followers' timeouts) make up for them, and after
    /// the listener connects again its first answer is `Tenancy`, so that admin changes missed meanwhile are not
    /// served from the cache.
    pub async fn next(&mut self) -> Notification {
        loop {
            if self.connected.is_none() {
                match tokio::time::timeout(self.reply_wait, listen_all(&self.own)).await {
                    Ok(Ok(listener)) => {
                        self.connected = Some(listener);
                        if std::mem::replace(&mut self.was_connected, true) {
                            tracing::info!("notification listener connected again");
                            return Notification::Tenancy;
                        }
                    }
                    failed => {
                        let error = match failed {
                            Ok(Err(e)) => e.to_string(),
                            _ => "no answer in time (database.reply_timeout_ms)".to_owned(),
                        };
                        tracing::warn!(%error, "could not listen for notifications; trying again");
                        self.own = own_pool(&self.options);
                        tokio::time::sleep(RECONNECT_WAIT).await;
                        continue;
                    }
                }
            }
            let Some(listener) = self.connected.as_mut() else {
                continue;
            };
            let lost = match hear_or_prove_alive(listener, self.reply_wait).await {
                Heard::Message(heard) => {
                    if let Some(notification) =
                        Notification::parse(heard.channel(), heard.payload())
                    {
                        return notification;
                    }
                    continue;
                }
                Heard::Lost(error) => error,
                Heard::Silent => "its connection fell silent".to_owned(),
            };
            tracing::warn!(error = %lost, "the notification listener lost its connection; connecting again");
            self.connected = None;
            self.own = own_pool(&self.options);
        }
    }
}

/// The next message on `listener`. After `quiet` with none, the listener asks its own connection for an answer
/// (`SELECT 1`); when none comes within `quiet`, the connection is silent. The proof goes over the listening
/// connection itself, so it needs none of the store's pool: a pool kept full by load (or by a fault) cannot hide a
/// connection that died. A message already arrived wins over a timer that ran out meanwhile (a paused process).
/// The wait for a message is given up only between messages, which sqlx's receive allows (it takes nothing off
/// the socket's buffer until a whole message is there); a notification that arrives while the proof is answered
/// is kept by sqlx and returned by the next receive.
async fn hear_or_prove_alive(listener: &mut PgListener, quiet: Duration) -> Heard {
    loop {
        let heard = {
            let receive = listener.try_recv();
            tokio::pin!(receive);
            tokio::select! {
                biased;
                heard = &mut receive => Some(heard),
                () = tokio::time::sleep(quiet) => None,
            }
        };
        match heard {
            Some(Ok(Some(heard))) => return Heard::Message(heard),
            Some(Ok(None)) => return Heard::Lost("the connection was closed".to_owned()),
            Some(Err(e)) => return Heard::Lost(e.to_string()),
            None => {}
        }
        let proof =
            tokio::time::timeout(quiet, sqlx::query("SELECT 1").execute(&mut *listener)).await;
        match proof {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => return Heard::Lost(e.to_string()),
            Err(_) => return Heard::Silent,
        }
    }
}

/// The pool of a listening connection: one place, kept for as long as it lives.
fn own_pool(options: &PgConnectOptions) -> PgPool {
    PgPoolOptions::new()
        .max_connections(1)
        .max_lifetime(None)
        .idle_timeout(None)
        .connect_lazy_with(options.clone())
}

/// A connection of `own` listening on every channel of the gateway.
async fn listen_all(own: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(own).await?;
    // A lost connection is the listener's to replace, within its bound, not sqlx's.
    listener.eager_reconnect(false);
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
                own: own_pool(&pool.connect_options()),
                options: (*pool.connect_options()).clone(),
                connected: None,
                reply_wait: self.reply_wait,
                was_connected: false,
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
        assert_eq!(
            Notification::parse("gateway_alive", ""),
            None,
            "the proof of life older replicas send themselves is acted on by nobody"
        );
    }
}
