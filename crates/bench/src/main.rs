//! `gateway-bench`: drives the gateway at a fixed concurrency (or a fixed rate) for a fixed time, sends the
//! same upstream work straight to the testkit mock model and tool server in the same run, and reports
//! requests/s, latency percentiles, the gateway's overhead, errors, and the gateway's RSS.
//!
//! By default it starts everything itself from the target directory it was built in: a fresh Postgres
//! database, `mock-model`, `example-tools` and `gateway serve`, configured through the admin API.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::Parser;
use reqwest::Client;
use serde_json::json;

use gateway_bench::load::{self, Load, Stats};
use gateway_bench::procs::{self, ChildProcess, StartOptions};
use gateway_bench::report::{Measured, Outcome, Report, StreamsMeasured, WriteFigures};
use gateway_bench::scenario::{self, reset_mocks, Scenario, Target};
use gateway_bench::timings::Histograms;

mod harness;

use harness::{CpuSnapshot, Harness};

/// Load generator for the gateway. Scenarios: text-stored, text-unstored, tool-round, parallel-tools,
/// passthrough, stream-text, open-streams.
#[derive(Debug, Parser)]
#[command(name = "gateway-bench", version, about)]
struct Args {
    /// `all`, or a comma-separated list of scenarios.
    #[arg(long, default_value = "all")]
    scenario: String,
    /// Measured seconds per target (gateway, and direct) of each scenario.
    #[arg(long, default_value_t = 10)]
    duration: u64,
    /// The gateway and direct runs alternate in slices of this many seconds (gateway, direct, gateway, …),
    /// so that both meet the same machine conditions; 0 runs each target's whole duration at once.
    #[arg(long, default_value_t = 2)]
    slice: u64,
    /// Workers sending back to back (closed loop).
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Fixed rate in requests/s instead of a closed loop (open loop; latency from the intended send time).
    #[arg(long)]
    rate: Option<f64>,
    /// Unmeasured seconds before each phase.
    #[arg(long, default_value_t = 2)]
    warmup: u64,
    /// Also write the report as Markdown to this file.
    #[arg(long)]
    markdown: Option<PathBuf>,
    #[command(flatten)]
    start: StartOptions,
    /// A Postgres setting for the bench database, `KEY=VALUE` (repeatable), e.g. `synchronous_commit=off`
    /// to see what the fsync of each commit costs. Applied with `ALTER DATABASE`, before the gateway starts.
    #[arg(long = "db-setting")]
    db_settings: Vec<String>,
    /// Streams held open at once by the open-streams scenario.
    #[arg(long, default_value_t = 1000)]
    streams: usize,
    /// How long the mock model holds each answer of the open-streams scenario, in ms.
    #[arg(long, default_value_t = 5000)]
    stream_hold_ms: u64,
    /// Bench a gateway that is already running (it must have deployments `mock` without server tools and
    /// `mock-tools` with the testkit tools add, echo and get_weather, on --mock-url and --tools-url).
    #[arg(long, requires_all = ["key", "mock_url", "tools_url"])]
    gateway_url: Option<String>,
    /// API key for --gateway-url.
    #[arg(long)]
    key: Option<String>,
    /// Base URL (`http://HOST:PORT`) of the mock model behind --gateway-url.
    #[arg(long)]
    mock_url: Option<String>,
    /// Base URL (`http://HOST:PORT`) of the tool server behind --gateway-url.
    #[arg(long)]
    tools_url: Option<String>,
    /// Process id of the gateway behind --gateway-url, for RSS and CPU figures.
    #[arg(long)]
    gateway_pid: Option<u32>,
    /// A directory holding another `gateway` binary (e.g. the previous commit's release build) to compare
    /// with: it runs beside the first on a database of its own, against the same mock model and tool server,
    /// and the gateway, baseline and direct runs alternate slice by slice (the two gateways taking turns at going
    /// first), so that the ratio between the two gateways is taken under the same machine conditions.
    #[arg(long, conflicts_with = "gateway_url")]
    baseline_bin_dir: Option<PathBuf>,
    /// The measured gateway exports OpenTelemetry spans (every request sampled) to an OTLP receiver in this
    /// process; a baseline runs with traces off. With `--baseline-bin-dir` set to the same build, the ratio is
    /// what traces cost.
    #[arg(long, conflicts_with = "gateway_url")]
    traces: bool,
    /// The baseline gateway's key, project and deployments are set up without limits, budgets or prices, so that
    /// it admits every create without counting it; with `--baseline-bin-dir` set to the same build, the ratio is
    /// what governance costs.
    #[arg(long, requires = "baseline_bin_dir")]
    baseline_ungoverned: bool,
    /// The baseline is `gateway-floor` from the bin dir instead of a gateway: the least a Responses-to-Chat proxy
    /// does on the gateway's stack (no keys, limits, store, logs or metrics), against the same mock model, so that
    /// the ratio says how far the gateway is from that floor, and its CPU per request beside the gateway's.
    #[arg(long, conflicts_with_all = ["gateway_url", "baseline_bin_dir"])]
    baseline_floor: bool,
    /// The measured gateway (and the baseline) run on the embedded store, a SQLite file in a fresh temporary
    /// directory, instead of a Postgres database.
    #[arg(long, conflicts_with = "gateway_url")]
    embedded: bool,
}

