//! The HTTP under model calls: hyper's pooled HTTP/1.1 client straight to the provider, or reqwest for a
//! provider URL that the environment sends through a proxy (`HTTP_PROXY`, `HTTPS_PROXY`, `ALL_PROXY`, `NO_PROXY`).
//!
//! reqwest's own layers (its redirect layer parsed every request's URL twice, though a model call never follows a
//! redirect) cost about a twentieth of an unstored call's CPU; hyper's client is what reqwest runs on, without them.
//! A proxied call keeps reqwest, which speaks to HTTP proxies and tunnels through them.

use std::error::Error as StdError;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use futures::Stream;
use http::header::{HeaderMap, HeaderValue, ACCEPT, CONTENT_TYPE, HOST};
use http::{Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::proxy::matcher::Matcher;
use hyper_util::rt::{TokioExecutor, TokioTimer};

use crate::config::UpstreamConfig;

/// The most endpoint URLs kept parsed (deployments are few; this only bounds it).
const MAX_ENDPOINTS: u64 = 1024;

/// How long an idle pooled connection is kept (as reqwest keeps them).
const POOL_IDLE: Duration = Duration::from_secs(90);

/// The TCP keepalive of upstream connections (as reqwest sets it).
const TCP_KEEPALIVE: Duration = Duration::from_secs(15);

/// The pooled clients of model calls, and their endpoints parsed once.
#[derive(Debug, Clone)]
pub(super) struct ModelHttp {
    direct: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
    proxied: reqwest::Client,
    proxies: Arc<Matcher>,
    endpoints: moka::sync::Cache<String, Endpoint>,
    read_timeout: Duration,
}

/// An endpoint URL parsed once (parsing one, host, IDNA and path, took a twentieth of an unstored call's CPU when
/// it was done on every call), and whether the environment proxies it.
#[derive(Debug, Clone)]
struct Endpoint {
    uri: Uri,
    /// Its `Host` header, made once: hyper's client would format it again on every request.
    host: Option<HeaderValue>,
    /// The URL again for reqwest, when a proxy is to be used for it.
    proxied: Option<reqwest::Url>,
}

/// Why a client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    #[error("TLS: {0}")]
    Tls(rustls::Error),
    #[error(transparent)]
    Reqwest(#[from] reqwest::Error),
}

impl ModelHttp {
    /// Clients with `config`'s timeouts and pool: connecting may take the timeout (at most 10 s), and each read of
    /// an answer (its head, each part of its body) the timeout again. Proxies are read from the environment once,
    /// by hyper-util's matcher for the choice and by reqwest for the call, which read the same variables.
    pub(super) fn new(config: &UpstreamConfig) -> Result<ModelHttp, BuildError> {
        ModelHttp::with_proxies(config, Matcher::from_env(), reqwest::Client::builder())
    }

    /// The same with the proxies given: `proxies` chooses which URLs go to `proxied`, which must know them.
    fn with_proxies(
        config: &UpstreamConfig,
        proxies: Matcher,
        proxied: reqwest::ClientBuilder,
    ) -> Result<ModelHttp, BuildError> {
        let connect_timeout = Duration::from_millis(config.timeout_ms.min(10_000));
        let read_timeout = Duration::from_millis(config.timeout_ms);
        let mut connector = HttpConnector::new();
        connector.enforce_http(false);
        connector.set_nodelay(true);
        connector.set_keepalive(Some(TCP_KEEPALIVE));
        connector.set_connect_timeout(Some(connect_timeout));
        let mut tls = crate::tools::remote::TLS_CONFIG
            .clone()
            .map_err(BuildError::Tls)?;
        // The connector offers the protocols it was built for (HTTP/1.1 only) and refuses a config that has any.
        tls.alpn_protocols.clear();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        let direct = Client::builder(TokioExecutor::new())
            .pool_idle_timeout(POOL_IDLE)
            .pool_max_idle_per_host(config.max_idle_connections)
            .pool_timer(TokioTimer::new())
            .timer(TokioTimer::new())
            .build(connector);
        let proxied = proxied
            .connect_timeout(connect_timeout)
            .read_timeout(read_timeout)
            .pool_max_idle_per_host(config.max_idle_connections)
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(ModelHttp {
            direct,
            proxied,
            proxies: Arc::new(proxies),
            endpoints: moka::sync::Cache::new(MAX_ENDPOINTS),
            read_timeout,
        })
    }

    /// `POST`s `body` (JSON) to `url` with `headers`. The answer's head must come within the read timeout; its
    /// body is read from the [`Answer`]. A failure is described for logs (the URL left out: it may hold a key).
    pub(super) async fn post(
        &self,
        url: &str,
        mut headers: HeaderMap,
        body: Bytes,
    ) -> Result<Answer, String> {
        let endpoint = self.endpoint(url)?;
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(ACCEPT, HeaderValue::from_static("*/*"));
        if let Some(url) = endpoint.proxied {
            return self.post_proxied(url, headers, body).await;
        }
        if let Some(host) = endpoint.host {
            headers.insert(HOST, host);
        }
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = endpoint.uri;
        *request.headers_mut() = headers;
        let head = tokio::time::timeout(self.read_timeout, self.direct.request(request))
            .await
            .map_err(|_| self.no_answer())?
            .map_err(|e| describe(&e))?;
        let (head, body) = head.into_parts();
        Ok(Answer {
            status: head.status,
            body: AnswerBody::Direct(body),
            read_timeout: self.read_timeout,
        })
    }

    /// The same through reqwest, which goes through the proxy (its read timeout is the same).
    async fn post_proxied(
        &self,
        url: reqwest::Url,
        headers: HeaderMap,
        body: Bytes,
    ) -> Result<Answer, String> {
        let response = self
            .proxied
            .post(url)
            .headers(headers)
            .body(body)
            .send()
            .await
            .map_err(|e| describe(&e.without_url()))?;
        let response: http::Response<reqwest::Body> = response.into();
        let (head, body) = response.into_parts();
        Ok(Answer {
            status: head.status,
            body: AnswerBody::Proxied(body),
            read_timeout: self.read_timeout,
        })
    }

    /// `url` parsed (as reqwest parses it: IDNA, percent-encoding), from the cache after the first time.
    fn endpoint(&self, url: &str) -> Result<Endpoint, String> {
        if let Some(endpoint) = self.endpoints.get(url) {
            return Ok(endpoint);
        }
        let parsed =
            url::Url::parse(url).map_err(|e| format!("the deployment's URL is not valid: {e}"))?;
        let uri: Uri = parsed
            .as_str()
            .parse()
            .map_err(|e| format!("the deployment's URL is not valid: {e}"))?;
        let proxied = self.proxies.intercept(&uri).map(|_| parsed);
        let endpoint = Endpoint {
            host: host_header(&uri),
            uri,
            proxied,
        };
        self.endpoints.insert(url.to_owned(), endpoint.clone());
        Ok(endpoint)
    }

    fn no_answer(&self) -> String {
        format!("no answer within {} ms", self.read_timeout.as_millis())
    }
}

/// The `Host` header of `uri` as hyper's client writes it: the host, with the port when it is not the scheme's
/// default.
fn host_header(uri: &Uri) -> Option<HeaderValue> {
    let host = uri.host()?;
    let default_port = if uri.scheme_str() == Some("https") {
        443
    } else {
        80
    };
    let value = match uri.port_u16() {
        Some(port) if port != default_port => format!("{host}:{port}"),
        _ => host.to_owned(),
    };
    HeaderValue::from_str(&value).ok()
}

/// An answer whose head has arrived; its body is read part by part, each within the read timeout.
pub(super) struct Answer {
    status: StatusCode,
    body: AnswerBody,
    read_timeout: Duration,
}

/// The body of an answer, from whichever client sent the request.
enum AnswerBody {
    Direct(hyper::body::Incoming),
    Proxied(reqwest::Body),
}

impl AnswerBody {
    /// The next part of the body's data (trailers skipped), `None` at its end.
    async fn next_data(&mut self) -> Option<Result<Bytes, String>> {
        loop {
            let frame = match self {
                AnswerBody::Direct(body) => body.frame().await?.map_err(|e| describe(&e)),
                AnswerBody::Proxied(body) => body.frame().await?.map_err(|e| describe(&e)),
            };
            match frame {
                Ok(frame) => {
                    if let Ok(data) = frame.into_data() {
                        return Some(Ok(data));
                    }
                }
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

impl Answer {
    pub(super) fn status(&self) -> StatusCode {
        self.status
    }

    /// The next part of the body, which must come within the read timeout; `None` at the body's end.
    async fn next_part(&mut self) -> Option<Result<Bytes, String>> {
        match tokio::time::timeout(self.read_timeout, self.body.next_data()).await {
            Ok(part) => part,
            Err(_) => Some(Err(format!(
                "no data for {} ms",
                self.read_timeout.as_millis()
            ))),
        }
    }

    /// The whole body (not copied when it came in one part).
    pub(super) async fn bytes(mut self) -> Result<Bytes, String> {
        let Some(first) = self.next_part().await else {
            return Ok(Bytes::new());
        };
        let first = first?;
        let Some(second) = self.next_part().await else {
            return Ok(first);
        };
        let mut whole = BytesMut::from(first);
        whole.extend_from_slice(&second?);
        while let Some(part) = self.next_part().await {
            whole.extend_from_slice(&part?);
        }
        Ok(whole.freeze())
    }

    /// The whole body as text (invalid UTF-8 replaced), or nothing if it could not be read: for error answers.
    pub(super) async fn text(self) -> String {
        match self.bytes().await {
            Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
            Err(_) => String::new(),
        }
    }

    /// The body's parts as they arrive (a streamed answer's SSE).
    pub(super) fn parts(self) -> impl Stream<Item = Result<Bytes, String>> + Send {
        futures::stream::unfold(self, |mut answer| async move {
            let part = answer.next_part().await?;
            Some((part, answer))
        })
    }
}

/// An error and its sources, one after another: hyper's own message ("client error (Connect)") says little
/// without them.
fn describe(error: &(dyn StdError + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let _ = write!(text, ": {cause}");
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_is_described_with_its_sources() {
        let inner = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        #[derive(Debug, thiserror::Error)]
        #[error("client error (Connect)")]
        struct Outer(#[source] std::io::Error);
        assert_eq!(describe(&Outer(inner)), "client error (Connect): refused");
    }

    /// The mock model stands as the proxy too: it answers a proxied request (`POST http://host/path`) by its path.
    #[tokio::test]
    async fn a_proxied_url_goes_through_the_proxy_and_any_other_goes_straight() {
        let model = gateway_testkit::MockModel::start().await.unwrap();
        model.push(gateway_testkit::Reply::text("straight"));
        model.push(gateway_testkit::Reply::text("through the proxy"));
        let proxy = format!("http://{}", model.addr());
        let http = ModelHttp::with_proxies(
            &UpstreamConfig::default(),
            Matcher::builder()
                .http(proxy.clone())
                .no("127.0.0.1")
                .build(),
            reqwest::Client::builder().proxy(reqwest::Proxy::http(&proxy).unwrap()),
        )
        .unwrap();
        let body = Bytes::from_static(
            br#"{"model": "mock", "messages": [{"role": "user", "content": "hi"}]}"#,
        );
        let post = |url: String| {
            let (http, body) = (http.clone(), body.clone());
            async move {
                let answer = http.post(&url, HeaderMap::new(), body).await.unwrap();
                assert_eq!(answer.status(), StatusCode::OK);
                String::from_utf8(answer.bytes().await.unwrap().to_vec()).unwrap()
            }
        };

        let straight = post(format!("{}/chat/completions", model.base_url())).await;
        assert!(straight.contains("straight"), "{straight}");
        // `model.invalid` has no address: only the proxy can answer for it.
        let proxied = post("http://model.invalid/v1/chat/completions".to_owned()).await;
        assert!(proxied.contains("through the proxy"), "{proxied}");
        assert_eq!(model.requests().len(), 2);
        let hosts: Vec<String> = model
            .request_headers()
            .iter()
            .map(|headers| {
                let host = headers.iter().find(|(name, _)| name == "host");
                host.map(|(_, value)| value.clone()).unwrap_or_default()
            })
            .collect();
        assert_eq!(hosts, [model.addr().to_string(), "model.invalid".into()]);
        let chosen = |url: &str| http.endpoint(url).unwrap().proxied.is_some();
        assert!(chosen("http://model.invalid/v1/chat/completions"));
        assert!(!chosen(&format!("{}/chat/completions", model.base_url())));
    }

    #[tokio::test]
    async fn endpoints_are_parsed_once_and_bad_urls_refused() {
        let http = ModelHttp::new(&UpstreamConfig::default()).unwrap();
        let endpoint = http
            .endpoint("http://model.example:8080/v1/chat/completions")
            .unwrap();
        assert_eq!(endpoint.uri.host(), Some("model.example"));
        assert_eq!(endpoint.uri.path(), "/v1/chat/completions");
        assert!(http
            .endpoints
            .get("http://model.example:8080/v1/chat/completions")
            .is_some());
        let host = |url: &str| http.endpoint(url).unwrap().host.unwrap();
        for (url, expected) in [
            ("http://model.example:8080/v1", "model.example:8080"),
            ("http://model.example:80/v1", "model.example"),
            ("https://model.example/v1", "model.example"),
            ("https://model.example:443/v1", "model.example"),
            ("https://model.example:8443/v1", "model.example:8443"),
            ("http://[::1]:9000/v1", "[::1]:9000"),
        ] {
            assert_eq!(host(url), expected, "{url}");
        }
        let refused = http.endpoint("not a url").unwrap_err();
        assert!(refused.contains("not valid"), "{refused}");
    }
}
