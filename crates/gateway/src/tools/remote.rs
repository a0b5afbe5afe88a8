//! MCP servers a request declares itself (`{"type": "mcp", "server_url": ...}`): whether the gateway may connect
//! to one (the operator's `tools.mcp_allowed_urls` for public addresses, `tools.mcp_allowed_private_urls` for
//! any; every address the host resolves to is checked), and an HTTP client
//! that connects to the checked addresses only, so that a DNS answer changed after the check (rebinding) cannot
//! send the gateway anywhere else.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::sync::{Arc, LazyLock};
use std::time::Duration;

use reqwest::Url;
use reqwest_mcp::dns::{Addrs, Name, Resolve, Resolving};

/// The operator's allow-lists of client-declared MCP servers, checked once per declared server.
#[derive(Debug, Clone, Default)]
pub struct RemoteServers {
    /// `tools.mcp_allowed_urls`: servers whose every address is public.
    public: Vec<AllowedPrefix>,
    /// `tools.mcp_allowed_private_urls`: servers allowed whatever their addresses (the operator's internal ones).
    private: Vec<AllowedPrefix>,
}

/// One entry of an allow-list, normalised so that it compares with a normalised URL.
#[derive(Debug, Clone, PartialEq, Eq)]
struct AllowedPrefix {
    text: String,
}

/// An entry of an allow-list that can never work as meant; reported at start-up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BadPrefix {
    #[error("`{prefix}` does not start with `http://` or `https://`")]
    Scheme { prefix: String },
    #[error("`{prefix}` is not a valid URL: {problem}")]
    Url { prefix: String, problem: String },
    #[error("`{prefix}` carries a user name or password; a declared server's URL may not, so it matches nothing")]
    Credentials { prefix: String },
}

/// Why a declared MCP server is refused. The messages are for the client: they name the URL's host, never its
/// path, query, user name, password or any header.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemoteRefusal {
    #[error("server_url is not a valid URL: {problem}")]
    Malformed { problem: String },
    #[error("server_url has scheme `{scheme}`; only `http` and `https` are supported")]
    UnsupportedScheme { scheme: String },
    #[error("server_url has no host")]
    MissingHost,
    #[error("server_url (host `{host}`) carries a user name or password; send credentials in a header instead")]
    Credentials { host: String },
    #[error(
        "server_url (host `{host}`) is not allowed: it matches no prefix of the gateway's tools.mcp_allowed_urls \
         or tools.mcp_allowed_private_urls"
    )]
    NotAllowed { host: String },
    #[error("server_url host `{host}` could not be resolved to any address")]
    Unresolvable { host: String },
    #[error(
        "server_url host `{host}` resolves to {address}, a private, loopback, link-local or otherwise non-public \
         address; only a prefix of the gateway's tools.mcp_allowed_private_urls allows that"
    )]
    PrivateAddress { host: String, address: IpAddr },
}

/// A declared server that passed [`RemoteServers::check`], with the addresses that were checked. Only `check`
/// makes one, and its client connects to those addresses and no others.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedServer {
    url: Url,
    host: String,
    addresses: Vec<SocketAddr>,
}

impl RemoteServers {
    /// The allow-lists from `tools.mcp_allowed_urls` (`public`) and `tools.mcp_allowed_private_urls` (`private`);
    /// two empty lists allow no declared server.
    pub fn new(public: &[String], private: &[String]) -> Result<RemoteServers, BadPrefix> {
        let parse = |prefixes: &[String]| {
            prefixes
                .iter()
                .map(|prefix| AllowedPrefix::parse(prefix))
                .collect::<Result<Vec<_>, _>>()
        };
        Ok(RemoteServers {
            public: parse(public)?,
            private: parse(private)?,
        })
    }