struct Bench<'a> {
    args: &'a Args,
    http: Client,
    load: Load,
    ticks_per_second: u64,
}

impl Bench<'_> {
    /// The measured duration of each target, cut into the slices in which gateway and direct alternate.
    fn slices(&self) -> Vec<Duration> {
        let total = self.args.duration.max(1);
        let slice = if self.args.slice == 0 {
            total
        } else {
            self.args.slice.min(total)
        };
        let mut slices = vec![Duration::from_secs(slice); (total / slice) as usize];
        if !total.is_multiple_of(slice) {
            slices.push(Duration::from_secs(total % slice));
        }
        slices
    }

    /// Runs the baseline for one slice: its figures into `stats`, the CPU ticks its process `pid` spent into
    /// `ticks` (which stays `None` once a reading is missing).
    async fn baseline_slice(
        &self,
        target: &Target,
        pid: Option<u32>,
        stats: &mut Stats,
        ticks: &mut Option<u64>,
        slice: Duration,
    ) -> anyhow::Result<()> {
        let before = pid.and_then(procs::cpu_ticks);
        stats.merge(&load::run(&self.http, target, self.load, slice).await?);
        let spent = before.zip(pid.and_then(procs::cpu_ticks));
        *ticks = ticks
            .zip(spent)
            .map(|(sum, (before, after))| sum + after.saturating_sub(before));
        Ok(())
    }

    async fn scenario(&self, harness: &Harness, scenario: Scenario) -> anyhow::Result<Outcome> {
        if scenario == Scenario::OpenStreams {
            return self.open_streams(harness).await;
        }
        let http = &self.http;
        let endpoints = &harness.endpoints;
        let (request, plan) = scenario::probe(http, endpoints, scenario).await?;
        let plan_text = plan.describe();
        let baseline = harness
            .baseline
            .as_ref()
            .map(|b| Target::Gateway(b.request(&request)));
        let gateway = Target::Gateway(request);
        let direct = Target::Direct(plan);
        if self.args.warmup > 0 {
            let warmup = Duration::from_secs(self.args.warmup);
            load::run(http, &gateway, self.load, warmup).await?;
            if let Some(baseline) = &baseline {
                load::run(http, baseline, self.load, warmup).await?;
            }
            load::run(http, &direct, self.load, warmup).await?;
            reset_mocks(http, endpoints).await?;
        }

        let load_average = procs::load_average();
        if let Some(pid) = harness.gateway_pid {
            procs::reset_peak(pid);
        }
        let mut gateway_stats = Stats::new()?;
        let mut baseline_stats = match baseline {
            Some(_) => Some(Stats::new()?),
            None => None,
        };
        let mut direct_stats = Stats::new()?;
        let mut cpu_spans = Vec::new();
        let baseline_pid = harness.baseline.as_ref().map(|b| b.process.pid);
        let mut baseline_ticks: Option<u64> = baseline_pid.map(|_| 0);
        let mut sampled = None;
        let mut timings = Histograms::default();
        let mut commits: Option<i64> = None;
        for (index, slice) in self.slices().into_iter().enumerate() {
            // The first target of a slice runs right after the previous slice's direct run and fares worse: the
            // two gateways take turns at going first, so that neither carries that bias.
            let baseline_first = index % 2 == 1;
            if baseline_first {
                if let (Some(target), Some(stats)) = (&baseline, &mut baseline_stats) {
                    self.baseline_slice(target, baseline_pid, stats, &mut baseline_ticks, slice)
                        .await?;
                    reset_mocks(http, endpoints).await?;
                }
            }
            let sampler = harness.gateway_pid.map(procs::RssSampler::start);
            let histograms = Histograms::scrape(http, &endpoints.gateway).await;
            let transactions_before = harness.transaction_ids().await;
            let before = CpuSnapshot::take(harness);
            gateway_stats.merge(&load::run(http, &gateway, self.load, slice).await?);
            cpu_spans.push((before, CpuSnapshot::take(harness)));
            if let (Some(before), Some(after)) =
                (transactions_before, harness.transaction_ids().await)
            {
                // The read before took an id of its own.
                *commits.get_or_insert(0) += (after - before - 1).max(0);
            }
            timings.add_between(
                &histograms,
                &Histograms::scrape(http, &endpoints.gateway).await,
            );
            if let Some(sampler) = sampler {
                sampled = sampled.max(Some(sampler.finish().await));
            }
            reset_mocks(http, endpoints).await?;
            if !baseline_first {
                if let (Some(target), Some(stats)) = (&baseline, &mut baseline_stats) {
                    self.baseline_slice(target, baseline_pid, stats, &mut baseline_ticks, slice)
                        .await?;
                    reset_mocks(http, endpoints).await?;
                }
            }
            direct_stats.merge(&load::run(http, &direct, self.load, slice).await?);
            reset_mocks(http, endpoints).await?;
        }
        let hwm = harness
            .gateway_pid
            .and_then(|pid| procs::memory(pid).ok())
            .map(|m| m.hwm_kib);

        Ok(Outcome::Measured(Box::new(Measured {
            scenario,
            load: self.load,
            load_average,
            plan: plan_text,
            cpu: CpuSnapshot::per_request(&cpu_spans, gateway_stats.ok, self.ticks_per_second),
            baseline_cpu: baseline_ticks
                .zip(baseline_stats.as_ref())
                .filter(|(_, stats)| stats.ok > 0)
                .map(|(ticks, stats)| {
                    ticks as f64 * 1e6 / self.ticks_per_second as f64 / stats.ok as f64
                }),
            timings: timings.describe(gateway_stats.ok + gateway_stats.errors),
            writes: WriteFigures::of(&timings, commits, gateway_stats.ok + gateway_stats.errors),
            gateway: gateway_stats,
            baseline: baseline_stats,
            direct: direct_stats,
            peak_rss_kib: sampled.max(hwm),
        })))
    }

    async fn open_streams(&self, harness: &Harness) -> anyhow::Result<Outcome> {
        let http = &self.http;
        let endpoints = &harness.endpoints;
        let count = self.args.streams.max(1);
        let hold = Duration::from_millis(self.args.stream_hold_ms);
        let (request, _) = scenario::probe(http, endpoints, Scenario::OpenStreams).await?;

        let reply =
            json!({"text": "Hello from a slow upstream.", "delay_ms": self.args.stream_hold_ms});
        let script = serde_json::Value::Array(vec![reply; count]);
        let response = http
            .post(format!("{}/_mock/script", endpoints.mock))
            .json(&script)
            .send()
            .await?;
        if !response.status().is_success() {
            bail!(
                "the mock model refused the delayed script ({}): {}; does it support \"delay_ms\"?",
                response.status(),
                response.text().await.unwrap_or_default()
            );
        }
        // Let the previous scenario's memory settle before the baseline.
        tokio::time::sleep(Duration::from_secs(1)).await;
        let load_average = procs::load_average();
        let memory_before = harness.gateway_pid.and_then(|pid| procs::memory(pid).ok());
        let allocated_before =
            Histograms::gauge(http, &endpoints.gateway, "gateway_memory_allocated_bytes").await;
        if let Some(pid) = harness.gateway_pid {
            procs::reset_peak(pid);
        }
        // The streams' clients of their own: dropped with their connections once the streams ended, as clients
        // that leave would, so that "after" measures what the gateway keeps, not connections kept open to it.
        let clients = client()?;
        let outcome = load::open_streams(&clients, &request, count, harness.gateway_pid).await?;
        drop(clients);
        let hwm = harness
            .gateway_pid
            .and_then(|pid| procs::memory(pid).ok())
            .map(|m| m.hwm_kib);
        let memory_now = || harness.gateway_pid.and_then(|pid| procs::memory(pid).ok());
        tokio::time::sleep(Duration::from_secs(1)).await;
        let rss_after = memory_now().map(|m| m.rss_kib);
        tokio::time::sleep(Duration::from_secs(4)).await;
        let memory_settled = memory_now();
        // What of it is live allocations (the rest is the allocator's free space and metadata), as the gateway's
        // allocator counts it: read twice a second by the gateway, so as of at most half a second ago.
        let allocated_settled =
            Histograms::gauge(http, &endpoints.gateway, "gateway_memory_allocated_bytes").await;
        let allocator_resident_settled =
            Histograms::gauge(http, &endpoints.gateway, "gateway_memory_resident_bytes").await;
        reset_mocks(http, endpoints).await?;
        Ok(Outcome::Streams(Box::new(StreamsMeasured {
            count,
            hold,
            load_average,
            outcome,
            rss_before_kib: memory_before.map(|m| m.rss_kib),
            hwm_kib: hwm,
            rss_after_kib: rss_after,
            rss_settled_kib: memory_settled.map(|m| m.rss_kib),
            anon_before_kib: memory_before.map(|m| m.anon_kib),
            anon_settled_kib: memory_settled.map(|m| m.anon_kib),
            allocated_before_kib: allocated_before.map(|bytes| (bytes / 1024.0) as u64),
            allocated_settled_kib: allocated_settled.map(|bytes| (bytes / 1024.0) as u64),
            allocator_resident_settled_kib: allocator_resident_settled
                .map(|bytes| (bytes / 1024.0) as u64),
        })))
    }
}

