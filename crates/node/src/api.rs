//! The HTTP API: Lambda's REST-JSON protocol (2015-03-31) for the operations
//! the node supports, plus `/metrics` and `/thaw/status`.
//!
//! A request is authenticated (SigV4), parsed into one [`Action`], and then
//! executed against the [`Node`]; the node never sees HTTP. Errors use
//! Lambda's shapes: status code, `x-amzn-ErrorType` header and a JSON body
//! `{"Type": "User", "message": ...}`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde::Deserialize;
use serde_json::{json, Value};
use thiserror::Error;
use tracing::{debug, warn, Instrument};

mod layers;
pub use layers::{layer_list_item, layer_matches, layer_version_answer, layer_version_number, page, publish_layer_request};
mod settings;
mod unimplemented;
mod url;
pub use url::{url_config_json, url_request, url_target, URL_PREFIX};
mod versions;

use versions::Target;
pub use versions::{alias_json, alias_request, aliases_json};
pub use settings::{reserved_concurrency_request, tagged_function};

use crate::events;
use crate::node::{error_chain, version_label, ConfigChange, DeployError, FunctionSpec, InvokeError, InvokeTarget, Node, Outcome};
use crate::registry::FunctionRecord;
use crate::sigv4::{SigV4Error, SignedRequest, Verifier};

/// Largest request body read (a 50 MB zip, base64-encoded, inside JSON).
pub const MAX_BODY: usize = 80 * 1024 * 1024;
/// Lambda's limit for a synchronous invocation's payload.
pub const MAX_PAYLOAD: usize = 6 * 1024 * 1024;
pub use crate::runtimes::{engine_runtime, RUNTIMES};
const API_PREFIX: &str = "/2015-03-31/functions";

pub struct App {
    pub node: Arc<Node>,
    pub verifier: Verifier,
    /// Serve /metrics to any peer (default: loopback peers only, like /thaw/status).
    pub metrics_public: bool,
    /// Bytes of request bodies being read before their signature could be checked
    /// (requests that do not sign `x-amz-content-sha256`), in KiB permits: bounds the
    /// memory unauthenticated clients can make the node hold.
    unverified_bodies: tokio::sync::Semaphore,
}

/// Most body bytes held at once for requests not yet authenticated.
pub const UNVERIFIED_BODY_BUDGET: usize = 96 * 1024 * 1024;

impl App {
    pub fn new(node: Arc<Node>, verifier: Verifier, metrics_public: bool) -> App {
        App { node, verifier, metrics_public, unverified_bodies: tokio::sync::Semaphore::new(UNVERIFIED_BODY_BUDGET / 1024) }
    }
}

/// An API error in Lambda's shape.
#[derive(Debug, Error)]
#[error("{kind}: {message}")]
pub struct ApiError {
    pub status: StatusCode,
    pub kind: &'static str,
    pub message: String,
    pub reason: Option<&'static str>,
}

impl ApiError {
    pub fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError { status, kind, message: message.into(), reason: None }
    }
    pub fn invalid(message: impl Into<String>) -> ApiError {
        Self::new(StatusCode::BAD_REQUEST, "InvalidParameterValueException", message)
    }
    pub fn not_found(message: impl Into<String>) -> ApiError {
        Self::new(StatusCode::NOT_FOUND, "ResourceNotFoundException", message)
    }
    fn service(message: impl Into<String>) -> ApiError {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "ServiceException", message)
    }

    pub fn into_response(self, request_id: &str) -> Response {
        let kind_type = if self.status.is_server_error() { "Service" } else { "User" };
        let mut body = json!({"Type": kind_type, "message": self.message, "Message": self.message});
        if let Some(r) = self.reason {
            body["Reason"] = json!(r);
        }
        let mut resp = (self.status, body.to_string()).into_response();
        let h = resp.headers_mut();
        h.insert("content-type", HeaderValue::from_static("application/json"));
        h.insert("x-amzn-errortype", HeaderValue::from_static(self.kind));
        if let Ok(v) = HeaderValue::from_str(request_id) {
            h.insert("x-amzn-requestid", v);
        }
        resp
    }
}

impl From<SigV4Error> for ApiError {
    fn from(e: SigV4Error) -> ApiError {
        ApiError::new(StatusCode::FORBIDDEN, e.error_type(), e.to_string())
    }
}

impl From<DeployError> for ApiError {
    fn from(e: DeployError) -> ApiError {
        match &e {
            DeployError::Exists(_) | DeployError::InProgress(_) => {
                ApiError::new(StatusCode::CONFLICT, "ResourceConflictException", e.to_string())
            }
            DeployError::NotFound(_) => ApiError::not_found(e.to_string()),
            DeployError::Bundle(b) => match b {
                crate::bundle::BundleError::Write { .. } => ApiError::service(error_chain(&e)),
                _ => ApiError::invalid(e.to_string()),
            },
            DeployError::Registry(_) | DeployError::Join(_) | DeployError::Copy { .. } => ApiError::service(error_chain(&e)),
            DeployError::RevisionMismatch => ApiError::new(StatusCode::PRECONDITION_FAILED, "PreconditionFailedException", e.to_string()),
            DeployError::Layer(_) => {
                let DeployError::Layer(l) = e else { unreachable!() };
                l.into()
            }
        }
    }
}

