//! The processes under test: starting the gateway and the testkit servers as children, draining their
//! output, and reading memory and CPU figures from `/proc`.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use serde_json::Value;

/// Where a bench finds the programs it starts and the Postgres server it makes its database on: the options
/// every bench command that starts processes takes (flattened into its own).
#[derive(Debug, clap::Args)]
pub struct StartOptions {
    /// Where `gateway` and the testkit servers it starts are (default: the directory of this executable).
    #[arg(long)]
    pub bin_dir: Option<PathBuf>,
    /// Postgres server on which a fresh database `gw_bench_*` is created, and dropped at the end.
    #[arg(
        long,
        env = "BENCH_DATABASE_URL",
        default_value = "postgres://postgres@127.0.0.1:5432/postgres"
    )]
    pub database_url: String,
}

impl StartOptions {
    /// `--bin-dir`, or else the directory of this executable.
    pub fn bin_dir(&self) -> anyhow::Result<PathBuf> {
        match &self.bin_dir {
            Some(dir) => Ok(dir.clone()),
            None => Ok(std::env::current_exe()?
                .parent()
                .context("the bench executable has no directory")?
                .to_path_buf()),
        }
    }
}

/// How long a child may take to print its readiness line (the gateway applies migrations first).
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Log lines kept per child, to show when something went wrong.
const TAIL_LINES: usize = 20;

/// What a child printed after its readiness line: counts by level and the last warnings/errors.
#[derive(Debug, Default)]
pub struct LogTail {
    pub lines: u64,
    pub warnings: u64,
    pub errors: u64,
    pub last_problems: VecDeque<String>,
}

/// How long a child asked to stop (SIGTERM) may take to exit before it is killed: the gateway finishes what it
/// has in flight (nothing, once a bench's phases ended) and exits, so that a build that writes something at exit
/// (an instrumented build's profile, for `scripts/build-pgo.sh`) gets to write it.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// A child process, asked to stop, then killed if it must be, and reaped, when dropped.
pub struct ChildProcess {
    pub name: String,
    pub pid: u32,
    pub url: String,
    /// What the child said of itself when ready (a gateway's replica id); empty for the testkit servers.
    pub ident: String,
    pub log: Arc<Mutex<LogTail>>,
    child: Child,
}

impl Drop for ChildProcess {
    fn drop(&mut self) {
        self.stop();
    }
}

impl ChildProcess {
    /// Fails when the child has exited.
    pub fn check_alive(&mut self) -> anyhow::Result<()> {
        match self.child.try_wait()? {
            Some(status) => bail!("{} exited with {status}", self.name),
            None => Ok(()),
        }
    }

    /// Asks the child to stop (SIGTERM), as an orchestrator does; kills it when it has not exited within
    /// [`STOP_GRACE`], and reaps it.
    pub fn stop(&mut self) {
        if matches!(self.child.try_wait(), Ok(Some(_))) {
            return;
        }
        let asked = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success());
        if asked {
            let deadline = std::time::Instant::now() + STOP_GRACE;
            while std::time::Instant::now() < deadline {
                match self.child.try_wait() {
                    Ok(Some(_)) => return,
                    Ok(None) => std::thread::sleep(Duration::from_millis(20)),
                    // Not known to have exited: killed and reaped below.
                    Err(_) => break,
                }
            }
        }
        self.kill();
    }

    /// Sends the child signal `name` (`STOP`, `CONT`, …) as `kill -<name>` does; whether it was sent.
    pub fn signal(&self, name: &str) -> bool {
        Command::new("kill")
            .args([format!("-{name}"), self.pid.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|status| status.success())
    }

    /// Kills the child (SIGKILL) and reaps it: nothing of it runs on.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Counts of the warnings and errors the child logged, with the last few of them.
    pub fn log_summary(&self) -> (u64, u64, Vec<String>) {
        let tail = self.log.lock().unwrap_or_else(|e| e.into_inner());
        (
            tail.warnings,
            tail.errors,
            tail.last_problems.iter().cloned().collect(),
        )
    }
}

