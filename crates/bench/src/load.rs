//! Load drivers: closed loop (N workers back to back), open loop (fixed rate, latency from the intended
//! send time), and N concurrent open streams.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use reqwest::Client;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use crate::procs;
use crate::scenario::{GatewayRequest, Target};

/// Longest latency the histograms hold (larger values are recorded as this).
const MAX_LATENCY_US: u64 = 300_000_000;

/// Requests in flight at most in open-loop mode; beyond it the scheduler waits (and the wait counts
/// as latency, since latency runs from the intended send time).
const MAX_IN_FLIGHT: usize = 8192;

/// Error messages kept per run.
const ERROR_SAMPLES: usize = 5;

fn histogram() -> anyhow::Result<Histogram<u64>> {
    Histogram::new_with_bounds(1, MAX_LATENCY_US, 3)
        .map_err(|e| anyhow::anyhow!("cannot create a histogram: {e:?}"))
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// Latencies (µs) and outcome counts of one run.
#[derive(Debug, Clone)]
pub struct Stats {
    /// Whole request: until the answer was read and checked.
    pub latency: Histogram<u64>,
    /// Until the first body bytes (streams only).
    pub first_event: Histogram<u64>,
    /// How late the open-loop scheduler sent requests (open loop only).
    pub send_lag: Histogram<u64>,
    pub ok: u64,
    pub errors: u64,
    pub error_samples: Vec<String>,
    pub elapsed: Duration,
}

impl Stats {
    /// Empty statistics; clone these rather than creating more.
    pub fn new() -> anyhow::Result<Stats> {
        Ok(Stats {
            latency: histogram()?,
            first_event: histogram()?,
            send_lag: histogram()?,
            ok: 0,
            errors: 0,
            error_samples: Vec::new(),
            elapsed: Duration::ZERO,
        })
    }

    fn record(&mut self, result: Result<Option<Instant>, String>, origin: Instant, sent: Instant) {
        match result {
            Ok(first) => {
                self.ok += 1;
                self.latency.saturating_record(micros(origin.elapsed()));
                if let Some(first) = first {
                    self.first_event
                        .saturating_record(micros(first.saturating_duration_since(origin)));
                }
                if sent > origin {
                    self.send_lag
                        .saturating_record(micros(sent.saturating_duration_since(origin)));
                }
            }
            Err(message) => {
                self.errors += 1;
                if self.error_samples.len() < ERROR_SAMPLES
                    && !self.error_samples.contains(&message)
                {
                    self.error_samples.push(message);
                }
            }
        }
    }

    /// Adds another run's figures, elapsed time included.
    pub fn merge(&mut self, other: &Stats) {
        self.elapsed += other.elapsed;
        let _ = self.latency.add(&other.latency);
        let _ = self.first_event.add(&other.first_event);
        let _ = self.send_lag.add(&other.send_lag);
        self.ok += other.ok;
        self.errors += other.errors;
        for message in &other.error_samples {
            if self.error_samples.len() < ERROR_SAMPLES && !self.error_samples.contains(message) {
                self.error_samples.push(message.clone());
            }
        }
    }

    /// Successful requests per second.
    pub fn rps(&self) -> f64 {
        let secs = self.elapsed.as_secs_f64();
        if secs > 0.0 {
            self.ok as f64 / secs
        } else {
            0.0
        }
    }

    /// A latency quantile in milliseconds (`None` without samples).
    pub fn ms(&self, quantile: f64) -> Option<f64> {
        quantile_ms(&self.latency, quantile)
    }

    pub fn first_event_ms(&self, quantile: f64) -> Option<f64> {
        quantile_ms(&self.first_event, quantile)
    }
}

pub fn quantile_ms(histogram: &Histogram<u64>, quantile: f64) -> Option<f64> {
    (!histogram.is_empty()).then(|| histogram.value_at_quantile(quantile) as f64 / 1000.0)
}

/// How a run is driven.
#[derive(Debug, Clone, Copy)]
pub enum Load {
    /// `concurrency` workers, each sending its next request when the previous one is answered.
    Closed { concurrency: usize },
    /// Requests sent at `rate` per second whatever the answers; latency runs from the intended send time.
    Open { rate: f64 },
}

impl Load {
    pub fn describe(self) -> String {
        match self {
            Load::Closed { concurrency } => format!("c={concurrency}"),
            Load::Open { rate } => format!("{rate} rps"),
        }
    }
}

pub async fn run(
    http: &Client,
    target: &Target,
    load: Load,
    duration: Duration,
) -> anyhow::Result<Stats> {
    let empty = Stats::new()?;
    Ok(match load {
        Load::Closed { concurrency } => {
            closed_loop(http, target, concurrency, duration, empty).await
        }
        Load::Open { rate } => open_loop(http, target, rate, duration, empty).await,
    })
}

async fn closed_loop(
    http: &Client,
    target: &Target,
    concurrency: usize,
    duration: Duration,
    empty: Stats,
) -> Stats {
    let start = Instant::now();
    let end = start + duration;
    let mut workers = JoinSet::new();
    for _ in 0..concurrency.max(1) {
        let http = http.clone();
        let target = target.clone();
        let mut stats = empty.clone();
        workers.spawn(async move {
            while Instant::now() < end {
                let sent = Instant::now();
                let result = target.execute(&http).await;
                stats.record(result, sent, sent);
            }
            stats
        });
    }
    let mut total = empty;
    while let Some(joined) = workers.join_next().await {
        match joined {
            Ok(stats) => total.merge(&stats),
            Err(e) => {
                total.errors += 1;
                total.error_samples.push(format!("worker failed: {e}"));
            }
        }
    }
    total.elapsed = start.elapsed();
    total
}

async fn open_loop(
    http: &Client,
    target: &Target,
    rate: f64,
    duration: Duration,
    empty: Stats,
) -> Stats {
    let stats = Arc::new(Mutex::new(empty));
    let slots = Arc::new(Semaphore::new(MAX_IN_FLIGHT));
    let rate = rate.max(0.001);
    let count = (rate * duration.as_secs_f64()).ceil() as u64;
    let start = Instant::now();
    let mut requests = JoinSet::new();
    for i in 0..count {
        let intended = start + Duration::from_secs_f64(i as f64 / rate);
        tokio::time::sleep_until(tokio::time::Instant::from_std(intended)).await;
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            break;
        };
        let http = http.clone();
        let target = target.clone();
        let stats = Arc::clone(&stats);
        requests.spawn(async move {
            let sent = Instant::now();
            let result = target.execute(&http).await;
            drop(slot);
            stats
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .record(result, intended, sent);
        });
        // Reap finished tasks as we go, so the set stays small.
        while requests.try_join_next().is_some() {}
    }
    while requests.join_next().await.is_some() {}
    let mut total = stats.lock().unwrap_or_else(|e| e.into_inner()).clone();
    total.elapsed = start.elapsed();
    total
}

