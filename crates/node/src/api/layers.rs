//! Lambda's layer operations (issue #16) on the paths boto3 and the AWS CLI use
//! (API version 2018-10-31): PublishLayerVersion, GetLayerVersion,
//! GetLayerVersionByArn, ListLayerVersions, ListLayers, DeleteLayerVersion. The node
//! side is `node/layer_versions.rs`.

use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};

use super::{decode, decode_zip, json_response, parse_json, query_param, segments, Action, ApiError, CodeInput};
use crate::node::{error_chain, LayerError, Node, PublishLayer};
use crate::registry::LayerVersionRecord;

impl From<LayerError> for ApiError {
    fn from(e: LayerError) -> ApiError {
        match &e {
            LayerError::NotFound(_) => ApiError::not_found(e.to_string()),
            LayerError::Invalid(_) => ApiError::invalid(e.to_string()),
            LayerError::Bundle(b) => match b {
                crate::bundle::BundleError::Write { .. } => ApiError::service(error_chain(&e)),
                _ => ApiError::invalid(e.to_string()),
            },
            LayerError::Registry(_) | LayerError::Io { .. } | LayerError::Join(_) => ApiError::service(error_chain(&e)),
        }
    }
}

/// The layer operations' routes (None: not one of them).
pub(super) fn route(method: &Method, raw_path: &str) -> Option<Action> {
    let segs = segments(raw_path);
    match (method.as_str(), segs.as_slice()) {
        ("GET", ["2018-10-31", "layers"]) => Some(Action::ListLayers),
        ("POST", ["2018-10-31", "layers", l, "versions"]) => Some(Action::PublishLayerVersion(decode(l))),
        ("GET", ["2018-10-31", "layers", l, "versions"]) => Some(Action::ListLayerVersions(decode(l))),
        ("GET", ["2018-10-31", "layers", l, "versions", v]) => Some(Action::GetLayerVersion(decode(l), decode(v))),
        ("DELETE", ["2018-10-31", "layers", l, "versions", v]) => Some(Action::DeleteLayerVersion(decode(l), decode(v))),
        _ => None,
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "PascalCase")]
struct PublishInput {
    content: Option<CodeInput>,
    description: Option<String>,
    #[serde(default)]
    compatible_runtimes: Vec<String>,
    #[serde(default)]
    compatible_architectures: Vec<String>,
    license_info: Option<String>,
}

/// Lambda's LayerVersionsListItem of `l`, whose version ARN is `version_arn`.
pub fn layer_list_item(version_arn: &str, l: &LayerVersionRecord) -> Value {
    let mut v = json!({
        "LayerVersionArn": version_arn,
        "Version": l.version,
        "Description": l.description,
        "CreatedDate": l.created,
        "CompatibleRuntimes": l.compatible_runtimes,
        "CompatibleArchitectures": l.compatible_architectures,
    });
    if let Some(lic) = &l.license_info {
        v["LicenseInfo"] = json!(lic);
    }
    v
}

/// GetLayerVersion's (and PublishLayerVersion's) answer for `l` of the layer `layer_arn`.
pub fn layer_version_answer(layer_arn: &str, l: &LayerVersionRecord) -> Value {
    let mut v = layer_list_item(&format!("{layer_arn}:{}", l.version), l);
    v["LayerArn"] = json!(layer_arn);
    // Lambda answers a presigned S3 URL; Thaw keeps the files (or the zip in its store).
    v["Content"] = json!({"Location": "", "CodeSha256": l.code_sha256, "CodeSize": l.code_size});
    v
}

fn list_item(node: &Node, l: &LayerVersionRecord) -> Value {
    layer_list_item(&node.layer_version_arn(&l.name, l.version), l)
}

fn version_answer(node: &Node, l: &LayerVersionRecord) -> Value {
    layer_version_answer(&node.layer_arn(&l.name), l)
}

/// A function's `Layers` as its configuration reports them (a deleted version keeps
/// its ARN, with size 0: the function still has its copy).
pub(super) fn function_layers(node: &Node, arns: &[String]) -> Value {
    let size = |a: &String| node.resolve_layers(std::slice::from_ref(a)).ok().and_then(|l| l.first().map(|l| l.code_size));
    let list: Vec<Value> = arns.iter().map(|a| json!({"Arn": a, "CodeSize": size(a).unwrap_or(0)})).collect();
    json!(list)
}

/// The `Marker`/`MaxItems` page of `items` (the marker is the key of the last item of
/// the previous page), and the next page's marker.
pub fn page<T>(items: Vec<T>, raw_query: Option<&str>, key: impl Fn(&T) -> String) -> Result<(Vec<T>, Option<String>), ApiError> {
    let max = match query_param(raw_query, "MaxItems") {
        Some(m) => m.parse::<usize>().ok().filter(|n| (1..=50).contains(n)).ok_or_else(|| ApiError::invalid("MaxItems must be between 1 and 50"))?,
        None => 50,
    };
    let start = match query_param(raw_query, "Marker") {
        Some(m) => items.iter().position(|i| key(i) == m).map(|p| p + 1).ok_or_else(|| ApiError::invalid(format!("Invalid Marker: {m}")))?,
        None => 0,
    };
    let more = items.len() > start + max;
    let page: Vec<T> = items.into_iter().skip(start).take(max).collect();
    let next = if more { page.last().map(&key) } else { None };
    Ok((page, next))
}