impl From<InvokeError> for ApiError {
    fn from(e: InvokeError) -> ApiError {
        match &e {
            InvokeError::NotFound(_) => ApiError::not_found(e.to_string()),
            InvokeError::NotReady { .. } => ApiError::new(StatusCode::CONFLICT, "ResourceConflictException", e.to_string()),
            InvokeError::Throttled { reason } => ApiError {
                reason: Some(reason),
                ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "TooManyRequestsException", e.to_string())
            },
            InvokeError::MemoryBudget { .. } => ApiError {
                reason: Some("ConcurrentInvocationLimitExceeded"),
                ..ApiError::new(StatusCode::TOO_MANY_REQUESTS, "TooManyRequestsException", e.to_string())
            },
            InvokeError::ShuttingDown => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "ServiceException", e.to_string()),
            InvokeError::Start { .. } | InvokeError::Workers(_) => ApiError::service(error_chain(&e)),
        }
    }
}

/// One API operation, parsed from method + path.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    CreateFunction,
    ListFunctions,
    GetFunction(String),
    GetFunctionConfiguration(String),
    UpdateFunctionCode(String),
    UpdateFunctionConfiguration(String),
    PublishVersion(String),
    ListVersionsByFunction(String),
    CreateAlias(String),
    ListAliases(String),
    /// (function, alias)
    GetAlias(String, String),
    UpdateAlias(String, String),
    DeleteAlias(String, String),
    PutProvisionedConcurrency(String),
    GetProvisionedConcurrency(String),
    DeleteProvisionedConcurrency(String),
    DeleteFunction(String),
    Invoke(String),
    GetAccountSettings,
    /// Tag operations name the function by its ARN.
    TagResource(String),
    UntagResource(String),
    ListTags(String),
    PutFunctionConcurrency(String),
    GetFunctionConcurrency(String),
    DeleteFunctionConcurrency(String),
    PublishLayerVersion(String),
    ListLayerVersions(String),
    /// (layer, version as given)
    GetLayerVersion(String, String),
    DeleteLayerVersion(String, String),
    /// Also GetLayerVersionByArn (`?find=LayerVersion`).
    ListLayers,
    CreateFunctionUrlConfig(String),
    GetFunctionUrlConfig(String),
    UpdateFunctionUrlConfig(String),
    DeleteFunctionUrlConfig(String),
    ListFunctionUrlConfigs(String),
}

/// Map method + raw path to an action (None: unknown operation).
pub fn route(method: &Method, raw_path: &str) -> Option<Action> {
    if let Some(a) = settings::route(method, raw_path).or_else(|| url::route(method, raw_path)).or_else(|| layers::route(method, raw_path)) {
        return Some(a);
    }
    let rest = raw_path.strip_prefix(API_PREFIX)?;
    let rest = rest.strip_prefix('/').unwrap_or(rest);
    let segs: Vec<&str> = if rest.is_empty() { vec![] } else { rest.split('/').collect() };
    match (method.as_str(), segs.as_slice()) {
        ("POST", []) => Some(Action::CreateFunction),
        ("GET", []) => Some(Action::ListFunctions),
        ("GET", [n]) => Some(Action::GetFunction(decode(n))),
        ("DELETE", [n]) => Some(Action::DeleteFunction(decode(n))),
        ("GET", [n, "configuration"]) => Some(Action::GetFunctionConfiguration(decode(n))),
        ("PUT", [n, "code"]) => Some(Action::UpdateFunctionCode(decode(n))),
        ("PUT", [n, "configuration"]) => Some(Action::UpdateFunctionConfiguration(decode(n))),
        ("POST", [n, "versions"]) => Some(Action::PublishVersion(decode(n))),
        ("GET", [n, "versions"]) => Some(Action::ListVersionsByFunction(decode(n))),
        ("POST", [n, "aliases"]) => Some(Action::CreateAlias(decode(n))),
        ("GET", [n, "aliases"]) => Some(Action::ListAliases(decode(n))),
        ("GET", [n, "aliases", a]) => Some(Action::GetAlias(decode(n), decode(a))),
        ("PUT", [n, "aliases", a]) => Some(Action::UpdateAlias(decode(n), decode(a))),
        ("DELETE", [n, "aliases", a]) => Some(Action::DeleteAlias(decode(n), decode(a))),
        ("POST", [n, "invocations"]) => Some(Action::Invoke(decode(n))),
        _ => None,
    }
}

/// Resolve a FunctionName parameter (name, partial or full ARN, optional qualifier) to a name.
pub fn function_name(input: &str, qualifier: Option<&str>) -> Result<(String, Option<String>), ApiError> {
    let parts: Vec<&str> = input.split(':').collect();
    let (name, q) = match parts.as_slice() {
        [n] => (*n, None),
        [n, q] => (*n, Some(*q)),
        [_, "function", n] => (*n, None),
        [_, "function", n, q] => (*n, Some(*q)),
        ["arn", _, "lambda", _, _, "function", n] => (*n, None),
        ["arn", _, "lambda", _, _, "function", n, q] => (*n, Some(*q)),
        _ => return Err(ApiError::invalid(format!("1 validation error detected: Value '{input}' at 'functionName' failed to satisfy constraint: Member must satisfy regular expression pattern"))),
    };
    if name.is_empty() || name.len() > 64 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Err(ApiError::invalid(format!(
            "1 validation error detected: Value '{input}' at 'functionName' failed to satisfy constraint: Member must satisfy regular expression pattern: [a-zA-Z0-9-_]+ and have length at most 64"
        )));
    }
    let q = match (q, qualifier) {
        (Some(a), Some(b)) if a != b => {
            return Err(ApiError::invalid("The derived qualifier from the function name does not match the specified qualifier."))
        }
        (a, b) => a.or(b).map(str::to_string),
    };
    Ok((name.to_string(), q))
}

/// A percent-encoded path segment or query value, decoded.
fn decode(s: &str) -> String {
    percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned()
}

/// The segments of a request path (leading and trailing slashes ignored).
fn segments(raw_path: &str) -> Vec<&str> {
    raw_path.trim_start_matches('/').trim_end_matches('/').split('/').collect()
}

