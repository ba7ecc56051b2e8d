//! Function settings that are not baked into a snapshot (issue #16): reserved
//! concurrency (Put/Get/DeleteFunctionConcurrency) and tags (Tag/Untag/ListTags),
//! plus the node's limits as GetAccountSettings reports them. Persisted in the
//! registry's `function_settings` table; the reservation is enforced in
//! `Node::acquire` (a call beyond it gets TooManyRequestsException with reason
//! ReservedFunctionConcurrentInvocationLimitExceeded).

use std::collections::BTreeMap;

use thiserror::Error;

use super::Node;
use crate::registry::{FunctionSettings, RegistryError, UrlConfig};

/// Lambda's published limits for code size (the node enforces the unzipped one
/// when it unpacks a bundle, see bundle.rs).
const CODE_SIZE_ZIPPED: u64 = 50 * 1024 * 1024;
const CODE_SIZE_UNZIPPED: u64 = 250 * 1024 * 1024;
const TOTAL_CODE_SIZE: u64 = 75 * 1024 * 1024 * 1024;
/// At most 50 tags per function, keys up to 128 characters, values up to 256 (Lambda's limits).
const MAX_TAGS: usize = 50;

#[derive(Debug, Error)]
pub enum SettingsError {
    #[error("Function not found: {0}")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

/// GetAccountSettings, for this node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AccountSettings {
    pub concurrent_executions: u64,
    pub unreserved_concurrent_executions: u64,
    pub total_code_size: u64,
    pub function_count: u64,
    pub code_size_zipped: u64,
    pub code_size_unzipped: u64,
    pub total_code_size_limit: u64,
}

/// The URL configuration `arn` (a function's or an alias's) gets from CreateFunctionUrlConfig
/// (`create`) or UpdateFunctionUrlConfig (fields `None` kept), given what it had (`old`).
/// Shared by the node and the cluster's registry.
pub fn changed_url(arn: &str, old: Option<UrlConfig>, auth_type: Option<String>, cors: Option<serde_json::Value>, create: bool) -> Result<UrlConfig, SettingsError> {
    if let Some(a) = auth_type.as_deref().filter(|a| !["NONE", "AWS_IAM"].contains(a)) {
        return Err(SettingsError::Invalid(format!(
            "1 validation error detected: Value '{a}' at 'authType' failed to satisfy constraint: Member must satisfy enum value set: [NONE, AWS_IAM]"
        )));
    }
    let now = super::timestamp();
    match (old, create) {
        (Some(_), true) => Err(SettingsError::Conflict(format!(
            "Failed to create function url config for [functionArn = {arn}]. Error message:  FunctionUrlConfig exists for this Lambda function"
        ))),
        (None, false) => Err(SettingsError::NotFound(format!("The resource you requested does not exist. (Function URL of {arn})"))),
        (None, true) => Ok(UrlConfig {
            auth_type: auth_type.ok_or_else(|| SettingsError::Invalid("AuthType is required".into()))?,
            cors,
            creation_time: now.clone(),
            last_modified_time: now,
        }),
        (Some(old), false) => Ok(UrlConfig { auth_type: auth_type.unwrap_or(old.auth_type), cors: cors.or(old.cors), creation_time: old.creation_time, last_modified_time: now }),
    }
}

/// Lambda's rules for tags: keys of 1-128 characters not starting with `aws:`,
/// values of at most 256, at most 50 per function.
pub fn check_tags(tags: &BTreeMap<String, String>) -> Result<(), SettingsError> {
    if tags.len() > MAX_TAGS {
        return Err(SettingsError::Invalid(format!("A function can have at most {MAX_TAGS} tags.")));
    }
    for (k, v) in tags {
        if k.is_empty() || k.chars().count() > 128 || v.chars().count() > 256 || k.to_ascii_lowercase().starts_with("aws:") {
            return Err(SettingsError::Invalid(format!(
                "Tag '{k}': keys are 1-128 characters and may not start with 'aws:'; values are at most 256 characters."
            )));
        }
    }
    Ok(())
}

impl Node {
    /// Concurrency that always stays unreserved: a tenth of the node's
    /// `--max-instances`, at least 1 (Lambda keeps 100 of an account's 1,000).
    fn min_unreserved(&self) -> u64 {
        (self.cfg.max_instances as u64 / 10).max(1)
    }

    fn with_settings<T>(&self, name: &str, f: impl FnOnce(&mut FunctionSettings) -> Result<T, SettingsError>) -> Result<T, SettingsError> {
        let func = self.function(name).ok_or_else(|| SettingsError::NotFound(self.arn(name)))?;
        let mut st = func.lock();
        let mut next = st.settings.clone();
        let out = f(&mut next)?;
        self.registry.put_settings(name, &next)?;
        st.settings = next;
        Ok(out)
    }

