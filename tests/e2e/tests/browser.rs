//! The console in a real browser: headless Chromium (Debian's `chromium` and `chromium-driver`, installed by
//! `scripts/install-browser.sh`) driven over WebDriver signs in through the form, finds a response with a tool
//! round in the list, opens its timeline and sees its tool call and model; every page loads nothing from
//! anywhere but the gateway. Screenshots go to `target/console-screenshots/` (test artefacts).
#![allow(clippy::expect_used, clippy::unwrap_used, clippy::panic)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use fantoccini::{Client, ClientBuilder, Locator};
use gateway_e2e::TestGateway;
use gateway_testkit::{Call, Reply};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long any one thing in the browser may take.
const DEADLINE: Duration = Duration::from_secs(30);

/// A chromedriver on a port of its choosing (`--port=0`), and that port.
async fn chromedriver() -> (Child, u16) {
    let mut child = Command::new("chromedriver")
        .arg("--port=0")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect(
            "chromedriver: run scripts/install-browser.sh to install chromium and chromium-driver",
        );
    let stdout = child.stdout.take().expect("stdout");
    let mut lines = BufReader::new(stdout).lines();
    let port = tokio::time::timeout(DEADLINE, async {
        while let Some(line) = lines.next_line().await.expect("chromedriver output") {
            if let Some(rest) = line.split("started successfully on port ").nth(1) {
                return rest
                    .trim_end_matches('.')
                    .trim()
                    .parse::<u16>()
                    .expect("port");
            }
        }
        panic!("chromedriver stopped before it listened");
    })
    .await
    .expect("chromedriver did not start in time");
    // Keep reading its output, so that it never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, port)
}

async fn browser(port: u16) -> Client {
    let mut options = json!({
        "args": ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1280,900", "--no-first-run", "--disable-extensions"]
    });
    if std::path::Path::new("/usr/bin/chromium").exists() {
        options["binary"] = json!("/usr/bin/chromium");
    }
    let mut capabilities = serde_json::Map::new();
    capabilities.insert("goog:chromeOptions".to_owned(), options);
    ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
        .capabilities(capabilities)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .expect("a WebDriver session")
}

fn screenshots() -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/console-screenshots");
    std::fs::create_dir_all(&dir).expect("screenshot folder");
    dir
}

async fn screenshot(client: &Client, name: &str) {
    let png = client.screenshot().await.expect("screenshot");
    std::fs::write(screenshots().join(format!("{name}.png")), png).expect("write screenshot");
}

async fn wait_for(client: &Client, css: &str) -> fantoccini::elements::Element {
    client
        .wait()
        .at_most(DEADLINE)
        .for_element(Locator::Css(css))
        .await
        .unwrap_or_else(|e| panic!("{css} did not appear: {e}"))
}

/// Every resource the page loaded (and the page itself) came from the gateway's origin.
async fn assert_same_origin(client: &Client, origin: &str) {
    let names = client
        .execute(
            "return performance.getEntries().map(e => e.name).filter(n => /^[a-z]+:/.test(n));",
            vec![],
        )
        .await
        .expect("performance entries");
    let names: Vec<String> = serde_json::from_value(names).expect("names");
    assert!(!names.is_empty());
    for name in &names {
        assert!(
            name.starts_with(&format!("{origin}/")),
            "{name} is not on {origin}: {names:?}"
        );
    }
}

async fn text_of(client: &Client, css: &str) -> String {
    wait_for(client, css).await.text().await.expect("text")
}

#[tokio::test]
async fn the_console_signs_in_finds_a_response_and_draws_its_tool_call_and_model() {
    let gw = TestGateway::start().await;
    let tenant = gw.tenant("acme").await;
    gw.attach_tool(&tenant.group_id, "add").await;
    gw.model.push(
        Reply::tool_calls(vec![
            Call::new("add", json!({"a": 2, "b": 3})).with_id("call_add")
        ])
        .with_usage(120, 18),
    );
    gw.model.push(Reply::text("2 + 3 = 5.").with_usage(160, 9));
    let created = gw
        .create(
            &tenant.key,
            json!({"model": "mock", "input": "What is 2 + 3?"}),
        )
        .await;
    assert!(created.status.is_success(), "{:#}", created.body);
    let id = created.body["id"].as_str().expect("id").to_owned();

    let (_driver, port) = chromedriver().await;
    let client = browser(port).await;
    let origin = gw.base_url.clone();

    client.goto(&format!("{origin}/console")).await.unwrap();
    let token = wait_for(&client, "form[method=post] input#token[type=password]").await;
    screenshot(&client, "sign-in").await;
    token.send_keys(&gw.admin_token).await.unwrap();
    client
        .find(Locator::Css("form[method=post] button[type=submit]"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();

    let link = wait_for(&client, &format!("a[href='/console/responses/{id}']")).await;
    let row = text_of(&client, "table tbody tr").await;
    assert!(row.contains("mock") && row.contains("completed"), "{row}");
    assert_same_origin(&client, &origin).await;
    screenshot(&client, "responses").await;

    link.click().await.unwrap();
    wait_for(&client, "details#step-1").await;
    let timeline = text_of(&client, "main").await;
    assert!(timeline.contains("tool add"), "{timeline}");
    assert!(timeline.contains("model · mock"), "{timeline}");
    assert!(
        timeline.contains("Tool calls of model step #0"),
        "{timeline}"
    );
    assert!(timeline.contains("2 + 3 = 5."), "{timeline}");
    client
        .find(Locator::Css("details#step-1 > summary"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let request = text_of(&client, "details#step-1 .step-body pre").await;
    assert_eq!(
        serde_json::from_str::<Value>(&request).unwrap(),
        json!({"a": 2, "b": 3})
    );
    assert_same_origin(&client, &origin).await;
    screenshot(&client, "timeline").await;

    client
        .goto(&format!("{origin}/console/tools"))
        .await
        .unwrap();
    let tools = text_of(&client, "table tbody tr").await;
    assert!(tools.starts_with("add"), "{tools}");
    assert_same_origin(&client, &origin).await;
    screenshot(&client, "tools").await;

    client
        .goto(&format!("{origin}/console/usage"))
        .await
        .unwrap();
    wait_for(&client, "svg.chart rect").await;
    assert_same_origin(&client, &origin).await;
    screenshot(&client, "usage").await;

    client.close().await.unwrap();
}
