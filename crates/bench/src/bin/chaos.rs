//! `gateway-chaos`: replicas of the gateway killed at random (SIGKILL) and restarted while they run background
//! responses with tool calls, all on one Postgres database. At the end it prints how many responses ended,
//! completed, are stuck or lost, how many tool requests were sent again under an `Idempotency-Key` already
//! used, how long takeovers took, and whether every output equals that of the same request run without chaos;
//! it fails (exit 1) unless none is stuck, none lost and every output equal.
//!
//! It starts everything from its own directory (`--bin-dir`): `mock-model`, `example-tools` and the replicas.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use gateway_bench::procs::{self, ChildProcess};
use gateway_bench::setup::{self, Database, TOOLS_MODEL};
use reqwest::Client;
use serde_json::{json, Value};

/// Replicas killed at random while they run background responses with tool calls.
#[derive(Debug, Parser)]
#[command(name = "gateway-chaos", version, about)]
struct Args {
    /// Replicas sharing the database.
    #[arg(long, default_value_t = 3)]
    replicas: usize,
    /// Background responses submitted, spread over the chaos.
    #[arg(long, default_value_t = 120)]
    responses: usize,
    /// Seconds during which replicas are killed.
    #[arg(long, default_value_t = 30)]
    chaos_seconds: u64,
    /// A replica is killed every this many milliseconds, give or take half.
    #[arg(long, default_value_t = 3000)]
    kill_every_ms: u64,
    /// The replicas' lease (`durability.lease_ms`).
    #[arg(long, default_value_t = 2000)]
    lease_ms: u64,
    /// After the chaos, how long the responses may take to end before the ones left count as stuck.
    #[arg(long, default_value_t = 120)]
    settle_seconds: u64,
    /// Where `gateway`, `mock-model` and `example-tools` are (default: the directory of this executable).
    #[arg(long)]
    bin_dir: Option<PathBuf>,
    /// Postgres server on which a fresh database `gw_bench_*` is created, and dropped at the end.
    #[arg(
        long,
        env = "BENCH_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    database_url: String,
}

/// The input of request `i`: a slow tool and an addition in one batch, both deterministic.
fn input(i: usize) -> String {
    let ms = 400 + (i * 137) % 1600;
    format!("!call slow {{\"ms\": {ms}}} !call add {{\"a\": {i}, \"b\": 1}}")
}

/// What must be equal between two runs of one request: the status, the text, and each output item's type,
/// name, arguments and output (ids differ).
fn essence(response: &Value) -> Value {
    let items: Vec<Value> = response["output"]
        .as_array()
        .map(|items| {
            items
                .iter()
                .map(|item| {
                    json!({"type": item["type"], "name": item["name"], "arguments": item["arguments"],
                           "output": item["output"], "status": item["status"]})
                })
                .collect()
        })
        .unwrap_or_default();
    json!({"status": response["status"], "output_text": response["output_text"], "output": items})
}

/// The replicas, restartable.
struct Replicas {
    bin_dir: PathBuf,
    database_url: String,
    admin_token: String,
    settings: Vec<(String, String)>,
    slots: Vec<ChildProcess>,
}

impl Replicas {
    fn start_one(&self) -> anyhow::Result<ChildProcess> {
        let settings: Vec<(&str, &str)> = self
            .settings
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        procs::start_gateway(
            &self.bin_dir,
            &self.database_url,
            &self.admin_token,
            &settings,
        )
    }

