//! Governance at the edge (SPEC 13): a create admitted against its key's and project's limits and budgets, or
//! refused with OpenAI's `429`; the `x-ratelimit-*` headers of both answers.

use std::sync::LazyLock;

use axum::http::{HeaderName, HeaderValue, StatusCode};
use axum::response::Response;
use gateway_core::governance::reset_duration;

use super::error::ApiError;
use super::AppState;
use crate::engine::Admitted;
use crate::governance::{LimitKind, Payer, RateHeaders, Refusal};
use crate::store::governance::KeyGrant;

/// Admits a create of `grant`'s key: who pays for it and its standings, or the `429` that refuses it (nothing
/// stored, nothing called).
pub async fn admit(
    state: &AppState,
    grant: &KeyGrant,
) -> Result<(Admitted, RateHeaders), ApiError> {
    let payer = Payer::of(grant);
    match state.engine.governor().admit(&payer).await {
        Ok(admission) => Ok((
            Admitted {
                payer,
                running: admission.running,
            },
            admission.headers,
        )),
        Err(refusal) => {
            crate::metrics::response_refused(match &refusal {
                Refusal::Limited { .. } => "rate_limited",
                Refusal::BudgetSpent { .. } => "budget_spent",
                Refusal::Store(_) => "store_failed",
            });
            Err(ApiError::from(refusal))
        }
    }
}

/// `response` with the `x-ratelimit-*` headers of `standings`.
pub fn with_rate_headers(mut response: Response, standings: &RateHeaders) -> Response {
    response.headers_mut().extend(rate_headers(standings));
    response
}

/// The names of OpenAI's `x-ratelimit-{limit,remaining,reset}-` headers of requests, then of tokens: made at
/// compile time rather than checked against the standard names on every answer.
const REQUEST_HEADERS: [HeaderName; 3] = [
    HeaderName::from_static("x-ratelimit-limit-requests"),
    HeaderName::from_static("x-ratelimit-remaining-requests"),
    HeaderName::from_static("x-ratelimit-reset-requests"),
];
const TOKEN_HEADERS: [HeaderName; 3] = [
    HeaderName::from_static("x-ratelimit-limit-tokens"),
    HeaderName::from_static("x-ratelimit-remaining-tokens"),
    HeaderName::from_static("x-ratelimit-reset-tokens"),
];

/// The `x-ratelimit-reset-*` values of every second of a minute (a limit's window resets within one), made once
/// rather than formatted on every answer.
static MINUTE_RESETS: LazyLock<Vec<HeaderValue>> =
    LazyLock::new(|| (0..=60).map(reset_header).collect());

/// The `x-ratelimit-reset-*` value of `secs`.
fn reset_header(secs: u64) -> HeaderValue {
    HeaderValue::from_str(&reset_duration(secs)).unwrap_or(HeaderValue::from_static("0s"))
}

/// OpenAI's `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` headers of the limits that apply.
pub fn rate_headers(standings: &RateHeaders) -> Vec<(HeaderName, HeaderValue)> {
    let mut headers = Vec::with_capacity(6);
    for (names, standing) in [
        (REQUEST_HEADERS, standings.requests),
        (TOKEN_HEADERS, standings.tokens),
    ] {
        let Some(standing) = standing else {
            continue;
        };
        let [limit, remaining, reset] = names;
        let reset_value = usize::try_from(standing.reset_secs)
            .ok()
            .and_then(|secs| MINUTE_RESETS.get(secs).cloned())
            .unwrap_or_else(|| reset_header(standing.reset_secs));
        headers.extend([
            (limit, HeaderValue::from(standing.limit)),
            (remaining, HeaderValue::from(standing.remaining)),
            (reset, reset_value),
        ]);
    }
    headers
}

impl From<Refusal> for ApiError {
    fn from(refusal: Refusal) -> ApiError {
        match refusal {
            Refusal::Limited {
                kind,
                scope,
                owner,
                limit,
                headers,
                retry_after_secs,
            } => {
                let (kind_name, message) = match kind {
                    LimitKind::RequestsPerMinute => (
                        "requests",
                        format!("Rate limit reached for requests per minute (RPM) on {} {owner}: Limit {limit}. Please try again in {}.", scope.as_str(), reset_duration(retry_after_secs)),
                    ),
                    LimitKind::TokensPerMinute => (
                        "tokens",
                        format!("Rate limit reached for tokens per minute (TPM) on {} {owner}: Limit {limit}. Please try again in {}.", scope.as_str(), reset_duration(retry_after_secs)),
                    ),
                    LimitKind::Concurrent => (
                        "requests",
                        format!("Too many responses running at once on {} {owner}: Limit {limit}. Please try again when one of them has ended.", scope.as_str()),
                    ),
                };
                ApiError {
                    status: StatusCode::TOO_MANY_REQUESTS,
                    kind: kind_name,
                    retryable: true,
                    retry_after_secs: Some(retry_after_secs),
                    rate_limits: Some(Box::new(headers)),
                    ..ApiError::invalid(message, None, Some("rate_limit_exceeded"))
                }
            }
            Refusal::BudgetSpent {
                scope,
                owner,
                budget,
            } => ApiError {
                status: StatusCode::TOO_MANY_REQUESTS,
                kind: "insufficient_quota",
                ..ApiError::invalid(
                    format!(
                        "You exceeded your current quota: the budget of {} {owner} is ${:.2} per {} and it is spent. Ask the gateway's operator to raise it.",
                        scope.as_str(),
                        budget.usd,
                        match budget.period.as_str() {
                            "total" => "all time",
                            period => period,
                        }
                    ),
                    None,
                    Some("insufficient_quota"),
                )
            },
            Refusal::Store(error) => ApiError::from(error),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gateway_core::governance::Standing;

    #[test]
    fn the_headers_are_openais_names_and_formats() {
        let standings = RateHeaders {
            requests: Some(Standing {
                limit: 60,
                remaining: 59,
                reset_secs: 61,
            }),
            tokens: None,
        };
        let headers: Vec<(String, String)> = rate_headers(&standings)
            .into_iter()
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_owned()))
            .collect();
        let expected = [
            ("x-ratelimit-limit-requests", "60"),
            ("x-ratelimit-remaining-requests", "59"),
            ("x-ratelimit-reset-requests", "1m1s"),
        ];
        assert_eq!(
            headers,
            expected.map(|(n, v)| (n.to_owned(), v.to_owned())).to_vec()
        );
        // Within a minute the values come made already; past it they are made on the spot: the same either way.
        for (secs, expected) in [
            (0, "0s"),
            (1, "1s"),
            (59, "59s"),
            (60, "1m0s"),
            (3_723, "1h2m3s"),
        ] {
            let standings = RateHeaders {
                requests: None,
                tokens: Some(Standing {
                    limit: 1,
                    remaining: 1,
                    reset_secs: secs,
                }),
            };
            let reset = rate_headers(&standings).pop().unwrap().1;
            assert_eq!(reset.to_str().unwrap(), expected, "{secs} s");
        }
    }
}
