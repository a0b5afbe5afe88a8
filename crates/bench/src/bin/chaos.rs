//! `gateway-chaos`: replicas of the gateway killed at random (SIGKILL) and restarted, or paused (SIGSTOP) past their
//! lease and resumed, and their database made unreachable for a while or every connection to it cut at once (the
//! replicas reach it through a fault proxy), while they run background responses with tool calls, all on one
//! Postgres database. Each response's batch holds two HTTP tools and one
//! MCP tool (an operator `mcp` source). At the end it prints how many responses ended, completed, are stuck or
//! lost, how many tool requests and MCP `tools/call`s were sent again under an idempotency key already used,
//! how long takeovers took, and whether every output equals that of the same request run without chaos; it
//! fails (exit 1) unless none is stuck, none lost, every output equal, every send carried its key (HTTP
//! `Idempotency-Key`, MCP `params._meta.idempotencyKey`, SPEC 7) of the form `<response id>:<seq>`, and no tool
//! step went out under two keys.
//!
//! It starts everything from its own directory (`--bin-dir`): `mock-model`, `example-tools`, `example-mcp` and
//! the replicas.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use gateway_bench::procs::{self, ChildProcess, StartOptions};
use gateway_bench::setup::{Admin, Database, MCP_PREFIX, TOOLS_MODEL};
use gateway_testkit::fault_proxy::FaultProxy;
use reqwest::Client;
use serde_json::{json, Value};

/// Replicas killed or paused at random while they run background responses with tool calls.
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
    /// Every this many faults, the replica is paused (SIGSTOP) for one to two leases and then resumed (SIGCONT)
    /// instead of killed: its responses are taken over meanwhile, and when it wakes its runs must stop before any
    /// call or write, wherever the pause caught them (between two statements of a transaction, say). 0: kills
    /// only.
    #[arg(long, default_value_t = 3)]
    pause_every: u32,
    /// Every this many faults, the database is hit instead of a replica, in turn: nothing goes through to it, for
    /// every replica at once, for one to two leases (a partition: every lease lapses, statements wait), or every
    /// connection to it is closed at once (a restart of the database server: statements and replies on their
    /// way are lost). 0: replicas only.
    #[arg(long, default_value_t = 4)]
    database_every: u32,
    /// The replicas' lease (`durability.lease_ms`).
    #[arg(long, default_value_t = 2000)]
    lease_ms: u64,
    /// After the chaos, how long the responses may take to end before the ones left count as stuck.
    #[arg(long, default_value_t = 120)]
    settle_seconds: u64,
    #[command(flatten)]
    start: StartOptions,
}

/// `b` of the MCP `add` call: with `a` the request's index, the arguments name the request, so that a
/// `tools/call` (which carries no response id of its own) can be placed without trusting its key.
const MCP_ADD_B: u64 = 1000;

