//! The gateway's own account of where a request's time went: mean durations from its `/metrics` histograms.

use std::collections::BTreeMap;

use reqwest::Client;

/// Sums and counts of every `*_seconds` histogram series, keyed by series (name and labels).
#[derive(Debug, Clone, Default)]
pub struct Histograms(BTreeMap<String, (f64, f64)>);

impl Histograms {
    /// Reads the gateway's `/metrics`; empty when it cannot be read (an older or foreign gateway).
    pub async fn scrape(http: &Client, gateway: &str) -> Histograms {
        let text = match http.get(format!("{gateway}/metrics")).send().await {
            Ok(response) if response.status().is_success() => {
                response.text().await.unwrap_or_default()
            }
            _ => String::new(),
        };
        Histograms::parse(&text)
    }

    /// The value of the unlabelled gauge `name` in the gateway's `/metrics`, if it has one.
    pub async fn gauge(http: &Client, gateway: &str, name: &str) -> Option<f64> {
        let response = http.get(format!("{gateway}/metrics")).send().await.ok()?;
        let text = response.text().await.ok()?;
        text.lines()
            .filter_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
            .find_map(|value| value.trim().parse().ok())
    }

    fn parse(text: &str) -> Histograms {
        let mut series: BTreeMap<String, (f64, f64)> = BTreeMap::new();
        for line in text.lines().filter(|l| !l.starts_with('#')) {
            let Some((key, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            if let Some(name) =
                series_name(key, "_seconds_sum").or_else(|| series_name(key, "_writes_sum"))
            {
                series.entry(name).or_default().0 = value;
            } else if let Some(name) =
                series_name(key, "_seconds_count").or_else(|| series_name(key, "_writes_count"))
            {
                series.entry(name).or_default().1 = value;
            }
        }
        Histograms(series)
    }

    /// Adds what happened between `before` and `after` (one measured slice).
    pub fn add_between(&mut self, before: &Histograms, after: &Histograms) {
        for (name, (sum, count)) in &after.0 {
            let (sum_before, count_before) = before.0.get(name).copied().unwrap_or_default();
            let entry = self.0.entry(name.clone()).or_default();
            entry.0 += sum - sum_before;
            entry.1 += count - count_before;
        }
    }

    /// Group commit's batches in the span, and the writes they held (`gateway_store_batch_writes`).
    pub fn batches(&self) -> Option<(f64, f64)> {
        self.0
            .get(BATCH_SERIES)
            .map(|(writes, batches)| (*batches, *writes))
    }

    /// `series: mean ms × calls per request` for every series that moved, busiest first.
    pub fn describe(&self, requests: u64) -> String {
        let mut rows: Vec<(&String, f64, f64)> = self
            .0
            .iter()
            .filter(|(name, (_, count))| {
                *count > 0.0
                    && !name.contains("/admin/")
                    && !name.contains("/metrics")
                    && name.as_str() != BATCH_SERIES
            })
            .map(|(name, (sum, count))| (name, sum / count * 1000.0, *count))
            .collect();
        rows.sort_by(|a, b| (b.1 * b.2).total_cmp(&(a.1 * a.2)));
        rows.iter()
            .map(|(name, mean_ms, count)| {
                format!(
                    "{name} {mean_ms:.3} ms × {:.2}",
                    count / requests.max(1) as f64
                )
            })
            .collect::<Vec<_>>()
            .join("; ")
    }
}

/// The series of group commit's batch sizes, as `series_name` names it.
const BATCH_SERIES: &str = "store_batch";

/// `gateway_store_duration{op="x"}` for `gateway_store_duration_seconds_sum{op="x"}`.
fn series_name(key: &str, suffix: &str) -> Option<String> {
    let (name, labels) = match key.split_once('{') {
        Some((name, labels)) => (name, format!("{{{labels}")),
        None => (key, String::new()),
    };
    let base = name.strip_suffix(suffix)?;
    Some(format!(
        "{}{labels}",
        base.strip_prefix("gateway_").unwrap_or(base)
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn means_come_from_the_deltas_of_sums_and_counts() {
        let before = Histograms::parse(
            "# TYPE x histogram\ngateway_store_duration_seconds_sum{op=\"create\"} 1.0\n\
             gateway_store_duration_seconds_count{op=\"create\"} 10\n",
        );
        let after = Histograms::parse(
            "gateway_store_duration_seconds_sum{op=\"create\"} 1.5\n\
             gateway_store_duration_seconds_count{op=\"create\"} 20\n\
             gateway_upstream_call_duration_seconds_sum{deployment=\"mock\"} 0.2\n\
             gateway_upstream_call_duration_seconds_count{deployment=\"mock\"} 20\n\
             gateway_responses_total 20\n\
             gateway_store_batch_writes_sum 30\n\
             gateway_store_batch_writes_count 12\n",
        );
        let mut total = Histograms::default();
        total.add_between(&before, &after);
        assert_eq!(
            total.describe(10),
            "store_duration{op=\"create\"} 50.000 ms × 1.00; \
             upstream_call_duration{deployment=\"mock\"} 10.000 ms × 2.00"
        );
        assert_eq!(total.batches(), Some((12.0, 30.0)));
    }
}