/// Every value of `key` in a query string (`tagKeys=a&tagKeys=b`), decoded, in order.
pub fn query_values(raw: Option<&str>, key: &str) -> Vec<String> {
    raw.unwrap_or("")
        .split('&')
        .filter_map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (k == key).then(|| decode(v))
        })
        .collect()
}

/// The first value of `key` in a query string, decoded.
pub fn query_param(raw: Option<&str>, key: &str) -> Option<String> {
    query_values(raw, key).into_iter().next()
}

/// A runtime whose instances Thaw cannot snapshot is served by cold boots: SnapStart
/// is Off and `Thaw` (outside Lambda's shape, so SDKs drop it; raw answers and
/// `/thaw/status` show it) says why.
pub(crate) fn mark_unsnapshotted(v: &mut Value, runtime: &str) {
    if engine_runtime(runtime).is_some_and(|r| !r.snapshots()) {
        v["SnapStart"]["OptimizationStatus"] = json!("Off");
        v["Thaw"] = json!({"Snapshot": false, "ColdStart": "boot", "Reason": UNSNAPSHOTTED});
    }
}

/// Why a custom runtime's instances are cold-booted.
pub const UNSNAPSHOTTED: &str = "custom runtimes (provided.*) are served by cold boots: the bootstrap runs as a second process beside the Runtime API bridge, connected over TCP, and the snapshot engine restores neither yet";

