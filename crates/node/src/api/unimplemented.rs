//! Lambda operations this node does not implement, by the method and path the SDKs
//! and the AWS CLI send, so a request for one is answered with Lambda's error shape
//! and a message naming the operation (issue #16) rather than a bare "unknown path".

/// (method, path pattern, operation). `*` matches one path segment.
const OPERATIONS: &[(&str, &str, &str)] = &[
    ("POST", "/2015-03-31/functions/*/policy", "AddPermission"),
    ("GET", "/2015-03-31/functions/*/policy", "GetPolicy"),
    ("DELETE", "/2015-03-31/functions/*/policy/*", "RemovePermission"),
    ("POST", "/2018-10-31/layers/*/versions/*/policy", "AddLayerVersionPermission"),
    ("GET", "/2018-10-31/layers/*/versions/*/policy", "GetLayerVersionPolicy"),
    ("DELETE", "/2018-10-31/layers/*/versions/*/policy/*", "RemoveLayerVersionPermission"),
    ("POST", "/2015-03-31/event-source-mappings", "CreateEventSourceMapping"),
    ("GET", "/2015-03-31/event-source-mappings", "ListEventSourceMappings"),
    ("GET", "/2015-03-31/event-source-mappings/*", "GetEventSourceMapping"),
    ("PUT", "/2015-03-31/event-source-mappings/*", "UpdateEventSourceMapping"),
    ("DELETE", "/2015-03-31/event-source-mappings/*", "DeleteEventSourceMapping"),
    ("POST", "/2020-04-22/code-signing-configs", "CreateCodeSigningConfig"),
    ("GET", "/2020-04-22/code-signing-configs", "ListCodeSigningConfigs"),
    ("GET", "/2020-04-22/code-signing-configs/*", "GetCodeSigningConfig"),
    ("PUT", "/2020-04-22/code-signing-configs/*", "UpdateCodeSigningConfig"),
    ("DELETE", "/2020-04-22/code-signing-configs/*", "DeleteCodeSigningConfig"),
    ("GET", "/2020-04-22/code-signing-configs/*/functions", "ListFunctionsByCodeSigningConfig"),
    ("PUT", "/2020-06-30/functions/*/code-signing-config", "PutFunctionCodeSigningConfig"),
    ("GET", "/2020-06-30/functions/*/code-signing-config", "GetFunctionCodeSigningConfig"),
    ("DELETE", "/2020-06-30/functions/*/code-signing-config", "DeleteFunctionCodeSigningConfig"),
    ("PUT", "/2019-09-25/functions/*/event-invoke-config", "PutFunctionEventInvokeConfig"),
    ("POST", "/2019-09-25/functions/*/event-invoke-config", "UpdateFunctionEventInvokeConfig"),
    ("GET", "/2019-09-25/functions/*/event-invoke-config", "GetFunctionEventInvokeConfig"),
    ("DELETE", "/2019-09-25/functions/*/event-invoke-config", "DeleteFunctionEventInvokeConfig"),
    ("GET", "/2019-09-25/functions/*/event-invoke-config/list", "ListFunctionEventInvokeConfigs"),
    ("PUT", "/2021-07-20/functions/*/runtime-management-config", "PutRuntimeManagementConfig"),
    ("GET", "/2021-07-20/functions/*/runtime-management-config", "GetRuntimeManagementConfig"),
    ("PUT", "/2024-08-31/functions/*/recursion-config", "PutFunctionRecursionConfig"),
    ("GET", "/2024-08-31/functions/*/recursion-config", "GetFunctionRecursionConfig"),
    ("POST", "/2014-11-13/functions/*/invoke-async", "InvokeAsync"),
    ("POST", "/2021-11-15/functions/*/response-streaming-invocations", "InvokeWithResponseStream"),
];

/// The Lambda operation a request names, when it is one this node does not implement.
pub(super) fn operation(method: &str, raw_path: &str) -> Option<&'static str> {
    let segs: Vec<&str> = raw_path.trim_matches('/').split('/').collect();
    OPERATIONS.iter().find_map(|(m, pattern, op)| {
        let pat: Vec<&str> = pattern.trim_matches('/').split('/').collect();
        let matches = *m == method && pat.len() == segs.len() && pat.iter().zip(&segs).all(|(p, s)| *p == "*" || p == s);
        matches.then_some(*op)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_operation_by_method_and_path() {
        assert_eq!(operation("POST", "/2015-03-31/functions/f/policy"), Some("AddPermission"));
        assert_eq!(operation("GET", "/2015-03-31/functions/f/policy"), Some("GetPolicy"));
        assert_eq!(operation("DELETE", "/2015-03-31/functions/f/policy/sid"), Some("RemovePermission"));
        assert_eq!(operation("GET", "/2019-09-25/functions/f/event-invoke-config/list"), Some("ListFunctionEventInvokeConfigs"));
        assert_eq!(operation("PUT", "/2015-03-31/functions/f/policy"), None);
        assert_eq!(operation("GET", "/nothing/here"), None);
        // Every pattern is reachable and names one operation.
        for (m, p, op) in OPERATIONS {
            assert_eq!(operation(m, &p.replace('*', "x")), Some(*op), "{m} {p}");
        }
    }
}