/// The input of request `i`: a slow HTTP tool, an HTTP addition and a slow MCP addition in one batch, all
/// deterministic. The MCP call takes its time so that kills catch some in flight, as they catch `slow`.
fn input(i: usize) -> String {
    let ms = 400 + (i * 137) % 1600;
    let mcp_ms = 300 + (i * 251) % 1500;
    format!(
        "!call slow {{\"ms\": {ms}}} !call add {{\"a\": {i}, \"b\": 1}} \
         !call {MCP_PREFIX}add {{\"a\": {i}, \"b\": {MCP_ADD_B}, \"ms\": {mcp_ms}}}"
    )
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
                           "output": item["output"], "error": item["error"], "status": item["status"]})
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
        (self.starter())()
    }

    /// What starts one more replica, on a thread of its own: the start blocks until the replica listens, which a
    /// stalled database delays (the replica waits for it).
    fn starter(&self) -> impl FnOnce() -> anyhow::Result<ChildProcess> + Send + 'static {
        let (bin_dir, database_url, admin_token, settings) = (
            self.bin_dir.clone(),
            self.database_url.clone(),
            self.admin_token.clone(),
            self.settings.clone(),
        );
        move || {
            let settings: Vec<(&str, &str)> = settings
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            procs::start_gateway(&bin_dir, &database_url, &admin_token, &settings)
        }
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
    let bin_dir = args.start.bin_dir()?;
    let http = Client::builder().timeout(Duration::from_secs(30)).build()?;
    let database = Database::create(&args.start.database_url).await?;
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
    let mcp = procs::start_testkit(bin_dir, "example-mcp")?;
    let (proxy, through_proxy) = database_proxy(&database.url).await?;
    let mut replicas = Replicas {
        bin_dir: bin_dir.to_path_buf(),
        database_url: through_proxy,
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
    let admin = Admin::new(http, &replicas.slots[0].url, &replicas.admin_token);
    let key = admin.configure(&mock.url, &tools.url, true).await?;
    admin.attach_mcp(&format!("{}/mcp", mcp.url)).await?;
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
        "chaotic",
    ));
    let mut kills = 0;
    let mut pauses = 0;
    let (mut stalls, mut cuts) = (0, 0);
    // When the database, stalled, is reachable again.
    let mut stalled_until: Option<Instant> = None;
    // Replicas paused now: (slot, when it is resumed).
    let mut paused: Vec<(usize, Instant)> = Vec::new();
    let mut takeovers = Vec::new();
    let mut rng_state = 0x9e37_79b9_7f4a_7c15_u64 ^ u64::from(std::process::id());
    while Instant::now() < chaos_end {
        let half = args.kill_every_ms / 2;
        let wait = half + next_random(&mut rng_state) % (args.kill_every_ms - half).max(1);
        tokio::time::sleep(Duration::from_millis(wait)).await;
        if Instant::now() >= chaos_end {
            break;
        }
        if stalled_until.is_some_and(|until| Instant::now() >= until) {
            proxy.heal();
            stalled_until = None;
        }
        paused.retain(|&(slot, until)| {
            let due = Instant::now() >= until;
            if due {
                replicas.slots[slot].signal("CONT");
            }
            !due
        });
        let faults = kills + pauses + stalls + cuts;
        if args.database_every > 0 && (faults + 1) % args.database_every as usize == 0 {
            if stalls <= cuts && stalled_until.is_none() {
                proxy.stall();
                stalls += 1;
                let stall = args.lease_ms + next_random(&mut rng_state) % args.lease_ms.max(1);
                stalled_until = Some(Instant::now() + Duration::from_millis(stall));
            } else {
                proxy.cut_all();
                cuts += 1;
            }
            continue;
        }
        let victim = (next_random(&mut rng_state) as usize) % replicas.slots.len();
        if paused.iter().any(|&(slot, _)| slot == victim) {
            continue;
        }
        if args.pause_every > 0 && (faults + 1) % args.pause_every as usize == 0 {
            let pause = args.lease_ms + next_random(&mut rng_state) % args.lease_ms.max(1);
            if replicas.slots[victim].signal("STOP") {
                pauses += 1;
                paused.push((victim, Instant::now() + Duration::from_millis(pause)));
            }
            continue;
        }
        let replica_id = replicas.slots[victim].ident.clone();
        replicas.slots[victim].kill();
        kills += 1;
        takeovers.push(tokio::spawn(takeover_time(
            database.url.clone(),
            replica_id,
            Instant::now(),
        )));
        // A replica restarted while the database is stalled waits for it: the stall still ends on time meanwhile.
        let start = tokio::task::spawn_blocking(replicas.starter());
        tokio::pin!(start);
        let restarted = loop {
            let heal_at =
                stalled_until.unwrap_or_else(|| Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                started = &mut start => break started??,
                () = tokio::time::sleep_until(heal_at.into()) => {
                    proxy.heal();
                    stalled_until = None;
                }
            }
        };
        replicas.slots[victim] = restarted;
        *urls.lock().unwrap_or_else(|e| e.into_inner()) = replicas.urls();
    }
    for (slot, _) in paused {
        replicas.slots[slot].signal("CONT");
    }
    proxy.heal();
    let ids = submitter.await??;
    eprintln!(
        "[chaos] {kills} kills, {pauses} pauses, {stalls} database stalls, {cuts} database cuts; waiting for the \
         responses to end"
    );
    let mut takeover_ms: Vec<u128> = Vec::new();
    for monitor in takeovers {
        if let Some(time) = monitor.await?? {
            takeover_ms.push(time.as_millis());
        }
    }
    let settle_end = Instant::now() + Duration::from_secs(args.settle_seconds);
    let chaotic = wait_all(http, &replicas.urls(), &key, &ids, settle_end).await?;
    // The MCP server cannot tell which response a call is for but by its key, the very thing checked; so its
    // record is taken apart between the two runs, and the arguments name the request.
    let chaotic_mcp = mcp_calls(http, &mcp.url).await?;
    http.post(format!("{}/_mcp/reset", mcp.url))
        .send()
        .await?
        .error_for_status()?;

    // The same requests, without chaos.
    eprintln!("[chaos] the same requests without chaos …");
    let calm_urls = Arc::new(Mutex::new(replicas.urls()));
    let calm_ids = submit_all(
        http.clone(),
        calm_urls,
        key.clone(),
        args.responses,
        Duration::from_secs(5),
        "calm",
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

    let calm_mcp = mcp_calls(http, &mcp.url).await?;
    let calls = http
        .get(format!("{}/_tools/calls", tools.url))
        .send()
        .await?
        .json::<Vec<Value>>()
        .await?;
    // The tool servers keep only their latest calls: an audit of fewer than were sent would pass on what it
    // cannot see.
    for (what, kept) in [("tool server", calls.len()), ("MCP server", calm_mcp.len())] {
        anyhow::ensure!(
            kept < gateway_testkit::DEFAULT_KEPT,
            "the {what} kept only its latest {kept} calls: fewer --responses let the audit see every one"
        );
    }
    let chaotic_ids: HashSet<&str> = ids.iter().map(String::as_str).collect();
    let http_sends: Vec<Sent> = calls.iter().map(http_send).collect();
    let mcp_sends: Vec<Sent> = chaotic_mcp
        .iter()
        .map(|call| mcp_send(call, &ids))
        .chain(calm_mcp.iter().map(|call| mcp_send(call, &calm_ids)))
        .collect();
    let ended_chaotic: Vec<&Value> = ids.iter().filter_map(|id| chaotic.get(id)).collect();
    let http_audit = audit(
        &http_sends,
        &chaotic_ids,
        tool_steps(&ended_chaotic, |name| !name.starts_with(MCP_PREFIX)),
    );
    let mcp_audit = audit(
        &mcp_sends,
        &chaotic_ids,
        tool_steps(&ended_chaotic, |name| name.starts_with(MCP_PREFIX)),
    );
    // A send under a key that is not its own response's is named, with the record it was found in, so that a
    // failed audit can be followed up.
    let records = std::iter::repeat_n("chaotic", chaotic_mcp.len())
        .chain(std::iter::repeat_n("calm", calm_mcp.len()))
        .map(|record| ("MCP", record))
        .zip(&mcp_sends)
        .chain(std::iter::repeat(("HTTP", "both")).zip(&http_sends));
    for ((kind, record), send) in records {
        if send
            .key
            .as_deref()
            .is_some_and(|key| !own_key(key, &send.response_id))
        {
            eprintln!("[chaos] {kind} send in the {record} record under a key not of its response: {send:?}");
        }
    }

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
    let passed = stuck == 0
        && lost == 0
        && different == 0
        && http_audit.keys_hold()
        && mcp_audit.keys_hold();
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
         * {} replicas on one Postgres database, lease {} ms; {} background responses, each a batch of three tool calls (HTTP `slow` 0.4–2 s and `add`, MCP `{MCP_PREFIX}add` 0.3–1.8 s) then a model answer, submitted over {} s; a fault every ~{} ms: {} kills (SIGKILL, then restarted); {} pauses (SIGSTOP for one to two leases, then SIGCONT); {} database stalls (nothing through to it, for every replica, for one to two leases); {} database cuts (every connection to it closed at once)\n\
         * submitted {}, **ended {}**, completed {}, statuses {:?}, **stuck {}**, **lost {}**\n\
         * outputs different from the same requests run without chaos: **{}**\n\
         * HTTP: {}\n\
         * MCP: {}\n\
         * takeover after a kill (the killed replica's last running response owned by another): {} measured, p50 {} ms, max {} ms\n\
         * verdict: {}\n",
        args.replicas,
        args.lease_ms,
        ids.len(),
        args.chaos_seconds,
        args.kill_every_ms,
        kills,
        pauses,
        stalls,
        cuts,
        ids.len(),
        ended,
        completed,
        statuses,
        stuck,
        lost,
        different,
        http_audit.describe("tool requests", "Idempotency-Key"),
        mcp_audit.describe("`tools/call`s", "`_meta.idempotencyKey`"),
        takeover_ms.len(),
        quantile(0.5),
        quantile(1.0),
        if passed { "passed" } else { "FAILED" },
    );
    drop((mock, tools, mcp, proxy));
    Ok(Report { text, passed })
}

