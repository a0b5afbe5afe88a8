//! `gateway-ws-bench`: the per-turn cost of continuing a `store: false` chain on one WebSocket, against the same
//! turn over HTTP (a streamed `store: false` create that sends the history again, and a streamed `store: true`
//! create that continues with `previous_response_id`), and against the model called directly with the same
//! messages. One client, one turn at a time; the transports alternate chain by chain, so that they meet the
//! same machine conditions. Every chain has the same length, so every transport sees the same contexts.
//!
//! It starts everything from its own directory (`--bin-dir`): a fresh Postgres database, `mock-model`,
//! `example-tools` and `gateway serve`.

use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Parser;
use futures::{SinkExt, StreamExt};
use gateway_bench::load::quantile_ms;
use gateway_bench::procs::{self, StartOptions};
use gateway_bench::setup::{Admin, Database, PLAIN_MODEL};
use hdrhistogram::Histogram;
use reqwest::Client;
use serde_json::{json, Value};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// A `store: false` chain on one WebSocket against the same turns over HTTP.
#[derive(Debug, Parser)]
#[command(name = "gateway-ws-bench", version, about)]
struct Args {
    /// Chains measured per transport.
    #[arg(long, default_value_t = 200)]
    chains: usize,
    /// Turns per chain; the first starts the chain, the others (measured) continue it.
    #[arg(long, default_value_t = 6)]
    turns: usize,
    /// Unmeasured chains per transport first.
    #[arg(long, default_value_t = 20)]
    warmup: usize,
    #[command(flatten)]
    start: StartOptions,
}

type Socket = WebSocketStream<MaybeTlsStream<TcpStream>>;

/// How a turn travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    /// `store: false` on one socket, continued from the connection's memory.
    WebSocket,
    /// `stream: true`, `store: false`, the whole history sent again.
    HttpResend,
    /// `stream: true`, `store: true`, continued with `previous_response_id`.
    HttpStored,
    /// The mock model's Chat Completions endpoint, streamed, with the same messages.
    Direct,
}

const TRANSPORTS: [Transport; 4] = [
    Transport::WebSocket,
    Transport::HttpResend,
    Transport::HttpStored,
    Transport::Direct,
];

impl Transport {
    fn name(self) -> &'static str {
        match self {
            Transport::WebSocket => "websocket, store:false, previous_response_id",
            Transport::HttpResend => "HTTP SSE, store:false, history resent",
            Transport::HttpStored => "HTTP SSE, store:true, previous_response_id",
            Transport::Direct => "mock model directly (same messages)",
        }
    }
}

/// What the bench talks to.
struct Bench {
    http: Client,
    gateway: String,
    key: String,
    mock: String,
    socket: Socket,
}

/// One chain as it goes: the last response's id and the conversation as `(role, text)`.
#[derive(Default)]
struct Chain {
    previous: Option<String>,
    history: Vec<(String, String)>,
}

impl Bench {
    /// Runs one turn of `chain` over `transport`; answers how long it took, from sending to the terminal event.
    async fn turn(
        &mut self,
        transport: Transport,
        chain: &mut Chain,
        text: &str,
    ) -> anyhow::Result<Duration> {
        let started = Instant::now();
        let (id, answer) = match transport {
            Transport::WebSocket => {
                let mut body = json!({"type": "response.create", "model": PLAIN_MODEL, "store": false,
                    "input": text});
                if let Some(previous) = &chain.previous {
                    body["previous_response_id"] = json!(previous);
                }
                self.socket.send(Message::text(body.to_string())).await?;
                let terminal = loop {
                    let message = self.socket.next().await.context("the socket closed")??;
                    let Message::Text(text) = message else {
                        continue;
                    };
                    let event: Value = serde_json::from_str(text.as_str())?;
                    match event["type"].as_str() {
                        Some("response.completed") => break event,
                        Some("error" | "response.failed" | "response.incomplete") => {
                            bail!("the turn failed: {event}")
                        }
                        _ => {}
                    }
                };
                response_of(&terminal["response"])
            }
            Transport::HttpResend | Transport::HttpStored => {
                let stored = transport == Transport::HttpStored;
                let mut body = json!({"model": PLAIN_MODEL, "stream": true, "store": stored});
                if stored {
                    body["input"] = json!(text);
                    if let Some(previous) = &chain.previous {
                        body["previous_response_id"] = json!(previous);
                    }
                } else {
                    let mut input: Vec<Value> = chain
                        .history
                        .iter()
                        .map(|(role, content)| json!({"type": "message", "role": role, "content": content}))
                        .collect();
                    input.push(json!({"type": "message", "role": "user", "content": text}));
                    body["input"] = json!(input);
                }
                let answer = self
                    .http
                    .post(format!("{}/v1/responses", self.gateway))
                    .bearer_auth(&self.key)
                    .json(&body)
                    .send()
                    .await?;
                if !answer.status().is_success() {
                    bail!("HTTP {}: {}", answer.status(), answer.text().await?);
                }
                let body = answer.text().await?;
                let terminal = body
                    .split("\n\n")
                    .filter_map(|frame| frame.lines().find_map(|l| l.strip_prefix("data: ")))
                    .filter_map(|data| serde_json::from_str::<Value>(data).ok())
                    .find(|event| event["type"] == "response.completed")
                    .with_context(|| format!("no response.completed in {body}"))?;
                response_of(&terminal["response"])
            }
            Transport::Direct => {
                let mut messages: Vec<Value> = chain
                    .history
                    .iter()
                    .map(|(role, content)| json!({"role": role, "content": content}))
                    .collect();
                messages.push(json!({"role": "user", "content": text}));
                let answer = self
                    .http
                    .post(format!("{}/v1/chat/completions", self.mock))
                    .json(
                        &json!({"model": "mock-model", "stream": true, "messages": messages,
                        "stream_options": {"include_usage": true}}),
                    )
                    .send()
                    .await?;
                if !answer.status().is_success() {
                    bail!("mock HTTP {}", answer.status());
                }
                let body = answer.text().await?;
                let text: String = body
                    .lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .filter_map(|data| serde_json::from_str::<Value>(data).ok())
                    .filter_map(|chunk| {
                        chunk["choices"][0]["delta"]["content"]
                            .as_str()
                            .map(str::to_owned)
                    })
                    .collect();
                (None, text)
            }
        };
        let took = started.elapsed();
        chain.previous = id;
        chain.history.push(("user".into(), text.to_owned()));
        chain.history.push(("assistant".into(), answer));
        Ok(took)
    }