    /// Whether the gateway may connect to `url`: its normalised form must start with an allowed prefix, then its
    /// host is resolved and every address checked (resolve first, then check: the addresses checked are the ones
    /// [`CheckedServer::http_client`] connects to). Resolution uses the system resolver and has no deadline of its
    /// own; wrap the call in one.
    pub async fn check(&self, url: &str) -> Result<CheckedServer, RemoteRefusal> {
        let url = Url::parse(url).map_err(|problem| RemoteRefusal::Malformed {
            problem: problem.to_string(),
        })?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(RemoteRefusal::UnsupportedScheme {
                scheme: url.scheme().to_owned(),
            });
        }
        let (Some(host), Some(port)) = (url.host(), url.port_or_known_default()) else {
            return Err(RemoteRefusal::MissingHost);
        };
        let host_name = host.to_string();
        if !url.username().is_empty() || url.password().is_some() {
            return Err(RemoteRefusal::Credentials { host: host_name });
        }
        let under = |prefixes: &[AllowedPrefix]| {
            prefixes
                .iter()
                .any(|prefix| url.as_str().starts_with(&prefix.text))
        };
        // A public prefix never admits a private address, however much of the URL it names: a public name that
        // is hijacked (or re-pointed) must not lead inside. Only the private list is the operator saying so.
        let private_allowed = under(&self.private);
        if !private_allowed && !under(&self.public) {
            return Err(RemoteRefusal::NotAllowed { host: host_name });
        }

        let mut addresses: Vec<SocketAddr> = match host {
            url::Host::Ipv4(ip) => vec![SocketAddr::new(IpAddr::V4(ip), port)],
            url::Host::Ipv6(ip) => vec![SocketAddr::new(IpAddr::V6(ip), port)],
            url::Host::Domain(domain) => tokio::net::lookup_host((domain, port))
                .await
                .map_err(|_| RemoteRefusal::Unresolvable {
                    host: host_name.clone(),
                })?
                .collect(),
        };
        // The system resolver repeats an address once per socket type.
        let mut seen = std::collections::HashSet::new();
        addresses.retain(|address| seen.insert(*address));
        if addresses.is_empty() {
            return Err(RemoteRefusal::Unresolvable { host: host_name });
        }
        if !private_allowed {
            if let Some(address) = addresses.iter().find(|a| !address_is_public(a.ip())) {
                return Err(RemoteRefusal::PrivateAddress {
                    host: host_name,
                    address: address.ip(),
                });
            }
        }
        Ok(CheckedServer {
            url,
            host: host_name,
            addresses,
        })
    }
}

impl AllowedPrefix {
    fn parse(prefix: &str) -> Result<AllowedPrefix, BadPrefix> {
        let lower = prefix.to_ascii_lowercase();
        let Some(after_scheme) = lower
            .strip_prefix("http://")
            .or_else(|| lower.strip_prefix("https://"))
        else {
            return Err(BadPrefix::Scheme {
                prefix: prefix.to_owned(),
            });
        };
        let past_host = after_scheme.contains(['/', '?', '#']);
        if !past_host {
            // A partial host (`https://mcp.`): compared as written, lower-cased as a URL's host is.
            if after_scheme.contains('@') {
                return Err(BadPrefix::Credentials {
                    prefix: prefix.to_owned(),
                });
            }
            return Ok(AllowedPrefix { text: lower });
        }
        // A whole host: normalised as the URLs it is compared with are (case, default port, IP forms, dots).
        let url = Url::parse(prefix).map_err(|problem| BadPrefix::Url {
            prefix: prefix.to_owned(),
            problem: problem.to_string(),
        })?;
        if !url.username().is_empty() || url.password().is_some() {
            return Err(BadPrefix::Credentials {
                prefix: prefix.to_owned(),
            });
        }
        Ok(AllowedPrefix {
            text: url.as_str().to_owned(),
        })
    }
}

impl CheckedServer {
    /// The normalised URL, to hand to the MCP transport.
    pub fn url(&self) -> &Url {
        &self.url
    }

    /// `text` with this server's URL cut to its origin (see [`redact_url`]), for logs and messages.
    pub fn redact(&self, text: &str) -> String {
        redact_url(text, self.url.as_str())
    }

    /// The URL's host as written in it (lower-case; an IPv6 address in brackets), for logs and messages.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The addresses that were checked, the only ones [`CheckedServer::http_client`] connects to.
    pub fn addresses(&self) -> &[SocketAddr] {
        &self.addresses
    }

