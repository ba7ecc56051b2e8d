//! PublishVersion, ListVersionsByFunction, Create/Get/Update/Delete/ListAliases and
//! the version or alias qualifier of GetFunction, GetFunctionConfiguration, Invoke and
//! DeleteFunction (issue #16; the node side is `node/versions.rs`). An invocation
//! through an alias runs its version, or an additional version with its weight's
//! probability; the answer's `X-Amz-Executed-Version` says which.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{configuration, json_response, parse_json, ApiError};
use std::sync::Arc;

use super::{function_name, Action};
use crate::node::{AliasChange, Node, ProvisionedView, VersionError, VersionView, LATEST};
use crate::registry::{AliasRecord, FunctionRecord};
use std::collections::BTreeMap;

impl From<VersionError> for ApiError {
    fn from(e: VersionError) -> ApiError {
        match e {
            VersionError::NotFound(_) => ApiError::not_found(e.to_string()),
            VersionError::Conflict(_) => ApiError::new(StatusCode::CONFLICT, "ResourceConflictException", e.to_string()),
            VersionError::Precondition(_) => ApiError::new(StatusCode::PRECONDITION_FAILED, "PreconditionFailedException", e.to_string()),
            VersionError::Invalid(_) => ApiError::invalid(e.to_string()),
            VersionError::Registry(_) => ApiError::service(crate::node::error_chain(&e)),
        }
    }
}

/// What a qualifier names.
pub(super) enum Target {
    Latest,
    Version(u64),
    Alias(String),
}

/// Resolve a qualifier (from the ARN or `Qualifier`): `$LATEST`, a version number, or
/// (not yet supported) an alias, reported as not found like any unknown qualifier.
pub(super) fn target(node: &Node, name: &str, q: Option<&str>) -> Result<Target, ApiError> {
    match q {
        None | Some("$LATEST") => Ok(Target::Latest),
        Some(v) if !v.is_empty() && v.bytes().all(|b| b.is_ascii_digit()) => match v.parse::<u64>() {
            Ok(n) if n > 0 => Ok(Target::Version(n)),
            _ => Err(ApiError::not_found(format!("Function not found: {}:{v}", node.arn(name)))),
        },
        Some(a) => Ok(Target::Alias(a.to_string())),
    }
}

/// The version a target runs now (`None`: $LATEST); an alias is routed by its weights.
pub(super) fn version_of(node: &Node, name: &str, t: &Target) -> Result<Option<u64>, ApiError> {
    Ok(match t {
        Target::Latest => None,
        Target::Version(v) => Some(*v),
        Target::Alias(a) => Some(node.route_alias(name, a)?).filter(|v| *v != LATEST),
    })
}

/// The configuration GetFunction reports for a target (an alias: its version's).
pub(super) fn configuration_of(node: &Node, latest: &FunctionRecord, t: &Target) -> Result<Value, ApiError> {
    Ok(match t {
        Target::Latest => configuration(node, latest),
        Target::Version(v) => version_configuration(node, latest, &node.version(&latest.name, *v)?),
        Target::Alias(a) => match node.alias(&latest.name, a)?.version {
            LATEST => configuration(node, latest),
            v => version_configuration(node, latest, &node.version(&latest.name, v)?),
        },
    })
}

