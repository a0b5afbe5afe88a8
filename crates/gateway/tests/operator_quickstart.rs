//! `docs/operator-quickstart.md`, run as written: its `sh` blocks, in order, in one `bash` with `set -e`, in a
//! fresh directory, with the binaries this build made on `PATH` (the page's own build step is the one block left
//! out) and free ports in `GW_PORT`, `MODEL_PORT` and `TOOLS_PORT`. A command of the page that fails (a `curl
//! -f` refused, a `jq -e` check false) fails the test. A port found free and taken by another test before a
//! server of the page bound it is the one failure tried again, with new ports.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The page's `sh` blocks but the build, in order.
fn runnable_blocks(page: &str) -> Vec<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in page.lines() {
        match (&mut current, line.trim_end()) {
            (None, "```sh") => current = Some(String::new()),
            (Some(block), "```") => {
                if !block.contains("cargo build") {
                    blocks.push(std::mem::take(block));
                }
                current = None;
            }
            (Some(block), text) => {
                block.push_str(text);
                block.push('\n');
            }
            (None, _) => {}
        }
    }
    blocks
}

/// A port nothing listens on now.
fn free_port() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.local_addr().expect("addr").port()
}

/// Kills the script's whole process group (the servers it started in the background) when the test ends.
struct Group(i32);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.0)])
            .status();
    }
}

/// The servers' logs of the page, where a port already taken shows.
const SERVER_LOGS: [&str; 3] = ["gateway.log", "mock-model.log", "example-tools.log"];

/// Tries of the page when a port was taken under it.
const TRIES: usize = 3;

#[test]
fn the_operator_quick_start_runs_as_written() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let page = std::fs::read_to_string(repo.join("docs/operator-quickstart.md")).expect("the page");
    let blocks = runnable_blocks(&page);
    assert!(blocks.len() >= 6, "the page's commands: {blocks:#?}");
    let bin_dir = PathBuf::from(env!("CARGO_BIN_EXE_gateway"))
        .parent()
        .expect("bin dir")
        .to_owned();
    for binary in ["mock-model", "example-tools"] {
        assert!(
            bin_dir.join(binary).is_file(),
            "{binary} is not built in {}: build the workspace (`cargo build --workspace`) first",
            bin_dir.display()
        );
    }
    let script = format!("set -euo pipefail\n{}", blocks.join("\n"));
    for attempt in 1..=TRIES {
        let dir =
            std::env::temp_dir().join(format!("gw-quickstart-{}-{attempt}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = format!(
            "{}:{}",
            bin_dir.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let child = Command::new("bash")
            .arg("-c")
            .arg(&script)
            .current_dir(&dir)
            .env("PATH", path)
            .env("GW_PORT", free_port().to_string())
            .env("MODEL_PORT", free_port().to_string())
            .env("TOOLS_PORT", free_port().to_string())
            .env_remove("DATABASE_URL")
            .env_remove("RUST_LOG")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("bash");
        let group = Group(child.id() as i32);
        let output = child.wait_with_output().expect("the script ends");
        drop(group);
        let read = |name: &str| std::fs::read_to_string(dir.join(name)).unwrap_or_default();
        let log = read("gateway.log");
        let port_taken = SERVER_LOGS
            .iter()
            .any(|name| read(name).contains("Address already in use"));
        if !output.status.success() && port_taken && attempt < TRIES {
            let _ = std::fs::remove_dir_all(&dir);
            continue;
        }
        assert!(
            output.status.success(),
            "the quick start failed ({}):\nstdout:\n{}\nstderr:\n{}\ngateway.log:\n{log}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
        );
        assert!(log.contains("gateway listening"), "{log}");
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
}