    /// A client for rmcp's `StreamableHttpClientTransport::with_client`: it resolves the URL's host to the checked
    /// addresses without asking DNS again, refuses every other host name, follows no redirect, uses no proxy, and
    /// speaks TLS (rustls, webpki roots) to `https` servers.
    pub fn http_client(
        &self,
        connect_timeout: Duration,
    ) -> Result<reqwest_mcp::Client, RemoteClientError> {
        let tls = TLS_CONFIG.clone().map_err(RemoteClientError::Tls)?;
        let resolver = PinnedResolver {
            host: self.host.clone(),
            addresses: self.addresses.clone(),
        };
        reqwest_mcp::Client::builder()
            .dns_resolver(resolver)
            .resolve_to_addrs(&self.host, &self.addresses)
            .redirect(reqwest_mcp::redirect::Policy::none())
            // A proxy would resolve the host itself, out of reach of the check.
            .no_proxy()
            .connect_timeout(connect_timeout)
            .tls_backend_preconfigured(tls)
            .build()
            .map_err(RemoteClientError::Build)
    }
}

/// The blocking client that exports spans over OTLP (SPEC 14): the same TLS as the MCP clients, no redirects.
/// It runs a runtime of its own: build and drop it off the async workers.
pub fn blocking_http_client() -> Result<reqwest_mcp::blocking::Client, RemoteClientError> {
    let tls = TLS_CONFIG.clone().map_err(RemoteClientError::Tls)?;
    reqwest_mcp::blocking::Client::builder()
        .redirect(reqwest_mcp::redirect::Policy::none())
        .tls_backend_preconfigured(tls)
        .build()
        .map_err(RemoteClientError::Build)
}

/// `text` (an error's message, say) with every mention of `url` cut to its origin, `scheme://host[:port]`, and any
/// other mention of its path and query replaced: a server's URL often holds a token in its path or query, and
/// neither may reach a log or an error message (SPEC 12). HTTP client errors name the whole URL they tried.
pub fn redact_url(text: &str, url: &str) -> String {
    let Ok(parsed) = Url::parse(url) else {
        return if url.is_empty() {
            text.to_owned()
        } else {
            text.replace(url, "<redacted URL>")
        };
    };
    let origin = parsed.origin().ascii_serialization();
    let mut redacted = text.replace(parsed.as_str(), &origin);
    if url != parsed.as_str() && !url.is_empty() {
        redacted = redacted.replace(url, &origin);
    }
    let tail = &parsed[url::Position::BeforePath..];
    if tail.len() > 1 {
        redacted = redacted.replace(tail, "/<redacted>");
    }
    redacted
}

/// Building the client of a checked server failed: a fault of the gateway, not of the request.
#[derive(Debug, thiserror::Error)]
pub enum RemoteClientError {
    #[error("TLS configuration: {0}")]
    Tls(rustls::Error),
    #[error("HTTP client: {0}")]
    Build(reqwest_mcp::Error),
}

/// Makes ring rustls's process-wide crypto provider, once; later calls (and a provider installed by someone
/// else first) leave it be. Needed by every reqwest 0.13 client built without a preconfigured TLS setup (rmcp's
/// own default client, `StreamableHttpClientTransport::from_config`): with the `rustls-no-provider` feature that
/// this crate turns on, building one without a provider installed panics. [`crate::tools::ToolExecutor::new`]
/// calls it; anything else that builds such a client before an executor exists must call it first.
pub fn install_tls_provider() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        // An error means a provider is already installed, which serves as well.
        let _ = rustls::crypto::ring::default_provider().install_default();
    });
}

/// rustls with ring and the webpki roots (also the model calls' TLS), offering HTTP/1.1 only: the client is
/// built without HTTP/2. Handed to reqwest preconfigured, so no process-wide crypto provider is needed.
pub(crate) static TLS_CONFIG: LazyLock<Result<rustls::ClientConfig, rustls::Error>> =
    LazyLock::new(|| {
        let roots = rustls::RootCertStore {
            roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
        };
        let mut config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    });

/// Answers the checked host with the checked addresses, and every other name with an error: nothing the client
/// does can reach an address that was not checked through DNS.
#[derive(Debug)]
struct PinnedResolver {
    host: String,
    addresses: Vec<SocketAddr>,
}

#[derive(Debug, thiserror::Error)]
#[error("`{0}` is not the checked MCP server's host")]
struct UncheckedHost(String);

impl Resolve for PinnedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let answer = if name.as_str().eq_ignore_ascii_case(&self.host) {
            let addresses: Addrs = Box::new(self.addresses.clone().into_iter());
            Ok(addresses)
        } else {
            Err(Box::new(UncheckedHost(name.as_str().to_owned())) as Box<_>)
        };
        Box::pin(std::future::ready(answer))
    }
}