/// An alias as the Lambda API shows it (`function_arn`: its function's ARN).
pub fn alias_json(function_arn: &str, a: &AliasRecord) -> Value {
    let mut v = json!({
        "AliasArn": format!("{function_arn}:{}", a.name),
        "Name": a.name,
        "FunctionVersion": if a.version == LATEST { "$LATEST".to_string() } else { a.version.to_string() },
        "Description": a.description,
        "RevisionId": a.revision_id,
    });
    if !a.weights.is_empty() {
        let w: serde_json::Map<String, Value> = a.weights.iter().map(|(k, w)| (k.to_string(), json!(w))).collect();
        v["RoutingConfig"] = json!({"AdditionalVersionWeights": w});
    }
    v
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct RoutingInput {
    additional_version_weights: Option<BTreeMap<String, f64>>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct AliasInput {
    name: Option<String>,
    function_version: Option<String>,
    description: Option<String>,
    routing_config: Option<RoutingInput>,
    revision_id: Option<String>,
}

fn version_number(arn: &str, v: &str) -> Result<u64, ApiError> {
    match v.parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ if v == "$LATEST" => Err(ApiError::invalid("$LATEST cannot take a share of an alias's routing; publish a version.")),
        _ => Err(ApiError::not_found(format!("Function not found: {arn}:{v}"))),
    }
}

/// A CreateAlias (`alias` None: the name is in the body) or UpdateAlias request of the
/// function `arn`: (the alias's name, what it asks for, whether it creates).
pub fn alias_request(arn: &str, alias: Option<&str>, body: &[u8]) -> Result<(String, AliasChange, bool), ApiError> {
    let i: AliasInput = parse_json(body)?;
    let create = alias.is_none();
    let alias = match alias {
        Some(a) => a.to_string(),
        None => i.name.clone().ok_or_else(|| ApiError::invalid("Name is required"))?,
    };
    let version = i.function_version.as_deref().map(|v| if v == "$LATEST" { Ok(LATEST) } else { version_number(arn, v) }).transpose()?;
    let weights: Option<BTreeMap<u64, f64>> = i
        .routing_config
        .map(|r| r.additional_version_weights.unwrap_or_default().iter().map(|(k, w)| Ok::<_, ApiError>((version_number(arn, k)?, *w))).collect())
        .transpose()?;
    Ok((alias, AliasChange { version, description: i.description, weights, revision_id: i.revision_id }, create))
}

/// CreateAlias (`alias` None: the name is in the body) or UpdateAlias.
pub(super) fn put_alias(node: &Node, name: &str, alias: Option<&str>, body: &[u8]) -> Result<Response, ApiError> {
    let (alias, change, create) = alias_request(&node.arn(name), alias, body)?;
    let a = node.put_alias(name, &alias, change, create)?;
    Ok(json_response(if create { StatusCode::CREATED } else { StatusCode::OK }, &alias_json(&node.arn(name), &a)))
}

pub(super) fn get_alias(node: &Node, name: &str, alias: &str) -> Result<Response, ApiError> {
    Ok(json_response(StatusCode::OK, &alias_json(&node.arn(name), &node.alias(name, alias)?)))
}

/// ListAliases' answer: the aliases of the function `function_arn`, those routing to
/// `function_version` when given.
pub fn aliases_json<'a>(function_arn: &str, aliases: impl IntoIterator<Item = &'a AliasRecord>, function_version: Option<&str>) -> Value {
    let all: Vec<Value> = aliases.into_iter().map(|a| alias_json(function_arn, a)).filter(|a| function_version.is_none_or(|v| a["FunctionVersion"] == v)).collect();
    json!({"Aliases": all})
}

pub(super) fn list_aliases(node: &Node, name: &str, function_version: Option<&str>) -> Result<Response, ApiError> {
    Ok(json_response(StatusCode::OK, &aliases_json(&node.arn(name), &node.aliases(name)?, function_version)))
}

pub(super) fn delete_alias(node: &Node, name: &str, alias: &str) -> Result<Response, ApiError> {
    node.delete_alias(name, alias)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// A version's FunctionConfiguration: the function's, with what the version froze.
pub(super) fn version_configuration(node: &Node, latest: &FunctionRecord, v: &VersionView) -> Value {
    let mut c = configuration(node, latest);
    let r = &v.revision;
    c["FunctionArn"] = json!(format!("{}:{}", node.arn(&latest.name), v.version.version));
    c["Version"] = json!(v.version.version.to_string());
    c["Runtime"] = json!(r.runtime);
    c["Handler"] = json!(r.handler);
    c["MemorySize"] = json!(r.memory_mb);
    c["CodeSha256"] = json!(r.code_sha256);
    c["CodeSize"] = json!(r.code_size);
    c["Timeout"] = json!(v.version.timeout_s);
    c["Description"] = json!(v.version.description);
    c["RevisionId"] = json!(v.version.revision_id);
    c["LastModified"] = json!(v.version.last_modified);
    c["State"] = json!("Active");
    c["LastUpdateStatus"] = json!("Successful");
    // Thaw serves every version from its own snapshot.
    c["SnapStart"] = json!({"ApplyOn": "PublishedVersions", "OptimizationStatus": "On"});
    let m = c.as_object_mut().expect("an object");
    for k in ["StateReason", "StateReasonCode", "LastUpdateStatusReason", "LastUpdateStatusReasonCode", "Environment", "Layers"] {
        m.remove(k);
    }
    if !r.env.is_empty() {
        c["Environment"] = json!({"Variables": r.env});
    }
    if !r.layers.is_empty() {
        c["Layers"] = super::layers::function_layers(node, &r.layers);
    }
    super::mark_unsnapshotted(&mut c, &r.runtime);
    c
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "PascalCase")]
struct PublishInput {
    code_sha256: Option<String>,
    description: Option<String>,
    revision_id: Option<String>,
}