/// A fault proxy in front of the database of `url`, and the URL that reaches the database through it.
async fn database_proxy(url: &str) -> anyhow::Result<(FaultProxy, String)> {
    let mut through = reqwest::Url::parse(url).context("the database URL")?;
    let host = through
        .host_str()
        .context("the database URL names no host")?;
    let port = through.port().unwrap_or(5432);
    let target = tokio::net::lookup_host((host, port))
        .await?
        .next()
        .with_context(|| format!("{host}:{port} resolves to no address"))?;
    // Never cuts by chance: only when told (`stall`, `cut_all`).
    let proxy = FaultProxy::start(target, u64::MAX, 1).await?;
    through
        .set_host(Some(&proxy.addr().ip().to_string()))
        .context("a host for the proxy")?;
    through
        .set_port(Some(proxy.addr().port()))
        .map_err(|()| anyhow::anyhow!("a port for the proxy"))?;
    Ok((proxy, through.to_string()))
}

/// The `tools/call`s the example MCP server recorded, each `{"tool", "arguments", "meta"}`.
async fn mcp_calls(http: &Client, mcp_url: &str) -> anyhow::Result<Vec<Value>> {
    let recorded: Value = http
        .get(format!("{mcp_url}/_mcp/calls"))
        .send()
        .await?
        .error_for_status()?
        .json()
        .await?;
    Ok(recorded["calls"].as_array().cloned().unwrap_or_default())
}

