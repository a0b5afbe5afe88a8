//! Why a server tool call failed: the `outcome` label of `gateway_tool_calls_total` and the cause its `WARN` line
//! names (a refused connection, a timeout, a DNS or TLS failure, a status), never a secret or a URL's path.

use std::error::Error as _;

/// How a failed call is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailureKind {
    /// The tool answered 3xx (the gateway follows no redirect) or 4xx.
    Http4xx,
    /// The tool answered 5xx.
    Http5xx,
    /// No answer: the connection was refused or broke, the name did not resolve, TLS failed, an MCP session
    /// could not be opened or its call failed.
    Unreachable,
    /// The call's timeout passed, waiting for a free slot of the source included.
    Timeout,
    /// The source's circuit breaker is open: no call was made.
    BreakerOpen,
    /// The arguments were not JSON or did not match the schema: no call was made.
    InvalidArguments,
    /// An MCP tool answered with `isError`.
    ToolError,
    /// The response was cancelled while the call ran.
    Cancelled,
}

impl FailureKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FailureKind::Http4xx => "http_4xx",
            FailureKind::Http5xx => "http_5xx",
            FailureKind::Unreachable => "unreachable",
            FailureKind::Timeout => "timeout",
            FailureKind::BreakerOpen => "breaker_open",
            FailureKind::InvalidArguments => "invalid_arguments",
            FailureKind::ToolError => "tool_error",
            FailureKind::Cancelled => "cancelled",
        }
    }

    /// The kind of an answer with this HTTP status.
    pub fn of_status(status: u16) -> FailureKind {
        if status >= 500 {
            FailureKind::Http5xx
        } else {
            FailureKind::Http4xx
        }
    }
}

/// A failed call: how it is counted, and its cause as the log line names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub kind: FailureKind,
    pub cause: String,
}

impl Failure {
    pub fn new(kind: FailureKind, cause: impl Into<String>) -> Failure {
        Failure {
            kind,
            cause: cause.into(),
        }
    }
}

/// The failure of an HTTP request that got no answer: the innermost cause reqwest was given ("Connection refused
/// (os error 111)", "failed to lookup address information: ...", a TLS alert), which its own message hides behind
/// "error sending request for url (...)" (a message that also names the whole URL).
pub fn of_send_error(error: &reqwest::Error) -> Failure {
    let kind = if error.is_timeout() {
        FailureKind::Timeout
    } else {
        FailureKind::Unreachable
    };
    let mut innermost: Option<&dyn std::error::Error> = None;
    let mut next = error.source();
    while let Some(inner) = next {
        innermost = Some(inner);
        next = inner.source();
    }
    // Without an inner cause, reqwest's own words, without the URL.
    let text = innermost.map_or_else(|| error.without_url_text(), ToString::to_string);
    Failure::new(kind, text)
}

/// reqwest's message of an error, without the URL it names.
trait WithoutUrl {
    fn without_url_text(&self) -> String;
}

impl WithoutUrl for reqwest::Error {
    fn without_url_text(&self) -> String {
        let mut quiet = format!("{self}");
        if let Some(url) = self.url() {
            quiet = quiet.replace(url.as_str(), "<url>");
        }
        quiet
    }
}

/// `url` cut to `scheme://host[:port]`: what a log line may name of a tool's address.
pub fn origin(url: &str) -> String {
    url::Url::parse(url)
        .map(|u| u.origin().ascii_serialization())
        .unwrap_or_else(|_| "<unparsable URL>".to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_split_into_client_and_server_errors() {
        assert_eq!(FailureKind::of_status(404), FailureKind::Http4xx);
        assert_eq!(FailureKind::of_status(302), FailureKind::Http4xx);
        assert_eq!(FailureKind::of_status(500), FailureKind::Http5xx);
        assert_eq!(FailureKind::of_status(503).as_str(), "http_5xx");
    }

    #[test]
    fn an_origin_keeps_no_path_or_query() {
        assert_eq!(
            origin("https://tools.example.com:8443/secret/path?token=abc"),
            "https://tools.example.com:8443"
        );
        assert_eq!(origin("not a url"), "<unparsable URL>");
    }

    #[tokio::test]
    async fn a_refused_connection_is_named_as_such() {
        // Bind then drop: nothing listens on the port any more.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = listener.local_addr().expect("addr").port();
        drop(listener);
        let error = reqwest::Client::new()
            .post(format!("http://127.0.0.1:{port}/tools/secret-path"))
            .send()
            .await
            .expect_err("nothing listens");
        let failure = of_send_error(&error);
        assert_eq!(failure.kind, FailureKind::Unreachable);
        assert!(
            failure.cause.to_lowercase().contains("refused"),
            "{}",
            failure.cause
        );
        assert!(!failure.cause.contains("secret-path"), "{}", failure.cause);
    }
}