/// Lambda's FunctionConfiguration for a record.
pub fn configuration(node: &Node, r: &FunctionRecord) -> Value {
    let mut v = json!({
        "FunctionName": r.name,
        "FunctionArn": node.arn(&r.name),
        "Runtime": r.runtime,
        "Role": r.role,
        "Handler": r.handler,
        "CodeSize": r.code_size,
        "Description": r.description,
        "Timeout": r.timeout_s,
        "MemorySize": r.memory_mb,
        "LastModified": r.last_modified,
        "CodeSha256": r.code_sha256,
        "Version": "$LATEST",
        "TracingConfig": {"Mode": "PassThrough"},
        "RevisionId": r.revision_id,
        "State": r.state,
        "LastUpdateStatus": r.last_update_status,
        "PackageType": "Zip",
        "Architectures": ["x86_64"],
        "EphemeralStorage": {"Size": 512},
        "SnapStart": {"ApplyOn": "None", "OptimizationStatus": "Off"},
        "LoggingConfig": {"LogFormat": "Text", "LogGroup": format!("/aws/lambda/{}", r.name)},
    });
    if !r.env.is_empty() {
        v["Environment"] = json!({"Variables": r.env});
    }
    if !r.layers.is_empty() {
        v["Layers"] = layers::function_layers(node, &r.layers);
    }
    if let Some(a) = node.settings(&r.name).ok().and_then(|s| s.snap_start) {
        v["SnapStart"]["ApplyOn"] = json!(a);
    }
    mark_unsnapshotted(&mut v, &r.runtime);
    for (k, val) in [
        ("StateReason", &r.state_reason),
        ("StateReasonCode", &r.state_reason_code),
        ("LastUpdateStatusReason", &r.last_update_status_reason),
        ("LastUpdateStatusReasonCode", &r.last_update_status_reason_code),
    ] {
        if let Some(s) = val {
            v[k] = json!(s);
        }
    }
    v
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct CodeInput {
    zip_file: Option<String>,
    s3_bucket: Option<String>,
    image_uri: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct EnvInput {
    variables: Option<BTreeMap<String, String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct CreateInput {
    function_name: String,
    runtime: Option<String>,
    role: Option<String>,
    handler: Option<String>,
    code: Option<CodeInput>,
    description: Option<String>,
    timeout: Option<i64>,
    memory_size: Option<i64>,
    environment: Option<EnvInput>,
    package_type: Option<String>,
    architectures: Option<Vec<String>>,
    layers: Option<Vec<String>>,
}

/// `SnapStart` of CreateFunction and UpdateFunctionConfiguration.
#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct SnapStartInput {
    apply_on: Option<String>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct SnapStartField {
    snap_start: Option<SnapStartInput>,
}

/// The request's `SnapStart.ApplyOn`, checked (None: not given).
fn snap_start_of(body: &[u8]) -> Result<Option<String>, ApiError> {
    let field: SnapStartField = parse_json(body)?;
    match field.snap_start.and_then(|s| s.apply_on) {
        None => Ok(None),
        Some(a) if a == "PublishedVersions" || a == "None" => Ok(Some(a)),
        Some(a) => Err(ApiError::invalid(format!(
            "1 validation error detected: Value '{a}' at 'snapStart.applyOn' failed to satisfy constraint: Member must satisfy enum value set: [PublishedVersions, None]"
        ))),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct UpdateConfigInput {
    runtime: Option<String>,
    role: Option<String>,
    handler: Option<String>,
    description: Option<String>,
    timeout: Option<i64>,
    memory_size: Option<i64>,
    environment: Option<EnvInput>,
    revision_id: Option<String>,
    layers: Option<Vec<String>>,
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct UpdateCodeInput {
    zip_file: Option<String>,
    s3_bucket: Option<String>,
    image_uri: Option<String>,
}

/// Environment variables the runtime sets and a function may not override (Lambda's reserved keys).
const RESERVED_ENV: &[&str] = &[
    "_HANDLER", "AWS_REGION", "AWS_DEFAULT_REGION", "AWS_EXECUTION_ENV", "AWS_LAMBDA_FUNCTION_NAME", "AWS_LAMBDA_FUNCTION_MEMORY_SIZE",
    "AWS_LAMBDA_FUNCTION_VERSION", "AWS_LAMBDA_LOG_GROUP_NAME", "AWS_LAMBDA_LOG_STREAM_NAME", "LAMBDA_TASK_ROOT",
    "LAMBDA_RUNTIME_DIR", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
];

fn decode_zip(b64: Option<String>, s3: Option<String>, image: Option<String>) -> Result<Vec<u8>, ApiError> {
    if s3.is_some() || image.is_some() {
        return Err(ApiError::invalid("This node accepts code only as Code.ZipFile (S3 and container images are not supported)."));
    }
    let b64 = b64.ok_or_else(|| ApiError::invalid("Please provide a source for function code (Code.ZipFile)."))?;
    base64::engine::general_purpose::STANDARD
        .decode(b64.as_bytes())
        .map_err(|_| ApiError::invalid("Could not unzip uploaded file. Please check your file, then try to upload again."))
}

/// A JSON request body, or the InvalidRequestContentException Lambda answers.
pub fn parse_json<'a, T: Deserialize<'a>>(body: &'a [u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| {
        ApiError::new(StatusCode::BAD_REQUEST, "InvalidRequestContentException", format!("Could not parse request body into json: {e}"))
    })
}

/// The zip of an UpdateFunctionCode request.
pub fn update_code_zip(body: &[u8]) -> Result<Vec<u8>, ApiError> {
    let input: UpdateCodeInput = parse_json(body)?;
    decode_zip(input.zip_file, input.s3_bucket, input.image_uri)
}

/// Validate a CreateFunction request into a spec + zip.
pub fn create_spec(body: &[u8]) -> Result<(FunctionSpec, Vec<u8>), ApiError> {
    let input: CreateInput = parse_json(body)?;
    let (name, q) = function_name(&input.function_name, None)?;
    if q.is_some() {
        return Err(ApiError::invalid("FunctionName must not have a qualifier in CreateFunction."));
    }
    if input.package_type.as_deref().is_some_and(|p| p != "Zip") {
        return Err(ApiError::invalid("PackageType Image is not supported by this node."));
    }
    if input.architectures.as_ref().is_some_and(|a| a.iter().any(|x| x != "x86_64")) {
        return Err(ApiError::invalid("Only the x86_64 architecture is supported by this node."));
    }
    let runtime = input.runtime.ok_or_else(|| ApiError::invalid("Runtime is required for .zip deployment packages."))?;
    let handler = input.handler.ok_or_else(|| ApiError::invalid("Handler is required for .zip deployment packages."))?;
    check_handler(&runtime, &handler)?;
    let timeout_s = check_timeout(input.timeout.unwrap_or(3))?;
    let memory_mb = check_memory(input.memory_size.unwrap_or(128))?;
    let env = input.environment.and_then(|e| e.variables).unwrap_or_default();
    check_env(&env)?;
    let code = input.code.unwrap_or_default();
    let zip = decode_zip(code.zip_file, code.s3_bucket, code.image_uri)?;
    let spec = FunctionSpec {
        name,
        runtime,
        role: input.role.unwrap_or_else(|| format!("arn:aws:iam::{}:role/thaw", crate::node::ACCOUNT)),
        handler,
        description: input.description.unwrap_or_default(),
        timeout_s,
        memory_mb,
        env,
        layers: input.layers.unwrap_or_default(),
    };
    Ok((spec, zip))
}

/// A supported runtime and a handler of the form it expects.
fn check_handler(runtime: &str, handler: &str) -> Result<(), ApiError> {
    let Some(engine) = engine_runtime(runtime) else {
        return Err(ApiError::invalid(format!(
            "The runtime parameter of {runtime} is not supported by this node (supported: {}).",
            RUNTIMES.join(", ")
        )));
    };
    if engine.check_handler(handler).is_err() || handler.len() > 128 {
        let expected = match engine {
            thaw_runtime::Runtime::Python3 => "module.function",
            thaw_runtime::Runtime::Nodejs20 => "file.function",
            thaw_runtime::Runtime::Java17 => "package.Class::method or package.Class",
            thaw_runtime::Runtime::Provided => "1 to 128 characters without whitespace",
        };
        return Err(ApiError::invalid(format!("Value '{handler}' at 'handler' failed to satisfy constraint: expected {expected} for {runtime}")));
    }
    Ok(())
}

fn check_timeout(t: i64) -> Result<u64, ApiError> {
    if !(1..=900).contains(&t) {
        return Err(ApiError::invalid(format!("Value '{t}' at 'timeout' failed to satisfy constraint: Member must have value between 1 and 900")));
    }
    Ok(t as u64)
}

fn check_memory(m: i64) -> Result<u64, ApiError> {
    if !(128..=10240).contains(&m) {
        return Err(ApiError::invalid(format!("Value '{m}' at 'memorySize' failed to satisfy constraint: Member must have value between 128 and 10240")));
    }
    Ok(m as u64)
}

fn check_env(env: &BTreeMap<String, String>) -> Result<(), ApiError> {
    let reserved: Vec<&str> = env.keys().filter(|k| RESERVED_ENV.contains(&k.as_str())).map(String::as_str).collect();
    if !reserved.is_empty() {
        return Err(ApiError::invalid(format!(
            "Lambda was unable to configure your environment variables because the environment variables you have provided contains reserved keys that are currently not supported for modification. Reserved keys used in this request: {}",
            reserved.join(", ")
        )));
    }
    if let Some(bad) = env.keys().find(|k| {
        let b = k.as_bytes();
        b.is_empty() || !b[0].is_ascii_alphabetic() || !b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'_')
    }) {
        return Err(ApiError::invalid(format!("Environment variable name '{bad}' is not valid: use letters, digits and '_', starting with a letter.")));
    }
    Ok(())
}

/// UpdateFunctionConfiguration's input, validated against the function's current
/// runtime and handler (fields absent are unchanged).
pub fn config_change(body: &[u8], current_runtime: &str, current_handler: &str) -> Result<ConfigChange, ApiError> {
    let input: UpdateConfigInput = parse_json(body)?;
    let runtime = input.runtime.clone().unwrap_or_else(|| current_runtime.to_string());
    let handler = input.handler.clone().unwrap_or_else(|| current_handler.to_string());
    if input.runtime.is_some() || input.handler.is_some() {
        check_handler(&runtime, &handler)?;
    }
    let env = input.environment.map(|e| e.variables.unwrap_or_default());
    if let Some(env) = &env {
        check_env(env)?;
    }
    Ok(ConfigChange {
        runtime: input.runtime,
        handler: input.handler,
        memory_mb: input.memory_size.map(check_memory).transpose()?,
        timeout_s: input.timeout.map(check_timeout).transpose()?,
        env,
        description: input.description,
        role: input.role,
        layers: input.layers,
        revision_id: input.revision_id,
    })
}

fn json_response(status: StatusCode, v: &Value) -> Response {
    let mut r = (status, v.to_string()).into_response();
    r.headers_mut().insert("content-type", HeaderValue::from_static("application/json"));
    r
}


/// The Lambda-style log tail: START/END/REPORT around the function's output, last 4 KB.
fn log_tail(inv: &crate::node::Invocation) -> String {
    let id = &inv.request_id;
    let mut s = format!("START RequestId: {id} Version: $LATEST\n{}", inv.logs);
    if !s.ends_with('\n') {
        s.push('\n');
    }
    s.push_str(&format!(
        "END RequestId: {id}\nREPORT RequestId: {id}\tDuration: {:.2} ms\tBilled Duration: {} ms\tMemory Size: {} MB\tMax Memory Used: {} MB",
        inv.invoke_ms,
        inv.invoke_ms.ceil() as u64,
        inv.memory_mb,
        inv.max_memory_used_mb
    ));
    match inv.start_kind {
        "warm" => {}
        "boot" => s.push_str(&format!("\tInit Duration: {:.2} ms", inv.start_ms)),
        _ => s.push_str(&format!("\tRestore Duration: {:.2} ms", inv.start_ms)),
    }
    s.push('\n');
    let bytes = s.as_bytes();
    let tail = &bytes[bytes.len().saturating_sub(4096)..];
    base64::engine::general_purpose::STANDARD.encode(tail)
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> Option<&'a str> {
    h.get(name).and_then(|v| v.to_str().ok())
}

/// The payload of an Invoke of type `kind` (`Event`, `RequestResponse`, `DryRun`) as
/// Lambda checks it: within the type's size limit, JSON text (an empty body is `{}`).
pub fn invoke_payload(body: &[u8], kind: &str) -> Result<String, ApiError> {
    let limit = if kind == "Event" { events::MAX_EVENT_PAYLOAD } else { MAX_PAYLOAD };
    if body.len() > limit {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "RequestEntityTooLargeException",
            format!("{} byte payload is too large for the {kind} invocation type (limit {limit} bytes)", body.len()),
        ));
    }
    if body.is_empty() {
        return Ok("{}".to_string());
    }
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::new(StatusCode::BAD_REQUEST, "InvalidRequestContentException", "Could not parse request body into json: not UTF-8"))?;
    if serde_json::from_str::<serde::de::IgnoredAny>(text).is_err() {
        return Err(ApiError::new(StatusCode::BAD_REQUEST, "InvalidRequestContentException", "Could not parse request body into json: Could not parse payload into json"));
    }
    Ok(text.to_string())
}