/// One request a tool server received: the tool step it was for, as known without its key, and its key.
#[derive(Debug, Clone, PartialEq)]
struct Sent {
    /// The response it was for.
    response_id: String,
    /// The tool step within that response (its call id, or the tool's name when the send does not carry it).
    step: String,
    key: Option<String>,
}

/// An HTTP tool request: the gateway names the response and the call in headers of their own.
fn http_send(call: &Value) -> Sent {
    let header = |name: &str| call["headers"][name].as_str().map(str::to_owned);
    Sent {
        response_id: header("x-gateway-response-id").unwrap_or_default(),
        step: header("x-gateway-call-id").unwrap_or_default(),
        key: header("idempotency-key"),
    }
}

/// An MCP `tools/call` of a run whose requests are `ids`: its argument `a` is the request's index (see
/// [`input`]), and a batch holds one MCP call, so the tool's name is the step.
fn mcp_send(call: &Value, ids: &[String]) -> Sent {
    let response_id = call["arguments"]["a"]
        .as_u64()
        .filter(|_| call["arguments"]["b"].as_u64() == Some(MCP_ADD_B))
        .and_then(|a| ids.get(usize::try_from(a).ok()?))
        .cloned()
        .unwrap_or_default();
    Sent {
        response_id,
        step: call["tool"].as_str().unwrap_or_default().to_owned(),
        key: call["meta"]["idempotencyKey"].as_str().map(str::to_owned),
    }
}

/// How many server tool calls (`mcp_call` items) whose name passes `tool` the `responses` hold.
fn tool_steps(responses: &[&Value], tool: impl Fn(&str) -> bool) -> usize {
    responses
        .iter()
        .flat_map(|r| r["output"].as_array().into_iter().flatten())
        .filter(|item| item["type"] == "mcp_call" && item["name"].as_str().is_some_and(&tool))
        .count()
}