/// Starts a testkit binary (`mock-model`, `example-tools`) on port 0 and reads its address from its
/// `listening on http://HOST:PORT` line.
pub fn start_testkit(bin_dir: &Path, name: &str) -> anyhow::Result<ChildProcess> {
    let path = bin_dir.join(name);
    let mut command = Command::new(&path);
    command
        .args(["--bind", "127.0.0.1:0"])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    start(name, command, |line| {
        line.trim().strip_prefix("listening on ").map(|url| Ready {
            url: url.to_owned(),
            ident: String::new(),
        })
    })
    .with_context(|| format!("start {}", path.display()))
}

/// Starts `gateway-floor` (the least a Responses-to-Chat proxy does on the gateway's stack) on port 0, calling the
/// mock model at `mock_url`, and reads its address from its `listening on http://HOST:PORT` line.
pub fn start_floor(bin_dir: &Path, mock_url: &str) -> anyhow::Result<ChildProcess> {
    let path = bin_dir.join("gateway-floor");
    let mut command = Command::new(&path);
    command
        .args(["--bind", "127.0.0.1:0", "--upstream"])
        .arg(format!("{}/v1", mock_url.trim_end_matches('/')))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    start("gateway-floor", command, |line| {
        line.trim().strip_prefix("listening on ").map(|url| Ready {
            url: url.to_owned(),
            ident: String::new(),
        })
    })
    .with_context(|| format!("start {}", path.display()))
}

/// Starts `gateway serve` on port 0 with JSON logs and reads its address from the `gateway listening`
/// log line.
pub fn start_gateway(
    bin_dir: &Path,
    database_url: &str,
    admin_token: &str,
    settings: &[(&str, &str)],
) -> anyhow::Result<ChildProcess> {
    let path = bin_dir.join("gateway");
    let mut command = Command::new(&path);
    command
        .arg("serve")
        .env("GATEWAY__SERVER__BIND", "127.0.0.1:0")
        .env("GATEWAY__LOG__FORMAT", "json")
        .env("GATEWAY__LOG__FILTER", "warn,gateway=info")
        .env("GATEWAY__ADMIN__TOKEN", admin_token)
        .env("DATABASE_URL", database_url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit());
    for (key, value) in settings {
        command.env(key, value);
    }
    start("gateway", command, |line| {
        let value: Value = serde_json::from_str(line).ok()?;
        let fields = value.get("fields")?;
        if fields.get("message")?.as_str()? != "gateway listening" {
            return None;
        }
        Some(Ready {
            url: format!("http://{}", fields.get("address")?.as_str()?),
            ident: fields
                .get("replica.id")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
        })
    })
    .with_context(|| format!("start {}", path.display()))
}

/// What a child's readiness line said: where it listens, and who it is.
struct Ready {
    url: String,
    ident: String,
}

fn start(
    name: &str,
    mut command: Command,
    ready: fn(&str) -> Option<Ready>,
) -> anyhow::Result<ChildProcess> {
    let mut child = command.spawn()?;
    let pid = child.id();
    let Some(stdout) = child.stdout.take() else {
        let _ = child.kill();
        let _ = child.wait();
        bail!("{name}: no stdout");
    };
    let log = Arc::new(Mutex::new(LogTail::default()));
    let (tx, rx) = mpsc::channel::<Ready>();
    let tail = Arc::clone(&log);
    // The child blocks when its stdout pipe is full, so this thread reads it until the end.
    std::thread::spawn(move || drain(stdout, tail, ready, tx));
    let mut process = ChildProcess {
        name: name.to_owned(),
        pid,
        url: String::new(),
        ident: String::new(),
        log,
        child,
    };
    match rx.recv_timeout(READY_TIMEOUT) {
        Ok(ready) => {
            process.url = ready.url;
            process.ident = ready.ident;
            Ok(process)
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            bail!("{name} did not report its address within {READY_TIMEOUT:?}")
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            process.check_alive()?;
            bail!("{name} closed its stdout before reporting its address")
        }
    }
}

