//! The figures of a bench run, rendered as Markdown (printed, and written with `--markdown`).

use std::fmt::Write as _;
use std::time::Duration;

use crate::load::{quantile_ms, Load, Stats, StreamsOutcome};
use crate::scenario::Scenario;

/// CPU time per successful gateway request, in µs, of each process (while the gateway phase ran).
#[derive(Debug, Clone, Copy, Default)]
pub struct CpuPerRequest {
    pub gateway: Option<f64>,
    pub postgres: Option<f64>,
    pub mock: Option<f64>,
    pub tools: Option<f64>,
    pub bench: Option<f64>,
}

/// A request/response scenario: the gateway run and the direct run.
#[derive(Debug, Clone)]
pub struct Measured {
    pub scenario: Scenario,
    pub load: Load,
    pub load_average: String,
    pub plan: String,
    pub gateway: Stats,
    /// The baseline gateway's run (`--baseline-bin-dir`), alternated with the others.
    pub baseline: Option<Stats>,
    pub direct: Stats,
    pub peak_rss_kib: Option<u64>,
    /// The gateway's own mean timings during the gateway run (from its `/metrics`).
    pub timings: String,
    /// What the gateway run's writes cost the database.
    pub writes: WriteFigures,
    pub cpu: CpuPerRequest,
    /// The baseline's CPU per request over its slices, in µs.
    pub baseline_cpu: Option<f64>,
}

/// What a run's writes cost the database: commits (Postgres' write transactions, every process included) and
/// group commit's batches, per gateway request.
#[derive(Debug, Clone, Copy, Default)]
pub struct WriteFigures {
    pub commits_per_request: Option<f64>,
    pub batches_per_request: Option<f64>,
    pub writes_per_batch: Option<f64>,
}

impl WriteFigures {
    /// From the gateway's batch histogram over the run and the write transactions counted around it.
    pub fn of(
        timings: &crate::timings::Histograms,
        commits: Option<i64>,
        requests: u64,
    ) -> WriteFigures {
        let requests = requests.max(1) as f64;
        let batches = timings.batches().filter(|(batches, _)| *batches > 0.0);
        WriteFigures {
            commits_per_request: commits.map(|c| c as f64 / requests),
            batches_per_request: batches.map(|(batches, _)| batches / requests),
            writes_per_batch: batches.map(|(batches, writes)| writes / batches),
        }
    }