async fn invoke(app: &App, name: String, qualifier: Option<String>, headers: &HeaderMap, body: Bytes, request_id: &str) -> Result<Response, ApiError> {
    let t0 = Instant::now();
    let node = &app.node;
    let (name, q) = function_name(&name, qualifier.as_deref())?;
    let version = versions::version_of(node, &name, &versions::target(node, &name, q.as_deref())?)?;
    let target = InvokeTarget { version, qualifier: q };
    let kind = header(headers, "x-amz-invocation-type").unwrap_or("RequestResponse");
    let payload = invoke_payload(&body, kind)?;
    let tail = match header(headers, "x-amz-log-type") {
        None | Some("None") => false,
        Some("Tail") => true,
        Some(other) => return Err(ApiError::invalid(format!("Value '{other}' at 'logType' failed to satisfy constraint: Member must satisfy enum value set: [None, Tail]"))),
    };
    let rid = HeaderValue::from_str(request_id).map_err(|_| ApiError::service("bad request id"))?;
    match kind {
        "DryRun" => {
            node.function(&name).ok_or_else(|| ApiError::not_found(format!("Function not found: {}", node.arn(&name))))?;
            let mut r = StatusCode::NO_CONTENT.into_response();
            r.headers_mut().insert("x-amzn-requestid", rid);
            Ok(r)
        }
        "Event" => {
            node.check_invocable(&name)?;
            // A version (an alias's weighted pick included) is resolved now and kept with the event.
            events::enqueue(node, request_id, &name, &target, payload.into_bytes()).map_err(|e| ApiError::service(error_chain(&e)))?;
            let mut r = StatusCode::ACCEPTED.into_response();
            r.headers_mut().insert("x-amzn-requestid", rid);
            Ok(r)
        }
        "RequestResponse" => {
            let inv = node.invoke_version(&name, target, request_id, payload).await?;
            let (body, error) = match &inv.outcome {
                Outcome::Ok(text) => (text.clone(), false),
                Outcome::Error(e, _) => (serde_json::to_string(e).expect("serializable"), true),
            };
            let mut r = (StatusCode::OK, body).into_response();
            let h = r.headers_mut();
            h.insert("content-type", HeaderValue::from_static("application/json"));
            h.insert("x-amzn-requestid", rid);
            let executed = version_label(version);
            h.insert("x-amz-executed-version", HeaderValue::from_str(&executed).expect("a version is a header value"));
            if error {
                h.insert("x-amz-function-error", HeaderValue::from_static("Unhandled"));
            }
            if tail {
                if let Ok(v) = HeaderValue::from_str(&log_tail(&inv)) {
                    h.insert("x-amz-log-result", v);
                }
            }
            h.insert("x-thaw-start", HeaderValue::from_static(inv.start_kind));
            let node_ms = t0.elapsed().as_secs_f64() * 1e3;
            let timing = format!("start={:.3};invoke={:.3};node={:.3}", inv.start_ms, inv.invoke_ms, node_ms);
            if let Ok(v) = HeaderValue::from_str(&timing) {
                h.insert("x-thaw-timing-ms", v);
            }
            node.metrics.request_seconds.with_label_values(&[]).observe(node_ms / 1e3);
            Ok(r)
        }
        other => Err(ApiError::invalid(format!(
            "Value '{other}' at 'invocationType' failed to satisfy constraint: Member must satisfy enum value set: [Event, RequestResponse, DryRun]"
        ))),
    }
}