/// What the sends of one kind of tool say about their keys.
#[derive(Debug, Default, PartialEq)]
struct KeyAudit {
    /// Sends for the chaotic responses.
    sent: usize,
    /// Distinct keys among them.
    keys: usize,
    /// Tool steps of this kind in the ended chaotic responses: one key each.
    steps: usize,
    /// The most sends of one key.
    most_sends: usize,
    /// Sends of either run without a key.
    without_key: usize,
    /// Sends of either run whose key is not `<response id>:<seq>` of the response the send was for.
    foreign_keys: usize,
    /// Steps of either run sent under more than one key.
    split_steps: usize,
}

impl KeyAudit {
    /// Every send keyed, by its own response, one key per step, and one step per key.
    fn keys_hold(&self) -> bool {
        self.without_key == 0
            && self.foreign_keys == 0
            && self.split_steps == 0
            && self.keys == self.steps
    }

    fn describe(&self, sends: &str, key: &str) -> String {
        format!(
            "{} {sends} for {} tool steps under {} distinct keys: **{} sent again under a key already used** \
             (at most {} sends of one key); without {key} {}, keys not `<response id>:<seq>` of their response {}, \
             **steps under two keys {}**",
            self.sent,
            self.steps,
            self.keys,
            self.sent - self.keys,
            self.most_sends,
            self.without_key,
            self.foreign_keys,
            self.split_steps,
        )
    }
}

/// Checks the keys of `sends` (both runs') and counts those of the `chaotic` responses, which hold `steps` tool
/// steps of this kind.
fn audit(sends: &[Sent], chaotic: &HashSet<&str>, steps: usize) -> KeyAudit {
    let mut result = KeyAudit {
        steps,
        ..KeyAudit::default()
    };
    let mut by_key: HashMap<&str, usize> = HashMap::new();
    let mut keys_of_step: HashMap<(&str, &str), BTreeSet<&str>> = HashMap::new();
    for send in sends {
        let Some(key) = send.key.as_deref() else {
            result.without_key += 1;
            continue;
        };
        if !own_key(key, &send.response_id) {
            result.foreign_keys += 1;
        }
        keys_of_step
            .entry((&send.response_id, &send.step))
            .or_default()
            .insert(key);
        if chaotic.contains(send.response_id.as_str()) {
            result.sent += 1;
            *by_key.entry(key).or_default() += 1;
        }
    }
    result.keys = by_key.len();
    result.most_sends = by_key.values().copied().max().unwrap_or(0);
    result.split_steps = keys_of_step.values().filter(|keys| keys.len() > 1).count();
    result
}

/// Whether `key` is `<response_id>:<seq>`.
fn own_key(key: &str, response_id: &str) -> bool {
    key.rsplit_once(':').is_some_and(|(response, seq)| {
        response == response_id && !seq.is_empty() && seq.bytes().all(|b| b.is_ascii_digit())
    })
}

/// A xorshift step: the chaos needs variety, not quality.
fn next_random(state: &mut u64) -> u64 {
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    *state
}

