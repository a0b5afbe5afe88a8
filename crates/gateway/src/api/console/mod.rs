//! The console at `/console`: a read-only web page for operators, served from the binary (HTML, CSS and a
//! little JS; no CDN). Sign-in posts the admin token through an HTML form and gets a session cookie
//! ([`session`]); the pages then read the admin API with that cookie (GET only), until a sign-out, which the
//! store records so that no replica takes the cookie again. Pages: responses with filters, one response as a
//! timeline, tool sources, usage.

pub mod session;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;

use super::admin::same_secret;
use super::extract::ApiPath;
use super::AppState;
use crate::clock::now;
use crate::store::StoreError;
use secrecy::ExposeSecret;

const CSS: &str = include_str!("console.css");
const JS: &str = include_str!("console.js");

/// Every console route, to be nested under `/console`.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/", get(home).post(sign_in))
        .route("/sign-out", post(sign_out))
        .route("/responses/{response_id}", get(timeline))
        .route("/tools", get(tools))
        .route("/usage", get(usage))
        .route("/console.css", get(css))
        .route("/console.js", get(js))
}

/// `GET /console`: the responses page when signed in, else the sign-in page.
async fn home(State(state): State<AppState>, headers: HeaderMap) -> Response {
    match signed_in(&state, &headers).await {
        Ok(true) => {}
        Ok(false) => return sign_in_page(StatusCode::OK, None),
        Err(_) => return store_unavailable(),
    }
    html(
        StatusCode::OK,
        &page(
            "Responses",
            "responses",
            r#"<main id="page" data-page="responses"></main>"#,
        ),
    )
}

/// `POST /console` with `token=<admin token>` (a form): a session cookie and back to the console, or the
/// sign-in page again, saying why, with no cookie.
async fn sign_in(State(state): State<AppState>, headers: HeaderMap, body: Bytes) -> Response {
    let Some(expected) = state.admin_token.as_deref() else {
        return sign_in_page(
            StatusCode::UNAUTHORIZED,
            Some("The console is disabled: the gateway has no admin token configured."),
        );
    };
    let given = serde_urlencoded::from_bytes::<Vec<(String, String)>>(&body)
        .ok()
        .and_then(|fields| fields.into_iter().find(|(name, _)| name == "token"))
        .map(|(_, value)| value);
    if !given.is_some_and(|given| same_secret(&given, expected.expose_secret())) {
        tracing::info!("console sign-in refused");
        return sign_in_page(StatusCode::UNAUTHORIZED, Some("Incorrect admin token."));
    }
    let Some(cookie) = session::issue(expected, now()) else {
        return sign_in_page(
            StatusCode::INTERNAL_SERVER_ERROR,
            Some("Could not start a session."),
        );
    };
    tracing::info!("console session started");
    redirect_with_cookie(&session::set_cookie(&cookie, session::over_https(&headers)))
}

/// `POST /console/sign-out`: the session recorded as signed out, so that no replica takes its cookie again, and
/// the cookie cleared, back to sign-in. When the store cannot record it, the session stays signed in and the
/// cookie is kept, so that signing out again (the page offers it) can record it: a cookie cleared unrecorded
/// would leave the session valid wherever a copy of it is, with nothing left in this browser to end it with.
async fn sign_out(State(state): State<AppState>, headers: HeaderMap) -> Response {
    if let Some(session) = session::of_request(&headers, state.admin_token.as_deref(), now()) {
        if let Err(e) = state
            .store
            .sign_out_console_session(session.id, session.expires_at)
            .await
        {
            tracing::warn!(error = %e, "a console sign-out could not be recorded");
            let main = concat!(
                r#"<main id="page"><p class="error" role="alert">The gateway could not record the sign-out, "#,
                "so this session is still signed in. Try signing out again.</p></main>"
            );
            let mut answer = html(StatusCode::SERVICE_UNAVAILABLE, &page("Sign out", "", main));
            answer
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            return answer;
        }
        tracing::info!("console session signed out");
    }
    redirect_with_cookie(&session::clear_cookie(session::over_https(&headers)))
}

/// `GET /console/responses/{id}`: one response as a timeline.
async fn timeline(
    State(state): State<AppState>,
    headers: HeaderMap,
    ApiPath(id): ApiPath<String>,
) -> Response {
    match signed_in(&state, &headers).await {
        Ok(true) => {}
        Ok(false) => return to_sign_in(),
        Err(_) => return store_unavailable(),
    }
    let main = format!(
        r#"<main id="page" data-page="timeline" data-id="{}"></main>"#,
        escape(&id)
    );
    html(StatusCode::OK, &page("Response", "responses", &main))
}

/// `GET /console/tools`: tool sources with their health.
async fn tools(State(state): State<AppState>, headers: HeaderMap) -> Response {
    section(&state, &headers, "Tool sources", "tools").await
}

/// `GET /console/usage`: usage per project, key and day.
async fn usage(State(state): State<AppState>, headers: HeaderMap) -> Response {
    section(&state, &headers, "Usage", "usage").await
}