async fn dispatch(app: &App, action: Action, raw_query: Option<&str>, headers: &HeaderMap, body: Bytes, request_id: &str) -> Result<Response, ApiError> {
    let node = &app.node;
    let qualifier = query_param(raw_query, "Qualifier");
    match action {
        Action::Invoke(name) => invoke(app, name, qualifier, headers, body, request_id).await,
        Action::CreateFunction => {
            let (spec, zip) = create_spec(&body)?;
            let tags = tags_in(&body)?;
            crate::node::check_tags(&tags)?;
            let snap_start = snap_start_of(&body)?;
            let rec = node.create_function(spec, zip).await?;
            if !tags.is_empty() {
                node.tag(&rec.name, &tags)?;
            }
            if let Some(a) = &snap_start {
                node.set_snap_start(&rec.name, a)?;
            }
            Ok(json_response(StatusCode::CREATED, &configuration(node, &rec)))
        }
        Action::ListFunctions => {
            let max = match query_param(raw_query, "MaxItems") {
                Some(m) => m.parse::<usize>().ok().filter(|n| (1..=10000).contains(n)).ok_or_else(|| ApiError::invalid("MaxItems must be between 1 and 10000"))?,
                None => 50,
            };
            let marker = query_param(raw_query, "Marker");
            let all = node.records();
            let start = marker.as_ref().map(|m| all.iter().position(|r| &r.name > m).unwrap_or(all.len())).unwrap_or(0);
            let page: Vec<Value> = all[start..].iter().take(max).map(|r| configuration(node, r)).collect();
            let mut v = json!({"Functions": page});
            if start + max < all.len() {
                v["NextMarker"] = json!(all[start + max - 1].name);
            }
            Ok(json_response(StatusCode::OK, &v))
        }
        Action::GetFunction(n) => {
            let (name, q) = function_name(&n, qualifier.as_deref())?;
            let target = versions::target(node, &name, q.as_deref())?;
            let rec = node.record(&name).ok_or_else(|| ApiError::not_found(format!("Function not found: {}", node.arn(&name))))?;
            let cfg = versions::configuration_of(node, &rec, &target)?;
            let mut v = json!({"Configuration": cfg, "Code": {"RepositoryType": "S3", "Location": ""}});
            settings::extend_get_function(node, &name, &mut v);
            Ok(json_response(StatusCode::OK, &v))
        }
        Action::GetFunctionConfiguration(n) => {
            let (name, q) = function_name(&n, qualifier.as_deref())?;
            let target = versions::target(node, &name, q.as_deref())?;
            let rec = node.record(&name).ok_or_else(|| ApiError::not_found(format!("Function not found: {}", node.arn(&name))))?;
            Ok(json_response(StatusCode::OK, &versions::configuration_of(node, &rec, &target)?))
        }
        Action::PublishVersion(n) => {
            let (name, _) = function_name(&n, None)?;
            versions::publish(node, &name, &body)
        }
        Action::ListVersionsByFunction(n) => {
            let (name, _) = function_name(&n, None)?;
            versions::list(node, &name)
        }
        Action::CreateAlias(n) => versions::put_alias(node, &function_name(&n, None)?.0, None, &body),
        Action::UpdateAlias(n, a) => versions::put_alias(node, &function_name(&n, None)?.0, Some(&a), &body),
        Action::GetAlias(n, a) => versions::get_alias(node, &function_name(&n, None)?.0, &a),
        Action::DeleteAlias(n, a) => versions::delete_alias(node, &function_name(&n, None)?.0, &a),
        Action::ListAliases(n) => {
            let fv = query_param(raw_query, "FunctionVersion");
            versions::list_aliases(node, &function_name(&n, None)?.0, fv.as_deref())
        }
        Action::UpdateFunctionCode(n) => {
            let (name, _) = function_name(&n, None)?;
            let zip = update_code_zip(&body)?;
            let rec = node.update_code(&name, zip).await?;
            Ok(json_response(StatusCode::OK, &configuration(node, &rec)))
        }
        Action::UpdateFunctionConfiguration(n) => {
            let (name, _) = function_name(&n, None)?;
            let rec = node.record(&name).ok_or_else(|| ApiError::not_found(format!("Function not found: {}", node.arn(&name))))?;
            let change = config_change(&body, &rec.runtime, &rec.handler)?;
            let snap_start = snap_start_of(&body)?;
            let rec = node.update_configuration(&name, change).await?;
            if let Some(a) = &snap_start {
                node.set_snap_start(&name, a)?;
            }
            Ok(json_response(StatusCode::OK, &configuration(node, &rec)))
        }
        Action::DeleteFunction(n) => {
            let (name, q) = function_name(&n, qualifier.as_deref())?;
            match versions::target(node, &name, q.as_deref())? {
                Target::Version(v) => return versions::delete(node, &name, v),
                Target::Alias(a) => return Err(ApiError::invalid(format!("Deleting a function by alias ({a}) is not possible; use DeleteAlias."))),
                Target::Latest => {}
            }
            node.delete_function(&name)?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        a @ (Action::GetAccountSettings
        | Action::TagResource(_)
        | Action::UntagResource(_)
        | Action::ListTags(_)
        | Action::PutFunctionConcurrency(_)
        | Action::GetFunctionConcurrency(_)
        | Action::DeleteFunctionConcurrency(_)) => settings::dispatch(node, a, raw_query, &body),
        a @ (Action::CreateFunctionUrlConfig(_)
        | Action::GetFunctionUrlConfig(_)
        | Action::UpdateFunctionUrlConfig(_)
        | Action::DeleteFunctionUrlConfig(_)
        | Action::ListFunctionUrlConfigs(_)) => url::dispatch(node, a, raw_query, headers, &body),
        a @ (Action::PublishLayerVersion(_)
        | Action::ListLayerVersions(_)
        | Action::GetLayerVersion(..)
        | Action::DeleteLayerVersion(..)
        | Action::ListLayers) => layers::dispatch(node, a, raw_query, &body).await,
        a @ (Action::PutProvisionedConcurrency(_) | Action::GetProvisionedConcurrency(_) | Action::DeleteProvisionedConcurrency(_)) => {
            versions::provisioned(node, a, raw_query, &body)
        }
    }
}

/// CreateFunction's `Tags` (the rest of its input is `create_spec`'s).
#[derive(Deserialize)]
struct TagsInput {
    #[serde(rename = "Tags", default)]
    tags: BTreeMap<String, String>,
}

/// The `Tags` of a CreateFunction or TagResource request (none: empty).
pub fn tags_in(body: &[u8]) -> Result<BTreeMap<String, String>, ApiError> {
    Ok(parse_json::<TagsInput>(body)?.tags)
}

fn too_large() -> ApiError {
    ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "RequestEntityTooLargeException", format!("Request must be smaller than {MAX_BODY} bytes"))
}