/// Submits `count` background responses, evenly over `over`, each to the next replica that answers and each
/// under an `Idempotency-Key` of its own (`run` tells the chaotic and the calm run's apart); returns their ids in
/// input order.
async fn submit_all(
    http: Client,
    urls: Arc<Mutex<Vec<String>>>,
    key: String,
    count: usize,
    over: Duration,
    run: &'static str,
) -> anyhow::Result<Vec<String>> {
    let gap = over / count.max(1) as u32;
    let mut ids = Vec::with_capacity(count);
    for i in 0..count {
        let body = json!({"model": TOOLS_MODEL, "input": input(i), "background": true});
        let mut attempt = 0;
        // A database stalled or restarting answers creates with 5xx for a while: a client that retries with its
        // key for long enough gets its response.
        let give_up = Instant::now() + Duration::from_secs(60);
        let id = loop {
            let candidates = urls.lock().unwrap_or_else(|e| e.into_inner()).clone();
            let url = &candidates[(i + attempt) % candidates.len()];
            attempt += 1;
            // A create sent again after its replica was killed may have been stored before the kill: under the
            // same key it answers that response, instead of starting a second one for the same request (whose
            // tool calls the audit would take for this one's under a foreign key).
            match http
                .post(format!("{url}/v1/responses"))
                .bearer_auth(&key)
                .header(
                    "Idempotency-Key",
                    format!("chaos-{}-{run}-{i}", std::process::id()),
                )
                .json(&body)
                .send()
                .await
            {
                Ok(response) if response.status().is_success() => {
                    let created: Value = response.json().await?;
                    break created["id"].as_str().context("an id")?.to_owned();
                }
                // A replica killed mid-request: another one takes the request. What a live replica answered is
                // shown.
                Ok(response) if Instant::now() < give_up => {
                    let status = response.status();
                    let text = response.text().await.unwrap_or_default();
                    eprintln!("[chaos] create {run} {i} answered {status}: {text}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(_) if Instant::now() < give_up => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(response) => bail!(
                    "create failed: {} {}",
                    response.status(),
                    response.text().await.unwrap_or_default()
                ),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sent(response_id: &str, step: &str, key: Option<&str>) -> Sent {
        Sent {
            response_id: response_id.into(),
            step: step.into(),
            key: key.map(str::to_owned),
        }
    }

    #[test]
    fn audit_counts_resends_and_catches_missing_foreign_and_split_keys() {
        let chaotic: HashSet<&str> = ["resp_a", "resp_b"].into();
        let cases = [
            (
                "a step re-sent under its key is a duplicate, not a fault",
                vec![
                    sent("resp_a", "mcp_add", Some("resp_a:3")),
                    sent("resp_a", "mcp_add", Some("resp_a:3")),
                    sent("resp_b", "mcp_add", Some("resp_b:3")),
                ],
                2,
                (3, 2, 2, 0, 0, 0, true),
            ),
            (
                "the calm run's sends are checked but not counted",
                vec![
                    sent("resp_a", "mcp_add", Some("resp_a:3")),
                    sent("resp_calm", "mcp_add", None),
                ],
                1,
                (1, 1, 1, 1, 0, 0, false),
            ),
            (
                "a key of another response, or without a sequence number, is foreign",
                vec![
                    sent("resp_a", "mcp_add", Some("resp_b:3")),
                    sent("resp_b", "mcp_add", Some("resp_b")),
                ],
                2,
                (2, 2, 1, 0, 2, 0, false),
            ),
            (
                "one step under two keys is split",
                vec![
                    sent("resp_a", "mcp_add", Some("resp_a:3")),
                    sent("resp_a", "mcp_add", Some("resp_a:4")),
                ],
                1,
                (2, 2, 1, 0, 0, 1, false),
            ),
            (
                "a step that never reached the server leaves fewer keys than steps",
                vec![sent("resp_a", "mcp_add", Some("resp_a:3"))],
                2,
                (1, 1, 1, 0, 0, 0, false),
            ),
        ];
        for (case, sends, steps, expected) in cases {
            let found = audit(&sends, &chaotic, steps);
            let (sent, keys, most_sends, without_key, foreign_keys, split_steps, holds) = expected;
            assert_eq!(
                found,
                KeyAudit {
                    sent,
                    keys,
                    steps,
                    most_sends,
                    without_key,
                    foreign_keys,
                    split_steps,
                },
                "{case}"
            );
            assert_eq!(found.keys_hold(), holds, "{case}");
        }
    }

    #[test]
    fn an_mcp_call_is_placed_by_its_arguments_not_its_key() {
        let ids = vec!["resp_0".to_owned(), "resp_1".to_owned()];
        let call = json!({"tool": "mcp_add", "arguments": {"a": 1, "b": MCP_ADD_B},
                          "meta": {"idempotencyKey": "resp_0:3"}});
        assert_eq!(
            mcp_send(&call, &ids),
            sent("resp_1", "mcp_add", Some("resp_0:3"))
        );
        let unkeyed = json!({"tool": "mcp_add", "arguments": {"a": 7, "b": 1}, "meta": {}});
        assert_eq!(mcp_send(&unkeyed, &ids), sent("", "mcp_add", None));
    }
}