    fn describe(&self) -> Option<String> {
        let mut parts = Vec::new();
        if let Some(commits) = self.commits_per_request {
            parts.push(format!(
                "{commits:.2} commits (write transactions) per request"
            ));
        }
        if let (Some(batches), Some(writes)) = (self.batches_per_request, self.writes_per_batch) {
            parts.push(format!(
                "{batches:.3} group-commit batches per request, {writes:.1} writes per batch"
            ));
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

impl Measured {
    /// Gateway quantile minus direct quantile, in ms.
    pub fn overhead_ms(&self, quantile: f64) -> Option<f64> {
        Some(self.gateway.ms(quantile)? - self.direct.ms(quantile)?)
    }

    pub fn first_event_overhead_ms(&self, quantile: f64) -> Option<f64> {
        Some(self.gateway.first_event_ms(quantile)? - self.direct.first_event_ms(quantile)?)
    }
}

/// The open-streams scenario.
#[derive(Debug, Clone)]
pub struct StreamsMeasured {
    pub count: usize,
    pub hold: Duration,
    pub load_average: String,
    pub outcome: StreamsOutcome,
    pub rss_before_kib: Option<u64>,
    pub hwm_kib: Option<u64>,
    pub rss_after_kib: Option<u64>,
    /// RSS 5 s after the streams and their connections closed.
    pub rss_settled_kib: Option<u64>,
    /// The anonymous part of the RSS before the streams, and 5 s after they closed (`RssAnon`).
    pub anon_before_kib: Option<u64>,
    pub anon_settled_kib: Option<u64>,
    /// Live allocations before the streams, as the gateway's allocator counts them.
    pub allocated_before_kib: Option<u64>,
    /// Of it, live allocations as the gateway's allocator counts them (`None` for a gateway that does not say).
    pub allocated_settled_kib: Option<u64>,
    /// Of it, what the allocator holds resident: live allocations, the free space between them, its metadata and
    /// freed pages not given back yet.
    pub allocator_resident_settled_kib: Option<u64>,
}

#[derive(Debug, Clone)]
pub enum Outcome {
    Measured(Box<Measured>),
    Streams(Box<StreamsMeasured>),
    Failed { scenario: Scenario, reason: String },
}

/// Everything a run found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub command: String,
    pub started: String,
    pub machine: String,
    pub settings: String,
    pub idle_rss_kib: Option<u64>,
    pub end_rss_kib: Option<u64>,
    pub outcomes: Vec<Outcome>,
    pub gateway_log: Option<(u64, u64, Vec<String>)>,
}

fn ms(value: Option<f64>) -> String {
    value.map_or_else(|| "–".into(), |v| format!("{v:.2}"))
}

fn mib(kib: Option<u64>) -> String {
    kib.map_or_else(|| "–".into(), |k| format!("{:.1}", k as f64 / 1024.0))
}

/// `after ÷ before` to three places (issue 27's memory target: within 1.200).
fn ratio(after: Option<u64>, before: Option<u64>) -> String {
    match (after, before) {
        (Some(after), Some(before)) if before > 0 => format!("{:.3}", after as f64 / before as f64),
        _ => "–".into(),
    }
}

fn us(value: Option<f64>) -> String {
    value.map_or_else(|| "–".into(), |v| format!("{v:.0}"))
}

/// The gateway against the baseline gateway, scenario by scenario, when the run had one.
fn render_baseline(out: &mut String, measured: &[&Measured]) {
    let compared: Vec<(&Measured, &Stats)> = measured
        .iter()
        .filter_map(|m| Some((*m, m.baseline.as_ref()?)))
        .collect();
    if compared.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "Against the baseline gateway (alternated slice by slice with the gateway and direct runs; ratio = \
         gateway req/s ÷ baseline req/s):\n"
    );
    let _ = writeln!(
        out,
        "| scenario | load | gw req/s | baseline req/s | ratio | gw p50 | baseline p50 | gw p99 | baseline p99 | errors gw/baseline | CPU µs/req gw/baseline |"
    );
    let _ = writeln!(out, "|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|");
    for (m, baseline) in compared {
        let ratio = (baseline.rps() > 0.0).then(|| m.gateway.rps() / baseline.rps());
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} | {:.0} | {} | {} | {} | {} | {} | {}/{} | {}/{} |",
            m.scenario.name(),
            m.load.describe(),
            m.gateway.rps(),
            baseline.rps(),
            ratio.map_or_else(|| "–".into(), |r| format!("{r:.3}")),
            ms(m.gateway.ms(0.5)),
            ms(baseline.ms(0.5)),
            ms(m.gateway.ms(0.99)),
            ms(baseline.ms(0.99)),
            m.gateway.errors,
            baseline.errors,
            us(m.cpu.gateway),
            us(m.baseline_cpu),
        );
    }
    out.push('\n');
}

fn target_row(out: &mut String, target: &str, measured: String, met: Option<bool>) {
    let verdict = match met {
        Some(true) => "met",
        Some(false) => "**not met**",
        None => "not measured in this run",
    };
    let _ = writeln!(out, "| {target} | {measured} | {verdict} |");
}

impl Report {
    fn measured(&self) -> impl Iterator<Item = &Measured> {
        self.outcomes.iter().filter_map(|o| match o {
            Outcome::Measured(m) => Some(m.as_ref()),
            _ => None,
        })
    }

    fn find(&self, scenario: Scenario) -> Option<&Measured> {
        self.measured().find(|m| m.scenario == scenario)
    }