/// Authenticate a request, reading as little as possible of an unauthenticated
/// one: every header check first (no body read at all for a missing or unknown
/// key, a stale date, UNSIGNED-PAYLOAD); a request that signs its body's hash is
/// fully verified before the body is read; any other body is read within the
/// node-wide [`UNVERIFIED_BODY_BUDGET`] and verified afterwards.
async fn authenticated_body(app: &App, parts: &axum::http::request::Parts, path: &str, body: Body) -> Result<Bytes, ApiError> {
    fn signed<'a>(parts: &'a axum::http::request::Parts, path: &'a str, body: &'a [u8]) -> SignedRequest<'a> {
        SignedRequest {
            method: parts.method.as_str(),
            raw_path: path,
            raw_query: parts.uri.query(),
            headers: parts.headers.iter().filter_map(|(k, v)| v.to_str().ok().map(|v| (k.as_str(), v))).collect(),
            body,
        }
    }
    let head = signed(parts, path, b"");
    app.verifier.check_headers(&head, SystemTime::now())?;
    let declared = parts.headers.get("content-length").and_then(|v| v.to_str().ok()?.parse::<usize>().ok());
    if declared.is_some_and(|n| n > MAX_BODY) {
        return Err(too_large());
    }
    if Verifier::hash_in_headers(&head) {
        app.verifier.verify_headers_only(&head, SystemTime::now())?;
        let body = axum::body::to_bytes(body, MAX_BODY).await.map_err(|_| too_large())?;
        Verifier::check_body(&signed(parts, path, &body))?;
        return Ok(body);
    }
    let kib = declared.unwrap_or(MAX_BODY).div_ceil(1024).max(1) as u32;
    let _permit = app.unverified_bodies.acquire_many(kib).await.map_err(|_| too_large())?;
    let body = axum::body::to_bytes(body, declared.unwrap_or(MAX_BODY).min(MAX_BODY)).await.map_err(|_| too_large())?;
    app.verifier.verify(&signed(parts, path, &body), SystemTime::now())?;
    Ok(body)
}

fn is_loopback(peer: &SocketAddr) -> bool {
    peer.ip().is_loopback()
}