/// A section of the console that its script fills (`data-page`), for a signed-in operator; else the way to
/// sign in.
async fn section(state: &AppState, headers: &HeaderMap, title: &str, name: &str) -> Response {
    match signed_in(state, headers).await {
        Ok(true) => {}
        Ok(false) => return to_sign_in(),
        Err(_) => return store_unavailable(),
    }
    let main = format!(r#"<main id="page" data-page="{name}"></main>"#);
    html(StatusCode::OK, &page(title, name, &main))
}

async fn css() -> Response {
    asset("text/css; charset=utf-8", CSS)
}

async fn js() -> Response {
    asset("text/javascript; charset=utf-8", JS)
}

/// Whether the request carries a session cookie that verifies with the admin token and was not signed out; the
/// store's failure when it cannot say (the session is then neither taken nor ended: the caller answers that the
/// gateway cannot tell now, so that the operator is not signed out by a passing failure).
pub(crate) async fn signed_in(state: &AppState, headers: &HeaderMap) -> Result<bool, StoreError> {
    let Some(session) = session::of_request(headers, state.admin_token.as_deref(), now()) else {
        return Ok(false);
    };
    match state.store.console_session_signed_out(session.id).await {
        Ok(signed_out) => Ok(!signed_out),
        Err(e) => {
            tracing::warn!(error = %e, "could not read whether a console session was signed out");
            Err(e)
        }
    }
}

/// 503: whether the session was signed out could not be read; the page asks to try again.
fn store_unavailable() -> Response {
    let mut page = html(
        StatusCode::SERVICE_UNAVAILABLE,
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>Console unavailable</title></head>\n\
         <body><main><p role=\"alert\">The gateway's store did not answer; reload the page to try again.</p>\
         </main></body></html>\n",
    );
    page.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    page
}

fn asset(content_type: &'static str, body: &'static str) -> Response {
    (
        [
            (header::CONTENT_TYPE, content_type),
            (header::CACHE_CONTROL, "public, max-age=300"),
        ],
        body,
    )
        .into_response()
}

/// A console page: no caching, no framing, and nothing loaded from anywhere but the gateway.
fn html(status: StatusCode, body: &str) -> Response {
    let mut response = (status, body.to_owned()).into_response();
    let headers = response.headers_mut();
    for (name, value) in [
        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
        (header::CACHE_CONTROL, "no-store"),
        (header::X_FRAME_OPTIONS, "DENY"),
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; \
             frame-ancestors 'none'; form-action 'self'",
        ),
        (header::REFERRER_POLICY, "no-referrer"),
    ] {
        headers.insert(name, HeaderValue::from_static(value));
    }
    response
}

/// 303 to the console's front page: a console page asked for without a session.
fn to_sign_in() -> Response {
    (StatusCode::SEE_OTHER, [(header::LOCATION, "/console")]).into_response()
}

fn redirect_with_cookie(cookie: &str) -> Response {
    let mut response = to_sign_in();
    if let Ok(value) = HeaderValue::from_str(cookie) {
        response.headers_mut().insert(header::SET_COOKIE, value);
    }
    response
}

fn sign_in_page(status: StatusCode, error: Option<&str>) -> Response {
    let error = error.map_or(String::new(), |e| {
        format!(r#"<p class="error" role="alert">{}</p>"#, escape(e))
    });
    let body = format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>Sign in · Gateway console</title><link rel="stylesheet" href="/console/console.css"></head>
<body class="sign-in"><main>
<h1>Gateway console</h1>
{error}<form method="post" action="/console">
<label for="token">Admin token</label>
<input id="token" name="token" type="password" autocomplete="current-password" required autofocus>
<button type="submit">Sign in</button>
</form></main></body></html>"#
    );
    html(status, &body)
}

/// A signed-in page: the navigation, then `main`, which the script fills from the admin API.
fn page(title: &str, active: &str, main: &str) -> String {
    let link = |href: &str, name: &str, label: &str| {
        let current = if name == active {
            r#" aria-current="page""#
        } else {
            ""
        };
        format!(r#"<a href="{href}"{current}>{label}</a>"#)
    };
    format!(
        r#"<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1">
<title>{title} · Gateway console</title><link rel="stylesheet" href="/console/console.css">
<script src="/console/console.js" defer></script></head>
<body><header><nav aria-label="Console">
<span class="brand">Gateway console</span>{responses}{tools}{usage}
<form method="post" action="/console/sign-out"><button type="submit">Sign out</button></form>
</nav></header>
{main}
<noscript><p>The console's pages read the admin API with a little JavaScript; please enable it.</p></noscript>
</body></html>"#,
        title = escape(title),
        responses = link("/console", "responses", "Responses"),
        tools = link("/console/tools", "tools", "Tool sources"),
        usage = link("/console/usage", "usage", "Usage"),
    )
}

/// Text safe inside HTML elements and quoted attributes.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escape_leaves_no_markup() {
        assert_eq!(
            escape(r#"<a href="x">'&'</a>"#),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;"
        );
    }
}
