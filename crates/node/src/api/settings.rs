//! Lambda operations on function settings outside the snapshot and on the account
//! (issue #16): TagResource, UntagResource, ListTags, Put/Get/DeleteFunctionConcurrency,
//! GetAccountSettings, each on the path and API version boto3 and the AWS CLI use.

use axum::http::{Method, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::{decode, function_name, json_response, parse_json, query_values, segments, Action, ApiError};
use crate::node::{Node, SettingsError};

impl From<SettingsError> for ApiError {
    fn from(e: SettingsError) -> ApiError {
        match e {
            SettingsError::NotFound(_) => ApiError::not_found(e.to_string()),
            SettingsError::Invalid(_) => ApiError::invalid(e.to_string()),
            SettingsError::Conflict(_) => ApiError::new(StatusCode::CONFLICT, "ResourceConflictException", e.to_string()),
            SettingsError::Registry(_) => ApiError::service(crate::node::error_chain(&e)),
        }
    }
}

/// The settings operations' routes (None: not one of them).
pub(super) fn route(method: &Method, raw_path: &str) -> Option<Action> {
    let segs = segments(raw_path);
    match (method.as_str(), segs.as_slice()) {
        ("GET", ["2016-08-19", "account-settings"]) => Some(Action::GetAccountSettings),
        ("POST", ["2017-03-31", "tags", arn]) => Some(Action::TagResource(decode(arn))),
        ("DELETE", ["2017-03-31", "tags", arn]) => Some(Action::UntagResource(decode(arn))),
        ("GET", ["2017-03-31", "tags", arn]) => Some(Action::ListTags(decode(arn))),
        ("PUT", ["2017-10-31", "functions", n, "concurrency"]) => Some(Action::PutFunctionConcurrency(decode(n))),
        ("DELETE", ["2017-10-31", "functions", n, "concurrency"]) => Some(Action::DeleteFunctionConcurrency(decode(n))),
        ("GET", ["2019-09-30", "functions", n, "concurrency"]) => Some(Action::GetFunctionConcurrency(decode(n))),
        ("PUT", ["2019-09-30", "functions", n, "provisioned-concurrency"]) => Some(Action::PutProvisionedConcurrency(decode(n))),
        ("GET", ["2019-09-30", "functions", n, "provisioned-concurrency"]) => Some(Action::GetProvisionedConcurrency(decode(n))),
        ("DELETE", ["2019-09-30", "functions", n, "provisioned-concurrency"]) => Some(Action::DeleteProvisionedConcurrency(decode(n))),
        _ => None,
    }
}

#[derive(Deserialize)]
struct ConcurrencyInput {
    #[serde(rename = "ReservedConcurrentExecutions")]
    reserved: Option<i64>,
}

/// A tagged resource is a function, named by its (unqualified) ARN.
/// The function a TagResource / UntagResource / ListTags ARN names (a qualified one is refused).
pub fn tagged_function(arn: &str) -> Result<String, ApiError> {
    match function_name(arn, None)? {
        (name, None) => Ok(name),
        (_, Some(_)) => Err(ApiError::invalid(format!("Tags apply to a function, not to a qualified ARN: {arn}"))),
    }
}

/// The ReservedConcurrentExecutions of a PutFunctionConcurrency body (the node's and
/// the gateway's).
pub fn reserved_concurrency_request(body: &[u8]) -> Result<u32, ApiError> {
    let input: ConcurrencyInput = parse_json(body)?;
    match input.reserved {
        Some(v) if (0..=i64::from(u32::MAX)).contains(&v) => Ok(v as u32),
        Some(v) => Err(ApiError::invalid(format!("1 validation error detected: Value '{v}' at 'reservedConcurrentExecutions' failed to satisfy constraint: Member must have value greater than or equal to 0"))),
        None => Err(ApiError::invalid("ReservedConcurrentExecutions is required")),
    }
}

/// `tags` and `Concurrency` of GetFunction's answer, as Lambda adds them.
pub(super) fn extend_get_function(node: &Node, name: &str, v: &mut serde_json::Value) {
    if let Ok(s) = node.settings(name) {
        if !s.tags.is_empty() {
            v["Tags"] = json!(s.tags);
        }
        if let Some(n) = s.reserved_concurrency {
            v["Concurrency"] = json!({"ReservedConcurrentExecutions": n});
        }
    }
}

pub(super) fn dispatch(node: &Node, action: Action, raw_query: Option<&str>, body: &[u8]) -> Result<Response, ApiError> {
    match action {
        Action::GetAccountSettings => {
            let a = node.account_settings();
            Ok(json_response(
                StatusCode::OK,
                &json!({
                    "AccountLimit": {
                        "TotalCodeSize": a.total_code_size_limit,
                        "CodeSizeUnzipped": a.code_size_unzipped,
                        "CodeSizeZipped": a.code_size_zipped,
                        "ConcurrentExecutions": a.concurrent_executions,
                        "UnreservedConcurrentExecutions": a.unreserved_concurrent_executions,
                    },
                    "AccountUsage": {"TotalCodeSize": a.total_code_size, "FunctionCount": a.function_count},
                }),
            ))
        }
        Action::TagResource(arn) => {
            node.tag(&tagged_function(&arn)?, &super::tags_in(body)?)?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        Action::UntagResource(arn) => {
            node.untag(&tagged_function(&arn)?, &query_values(raw_query, "tagKeys"))?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        Action::ListTags(arn) => {
            let s = node.settings(&tagged_function(&arn)?)?;
            Ok(json_response(StatusCode::OK, &json!({"Tags": s.tags})))
        }
        Action::PutFunctionConcurrency(n) => {
            let (name, _) = function_name(&n, None)?;
            let n = node.put_reserved_concurrency(&name, reserved_concurrency_request(body)?)?;
            Ok(json_response(StatusCode::OK, &json!({"ReservedConcurrentExecutions": n})))
        }
        Action::GetFunctionConcurrency(n) => {
            let (name, _) = function_name(&n, None)?;
            let v = match node.settings(&name)?.reserved_concurrency {
                Some(r) => json!({"ReservedConcurrentExecutions": r}),
                None => json!({}),
            };
            Ok(json_response(StatusCode::OK, &v))
        }
        Action::DeleteFunctionConcurrency(n) => {
            let (name, _) = function_name(&n, None)?;
            node.delete_reserved_concurrency(&name)?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        other => Err(ApiError::service(format!("{other:?} is not a settings operation"))),
    }
}