/// Whether `ip` is an ordinary public unicast address: not loopback, private, link-local, CGNAT, unspecified,
/// multicast, broadcast, documentation, benchmarking or reserved; an IPv6 address that embeds an IPv4 one
/// (mapped, NAT64, 6to4) is judged by that IPv4 address.
fn address_is_public(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(ip) => ipv4_is_public(ip),
        IpAddr::V6(ip) => ipv6_is_public(ip),
    }
}

/// IPv4 blocks that are not public (IANA special-purpose registry, RFC 6890 and later).
const NOT_PUBLIC_V4: [(u32, u32); 15] = [
    (0x0000_0000, 8),  // 0.0.0.0/8 "this network", unspecified
    (0x0a00_0000, 8),  // 10.0.0.0/8 private
    (0x6440_0000, 10), // 100.64.0.0/10 CGNAT
    (0x7f00_0000, 8),  // 127.0.0.0/8 loopback
    (0xa9fe_0000, 16), // 169.254.0.0/16 link-local (cloud metadata)
    (0xac10_0000, 12), // 172.16.0.0/12 private
    (0xc000_0000, 24), // 192.0.0.0/24 IETF protocol assignments
    (0xc000_0200, 24), // 192.0.2.0/24 documentation
    (0xc058_6300, 24), // 192.88.99.0/24 6to4 relay
    (0xc0a8_0000, 16), // 192.168.0.0/16 private
    (0xc612_0000, 15), // 198.18.0.0/15 benchmarking
    (0xc633_6400, 24), // 198.51.100.0/24 documentation
    (0xcb00_7100, 24), // 203.0.113.0/24 documentation
    (0xe000_0000, 4),  // 224.0.0.0/4 multicast
    (0xf000_0000, 4),  // 240.0.0.0/4 reserved, broadcast
];

fn ipv4_is_public(ip: Ipv4Addr) -> bool {
    let bits = u32::from(ip);
    !NOT_PUBLIC_V4.iter().any(|&(network, length)| {
        let mask = u32::MAX << (32 - length);
        bits & mask == network
    })
}

fn ipv6_in(bits: u128, network: u128, length: u32) -> bool {
    let mask = u128::MAX << (128 - length);
    bits & mask == network
}