    /// Runs one chain over `transport`; records the continuing turns' times in `histogram` (when given).
    async fn chain(
        &mut self,
        transport: Transport,
        turns: usize,
        index: usize,
        mut histogram: Option<&mut Histogram<u64>>,
    ) -> anyhow::Result<()> {
        let mut chain = Chain::default();
        for turn in 0..turns {
            let took = self
                .turn(
                    transport,
                    &mut chain,
                    &format!("chain {index}, turn {turn}"),
                )
                .await?;
            if turn > 0 {
                if let Some(histogram) = histogram.as_deref_mut() {
                    histogram.record(u64::try_from(took.as_micros()).unwrap_or(u64::MAX))?;
                }
            }
        }
        Ok(())
    }
}

/// The id and text of a response object.
fn response_of(response: &Value) -> (Option<String>, String) {
    (
        response["id"].as_str().map(str::to_owned),
        response["output_text"]
            .as_str()
            .unwrap_or_default()
            .to_owned(),
    )
}

async fn connect(gateway: &str, key: &str) -> anyhow::Result<Socket> {
    let mut request =
        format!("{}/v1/responses", gateway.replacen("http", "ws", 1)).into_client_request()?;
    request
        .headers_mut()
        .insert("authorization", format!("Bearer {key}").parse()?);
    let (socket, _) = tokio_tungstenite::connect_async(request).await?;
    Ok(socket)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.turns < 2 {
        bail!("--turns must be at least 2: the first turn starts a chain, the others continue it");
    }
    let bin_dir = args.start.bin_dir()?;
    let database = Database::create(&args.start.database_url).await?;
    let outcome = run(&args, &bin_dir, &database).await;
    if let Err(e) = database.drop_database().await {
        eprintln!("could not drop the bench database: {e:#}");
    }
    println!("{}", outcome?);
    Ok(())
}

async fn run(
    args: &Args,
    bin_dir: &std::path::Path,
    database: &Database,
) -> anyhow::Result<String> {
    let mut mock = procs::start_testkit(bin_dir, "mock-model")?;
    let mut tools = procs::start_testkit(bin_dir, "example-tools")?;
    let admin_token = format!("ws-bench-admin-{}", std::process::id());
    let mut gateway = procs::start_gateway(bin_dir, &database.url, &admin_token, &[])?;
    let outcome = measure(args, &gateway.url, &admin_token, &mock.url, &tools.url).await;
    gateway.kill();
    tools.kill();
    mock.kill();
    outcome
}

async fn measure(
    args: &Args,
    gateway: &str,
    admin_token: &str,
    mock: &str,
    tools: &str,
) -> anyhow::Result<String> {
    let http = Client::builder().timeout(Duration::from_secs(30)).build()?;
    let key = Admin::new(&http, gateway, admin_token)
        .configure(mock, tools, true)
        .await?;
    let socket = connect(gateway, &key).await?;
    let mut client = Bench {
        http,
        gateway: gateway.to_owned(),
        key,
        mock: mock.to_owned(),
        socket,
    };
    for index in 0..args.warmup {
        for transport in TRANSPORTS {
            client.chain(transport, args.turns, index, None).await?;
        }
    }
    let mut histograms = Vec::new();
    for _ in TRANSPORTS {
        histograms.push(Histogram::<u64>::new(3)?);
    }
    for index in 0..args.chains {
        // Each chain a different transport goes first.
        for offset in 0..TRANSPORTS.len() {
            let slot = (index + offset) % TRANSPORTS.len();
            client
                .chain(
                    TRANSPORTS[slot],
                    args.turns,
                    index,
                    Some(&mut histograms[slot]),
                )
                .await?;
        }
    }
    let ms = |h: &Histogram<u64>, q: f64| quantile_ms(h, q).unwrap_or(f64::NAN);
    let direct = &histograms[3];
    let mut report = format!(
        "{} chains x {} continuing turns per transport, one client, one turn at a time\n\n\
         | transport | p50 ms | p90 ms | p99 ms | mean ms | overhead p50 ms (vs direct) |\n|---|---|---|---|---|---|\n",
        args.chains,
        args.turns - 1
    );
    for (transport, histogram) in TRANSPORTS.iter().zip(&histograms) {
        report.push_str(&format!(
            "| {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} |\n",
            transport.name(),
            ms(histogram, 0.5),
            ms(histogram, 0.9),
            ms(histogram, 0.99),
            histogram.mean() / 1000.0,
            ms(histogram, 0.5) - ms(direct, 0.5),
        ));
    }
    let overhead = |h: &Histogram<u64>| ms(h, 0.5) - ms(direct, 0.5);
    report.push_str(&format!(
        "\nper-turn overhead at p50, WebSocket / HTTP (history resent): {:.2}; WebSocket / HTTP (stored, \
         previous_response_id): {:.2}\n",
        overhead(&histograms[0]) / overhead(&histograms[1]),
        overhead(&histograms[0]) / overhead(&histograms[2]),
    ));
    Ok(report)
}