/// Whether a layer version matches the `CompatibleRuntime` / `CompatibleArchitecture` filters.
pub fn layer_matches(l: &LayerVersionRecord, runtime: Option<&str>, arch: Option<&str>) -> bool {
    runtime.is_none_or(|r| l.compatible_runtimes.iter().any(|c| c == r))
        && arch.is_none_or(|a| l.compatible_architectures.iter().any(|c| c == a))
}

pub fn layer_version_number(v: &str) -> Result<u64, ApiError> {
    v.parse::<u64>()
        .ok()
        .filter(|n| *n >= 1)
        .ok_or_else(|| ApiError::invalid(format!("1 validation error detected: Value '{v}' at 'versionNumber' failed to satisfy constraint: Member must be a positive number")))
}

/// PublishLayerVersion's body: the zip and what is published with it.
pub fn publish_layer_request(body: &[u8]) -> Result<(Vec<u8>, PublishLayer), ApiError> {
    let input: PublishInput = parse_json(body)?;
    let content = input.content.ok_or_else(|| ApiError::invalid("Content is required to publish a layer version."))?;
    let zip = decode_zip(content.zip_file, content.s3_bucket, content.image_uri)?;
    if input.compatible_runtimes.len() > 15 {
        return Err(ApiError::invalid("CompatibleRuntimes must have at most 15 entries."));
    }
    if input.compatible_architectures.iter().any(|a| a != "x86_64" && a != "arm64") {
        return Err(ApiError::invalid("CompatibleArchitectures must be x86_64 or arm64."));
    }
    let p = PublishLayer {
        description: input.description.unwrap_or_default(),
        compatible_runtimes: input.compatible_runtimes,
        compatible_architectures: input.compatible_architectures,
        license_info: input.license_info,
    };
    Ok((zip, p))
}

pub(super) async fn dispatch(node: &Node, action: Action, raw_query: Option<&str>, body: &[u8]) -> Result<Response, ApiError> {
    match action {
        Action::PublishLayerVersion(l) => {
            let name = node.layer_name(&l)?;
            let (zip, p) = publish_layer_request(body)?;
            let rec = node.publish_layer_version(&name, zip, p).await?;
            Ok(json_response(StatusCode::CREATED, &version_answer(node, &rec)))
        }
        Action::GetLayerVersion(l, v) => {
            let rec = node.layer_version(&node.layer_name(&l)?, layer_version_number(&v)?)?;
            Ok(json_response(StatusCode::OK, &version_answer(node, &rec)))
        }
        Action::DeleteLayerVersion(l, v) => {
            node.delete_layer_version(&node.layer_name(&l)?, layer_version_number(&v)?)?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        Action::ListLayerVersions(l) => {
            let name = node.layer_name(&l)?;
            let (runtime, arch) = (query_param(raw_query, "CompatibleRuntime"), query_param(raw_query, "CompatibleArchitecture"));
            let all: Vec<LayerVersionRecord> =
                node.layer_versions(&name)?.into_iter().filter(|r| layer_matches(r, runtime.as_deref(), arch.as_deref())).collect();
            let (items, next) = page(all, raw_query, |r| r.version.to_string())?;
            let mut v = json!({"LayerVersions": items.iter().map(|r| list_item(node, r)).collect::<Vec<_>>()});
            if let Some(n) = next {
                v["NextMarker"] = json!(n);
            }
            Ok(json_response(StatusCode::OK, &v))
        }
        Action::ListLayers => {
            // GetLayerVersionByArn shares this path: `?find=LayerVersion&Arn=...`.
            if query_param(raw_query, "find").as_deref() == Some("LayerVersion") {
                let arn = query_param(raw_query, "Arn").ok_or_else(|| ApiError::invalid("Arn is required."))?;
                let (prefix, v) = arn.rsplit_once(':').ok_or_else(|| ApiError::invalid(format!("Invalid layer version ARN: {arn}")))?;
                let rec = node.layer_version(&node.layer_name(prefix)?, layer_version_number(v)?)?;
                return Ok(json_response(StatusCode::OK, &version_answer(node, &rec)));
            }
            let (runtime, arch) = (query_param(raw_query, "CompatibleRuntime"), query_param(raw_query, "CompatibleArchitecture"));
            let all = node.layers(|l| layer_matches(l, runtime.as_deref(), arch.as_deref()))?;
            let (items, next) = page(all, raw_query, |l| l.name.clone())?;
            let list: Vec<Value> = items
                .iter()
                .map(|l| json!({"LayerName": l.name, "LayerArn": node.layer_arn(&l.name), "LatestMatchingVersion": list_item(node, l)}))
                .collect();
            let mut v = json!({"Layers": list});
            if let Some(n) = next {
                v["NextMarker"] = json!(n);
            }
            Ok(json_response(StatusCode::OK, &v))
        }
        other => Err(ApiError::service(format!("not a layer operation: {other:?}"))),
    }
}