fn drain(
    stdout: impl Read,
    tail: Arc<Mutex<LogTail>>,
    ready: fn(&str) -> Option<Ready>,
    tx: mpsc::Sender<Ready>,
) {
    let mut announced = false;
    for line in BufReader::new(stdout).lines() {
        let Ok(line) = line else { break };
        if !announced {
            if let Some(found) = ready(&line) {
                announced = true;
                let _ = tx.send(found);
                continue;
            }
        }
        let mut tail = tail.lock().unwrap_or_else(|e| e.into_inner());
        tail.lines += 1;
        let level = if line.contains("\"level\":\"ERROR\"") || line.contains(" ERROR ") {
            Some(true)
        } else if line.contains("\"level\":\"WARN\"") || line.contains(" WARN ") {
            Some(false)
        } else {
            None
        };
        if let Some(is_error) = level {
            if is_error {
                tail.errors += 1;
            } else {
                tail.warnings += 1;
            }
            if tail.last_problems.len() == TAIL_LINES {
                tail.last_problems.pop_front();
            }
            tail.last_problems.push_back(line);
        }
    }
}

/// Resident memory of a process, in KiB: now (`VmRSS`), the peak since start or the last [`reset_peak`]
/// (`VmHWM`), and of the first, the anonymous part (`RssAnon`: the heap and stacks, without the pages of the
/// binary file, whose count depends on how recently the file was written: a fresh copy of the same build starts
/// with some 4 MiB more of them resident).
#[derive(Debug, Clone, Copy, Default)]
pub struct Memory {
    pub rss_kib: u64,
    pub hwm_kib: u64,
    pub anon_kib: u64,
}

pub fn memory(pid: u32) -> anyhow::Result<Memory> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read /proc/{pid}/status"))?;
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    Ok(Memory {
        rss_kib: field("VmRSS:"),
        hwm_kib: field("VmHWM:"),
        anon_kib: field("RssAnon:"),
    })
}

/// Resets `VmHWM` to the current RSS (`echo 5 > /proc/PID/clear_refs`); false when not permitted.
pub fn reset_peak(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// User plus system CPU time of a process, in clock ticks.
pub fn cpu_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses; the fields after the last ')' start at 3.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// Clock ticks per second (`getconf CLK_TCK`, 100 when unknown).
pub fn ticks_per_second() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse().ok())
        .filter(|&t: &u64| t > 0)
        .unwrap_or(100)
}

/// CPU ticks of every Postgres backend serving database `database`, by pid.
pub fn postgres_backends(database: &str) -> HashMap<u32, u64> {
    let mut found = HashMap::new();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return found;
    };
    for entry in entries.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim() != "postgres" {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        // A backend's title is "postgres: USER DATABASE HOST(PORT) STATE".
        let title = String::from_utf8_lossy(&cmdline);
        if title.split_whitespace().any(|w| w == database) {
            if let Some(ticks) = cpu_ticks(pid) {
                found.insert(pid, ticks);
            }
        }
    }
    found
}

/// Ticks spent by the backends in `after` since `before` (new backends count from zero).
pub fn postgres_ticks_between(before: &HashMap<u32, u64>, after: &HashMap<u32, u64>) -> u64 {
    after
        .iter()
        .map(|(pid, ticks)| ticks.saturating_sub(before.get(pid).copied().unwrap_or(0)))
        .sum()
}

/// The 1, 5 and 15 minute load averages, as `/proc/loadavg` prints them.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "?".into())
}

/// Samples a process's RSS every 20 ms on a tokio task until stopped; answers the highest value.
pub struct RssSampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<u64>,
}

impl RssSampler {
    pub fn start(pid: u32) -> RssSampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let task = tokio::spawn(async move {
            let mut peak = 0;
            loop {
                if let Ok(m) = memory(pid) {
                    peak = peak.max(m.rss_kib);
                }
                if flag.load(Ordering::Relaxed) {
                    return peak;
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        RssSampler { stop, task }
    }

    pub async fn finish(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.task.await.unwrap_or(0)
    }
}