    fn urls(&self) -> Vec<String> {
        self.slots.iter().map(|r| r.url.clone()).collect()
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.replicas < 2 {
        bail!("--replicas must be at least 2: one must live to take over");
    }
    let bin_dir = match &args.bin_dir {
        Some(dir) => dir.clone(),
        None => std::env::current_exe()?
            .parent()
            .context("no directory")?
            .to_path_buf(),
    };
    let http = Client::builder().timeout(Duration::from_secs(30)).build()?;
    let database = Database::create(&args.database_url).await?;
    let outcome = run(&args, &bin_dir, &database, &http).await;
    if let Err(e) = database.drop_database().await {
        eprintln!("could not drop the chaos database: {e:#}");
    }
    let report = outcome?;
    println!("{}", report.text);
    if !report.passed {
        std::process::exit(1);
    }
    Ok(())
}

struct Report {
    text: String,
    passed: bool,
}

async fn run(
    args: &Args,
    bin_dir: &std::path::Path,
    database: &Database,
    http: &Client,
) -> anyhow::Result<Report> {
    let mock = procs::start_testkit(bin_dir, "mock-model")?;
    let tools = procs::start_testkit(bin_dir, "example-tools")?;
    let mut replicas = Replicas {
        bin_dir: bin_dir.to_path_buf(),
        database_url: database.url.clone(),
        admin_token: format!("chaos-admin-{}", std::process::id()),
        settings: vec![
            (
                "GATEWAY__DURABILITY__LEASE_MS".into(),
                args.lease_ms.to_string(),
            ),
            (
                "GATEWAY__DURABILITY__SWEEP_INTERVAL_MS".into(),
                (args.lease_ms / 8).max(50).to_string(),
            ),
        ],
        slots: Vec::new(),
    };
    for _ in 0..args.replicas {
        let replica = replicas.start_one()?;
        replicas.slots.push(replica);
    }
    let key = setup::configure(
        http,
        &replicas.slots[0].url,
        &replicas.admin_token,
        &mock.url,
        &tools.url,
    )
    .await?;
    eprintln!(
        "[chaos] {} replicas, {} background responses over {} s, a kill every ~{} ms, lease {} ms",
        args.replicas, args.responses, args.chaos_seconds, args.kill_every_ms, args.lease_ms
    );

    // Submissions spread over the chaos, to whichever replica is up; kills meanwhile.
    let started = Instant::now();
    let chaos_end = started + Duration::from_secs(args.chaos_seconds);
    let urls = Arc::new(Mutex::new(replicas.urls()));
    let submitter = tokio::spawn(submit_all(
        http.clone(),
        Arc::clone(&urls),
        key.clone(),
        args.responses,
        Duration::from_secs(args.chaos_seconds) * 9 / 10,
    ));
    let mut kills = 0;
    let mut takeovers = Vec::new();
    let mut rng_state = 0x9e37_79b9_7f4a_7c15_u64 ^ u64::from(std::process::id());
    while Instant::now() < chaos_end {
        let half = args.kill_every_ms / 2;
        let wait = half + next_random(&mut rng_state) % (args.kill_every_ms - half).max(1);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        if Instant::now() >= chaos_end {
            break;
        }
        let victim = (next_random(&mut rng_state) as usize) % replicas.slots.len();
        let replica_id = replicas.slots[victim].ident.clone();
        replicas.slots[victim].kill();
        kills += 1;
        takeovers.push(tokio::spawn(takeover_time(
            database.url.clone(),
            replica_id,
            Instant::now(),
        )));
        let restarted = replicas.start_one()?;
        replicas.slots[victim] = restarted;
        *urls.lock().unwrap_or_else(|e| e.into_inner()) = replicas.urls();
    }
    let ids = submitter.await??;
    eprintln!("[chaos] {kills} kills; waiting for the responses to end");
    let mut takeover_ms: Vec<u128> = Vec::new();
    for monitor in takeovers {
        if let Some(time) = monitor.await?? {
            takeover_ms.push(time.as_millis());
        }
    }
    let settle_end = Instant::now() + Duration::from_secs(args.settle_seconds);
    let chaotic = wait_all(http, &replicas.urls(), &key, &ids, settle_end).await?;

    // The same requests, without chaos.
    eprintln!("[chaos] the same requests without chaos …");
    let calm_urls = Arc::new(Mutex::new(replicas.urls()));
    let calm_ids = submit_all(
        http.clone(),
        calm_urls,
        key.clone(),
        args.responses,
        Duration::from_secs(5),
    )
    .await?;
    let calm = wait_all(
        http,
        &replicas.urls(),
        &key,
        &calm_ids,
        Instant::now() + Duration::from_secs(args.settle_seconds),
    )
    .await?;

    let calls = http
        .get(format!("{}/_tools/calls", tools.url))
        .send()
        .await?
        .json::<Vec<Value>>()
        .await?;
    let chaotic_ids: std::collections::HashSet<&str> = ids.iter().map(String::as_str).collect();
    let mut by_key: HashMap<String, usize> = HashMap::new();
    for call in &calls {
        let response_id = call["headers"]["x-gateway-response-id"]
            .as_str()
            .unwrap_or_default();
        if !chaotic_ids.contains(response_id) {
            continue;
        }
        let key = call["headers"]["idempotency-key"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        *by_key.entry(key).or_default() += 1;
    }
    let sent: usize = by_key.values().sum();
    let duplicates = sent - by_key.len();
    let most_sends = by_key.values().copied().max().unwrap_or(0);

    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
    let (mut stuck, mut lost, mut different) = (0, 0, 0);
    for (i, id) in ids.iter().enumerate() {
        match chaotic.get(id) {
            None => lost += 1,
            Some(response) => {
                let status = response["status"].as_str().unwrap_or("?").to_owned();
                if matches!(status.as_str(), "queued" | "in_progress") {
                    stuck += 1;
                }
                *statuses.entry(status).or_default() += 1;
                let expected = calm.get(&calm_ids[i]).map(essence);
                if expected.as_ref() != Some(&essence(response)) {
                    different += 1;
                }
            }
        }
    }
    let ended = ids.len() - stuck - lost;
    let completed = statuses.get("completed").copied().unwrap_or(0);
    let passed = stuck == 0 && lost == 0 && different == 0;
    takeover_ms.sort_unstable();
    let quantile = |q: f64| -> String {
        if takeover_ms.is_empty() {
            return "–".into();
        }
        let index = ((takeover_ms.len() - 1) as f64 * q).round() as usize;
        takeover_ms[index].to_string()
    };
    let text = format!(
        "## Chaos run\n\n\
         * {} replicas on one Postgres database, lease {} ms; {} background responses, each a batch of two tool calls (`slow` 0.4–2 s and `add`) then a model answer, submitted over {} s; a replica killed with SIGKILL every ~{} ms and restarted: {} kills\n\
         * submitted {}, **ended {}**, completed {}, statuses {:?}, **stuck {}**, **lost {}**\n\
         * outputs different from the same requests run without chaos: **{}**\n\
         * tool requests {} for {} tool steps: {} sent again under an Idempotency-Key already used (at least once delivery; at most {} sends of one key)\n\
         * takeover after a kill (the killed replica's last running response owned by another): {} measured, p50 {} ms, max {} ms\n\
         * verdict: {}\n",
        args.replicas,
        args.lease_ms,
        ids.len(),
        args.chaos_seconds,
        args.kill_every_ms,
        kills,
        ids.len(),
        ended,
        completed,
        statuses,
        stuck,
        lost,
        different,
        sent,
        by_key.len(),
        duplicates,
        most_sends,
        takeover_ms.len(),
        quantile(0.5),
        quantile(1.0),
        if passed { "passed" } else { "FAILED" },
    );
    drop((mock, tools));
    Ok(Report { text, passed })
}

/// A xorshift step: the chaos needs variety, not quality.
fn next_random(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Submits `count` background responses, evenly over `over`, each to the next replica that answers; returns
/// their ids in input order.
async fn submit_all(
    http: Client,
    urls: Arc<Mutex<Vec<String>>>,
    key: String,
    count: usize,
    over: Duration,
) -> anyhow::Result<Vec<String>> {
    let gap = over / count.max(1) as u32;
    let mut ids = Vec::with_capacity(count);
    for i in 0..count {
        let body = json!({"model": TOOLS_MODEL, "input": input(i), "background": true});
        let mut attempt = 0;
        let id = loop {
            let candidates = urls.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let url = &candidates[(i + attempt) % candidates.len()];
            attempt += 1;
            match http
                .post(format!("{url}/v1/responses"))
                .bearer_auth(&key)
                .json(&body)
                .send()
                .await
            {
                Ok(response) if response.status().is_success() => {
                    let created: Value = response.json().await?;
                    break created["id"].as_str().context("an id")?.to_owned();
                }
                // A replica killed mid-request: another one takes the request.
                _ if attempt < 20 => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(response) => bail!("create failed: {}", response.status()),
                Err(e) => bail!("create failed: {e}"),
            }
        };
        ids.push(id);
        tokio::time::sleep(gap).await;
    }
    Ok(ids)
}

/// Polls the responses until every one ended or `until` passed; answers the last state read of each.
async fn wait_all(
    http: &Client,
    urls: &[String],
    key: &str,
    ids: &[String],
    until: Instant,
) -> anyhow::Result<HashMap<String, Value>> {
    let mut seen: HashMap<String, Value> = HashMap::new();
    loop {
        let mut open = 0;
        for (i, id) in ids.iter().enumerate() {
            if seen
                .get(id)
                .is_some_and(|r| !matches!(r["status"].as_str(), Some("queued" | "in_progress")))
            {
                continue;
            }
            let url = &urls[i % urls.len()];
            let response = http
                .get(format!("{url}/v1/responses/{id}"))
                .bearer_auth(key)
                .send()
                .await?;
            if response.status().is_success() {
                let body: Value = response.json().await?;
                if matches!(body["status"].as_str(), Some("queued" | "in_progress")) {
                    open += 1;
                }
                seen.insert(id.clone(), body);
            } else {
                open += 1;
            }
        }
        if open == 0 || Instant::now() >= until {
            return Ok(seen);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// After a kill at `at`: how long until no running response is owned by the killed `replica` any more, that is
/// until others took over all it was running; `None` when it was running none.
async fn takeover_time(
    database_url: String,
    replica: String,
    at: Instant,
) -> anyhow::Result<Option<Duration>> {
    use sqlx::Connection;
    let mut conn = sqlx::PgConnection::connect(&database_url).await?;
    let give_up = at + Duration::from_secs(120);
    let mut first = true;
    while Instant::now() < give_up {
        let owned: i64 = sqlx::query_scalar(
            "SELECT COUNT(*) FROM responses WHERE owner = $1 AND status IN ('queued', 'in_progress')",
        )
        .bind(&replica)
        .fetch_one(&mut conn)
        .await?;
        if owned == 0 {
            return Ok((!first).then(|| at.elapsed()));
        }
        first = false;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bail!("the responses of replica {replica} were never taken over")
}
