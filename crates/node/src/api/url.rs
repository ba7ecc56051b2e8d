//! Function URLs (issue #16): Create/Get/Update/Delete/ListFunctionUrlConfigs, and the
//! URLs themselves. A function's URL on this node is path-style,
//! `http://HOST:PORT/url/<function>/` (Lambda's is a host of its own); a request to
//! it (any method, any path below it) is delivered to the function as Lambda does:
//! an API Gateway HTTP API payload (format 2.0) event, and the function's result
//! mapped back (`statusCode`, `headers`, `cookies`, `body`, `isBase64Encoded`; any
//! other JSON value is a 200 `application/json` body). AuthType `AWS_IAM` requires a
//! SigV4 signature (service `lambda`, the node's keys), `NONE` lets anyone call it.
//! CORS (`Cors`) answers preflight requests itself and adds its headers to answers.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Value};

use super::{authenticated_body, decode, function_name, json_response, parse_json, segments, Action, ApiError, App, MAX_PAYLOAD};
use crate::node::{qualified, InvokeError, InvokeTarget, Node, Outcome};
use crate::registry::UrlConfig;

/// Paths of function URLs on the node.
pub const URL_PREFIX: &str = "/url/";

/// The URL configuration operations' routes.
pub(super) fn route(method: &Method, raw_path: &str) -> Option<Action> {
    let segs = segments(raw_path);
    match (method.as_str(), segs.as_slice()) {
        ("POST", ["2021-10-31", "functions", n, "url"]) => Some(Action::CreateFunctionUrlConfig(decode(n))),
        ("GET", ["2021-10-31", "functions", n, "url"]) => Some(Action::GetFunctionUrlConfig(decode(n))),
        ("PUT", ["2021-10-31", "functions", n, "url"]) => Some(Action::UpdateFunctionUrlConfig(decode(n))),
        ("DELETE", ["2021-10-31", "functions", n, "url"]) => Some(Action::DeleteFunctionUrlConfig(decode(n))),
        ("GET", ["2021-10-31", "functions", n, "urls"]) => Some(Action::ListFunctionUrlConfigs(decode(n))),
        _ => None,
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct UrlInput {
    auth_type: Option<String>,
    cors: Option<Value>,
    invoke_mode: Option<String>,
}

fn config_json(node: &Node, name: &str, alias: Option<&str>, host: &str, u: &UrlConfig) -> Value {
    url_config_json(&node.url_arn(name, alias), name, alias, host, u)
}

/// A function URL's configuration as the Lambda API shows it: the URL of function
/// `name` (or its `alias`) at `host`, which invokes `url_arn`.
pub fn url_config_json(url_arn: &str, name: &str, alias: Option<&str>, host: &str, u: &UrlConfig) -> Value {
    let mut v = json!({
        // The path segment: the function's name, with `:alias` for an alias's URL.
        "FunctionUrl": format!("http://{host}{URL_PREFIX}{}/", qualified(name, alias)),
        "FunctionArn": url_arn,
        "AuthType": u.auth_type,
        "CreationTime": u.creation_time,
        "LastModifiedTime": u.last_modified_time,
        "InvokeMode": "BUFFERED",
    });
    if let Some(c) = &u.cors {
        v["Cors"] = c.clone();
    }
    v
}

/// The function and the alias (`None`: $LATEST) a URL operation names, from the name
/// (a partial or full ARN may carry the qualifier) or `Qualifier`. A URL belongs to
/// $LATEST or an alias, never to a version (as in Lambda).
pub fn url_target(n: &str, raw_query: Option<&str>) -> Result<(String, Option<String>), ApiError> {
    let q = super::query_param(raw_query, "Qualifier");
    let (name, q) = function_name(n, q.as_deref())?;
    match q.as_deref() {
        None | Some("$LATEST") => Ok((name, None)),
        Some(v) if v.bytes().all(|b| b.is_ascii_digit()) => {
            Err(ApiError::invalid(format!("A function URL can be configured for $LATEST or an alias, not version {v}.")))
        }
        Some(a) => Ok((name, Some(a.to_string()))),
    }
}

/// A Create/UpdateFunctionUrlConfig request: (AuthType, Cors).
pub fn url_request(body: &[u8]) -> Result<(Option<String>, Option<Value>), ApiError> {
    let i: UrlInput = parse_json(body)?;
    if i.invoke_mode.as_deref().is_some_and(|m| m != "BUFFERED") {
        return Err(ApiError::invalid("Only InvokeMode BUFFERED is supported by this node."));
    }
    Ok((i.auth_type, i.cors))
}

pub(super) fn dispatch(node: &Node, action: Action, raw_query: Option<&str>, headers: &HeaderMap, body: &[u8]) -> Result<Response, ApiError> {
    let host = headers.get("host").and_then(|h| h.to_str().ok()).unwrap_or("127.0.0.1").to_string();
    let missing = |name: &str, alias: Option<&str>| {
        ApiError::not_found(format!("The resource you requested does not exist. (Function URL of {})", node.url_arn(name, alias)))
    };
    match action {
        Action::CreateFunctionUrlConfig(n) => {
            let (name, alias) = url_target(&n, raw_query)?;
            let (auth_type, cors) = url_request(body)?;
            let u = node.put_url(&name, alias.as_deref(), auth_type, cors, true)?;
            Ok(json_response(StatusCode::CREATED, &config_json(node, &name, alias.as_deref(), &host, &u)))
        }
        Action::UpdateFunctionUrlConfig(n) => {
            let (name, alias) = url_target(&n, raw_query)?;
            let (auth_type, cors) = url_request(body)?;
            let u = node.put_url(&name, alias.as_deref(), auth_type, cors, false)?;
            Ok(json_response(StatusCode::OK, &config_json(node, &name, alias.as_deref(), &host, &u)))
        }
        Action::GetFunctionUrlConfig(n) => {
            let (name, alias) = url_target(&n, raw_query)?;
            let s = node.settings(&name)?;
            let u = s.url_of(alias.as_deref()).ok_or_else(|| missing(&name, alias.as_deref()))?;
            Ok(json_response(StatusCode::OK, &config_json(node, &name, alias.as_deref(), &host, u)))
        }
        Action::DeleteFunctionUrlConfig(n) => {
            let (name, alias) = url_target(&n, raw_query)?;
            node.delete_url(&name, alias.as_deref())?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        Action::ListFunctionUrlConfigs(n) => {
            let (name, _) = function_name(&n, None)?;
            let s = node.settings(&name)?;
            let urls: Vec<Value> = s
                .url
                .iter()
                .map(|u| config_json(node, &name, None, &host, u))
                .chain(s.alias_urls.iter().map(|(a, u)| config_json(node, &name, Some(a), &host, u)))
                .collect();
            Ok(json_response(StatusCode::OK, &json!({"FunctionUrlConfigs": urls})))
        }
        other => Err(ApiError::service(format!("{other:?} is not a function URL operation"))),
    }
}

/// A plain HTTP answer of a function URL (Lambda's URL errors are `{"Message": ...}`).
fn plain(status: StatusCode, message: &str) -> Response {
    let mut r = (status, json!({"Message": message}).to_string()).into_response();
    r.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
    r
}

/// The CORS headers of `cors` for a request from `origin` (none if the origin is not allowed).
fn cors_headers(cors: &Value, origin: Option<&str>) -> Vec<(&'static str, String)> {
    let list = |k: &str| -> Vec<String> { cors[k].as_array().map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect()).unwrap_or_default() };
    let origins = list("AllowOrigins");
    let Some(origin) = origin else { return vec![] };
    let allowed = if origins.iter().any(|o| o == "*") { "*".to_string() } else if origins.iter().any(|o| o == origin) { origin.to_string() } else { return vec![] };
    let mut h = vec![("access-control-allow-origin", allowed)];
    for (key, header) in [("AllowMethods", "access-control-allow-methods"), ("AllowHeaders", "access-control-allow-headers"), ("ExposeHeaders", "access-control-expose-headers")] {
        let v = list(key);
        if !v.is_empty() {
            h.push((header, v.join(",")));
        }
    }
    if let Some(age) = cors["MaxAge"].as_u64() {
        h.push(("access-control-max-age", age.to_string()));
    }
    if cors["AllowCredentials"].as_bool() == Some(true) {
        h.push(("access-control-allow-credentials", "true".into()));
    }
    h
}

/// The payload format 2.0 event of a URL request.
fn event(name: &str, parts: &axum::http::request::Parts, sub_path: &str, body: &[u8], peer: &SocketAddr, request_id: &str) -> Value {
    let mut headers = serde_json::Map::new();
    let mut cookies = vec![];
    for (k, v) in &parts.headers {
        let v = String::from_utf8_lossy(v.as_bytes()).into_owned();
        if k == "cookie" {
            cookies.extend(v.split(';').map(|c| c.trim().to_string()).filter(|c| !c.is_empty()));
            continue;
        }
        match headers.get_mut(k.as_str()) {
            Some(Value::String(prev)) => {
                prev.push(',');
                prev.push_str(&v);
            }
            _ => {
                headers.insert(k.as_str().to_string(), Value::String(v));
            }
        }
    }
    let raw_query = parts.uri.query().unwrap_or("");
    let mut query: BTreeMap<String, String> = BTreeMap::new();
    for p in raw_query.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = p.split_once('=').unwrap_or((p, ""));
        let dec = |s: &str| percent_encoding::percent_decode_str(&s.replace('+', " ")).decode_utf8_lossy().into_owned();
        query.entry(dec(k)).and_modify(|e| {
            e.push(',');
            e.push_str(&dec(v));
        }).or_insert_with(|| dec(v));
    }
    let text = std::str::from_utf8(body).ok().filter(|_| !body.is_empty());
    let now = chrono::Utc::now();
    let mut ev = json!({
        "version": "2.0",
        "routeKey": "$default",
        "rawPath": sub_path,
        "rawQueryString": raw_query,
        "headers": headers,
        "requestContext": {
            "accountId": "anonymous",
            "apiId": name,
            "domainName": parts.headers.get("host").and_then(|h| h.to_str().ok()).unwrap_or(""),
            "domainPrefix": name,
            "http": {
                "method": parts.method.as_str(),
                "path": sub_path,
                "protocol": format!("{:?}", parts.version),
                "sourceIp": peer.ip().to_string(),
                "userAgent": parts.headers.get("user-agent").and_then(|h| h.to_str().ok()).unwrap_or(""),
            },
            "requestId": request_id,
            "routeKey": "$default",
            "stage": "$default",
            "time": now.format("%d/%b/%Y:%H:%M:%S %z").to_string(),
            "timeEpoch": now.timestamp_millis(),
        },
        "isBase64Encoded": !body.is_empty() && text.is_none(),
    });
    if !query.is_empty() {
        ev["queryStringParameters"] = json!(query);
    }
    if !cookies.is_empty() {
        ev["cookies"] = json!(cookies);
    }
    if !body.is_empty() {
        ev["body"] = match text {
            Some(t) => json!(t),
            None => json!(base64::engine::general_purpose::STANDARD.encode(body)),
        };
    }
    ev
}

/// The HTTP answer of a function's result (Lambda's rules for URL responses).
fn answer(result: &str) -> Response {
    let v: Value = serde_json::from_str(result).unwrap_or(Value::Null);
    let Some(obj) = v.as_object().filter(|o| o.contains_key("statusCode")) else {
        let mut r = (StatusCode::OK, result.to_string()).into_response();
        r.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
        return r;
    };
    let status = obj["statusCode"].as_u64().and_then(|s| StatusCode::from_u16(s as u16).ok()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = match &obj.get("body") {
        Some(Value::String(s)) if obj.get("isBase64Encoded").and_then(Value::as_bool) == Some(true) => {
            base64::engine::general_purpose::STANDARD.decode(s).unwrap_or_default()
        }
        Some(Value::String(s)) => s.clone().into_bytes(),
        Some(other) if !other.is_null() => other.to_string().into_bytes(),
        _ => vec![],
    };
    let mut r = Response::builder().status(status).body(Body::from(body)).expect("valid response");
    let h = r.headers_mut();
    if let Some(hs) = obj.get("headers").and_then(Value::as_object) {
        for (k, v) in hs {
            let v = v.as_str().map(str::to_string).unwrap_or_else(|| v.to_string());
            if let (Ok(k), Ok(v)) = (HeaderName::try_from(k.as_str()), HeaderValue::try_from(v)) {
                h.insert(k, v);
            }
        }
    }
    if let Some(cs) = obj.get("cookies").and_then(Value::as_array) {
        for c in cs.iter().filter_map(Value::as_str) {
            if let Ok(v) = HeaderValue::try_from(c) {
                h.append("set-cookie", v);
            }
        }
    }
    h.entry("content-type").or_insert(HeaderValue::from_static("application/json"));
    r
}

/// Serve a request to a function URL (`/url/<function>/...`).
pub(super) async fn serve(app: &App, parts: axum::http::request::Parts, body: Body, peer: SocketAddr, request_id: &str) -> Response {
    let path = parts.uri.path().to_string();
    let rest = &path[URL_PREFIX.len()..];
    let (raw_name, sub) = rest.split_once('/').map(|(n, s)| (n, format!("/{s}"))).unwrap_or((rest, "/".to_string()));
    let decoded = decode(raw_name);
    let (name, alias) = match decoded.split_once(':') {
        Some((n, a)) => (n.to_string(), Some(a.to_string())),
        None => (decoded, None),
    };
    let node = &app.node;
    let Some(url) = node.settings(&name).ok().and_then(|s| s.url_of(alias.as_deref()).cloned()) else {
        return plain(StatusCode::NOT_FOUND, "Not Found");
    };
    let origin = parts.headers.get("origin").and_then(|o| o.to_str().ok()).map(str::to_string);
    let cors = url.cors.as_ref().map(|c| cors_headers(c, origin.as_deref())).unwrap_or_default();
    let with_cors = |mut r: Response| {
        for (k, v) in &cors {
            if let Ok(v) = HeaderValue::try_from(v.as_str()) {
                r.headers_mut().insert(*k, v);
            }
        }
        if let Ok(v) = HeaderValue::from_str(request_id) {
            r.headers_mut().insert("x-amzn-requestid", v);
        }
        r
    };
    // A CORS preflight is answered by the URL, not the function.
    if parts.method == Method::OPTIONS && url.cors.is_some() && parts.headers.contains_key("access-control-request-method") {
        return with_cors(StatusCode::OK.into_response());
    }
    let body: Bytes = if url.auth_type == "AWS_IAM" {
        match authenticated_body(app, &parts, &path, body).await {
            Ok(b) => b,
            Err(_) => return with_cors(plain(StatusCode::FORBIDDEN, "Forbidden")),
        }
    } else {
        match axum::body::to_bytes(body, MAX_PAYLOAD).await {
            Ok(b) => b,
            Err(_) => return with_cors(plain(StatusCode::PAYLOAD_TOO_LARGE, "Request Entity Too Large")),
        }
    };
    let ev = event(&name, &parts, &sub, &body, &peer, request_id);
    // An alias's URL runs the version the alias routes to, and says so to the function.
    let target = match &alias {
        None => InvokeTarget::latest(),
        Some(a) => match super::versions::version_of(node, &name, &super::versions::Target::Alias(a.clone())) {
            Ok(version) => InvokeTarget { version, qualifier: Some(a.clone()) },
            Err(_) => return with_cors(plain(StatusCode::NOT_FOUND, "Not Found")),
        },
    };
    let r = match node.invoke_version(&name, target, request_id, ev.to_string()).await {
        Ok(inv) => match &inv.outcome {
            Outcome::Ok(text) => answer(text),
            Outcome::Error(..) => plain(StatusCode::BAD_GATEWAY, "Internal Server Error"),
        },
        Err(InvokeError::NotFound(_)) => plain(StatusCode::NOT_FOUND, "Not Found"),
        Err(InvokeError::Throttled { .. } | InvokeError::MemoryBudget { .. }) => plain(StatusCode::TOO_MANY_REQUESTS, "Rate Exceeded."),
        Err(e) => {
            tracing::warn!(function = %name, error = %crate::node::error_chain(&e), "function URL request failed");
            plain(StatusCode::BAD_GATEWAY, "Internal Server Error")
        }
    };
    with_cors(r)
}