    fn streams(&self) -> Option<&StreamsMeasured> {
        self.outcomes.iter().find_map(|o| match o {
            Outcome::Streams(s) => Some(s.as_ref()),
            _ => None,
        })
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(out, "## Bench run {}\n", self.started);
        let _ = writeln!(out, "* command: `{}`", self.command);
        let _ = writeln!(out, "* machine: {}", self.machine);
        let _ = writeln!(out, "* settings: {}", self.settings);
        let _ = writeln!(
            out,
            "* gateway RSS idle after start-up: {} MiB; at the end of the run: {} MiB",
            mib(self.idle_rss_kib),
            mib(self.end_rss_kib)
        );
        if let Some((warnings, errors, _)) = &self.gateway_log {
            let _ = writeln!(
                out,
                "* gateway log: {warnings} warning(s), {errors} error(s)"
            );
        }
        out.push('\n');

        let measured: Vec<&Measured> = self.measured().collect();
        if !measured.is_empty() {
            let _ = writeln!(
                out,
                "Latencies in ms. *direct* is the same upstream work sent straight to the mock model and tool \
                 server; overhead = gateway quantile − direct quantile. CPU is µs per gateway request spent by \
                 each process during the gateway phase (gateway / Postgres backends / mock model).\n"
            );
            let _ = writeln!(
                out,
                "| scenario | load | load avg | gw req/s | gw p50 | gw p90 | gw p99 | direct req/s | direct p50 | direct p99 | overhead p50 | overhead p99 | errors gw/direct | peak RSS MiB | CPU µs/req gw/pg/mock |"
            );
            let _ = writeln!(
                out,
                "|---|---|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
            );
            for m in &measured {
                let _ = writeln!(
                    out,
                    "| {} | {} | {} | {:.0} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {}/{} | {} | {}/{}/{} |",
                    m.scenario.name(),
                    m.load.describe(),
                    m.load_average,
                    m.gateway.rps(),
                    ms(m.gateway.ms(0.5)),
                    ms(m.gateway.ms(0.9)),
                    ms(m.gateway.ms(0.99)),
                    m.direct.rps(),
                    ms(m.direct.ms(0.5)),
                    ms(m.direct.ms(0.99)),
                    ms(m.overhead_ms(0.5)),
                    ms(m.overhead_ms(0.99)),
                    m.gateway.errors,
                    m.direct.errors,
                    mib(m.peak_rss_kib),
                    us(m.cpu.gateway),
                    us(m.cpu.postgres),
                    us(m.cpu.mock),
                );
                if !m.gateway.first_event.is_empty() {
                    let _ = writeln!(
                        out,
                        "| {} (first event) | {} | | | {} | {} | {} | | {} | {} | {} | {} | | | |",
                        m.scenario.name(),
                        m.load.describe(),
                        ms(m.gateway.first_event_ms(0.5)),
                        ms(m.gateway.first_event_ms(0.9)),
                        ms(m.gateway.first_event_ms(0.99)),
                        ms(m.direct.first_event_ms(0.5)),
                        ms(m.direct.first_event_ms(0.99)),
                        ms(m.first_event_overhead_ms(0.5)),
                        ms(m.first_event_overhead_ms(0.99)),
                    );
                }
            }
            out.push('\n');
            render_baseline(&mut out, &measured);
            for m in &measured {
                let lag = quantile_ms(&m.gateway.send_lag, 0.99);
                let _ = writeln!(
                    out,
                    "* {}: {}; direct = {}; gateway {} ok in {:.1} s, direct {} ok{}{}",
                    m.scenario.name(),
                    m.scenario.describe(),
                    m.plan,
                    m.gateway.ok,
                    m.gateway.elapsed.as_secs_f64(),
                    m.direct.ok,
                    match (m.cpu.tools, m.cpu.bench) {
                        (Some(t), Some(b)) if t > 0.5 =>
                            format!("; CPU µs/req tool server {t:.0}, bench {b:.0}"),
                        (_, Some(b)) => format!("; CPU µs/req bench {b:.0}"),
                        _ => String::new(),
                    },
                    lag.map_or_else(String::new, |l| format!(
                        "; open-loop send lag p99 {l:.2} ms"
                    )),
                );
                if !m.timings.is_empty() {
                    let _ = writeln!(
                        out,
                        "  * gateway's own mean timings per call × calls per request: {}",
                        m.timings
                    );
                }
                if let Some(writes) = m.writes.describe() {
                    let _ = writeln!(out, "  * writes: {writes}");
                }
                for sample in m
                    .gateway
                    .error_samples
                    .iter()
                    .chain(&m.direct.error_samples)
                {
                    let _ = writeln!(out, "  * error: `{}`", sample.replace('`', "'"));
                }
            }
            out.push('\n');
        }

        if let Some(s) = self.streams() {
            let o = &s.outcome;
            let _ = writeln!(
                out,
                "### {} concurrent open streams (upstream holds each answer {} ms)\n",
                s.count,
                s.hold.as_millis()
            );
            let _ = writeln!(
                out,
                "| load avg | streams ok | errors | max open at once | all open after | RSS before MiB | RSS at max open MiB | peak RSS MiB | RSS 1 s after MiB | RSS 5 s after MiB | RSS 5 s after ÷ before | anonymous RSS before / 5 s after MiB | allocated before / 5 s after MiB | allocator's resident 5 s after MiB | first event p50 | first event p99 | total p50 | total p99 |"
            );
            let _ = writeln!(
                out,
                "|---|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|"
            );
            let _ =
                writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} / {} | {} / {} | {} | {} | {} | {} | {} |",
                s.load_average,
                o.stats.ok,
                o.stats.errors,
                o.max_open,
                o.all_open_after
                    .map_or_else(|| "never".into(), |d| format!("{:.2} s", d.as_secs_f64())),
                mib(s.rss_before_kib),
                mib(o.rss_at_max_open_kib),
                mib(o.peak_rss_kib.max(s.hwm_kib)),
                mib(s.rss_after_kib),
                mib(s.rss_settled_kib),
                ratio(s.rss_settled_kib, s.rss_before_kib),
                mib(s.anon_before_kib),
                mib(s.anon_settled_kib),
                mib(s.allocated_before_kib),
                mib(s.allocated_settled_kib),
                mib(s.allocator_resident_settled_kib),
                ms(o.stats.first_event_ms(0.5)),
                ms(o.stats.first_event_ms(0.99)),
                ms(o.stats.ms(0.5)),
                ms(o.stats.ms(0.99)),
            );
            for sample in &o.stats.error_samples {
                let _ = writeln!(out, "* error: `{}`", sample.replace('`', "'"));
            }
            out.push('\n');
        }

        for outcome in &self.outcomes {
            if let Outcome::Failed { scenario, reason } = outcome {
                let _ = writeln!(
                    out,
                    "* **{} failed**: {}",
                    scenario.name(),
                    reason.replace('\n', " ")
                );
            }
        }

        let text = self.find(Scenario::TextStored);
        let mut iteration_lines = Vec::new();
        if let Some(text) = text {
            for extra in [Scenario::ToolRound, Scenario::ParallelTools] {
                if let Some(m) = self.find(extra) {
                    if m.load.describe() == text.load.describe() {
                        iteration_lines.push(format!(
                            "* {} − text-stored overhead (one extra loop iteration, {}): p50 {} ms, p99 {} ms",
                            extra.name(),
                            m.load.describe(),
                            ms(m.overhead_ms(0.5).zip(text.overhead_ms(0.5)).map(|(a, b)| a - b)),
                            ms(m.overhead_ms(0.99).zip(text.overhead_ms(0.99)).map(|(a, b)| a - b)),
                        ));
                    }
                }
            }
        }
        if !iteration_lines.is_empty() {
            let _ = writeln!(out, "### Cost of an extra loop iteration\n");
            for line in iteration_lines {
                let _ = writeln!(out, "{line}");
            }
            out.push('\n');
        }

        let _ = writeln!(out, "### Targets\n");
        let _ = writeln!(out, "| target | measured | verdict |");
        let _ = writeln!(out, "|---|---|---|");
        match text.filter(|m| matches!(m.load, Load::Closed { concurrency: 64 })) {
            Some(m) => target_row(
                &mut out,
                "text-stored ≥ 2,000 req/s at concurrency 64",
                format!("{:.0} req/s", m.gateway.rps()),
                Some(m.gateway.rps() >= 2000.0),
            ),
            None => target_row(
                &mut out,
                "text-stored ≥ 2,000 req/s at concurrency 64",
                "–".into(),
                None,
            ),
        }
        for (scenario, limit) in [(Scenario::TextStored, 3.0), (Scenario::TextUnstored, 1.0)] {
            let name = format!("{} p99 overhead ≤ {limit} ms at 500 req/s", scenario.name());
            match self
                .find(scenario)
                .filter(|m| matches!(m.load, Load::Open { rate } if (rate - 500.0).abs() < 0.5))
            {
                Some(m) => {
                    let o = m.overhead_ms(0.99);
                    target_row(
                        &mut out,
                        &name,
                        format!("{} ms", ms(o)),
                        o.map(|o| o <= limit),
                    );
                }
                None => target_row(&mut out, &name, "–".into(), None),
            }
        }
        match (text, self.find(Scenario::ToolRound)) {
            (Some(t), Some(r)) if t.load.describe() == r.load.describe() => {
                let p50 = r
                    .overhead_ms(0.5)
                    .zip(t.overhead_ms(0.5))
                    .map(|(a, b)| a - b);
                let p99 = r
                    .overhead_ms(0.99)
                    .zip(t.overhead_ms(0.99))
                    .map(|(a, b)| a - b);
                target_row(
                    &mut out,
                    "an extra loop iteration adds ≤ 1 ms (tool-round − text-stored overhead)",
                    format!(
                        "p50 {} ms, p99 {} ms ({})",
                        ms(p50),
                        ms(p99),
                        r.load.describe()
                    ),
                    p50.map(|v| v <= 1.0),
                );
            }
            _ => target_row(
                &mut out,
                "an extra loop iteration adds ≤ 1 ms",
                "–".into(),
                None,
            ),
        }
        target_row(
            &mut out,
            "RSS ≤ 64 MiB idle",
            format!("{} MiB", mib(self.idle_rss_kib)),
            self.idle_rss_kib.map(|k| k <= 64 * 1024),
        );
        match self.streams() {
            Some(s) => {
                let peak = s.outcome.peak_rss_kib.max(s.hwm_kib);
                target_row(
                    &mut out,
                    &format!("RSS ≤ 256 MiB holding {} streams", s.count),
                    format!("{} MiB ({} open at once)", mib(peak), s.outcome.max_open),
                    peak.map(|k| k <= 256 * 1024 && s.outcome.max_open >= s.count),
                );
            }
            None => target_row(
                &mut out,
                "RSS ≤ 256 MiB holding 1,000 streams",
                "–".into(),
                None,
            ),
        }
        let errors: u64 = self
            .outcomes
            .iter()
            .map(|o| match o {
                Outcome::Measured(m) => m.gateway.errors,
                Outcome::Streams(s) => s.outcome.stats.errors,
                Outcome::Failed { .. } => 1,
            })
            .sum();
        target_row(
            &mut out,
            "no gateway error under any load",
            format!("{errors} error(s)"),
            (!self.outcomes.is_empty()).then_some(errors == 0),
        );
        out.push('\n');

        if let Some((_, _, lines)) = &self.gateway_log {
            if !lines.is_empty() {
                let _ = writeln!(out, "Last gateway warnings/errors:\n\n```");
                for line in lines {
                    let _ = writeln!(out, "{line}");
                }
                let _ = writeln!(out, "```\n");
            }
        }
        out
    }
}