/// The single entry point of every HTTP request.
pub async fn handle(State(app): State<Arc<App>>, ConnectInfo(peer): ConnectInfo<SocketAddr>, req: Request) -> Response {
    let request_id = uuid::Uuid::new_v4().to_string();
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_string();
    let span = tracing::debug_span!("request", request_id = %request_id, method = %parts.method, path = %path);
    async move {
        if parts.method == Method::GET && path == "/metrics" {
            if !app.metrics_public && !is_loopback(&peer) {
                return ApiError::new(
                    StatusCode::FORBIDDEN,
                    "AccessDeniedException",
                    "/metrics is only served to loopback clients (start the node with --metrics-public to serve it to any peer)",
                )
                .into_response(&request_id);
            }
            if let Some(b) = &app.node.cfg.bases {
                crate::node::layered::set_metrics(b, &app.node.metrics);
            }
            if let Some(p) = &app.node.cfg.sandbox_pool {
                app.node.metrics.sandbox_pool_ready.set(p.stats().ready as i64);
            }
            app.node.metrics.set_network_namespaces(&thaw_sandbox::netns_stats());
            app.node.metrics.pageserver_threads.set(thaw_engine::pageserver::shared::threads() as i64);
            let mut r = app.node.metrics.render().into_response();
            r.headers_mut().insert("content-type", HeaderValue::from_static("text/plain; version=0.0.4"));
            return r;
        }
        if parts.method == Method::GET && path == "/thaw/status" {
            if !is_loopback(&peer) {
                return ApiError::new(StatusCode::FORBIDDEN, "AccessDeniedException", "/thaw/status is only served to loopback clients")
                    .into_response(&request_id);
            }
            return json_response(StatusCode::OK, &app.node.status());
        }
        // Function URLs authenticate (or not) by their own AuthType.
        if path.starts_with(url::URL_PREFIX) {
            return url::serve(&app, parts, body, peer, &request_id).await;
        }
        let body = match authenticated_body(&app, &parts, &path, body).await {
            Ok(b) => b,
            Err(e) => {
                debug!(error = %e, "request not authenticated");
                return e.into_response(&request_id);
            }
        };
        let Some(action) = route(&parts.method, &path) else {
            let e = match unimplemented::operation(parts.method.as_str(), &path) {
                Some(op) => ApiError::new(
                    StatusCode::NOT_IMPLEMENTED,
                    "UnknownOperationException",
                    format!("{op} is not implemented by this Thaw node ({} {path})", parts.method),
                ),
                None => ApiError::new(StatusCode::NOT_FOUND, "UnknownOperationException", format!("Unknown operation {} {path}", parts.method)),
            };
            return e.into_response(&request_id);
        };
        debug!(?action, "request");
        match dispatch(&app, action, parts.uri.query(), &parts.headers, body, &request_id).await {
            Ok(mut r) => {
                if let Ok(v) = HeaderValue::from_str(&request_id) {
                    r.headers_mut().entry("x-amzn-requestid").or_insert(v);
                }
                r
            }
            Err(e) => {
                if e.status.is_server_error() {
                    warn!(error = %e, "request failed");
                } else {
                    debug!(error = %e, "request rejected");
                }
                e.into_response(&request_id)
            }
        }
    }
    .instrument(span)
    .await
}

pub fn router(app: Arc<App>) -> axum::Router {
    axum::Router::new().fallback(handle).with_state(app)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(route(&Method::POST, "/2015-03-31/functions"), Some(Action::CreateFunction));
        assert_eq!(route(&Method::GET, "/2015-03-31/functions/"), Some(Action::ListFunctions));
        assert_eq!(route(&Method::GET, "/2015-03-31/functions/f%3A%24LATEST"), Some(Action::GetFunction("f:$LATEST".into())));
        assert_eq!(route(&Method::POST, "/2015-03-31/functions/f/invocations"), Some(Action::Invoke("f".into())));
        assert_eq!(route(&Method::PUT, "/2015-03-31/functions/f/code"), Some(Action::UpdateFunctionCode("f".into())));
        assert_eq!(route(&Method::GET, "/2015-03-31/functions/f/configuration"), Some(Action::GetFunctionConfiguration("f".into())));
        assert_eq!(route(&Method::DELETE, "/2015-03-31/functions/f"), Some(Action::DeleteFunction("f".into())));
        assert_eq!(route(&Method::GET, "/other"), None);
    }

    #[test]
    fn function_names() {
        assert_eq!(function_name("f", None).unwrap(), ("f".into(), None));
        assert_eq!(function_name("arn:aws:lambda:us-east-1:000000000000:function:f:$LATEST", None).unwrap(), ("f".into(), Some("$LATEST".into())));
        assert_eq!(function_name("000000000000:function:f", Some("1")).unwrap(), ("f".into(), Some("1".into())));
        assert!(function_name("bad name", None).is_err());
        assert!(function_name("f:1", Some("2")).is_err());
    }

    #[test]
    fn create_validation() {
        let err = |v: Value| create_spec(v.to_string().as_bytes()).unwrap_err();
        let base = json!({"FunctionName": "f", "Runtime": "python3.12", "Handler": "h.h", "Role": "r", "Code": {"ZipFile": "UEsFBgAAAAAAAAAAAAAAAAAAAAAAAA=="}});
        assert!(create_spec(base.to_string().as_bytes()).is_ok());
        for (rt, handler) in [("nodejs20.x", "index.handler"), ("java17", "example.Hello::handle"), ("java17", "example.Hello")] {
            let mut v = base.clone();
            v["Runtime"] = json!(rt);
            v["Handler"] = json!(handler);
            assert!(create_spec(v.to_string().as_bytes()).is_ok(), "{rt} {handler}");
        }
        let mut v = base.clone();
        v["Runtime"] = json!("java17");
        v["Handler"] = json!("example.Hello::");
        assert_eq!(err(v).message, "Value 'example.Hello::' at 'handler' failed to satisfy constraint: expected package.Class::method or package.Class for java17");
        let mut v = base.clone();
        v["Runtime"] = json!("ruby3.3");
        let e = err(v);
        assert_eq!((e.kind, e.status), ("InvalidParameterValueException", StatusCode::BAD_REQUEST));
        assert_eq!(e.message, "The runtime parameter of ruby3.3 is not supported by this node (supported: python3.11, python3.12, nodejs20.x, java17, provided.al2023, provided.al2).");
        let mut v = base.clone();
        v["MemorySize"] = json!(64);
        assert_eq!(err(v).kind, "InvalidParameterValueException");
        let mut v = base.clone();
        v["Environment"] = json!({"Variables": {"AWS_REGION": "x"}});
        assert!(err(v).message.ends_with("Reserved keys used in this request: AWS_REGION"));
        assert_eq!(create_spec(b"{").unwrap_err().kind, "InvalidRequestContentException");
    }
}