/// What holding many streams open did.
#[derive(Debug, Clone)]
pub struct StreamsOutcome {
    pub stats: Stats,
    /// The most streams that had received their first event and not ended, at the same time.
    pub max_open: usize,
    /// When every stream was open at once (from the first request), if that happened.
    pub all_open_after: Option<Duration>,
    /// Gateway RSS (KiB) when the most streams were open.
    pub rss_at_max_open_kib: Option<u64>,
    /// Highest gateway RSS sampled (KiB).
    pub peak_rss_kib: Option<u64>,
}

/// Opens `count` streams at once and reads each to its end, sampling how many are open and the
/// gateway's RSS every 20 ms.
pub async fn open_streams(
    http: &Client,
    request: &GatewayRequest,
    count: usize,
    gateway_pid: Option<u32>,
) -> anyhow::Result<StreamsOutcome> {
    let empty = Stats::new()?;
    let open = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut streams = JoinSet::new();
    for _ in 0..count {
        let http = http.clone();
        let request = request.clone();
        let open = Arc::clone(&open);
        let mut stats = empty.clone();
        streams.spawn(async move {
            let sent = Instant::now();
            let result = stream_once(&http, &request, &open).await;
            stats.record(result, sent, sent);
            stats
        });
    }

    let mut outcome = StreamsOutcome {
        stats: empty,
        max_open: 0,
        all_open_after: None,
        rss_at_max_open_kib: None,
        peak_rss_kib: None,
    };
    let mut best_open = 0;
    loop {
        let now_open = open.load(Ordering::SeqCst);
        let rss = gateway_pid
            .and_then(|pid| procs::memory(pid).ok())
            .map(|m| m.rss_kib);
        if now_open > best_open || (now_open == best_open && rss > outcome.rss_at_max_open_kib) {
            best_open = now_open;
            outcome.rss_at_max_open_kib = rss;
        }
        if now_open >= count && outcome.all_open_after.is_none() {
            outcome.all_open_after = Some(start.elapsed());
        }
        outcome.peak_rss_kib = outcome.peak_rss_kib.max(rss);
        if streams.is_empty() {
            break;
        }
        while let Some(joined) = streams.try_join_next() {
            match joined {
                Ok(stats) => outcome.stats.merge(&stats),
                Err(e) => {
                    outcome.stats.errors += 1;
                    outcome
                        .stats
                        .error_samples
                        .push(format!("stream task failed: {e}"));
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    outcome.stats.elapsed = start.elapsed();
    outcome.max_open = best_open;
    Ok(outcome)
}

/// One stream, counted in `open` from its first bytes to its end.
async fn stream_once(
    http: &Client,
    request: &GatewayRequest,
    open: &AtomicUsize,
) -> Result<Option<Instant>, String> {
    struct Open<'a>(&'a AtomicUsize);
    impl Drop for Open<'_> {
        fn drop(&mut self) {
            self.0.fetch_sub(1, Ordering::SeqCst);
        }
    }
    let response = request.send(http).await.map_err(|e| format!("send: {e}"))?;
    let status = response.status();
    let mut chunks = response.bytes_stream();
    let mut body = Vec::new();
    let mut first = None;
    let mut guard = None;
    while let Some(chunk) = futures::StreamExt::next(&mut chunks).await {
        let chunk = chunk.map_err(|e| format!("body: {e}"))?;
        if first.is_none() && !chunk.is_empty() {
            first = Some(Instant::now());
            open.fetch_add(1, Ordering::SeqCst);
            guard = Some(Open(open));
        }
        body.extend_from_slice(&chunk);
    }
    drop(guard);
    if !status.is_success() {
        let text: String = String::from_utf8_lossy(&body).chars().take(300).collect();
        return Err(format!("HTTP {status}: {text}"));
    }
    let text = String::from_utf8_lossy(&body);
    if !text.contains("response.completed") {
        let end = last_chars(&text, 200);
        return Err(format!(
            "stream ended without response.completed (ends with {end:?})"
        ));
    }
    Ok(first)
}

/// The last `count` characters of `text`: how a stream that went wrong ended, for its error message.
pub(crate) fn last_chars(text: &str, count: usize) -> String {
    let mut end: Vec<char> = text.chars().rev().take(count).collect();
    end.reverse();
    end.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::last_chars;

    #[test]
    fn last_chars_counts_characters_not_bytes() {
        assert_eq!(last_chars("naïve café", 4), "café");
        assert_eq!(last_chars("ab", 5), "ab");
        assert_eq!(last_chars("", 3), "");
    }
}