/// Only global unicast (2000::/3) is public, less its special blocks; an embedded IPv4 address decides for the
/// forms that carry one.
fn ipv6_is_public(ip: Ipv6Addr) -> bool {
    let bits = u128::from(ip);
    let low_v4 = Ipv4Addr::from((bits & 0xffff_ffff) as u32);
    if ipv6_in(bits, 0xffff << 32, 96) || ipv6_in(bits, 0x0064_ff9b << 96, 96) {
        // ::ffff:a.b.c.d (IPv4-mapped), 64:ff9b::a.b.c.d (NAT64)
        return ipv4_is_public(low_v4);
    }
    if ipv6_in(bits, 0x2002 << 112, 16) {
        // 2002:aabb:ccdd::/48 (6to4) carries a.b.c.d in bits 16..48
        return ipv4_is_public(Ipv4Addr::from((bits >> 80) as u32));
    }
    let special = [
        (0x2001 << 112, 23), // 2001::/23 IETF protocol assignments (Teredo, benchmarking, ORCHID)
        (0x2001_0db8 << 96, 32), // 2001:db8::/32 documentation
        (0x3fff << 112, 20), // 3fff::/20 documentation
    ];
    ipv6_in(bits, 0x2 << 124, 3)
        && !special
            .iter()
            .any(|&(network, length)| ipv6_in(bits, network, length))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn strings(prefixes: &[&str]) -> Vec<String> {
        prefixes.iter().map(|p| p.to_string()).collect()
    }

    /// Prefixes of `tools.mcp_allowed_urls`.
    fn servers(prefixes: &[&str]) -> RemoteServers {
        RemoteServers::new(&strings(prefixes), &[]).expect("valid prefixes")
    }

    /// Prefixes of `tools.mcp_allowed_private_urls`.
    fn private_servers(prefixes: &[&str]) -> RemoteServers {
        RemoteServers::new(&[], &strings(prefixes)).expect("valid prefixes")
    }

    #[tokio::test]
    async fn a_url_under_a_prefix_is_allowed_and_any_other_is_not() {
        let servers = private_servers(&["http://127.0.0.1:1/mcp/"]);
        let checked = servers
            .check("http://127.0.0.1:1/mcp/tools")
            .await
            .expect("allowed");
        assert_eq!(checked.host(), "127.0.0.1");
        assert_eq!(
            checked.addresses(),
            &[SocketAddr::from(([127, 0, 0, 1], 1))]
        );
        for other in [
            "http://127.0.0.1:1/other",
            "http://127.0.0.1:2/mcp/",
            "https://127.0.0.1:1/mcp/",
        ] {
            assert_eq!(
                servers.check(other).await,
                Err(RemoteRefusal::NotAllowed {
                    host: "127.0.0.1".into()
                }),
                "{other}"
            );
        }
    }

    #[tokio::test]
    async fn no_prefix_allows_nothing() {
        let refusal = RemoteServers::default()
            .check("https://mcp.example.com/")
            .await;
        assert_eq!(
            refusal,
            Err(RemoteRefusal::NotAllowed {
                host: "mcp.example.com".into()
            })
        );
        let message = refusal.err().map(|r| r.to_string()).unwrap_or_default();
        assert!(message.contains("mcp.example.com"), "{message}");
        assert!(message.contains("tools.mcp_allowed_urls"), "{message}");
    }

    #[tokio::test]
    async fn urls_are_compared_normalised() {
        let servers = private_servers(&["HTTP://127.0.0.1:80/MCP"]);
        let checked = servers
            .check("http://0x7f.1/MCP/x")
            .await
            .expect("same URL once normalised");
        assert_eq!(checked.url().as_str(), "http://127.0.0.1/MCP/x");
        assert_eq!(
            checked.addresses(),
            &[SocketAddr::from(([127, 0, 0, 1], 80))]
        );
    }

    #[tokio::test]
    async fn only_http_and_https_with_a_host_and_no_credentials_are_accepted() {
        let servers = servers(&["http://"]);
        assert_eq!(
            servers.check("ftp://127.0.0.1/").await,
            Err(RemoteRefusal::UnsupportedScheme {
                scheme: "ftp".into()
            })
        );
        assert_eq!(
            servers.check("file:///etc/passwd").await,
            Err(RemoteRefusal::UnsupportedScheme {
                scheme: "file".into()
            })
        );
        assert!(matches!(
            servers.check("not a url").await,
            Err(RemoteRefusal::Malformed { .. })
        ));
        let refusal = servers
            .check("http://user:hunter2@8.8.8.8/")
            .await
            .expect_err("credentials refused");
        assert_eq!(
            refusal,
            RemoteRefusal::Credentials {
                host: "8.8.8.8".into()
            }
        );
        assert!(!refusal.to_string().contains("hunter2"));
    }

    #[tokio::test]
    async fn loopback_is_refused_by_any_public_prefix_and_allowed_by_a_private_one() {
        for public in [
            "http://",
            "http://127.",
            "http://127.0.0.1:1",
            "http://127.0.0.1:1/",
            "http://127.0.0.1:1/mcp/exactly",
        ] {
            let refusal = servers(&[public])
                .check("http://127.0.0.1:1/mcp/exactly")
                .await;
            assert_eq!(
                refusal,
                Err(RemoteRefusal::PrivateAddress {
                    host: "127.0.0.1".into(),
                    address: IpAddr::from([127, 0, 0, 1]),
                }),
                "{public}"
            );
        }
        let message = servers(&["http://"])
            .check("http://127.0.0.1:1/")
            .await
            .err()
            .map(|r| r.to_string())
            .unwrap_or_default();
        assert!(
            message.contains("tools.mcp_allowed_private_urls"),
            "{message}"
        );
        let private = private_servers(&["http://127.0.0.1:1/"])
            .check("http://127.0.0.1:1/")
            .await;
        assert!(private.is_ok(), "{private:?}");
        // The private list on its own allows the URL: it needs no public prefix too.
        let both = RemoteServers::new(&strings(&["https://"]), &strings(&["http://127.0.0.1:1/"]))
            .expect("valid");
        assert!(both.check("http://127.0.0.1:1/mcp").await.is_ok());
        assert!(matches!(
            both.check("http://127.0.0.1:2/mcp").await,
            Err(RemoteRefusal::NotAllowed { .. })
        ));
    }

    #[tokio::test]
    async fn a_name_is_resolved_before_it_is_checked() {
        let refusal = servers(&["http://"]).check("http://localhost:1/").await;
        match refusal {
            Err(RemoteRefusal::PrivateAddress { host, address }) => {
                assert_eq!(host, "localhost");
                assert!(address.is_loopback(), "{address}");
            }
            other => panic!("localhost must resolve to loopback and be refused: {other:?}"),
        }
        let named = private_servers(&["http://localhost:1/"])
            .check("http://localhost:1/mcp")
            .await
            .expect("a prefix naming localhost allows it");
        assert!(named.addresses().iter().all(|a| a.ip().is_loopback()));
        assert!(named.addresses().iter().all(|a| a.port() == 1));
    }

    #[tokio::test]
    async fn a_name_that_does_not_resolve_is_refused() {
        assert_eq!(
            servers(&["http://"]).check("http://mcp.invalid/").await,
            Err(RemoteRefusal::Unresolvable {
                host: "mcp.invalid".into()
            })
        );
    }

    #[test]
    fn a_url_s_path_and_query_are_cut_from_a_message_that_names_it() {
        let url = "https://Mcp.Example.com:8443/t/sk-PATH/mcp?token=QUERY";
        for message in [
            "error sending request for url (https://mcp.example.com:8443/t/sk-PATH/mcp?token=QUERY)",
            "failed: https://Mcp.Example.com:8443/t/sk-PATH/mcp?token=QUERY",
            "POST /t/sk-PATH/mcp?token=QUERY answered 404",
        ] {
            let redacted = redact_url(message, url);
            assert!(
                !redacted.contains("PATH") && !redacted.contains("QUERY"),
                "{redacted}"
            );
        }
        assert_eq!(
            redact_url(
                "error sending request for url (https://mcp.example.com:8443/t/sk-PATH/mcp?token=QUERY)",
                url
            ),
            "error sending request for url (https://mcp.example.com:8443)"
        );
        assert_eq!(
            redact_url("at http://calc/ and http://calc/", "http://calc/"),
            "at http://calc and http://calc"
        );
        assert_eq!(redact_url("plain", "not a url"), "plain");
    }

    #[test]
    fn addresses_are_classified() {
        let not_public = [
            "0.0.0.0",
            "10.0.0.1",
            "100.64.0.1",
            "127.0.0.1",
            "169.254.169.254",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "192.0.2.1",
            "198.18.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "::",
            "::1",
            "fe80::1",
            "fc00::1",
            "fd12:3456::1",
            "ff02::1",
            "2001:db8::1",
            "::ffff:127.0.0.1",
            "::ffff:10.0.0.1",
            "::ffff:169.254.169.254",
            "64:ff9b::a9fe:a9fe",
            "2002:7f00:1::",
            "::127.0.0.1",
        ];
        for address in not_public {
            let ip: IpAddr = address.parse().expect("address");
            assert!(!address_is_public(ip), "{address} must not be public");
        }
        let public = [
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "2606:4700:4700::1111",
            "2001:4860:4860::8888",
            "::ffff:8.8.8.8",
        ];
        for address in public {
            let ip: IpAddr = address.parse().expect("address");
            assert!(address_is_public(ip), "{address} must be public");
        }
    }

    #[test]
    fn prefixes_that_cannot_work_are_reported() {
        for prefix in [
            "",
            "mcp.example.com/",
            "ftp://x/",
            "https://a@b/",
            "https://a@",
        ] {
            assert!(
                AllowedPrefix::parse(prefix).is_err(),
                "{prefix} must be refused"
            );
        }
        assert_eq!(
            AllowedPrefix::parse("HTTPS://MCP.Example.com:443/v1").map(|p| p.text),
            Ok("https://mcp.example.com/v1".to_owned())
        );
        assert_eq!(
            AllowedPrefix::parse("HTTPS://MCP.").map(|p| p.text),
            Ok("https://mcp.".to_owned())
        );
    }

    /// A listener on 127.0.0.1 that answers one request with `ok` and hands back the request head it read.
    async fn one_shot_server() -> (SocketAddr, tokio::task::JoinHandle<String>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let served = tokio::spawn(async move {
            let (mut stream, _) = listener.accept().await.expect("accept");
            let mut head = Vec::new();
            let mut buffer = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                let read = stream.read(&mut buffer).await.expect("read");
                assert!(read > 0, "connection closed before the request head");
                head.extend_from_slice(&buffer[..read]);
            }
            stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
                .await
                .expect("write");
            String::from_utf8_lossy(&head).into_owned()
        });
        (address, served)
    }

    /// `mcp.invalid` (a name that never resolves, RFC 6761) as checked and pinned to `address`, at `path` over
    /// `scheme`: only the pinned resolver can reach it.
    fn pinned_invalid_host(scheme: &str, address: SocketAddr, path: &str) -> CheckedServer {
        CheckedServer {
            url: Url::parse(&format!("{scheme}://mcp.invalid:{}{path}", address.port()))
                .expect("url"),
            host: "mcp.invalid".into(),
            addresses: vec![address],
        }
    }

    /// A GET of the server's own URL through its pinned client, which must be answered `200`.
    async fn get_ok_through_its_client(server: &CheckedServer) -> reqwest_mcp::Response {
        let client = server.http_client(Duration::from_secs(5)).expect("client");
        let response = client
            .get(server.url().clone())
            .send()
            .await
            .expect("the pinned address answers");
        assert_eq!(response.status(), 200);
        response
    }

    #[tokio::test]
    async fn the_client_connects_to_the_checked_addresses_without_asking_dns() {
        let (address, served) = one_shot_server().await;
        // Reaching the listener proves the client did not look the name up.
        let server = pinned_invalid_host("http", address, "/mcp");
        let response = get_ok_through_its_client(&server).await;
        assert_eq!(response.text().await.expect("body"), "ok");
        let head = served.await.expect("served").to_ascii_lowercase();
        assert!(head.starts_with("get /mcp http/1.1"), "{head}");
        assert!(
            head.contains(&format!("host: mcp.invalid:{}", address.port())),
            "{head}"
        );
    }

    #[tokio::test]
    async fn the_client_refuses_any_other_host_name() {
        let (address, served) = one_shot_server().await;
        let server = pinned_invalid_host("http", address, "/");
        let client = server.http_client(Duration::from_secs(5)).expect("client");
        // `localhost` would resolve to the listener; the pinned resolver must not let it.
        let other = client
            .get(format!("http://localhost:{}/", address.port()))
            .send()
            .await;
        assert!(other.is_err(), "{other:?}");
        served.abort();
    }

    #[tokio::test]
    async fn a_checked_ip_literal_is_reached_through_its_client() {
        let (address, served) = one_shot_server().await;
        let servers = private_servers(&[&format!("http://127.0.0.1:{}/", address.port())]);
        let server = servers
            .check(&format!("http://127.0.0.1:{}/mcp", address.port()))
            .await
            .expect("allowed");
        assert_eq!(server.addresses(), &[address]);
        get_ok_through_its_client(&server).await;
        served.await.expect("served");
    }

    #[tokio::test]
    async fn an_https_server_gets_a_tls_handshake_for_the_checked_name() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let address = listener.local_addr().expect("address");
        let server = pinned_invalid_host("https", address, "/mcp");
        let client = server.http_client(Duration::from_secs(5)).expect("client");
        let request = tokio::spawn(async move { client.get(server.url().clone()).send().await });
        let (mut stream, _) = listener.accept().await.expect("accept");
        let mut hello = vec![0u8; 5];
        stream.read_exact(&mut hello).await.expect("record header");
        // A TLS handshake record, whose ClientHello names the checked host (SNI), not the address.
        assert_eq!(hello[0], 0x16, "{hello:?}");
        let length = usize::from(u16::from_be_bytes([hello[3], hello[4]]));
        let mut body = vec![0u8; length];
        stream.read_exact(&mut body).await.expect("ClientHello");
        assert!(body.windows(11).any(|w| w == b"mcp.invalid"));
        drop(stream);
        assert!(request.await.expect("joined").is_err());
    }

    #[test]
    fn rmcp_default_clients_build_once_the_provider_is_installed() {
        install_tls_provider();
        install_tls_provider();
        assert!(reqwest_mcp::Client::builder().build().is_ok());
    }
}