pub(super) fn publish(node: &Node, name: &str, body: &[u8]) -> Result<Response, ApiError> {
    let input: PublishInput = if body.is_empty() { PublishInput::default() } else { parse_json(body)? };
    let latest = node.record(name).ok_or_else(|| ApiError::not_found(format!("Function not found: {}", node.arn(name))))?;
    let v = node.publish_version(name, input.description, input.code_sha256.as_deref(), input.revision_id.as_deref())?;
    Ok(json_response(StatusCode::CREATED, &version_configuration(node, &latest, &v)))
}

pub(super) fn list(node: &Node, name: &str) -> Result<Response, ApiError> {
    let latest = node.record(name).ok_or_else(|| ApiError::not_found(format!("Function not found: {}", node.arn(name))))?;
    let mut all = vec![configuration(node, &latest)];
    all.extend(node.versions(name)?.iter().map(|v| version_configuration(node, &latest, v)));
    Ok(json_response(StatusCode::OK, &json!({"Versions": all})))
}

pub(super) fn delete(node: &Node, name: &str, version: u64) -> Result<Response, ApiError> {
    node.delete_version(name, version)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

fn provisioned_json(node: &Node, name: &str, p: &ProvisionedView, with_arn: bool) -> Value {
    let mut v = json!({
        "RequestedProvisionedConcurrentExecutions": p.requested,
        "AvailableProvisionedConcurrentExecutions": p.allocated,
        "AllocatedProvisionedConcurrentExecutions": p.allocated,
        "Status": p.status,
        "LastModified": p.last_modified,
    });
    if let Some(r) = &p.reason {
        v["StatusReason"] = json!(r);
    }
    if with_arn {
        v["FunctionArn"] = json!(format!("{}:{}", node.arn(name), p.version));
    }
    v
}

/// The version a provisioned-concurrency call names (a version or an alias, not $LATEST).
fn provisioned_version(node: &Node, name: &str, q: Option<&str>) -> Result<u64, ApiError> {
    match q.map(|q| target(node, name, Some(q))).transpose()? {
        Some(Target::Version(v)) => Ok(v),
        Some(Target::Alias(a)) => match node.alias(name, &a)?.version {
            LATEST => Err(ApiError::invalid("Provisioned concurrency cannot be configured on an alias of $LATEST.")),
            v => Ok(v),
        },
        _ => Err(ApiError::invalid("Provisioned concurrency applies to a published version or an alias: give a Qualifier other than $LATEST.")),
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct ProvisionedInput {
    provisioned_concurrent_executions: i64,
}

pub(super) fn provisioned(node: &Arc<Node>, action: Action, raw_query: Option<&str>, body: &[u8]) -> Result<Response, ApiError> {
    let q = |k| super::query_param(raw_query, k);
    match action {
        Action::PutProvisionedConcurrency(n) => {
            let (name, nq) = function_name(&n, None)?;
            let v = provisioned_version(node, &name, nq.or(q("Qualifier")).as_deref())?;
            let i: ProvisionedInput = parse_json(body)?;
            let count = usize::try_from(i.provisioned_concurrent_executions).map_err(|_| ApiError::invalid("ProvisionedConcurrentExecutions must be at least 1"))?;
            let p = node.put_provisioned(&name, v, count)?;
            Ok(json_response(StatusCode::ACCEPTED, &provisioned_json(node, &name, &p, false)))
        }
        Action::GetProvisionedConcurrency(n) if q("List").is_some() => {
            let (name, _) = function_name(&n, None)?;
            let all: Vec<Value> = node.provisioned_all(&name)?.iter().map(|p| provisioned_json(node, &name, p, true)).collect();
            Ok(json_response(StatusCode::OK, &json!({"ProvisionedConcurrencyConfigs": all})))
        }
        Action::GetProvisionedConcurrency(n) => {
            let (name, nq) = function_name(&n, None)?;
            let v = provisioned_version(node, &name, nq.or(q("Qualifier")).as_deref())?;
            Ok(json_response(StatusCode::OK, &provisioned_json(node, &name, &node.provisioned(&name, v)?, false)))
        }
        Action::DeleteProvisionedConcurrency(n) => {
            let (name, nq) = function_name(&n, None)?;
            let v = provisioned_version(node, &name, nq.or(q("Qualifier")).as_deref())?;
            node.delete_provisioned(&name, v)?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        other => Err(ApiError::service(format!("{other:?} is not a provisioned concurrency operation"))),
    }
}