    /// `SnapStart.ApplyOn` (CreateFunction, UpdateFunctionConfiguration): recorded and
    /// reported; Thaw snapshots every version whatever it says.
    pub fn set_snap_start(&self, name: &str, apply_on: &str) -> Result<(), SettingsError> {
        self.with_settings(name, |s| {
            s.snap_start = Some(apply_on.to_string());
            Ok(())
        })
    }

    pub fn settings(&self, name: &str) -> Result<FunctionSettings, SettingsError> {
        let func = self.function(name).ok_or_else(|| SettingsError::NotFound(self.arn(name)))?;
        let s = func.lock().settings.clone();
        Ok(s)
    }

    fn reserved_by_others(&self, name: &str) -> u64 {
        let fs: Vec<_> = self.functions_map().values().filter(|f| f.name != name).cloned().collect();
        fs.iter().filter_map(|f| f.lock().settings.reserved_concurrency).map(u64::from).sum()
    }

    /// PutFunctionConcurrency: at most `n` invocations of `name` run at once, and
    /// `n` of the node's concurrency is set aside for it.
    pub fn put_reserved_concurrency(&self, name: &str, n: u32) -> Result<u32, SettingsError> {
        let _one_at_a_time = self.reserving.lock().unwrap_or_else(|p| p.into_inner());
        let limit = self.cfg.max_instances as u64;
        let others = self.reserved_by_others(name);
        if others + u64::from(n) + self.min_unreserved() > limit {
            return Err(SettingsError::Invalid(format!(
                "Specified ReservedConcurrentExecutions for function decreases account's UnreservedConcurrentExecution below its minimum value of [{}].",
                self.min_unreserved()
            )));
        }
        self.with_settings(name, |s| {
            s.reserved_concurrency = Some(n);
            Ok(n)
        })
    }

    pub fn delete_reserved_concurrency(&self, name: &str) -> Result<(), SettingsError> {
        self.with_settings(name, |s| {
            s.reserved_concurrency = None;
            Ok(())
        })
    }

    /// TagResource: add or overwrite tags.
    pub fn tag(&self, name: &str, tags: &BTreeMap<String, String>) -> Result<(), SettingsError> {
        check_tags(tags)?;
        self.with_settings(name, |s| {
            let mut next = s.tags.clone();
            next.extend(tags.iter().map(|(k, v)| (k.clone(), v.clone())));
            if next.len() > MAX_TAGS {
                return Err(SettingsError::Invalid(format!("A function can have at most {MAX_TAGS} tags.")));
            }
            s.tags = next;
            Ok(())
        })
    }

    /// UntagResource: remove the given keys (absent ones are ignored, as Lambda does).
    pub fn untag(&self, name: &str, keys: &[String]) -> Result<(), SettingsError> {
        self.with_settings(name, |s| {
            for k in keys {
                s.tags.remove(k);
            }
            Ok(())
        })
    }

    /// Create (`create`) or update the URL configuration of the function's $LATEST
    /// (`alias` None) or of one of its aliases, which must exist.
    pub fn put_url(&self, name: &str, alias: Option<&str>, auth_type: Option<String>, cors: Option<serde_json::Value>, create: bool) -> Result<UrlConfig, SettingsError> {
        let arn = self.url_arn(name, alias);
        if let Some(a) = alias {
            self.alias(name, a).map_err(|_| SettingsError::NotFound(format!("The resource you requested does not exist. (Alias {a} of {})", self.arn(name))))?;
        }
        self.with_settings(name, |s| {
            let url = changed_url(&arn, s.take_url(alias), auth_type.clone(), cors.clone(), create)?;
            s.set_url(alias, url.clone());
            Ok(url)
        })
    }

    pub fn delete_url(&self, name: &str, alias: Option<&str>) -> Result<(), SettingsError> {
        let arn = self.url_arn(name, alias);
        self.with_settings(name, |s| match s.take_url(alias) {
            Some(_) => Ok(()),
            None => Err(SettingsError::NotFound(format!("The resource you requested does not exist. (Function URL of {arn})"))),
        })
    }

    /// The ARN a URL invokes: the function's, or its alias's.
    pub fn url_arn(&self, name: &str, alias: Option<&str>) -> String {
        super::qualified(&self.arn(name), alias)
    }

    pub fn account_settings(&self) -> AccountSettings {
        let records = self.records();
        let limit = self.cfg.max_instances as u64;
        AccountSettings {
            concurrent_executions: limit,
            unreserved_concurrent_executions: limit.saturating_sub(self.reserved_by_others("")),
            total_code_size: records.iter().map(|r| r.code_size).sum(),
            function_count: records.len() as u64,
            code_size_zipped: CODE_SIZE_ZIPPED,
            code_size_unzipped: CODE_SIZE_UNZIPPED,
            total_code_size_limit: TOTAL_CODE_SIZE,
        }
    }
}
