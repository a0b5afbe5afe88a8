//! What the bench runs against (a module of the `gateway-bench` binary, beside its `Args`): the processes it
//! starts or the ones it is pointed at, the baseline gateway it compares with, and the CPU each process spends.

use std::collections::HashMap;

use anyhow::bail;
use futures::future::OptionFuture;
use reqwest::Client;

use gateway_bench::procs::{self, ChildProcess};
use gateway_bench::report::CpuPerRequest;
use gateway_bench::scenario::{self, Endpoints};
use gateway_bench::setup::{Admin, Database};

use crate::Args;

/// What the bench runs against.
pub(crate) struct Harness {
    pub(crate) endpoints: Endpoints,
    pub(crate) gateway: Option<ChildProcess>,
    pub(crate) mock: Option<ChildProcess>,
    pub(crate) tools: Option<ChildProcess>,
    pub(crate) gateway_pid: Option<u32>,
    pub(crate) database: Option<Database>,
    pub(crate) baseline: Option<Baseline>,
    /// With `--traces`: the OTLP receiver the measured gateway exports its spans to.
    pub(crate) _traces: Option<gateway_testkit::OtlpReceiver>,
}

/// What the gateway is compared with: another gateway (`--baseline-bin-dir`) with its database, or the floor
/// (`--baseline-floor`), which has none; its process, URL and key.
pub(crate) struct Baseline {
    pub(crate) process: ChildProcess,
    pub(crate) database: Option<Database>,
    pub(crate) key: String,
}

impl Baseline {
    /// `request`, sent to the baseline gateway instead.
    pub(crate) fn request(&self, request: &scenario::GatewayRequest) -> scenario::GatewayRequest {
        scenario::GatewayRequest {
            url: format!("{}/v1/responses", self.process.url),
            key: self.key.clone(),
            ..request.clone()
        }
    }
}

impl Harness {
    pub(crate) async fn start(args: &Args, http: &Client) -> anyhow::Result<Harness> {
        if let (Some(gateway), Some(key), Some(mock), Some(tools)) = (
            &args.gateway_url,
            &args.key,
            &args.mock_url,
            &args.tools_url,
        ) {
            return Ok(Harness {
                endpoints: Endpoints {
                    gateway: gateway.trim_end_matches('/').to_owned(),
                    key: key.clone(),
                    mock: mock.trim_end_matches('/').to_owned(),
                    tools: tools.trim_end_matches('/').to_owned(),
                },
                gateway: None,
                mock: None,
                tools: None,
                gateway_pid: args.gateway_pid,
                database: None,
                baseline: None,
                _traces: None,
            });
        }
        let bin_dir = args.start.bin_dir()?;
        for name in ["gateway", "mock-model", "example-tools"] {
            if !bin_dir.join(name).is_file() {
                bail!(
                    "{} not found; build it first: cargo build --release -p gateway -p gateway-testkit -p gateway-bench",
                    bin_dir.join(name).display()
                );
            }
        }
        let database = Harness::database(args).await?;
        if let Err(e) = database.apply_settings(&args.db_settings).await {
            let _ = database.drop_database().await;
            return Err(e);
        }
        // `--traces`: only the measured gateway exports spans (the baseline, if any, runs with traces off).
        let traces = if args.traces {
            Some(gateway_testkit::OtlpReceiver::start().await?)
        } else {
            None
        };
        let endpoint = traces.as_ref().map(gateway_testkit::OtlpReceiver::endpoint);
        let settings: Vec<(&str, &str)> = endpoint
            .as_deref()
            .map(|e| {
                vec![
                    ("GATEWAY__TELEMETRY__OTLP_ENDPOINT", e),
                    ("GATEWAY__TELEMETRY__EXPORT_DELAY_MS", "1000"),
                ]
            })
            .unwrap_or_default();
        let mut harness = match Harness::start_processes(&bin_dir, database, http, &settings).await
        {
            Ok(harness) => Harness {
                _traces: traces,
                ..harness
            },
            Err((e, database)) => {
                if let Err(drop_error) = database.drop_database().await {
                    eprintln!("could not drop the bench database: {drop_error:#}");
                }
                return Err(e);
            }
        };
        if let Some(dir) = &args.baseline_bin_dir {
            match Harness::start_baseline(args, dir, &harness.endpoints, http).await {
                Ok(baseline) => harness.baseline = Some(baseline),
                Err(e) => {
                    harness.stop().await;
                    return Err(e.context("start the baseline gateway"));
                }
            }
        } else if args.baseline_floor {
            match procs::start_floor(&bin_dir, &harness.endpoints.mock) {
                Ok(process) => {
                    harness.baseline = Some(Baseline {
                        process,
                        database: None,
                        key: "floor-reads-no-key".to_owned(),
                    })
                }
                Err(e) => {
                    harness.stop().await;
                    return Err(e.context("start the floor"));
                }
            }
        }
        Ok(harness)
    }

    /// A fresh database for a gateway: on the Postgres server, or an embedded store with `--embedded`.
    async fn database(args: &Args) -> anyhow::Result<Database> {
        if args.embedded {
            Database::embedded()
        } else {
            Database::create(&args.start.database_url).await
        }
    }

    /// The Postgres server's transaction ids taken so far (see `Database::transaction_ids`); `None` on the
    /// embedded store or a gateway the bench did not start.
    pub(crate) async fn transaction_ids(&self) -> Option<i64> {
        self.database.as_ref()?.transaction_ids().await
    }