fn machine() -> String {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get());
    let model = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("model name"))
                .map(|rest| rest.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let memory = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|info| {
            info.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|rest| rest.split_whitespace().next()?.parse::<u64>().ok())
        })
        .map_or_else(String::new, |kib| {
            format!(", {:.1} GiB RAM", kib as f64 / 1024.0 / 1024.0)
        });
    format!(
        "{cpus} CPUs ({model}){memory}; load average at start {}",
        procs::load_average()
    )
}

fn utc_now() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

async fn run_all(
    bench: &Bench<'_>,
    harness: &mut Harness,
    scenarios: &[Scenario],
    report: &mut Report,
) -> anyhow::Result<()> {
    // Let start-up settle, then take the idle figure.
    tokio::time::sleep(Duration::from_secs(1)).await;
    report.idle_rss_kib = harness
        .gateway_pid
        .and_then(|pid| procs::memory(pid).ok())
        .map(|m| m.rss_kib);
    for &scenario in scenarios {
        eprintln!("[bench] {} ({}) …", scenario.name(), scenario.describe());
        let outcome = match bench.scenario(harness, scenario).await {
            Ok(outcome) => outcome,
            Err(e) => Outcome::Failed {
                scenario,
                reason: format!("{e:#}"),
            },
        };
        if let Outcome::Failed { reason, .. } = &outcome {
            eprintln!("[bench] {} failed: {reason}", scenario.name());
        }
        report.outcomes.push(outcome);
        harness.check_alive()?;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    report.end_rss_kib = harness
        .gateway_pid
        .and_then(|pid| procs::memory(pid).ok())
        .map(|m| m.rss_kib);
    Ok(())
}

/// The bench's HTTP client: connections kept, no delay on small writes.
fn client() -> anyhow::Result<Client> {
    Ok(Client::builder()
        .pool_max_idle_per_host(usize::MAX)
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(300))
        .build()?)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let scenarios = Scenario::parse_list(&args.scenario)?;
    let load = match args.rate {
        Some(rate) if rate > 0.0 => Load::Open { rate },
        Some(rate) => bail!("--rate must be positive, got {rate}"),
        None => Load::Closed {
            concurrency: args.concurrency.max(1),
        },
    };
    let http = client()?;

    let mut report = Report {
        command: std::env::args()
            .map(|a| if a.contains(' ') { format!("'{a}'") } else { a })
            .collect::<Vec<_>>()
            .join(" "),
        started: utc_now(),
        machine: machine(),
        settings: format!(
            "{} s per target after {} s warm-up, gateway{}{}{}{} and direct alternating {}, {}{}",
            args.duration,
            args.warmup,
            if args.embedded {
                " (embedded store)"
            } else {
                ""
            },
            if args.traces {
                " (traces on, every request sampled)"
            } else {
                ""
            },
            if args.baseline_floor {
                ", baseline (the floor, gateway-floor)".to_owned()
            } else {
                String::new()
            },
            args.baseline_bin_dir
                .as_ref()
                .map_or_else(String::new, |dir| {
                    let ungoverned = if args.baseline_ungoverned {
                        ", without limits, budgets or prices"
                    } else {
                        ""
                    };
                    format!(", baseline ({}{ungoverned})", dir.display())
                }),
            if args.slice == 0 {
                "once".to_owned()
            } else {
                format!("every {} s", args.slice.min(args.duration.max(1)))
            },
            load.describe(),
            if args.db_settings.is_empty() {
                String::new()
            } else {
                format!("; database settings {}", args.db_settings.join(", "))
            }
        ),
        ..Report::default()
    };

    let mut harness = Harness::start(&args, &http).await?;
    eprintln!(
        "[bench] gateway {} (pid {}), mock model {}, tool server {}",
        harness.endpoints.gateway,
        harness
            .gateway_pid
            .map_or_else(|| "unknown".into(), |p| p.to_string()),
        harness.endpoints.mock,
        harness.endpoints.tools
    );
    let bench = Bench {
        args: &args,
        http: http.clone(),
        load,
        ticks_per_second: procs::ticks_per_second(),
    };
    let result = tokio::select! {
        result = run_all(&bench, &mut harness, &scenarios, &mut report) => result,
        _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
    };
    report.gateway_log = harness.gateway.as_ref().map(ChildProcess::log_summary);
    harness.stop().await;

    let rendered = report.render();
    println!("{rendered}");
    if let Some(path) = &args.markdown {
        std::fs::write(path, &rendered).with_context(|| format!("write {}", path.display()))?;
    }
    result
}