    /// Starts the baseline gateway from `dir` on a fresh database of its own, configured like the first.
    pub(crate) async fn start_baseline(
        args: &Args,
        dir: &std::path::Path,
        endpoints: &Endpoints,
        http: &Client,
    ) -> anyhow::Result<Baseline> {
        if !dir.join("gateway").is_file() {
            bail!("{} not found", dir.join("gateway").display());
        }
        let database = Harness::database(args).await?;
        let started = async {
            database.apply_settings(&args.db_settings).await?;
            let token = format!("bench-admin-{}", uuid::Uuid::new_v4().simple());
            let process = procs::start_gateway(dir, &database.url, &token, &[])?;
            let key = Admin::new(http, &process.url, &token)
                .configure(&endpoints.mock, &endpoints.tools, !args.baseline_ungoverned)
                .await?;
            anyhow::Ok((process, key))
        }
        .await;
        match started {
            Ok((process, key)) => Ok(Baseline {
                process,
                database: Some(database),
                key,
            }),
            Err(e) => {
                let _ = database.drop_database().await;
                Err(e)
            }
        }
    }

    pub(crate) async fn start_processes(
        bin_dir: &std::path::Path,
        database: Database,
        http: &Client,
        settings: &[(&str, &str)],
    ) -> Result<Harness, (anyhow::Error, Database)> {
        let started = async {
            let mock = procs::start_testkit(bin_dir, "mock-model")?;
            let tools = procs::start_testkit(bin_dir, "example-tools")?;
            let token = format!("bench-admin-{}", uuid::Uuid::new_v4().simple());
            let gateway = procs::start_gateway(bin_dir, &database.url, &token, settings)?;
            let key = Admin::new(http, &gateway.url, &token)
                .configure(&mock.url, &tools.url, true)
                .await?;
            anyhow::Ok((mock, tools, gateway, key))
        }
        .await;
        match started {
            Ok((mock, tools, gateway, key)) => Ok(Harness {
                endpoints: Endpoints {
                    gateway: gateway.url.clone(),
                    key,
                    mock: mock.url.clone(),
                    tools: tools.url.clone(),
                },
                gateway_pid: Some(gateway.pid),
                gateway: Some(gateway),
                mock: Some(mock),
                tools: Some(tools),
                database: Some(database),
                baseline: None,
                _traces: None,
            }),
            Err(e) => Err((e, database)),
        }
    }

    pub(crate) fn check_alive(&mut self) -> anyhow::Result<()> {
        for child in [&mut self.gateway, &mut self.mock, &mut self.tools]
            .into_iter()
            .flatten()
        {
            child.check_alive()?;
        }
        if let Some(baseline) = &mut self.baseline {
            baseline.process.check_alive()?;
        }
        Ok(())
    }

    pub(crate) async fn stop(mut self) {
        // Children first: the database cannot be dropped while the gateway holds connections.
        drop(self.gateway.take());
        if let Some(baseline) = self.baseline.take() {
            let Baseline {
                process, database, ..
            } = baseline;
            drop(process);
            if let Some(Err(e)) = OptionFuture::from(database.map(Database::drop_database)).await {
                eprintln!("could not drop the baseline's bench database: {e:#}");
            }
        }
        drop(self.mock.take());
        drop(self.tools.take());
        if let Some(database) = self.database.take() {
            let name = database.name.clone();
            if let Err(e) = database.drop_database().await {
                eprintln!("could not drop the bench database {name}: {e:#}");
            }
        }
    }
}

/// CPU ticks of every process involved, at one instant.
pub(crate) struct CpuSnapshot {
    pub(crate) gateway: Option<u64>,
    pub(crate) mock: Option<u64>,
    pub(crate) tools: Option<u64>,
    pub(crate) bench: Option<u64>,
    pub(crate) postgres: Option<HashMap<u32, u64>>,
}

impl CpuSnapshot {
    pub(crate) fn take(harness: &Harness) -> CpuSnapshot {
        let ticks =
            |child: &Option<ChildProcess>| child.as_ref().and_then(|c| procs::cpu_ticks(c.pid));
        CpuSnapshot {
            gateway: harness.gateway_pid.and_then(procs::cpu_ticks),
            mock: ticks(&harness.mock),
            tools: ticks(&harness.tools),
            bench: procs::cpu_ticks(std::process::id()),
            postgres: harness
                .database
                .as_ref()
                .filter(|d| !d.is_embedded())
                .map(|d| procs::postgres_backends(&d.name)),
        }
    }

    /// CPU per request over `spans` (each a snapshot before and after a measured slice).
    pub(crate) fn per_request(
        spans: &[(CpuSnapshot, CpuSnapshot)],
        requests: u64,
        ticks_per_second: u64,
    ) -> CpuPerRequest {
        let scale = |ticks: u64| {
            (requests > 0).then(|| ticks as f64 * 1e6 / ticks_per_second as f64 / requests as f64)
        };
        // Ticks spent during every span, or `None` when a snapshot lacks the figure.
        let total = |ticks: fn(&CpuSnapshot) -> Option<u64>| {
            spans
                .iter()
                .map(|(before, after)| Some(ticks(after)?.saturating_sub(ticks(before)?)))
                .sum::<Option<u64>>()
                .and_then(scale)
        };
        CpuPerRequest {
            gateway: total(|s| s.gateway),
            mock: total(|s| s.mock),
            tools: total(|s| s.tools),
            bench: total(|s| s.bench),
            postgres: spans
                .iter()
                .map(|(before, after)| {
                    Some(procs::postgres_ticks_between(
                        before.postgres.as_ref()?,
                        after.postgres.as_ref()?,
                    ))
                })
                .sum::<Option<u64>>()
                .and_then(scale),
        }
    }
}
