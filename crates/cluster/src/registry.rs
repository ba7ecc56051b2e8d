//! The cluster's function registry (issue #29): one ThawFunction object per function
//! (deploy/base/crd-thawfunction.yaml) in the apiserver, its code bundle in the
//! snapshot store (`thaw_store::bundle`). The agents deploy what it holds
//! ([`crate::follow`]); the gateway writes it for the Lambda API's CreateFunction,
//! UpdateFunctionCode, UpdateFunctionConfiguration and DeleteFunction and reads it for GetFunction and
//! ListFunctions ([`Registry`]). This module is the vocabulary both sides share.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::StatusCode;
use base64::Engine;
use kube::api::{DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Api, Client};
use serde_json::{json, Value};
use thaw_node::api::ApiError;
use thaw_node::node::FunctionSpec;

/// What the description of a function deployed from the registry starts with.
pub const MARKER: &str = "ThawFunction ";

/// The Ready condition's reason for a function served by cold boots (its runtime cannot
/// be snapshotted): deployed, and no snapshot will be published.
pub const COLD_BOOT: &str = "ColdBoot";

pub fn thawfunction_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("thaw.dev", "v1alpha1", "ThawFunction"), "thawfunctions")
}

/// A function as its ThawFunction describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Wanted {
    pub name: String,
    pub runtime: String,
    pub handler: String,
    pub memory_mb: u64,
    pub timeout_s: u64,
    pub env: BTreeMap<String, String>,
    /// The bundle in the store, and its SHA-256 (hex).
    pub key: String,
    pub sha256: String,
    /// `ThawFunction NAMESPACE/NAME`, the deployed function's description.
    pub description: String,
    pub namespace: String,
    /// The object's generation (its spec's version).
    pub generation: i64,
    /// A stored snapshot of this very generation to serve from instead of building
    /// one: pinned (`spec.snapshotManifest`), or published by the builder
    /// (`status.snapshot`, when its `generation` is this one).
    pub snapshot: Option<String>,
    /// What `status.snapshot` says now: (id, generation), to tell when it is stale.
    pub published: Option<(String, i64)>,
    /// The builder's build of this generation failed (Ready=False, BuildFailed): the
    /// other agents stop waiting for a snapshot (their own build says why too).
    pub build_failed: bool,
    /// Its runtime's instances cannot be snapshotted (custom runtimes): every agent
    /// cold-boots it, none waits for a build.
    pub unsnapshotted: bool,
    /// Ready=True for this generation, reason ColdBoot: the builder said it serves by
    /// cold boots.
    pub cold_boot_ready: bool,
}

impl Wanted {
    /// Read a ThawFunction. Err: why it cannot be deployed (the apiserver has checked
    /// the schema; what is left is what the node accepts).
    pub fn from_object(obj: &DynamicObject) -> Result<Wanted, String> {
        let name = obj.metadata.name.clone().ok_or("no name")?;
        let ns = obj.metadata.namespace.clone().unwrap_or_default();
        if name.is_empty() || name.len() > 64 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            return Err(format!("'{name}' is not a Lambda function name (letters, digits, - and _, at most 64)"));
        }
        let spec = &obj.data["spec"];
        let text = |k: &str| spec[k].as_str().map(str::to_string).ok_or(format!("spec.{k} is missing"));
        let mut env = BTreeMap::new();
        for e in spec["env"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let var = e["name"].as_str().ok_or("an env entry without a name")?;
            match &e["value"] {
                Value::String(v) => {
                    env.insert(var.to_string(), v.clone());
                }
                _ if !e["valueFrom"].is_null() => return Err(format!("env {var}: valueFrom (Secrets, ConfigMaps) is not supported by the agents yet")),
                _ => {
                    env.insert(var.to_string(), String::new());
                }
            }
        }
        let sha256 = spec["code"]["sha256"].as_str().ok_or("spec.code.sha256 is missing")?.to_string();
        if sha256.len() != 64 || !sha256.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) {
            return Err(format!("spec.code.sha256 '{sha256}' is not 64 lowercase hex digits"));
        }
        let generation = obj.metadata.generation.unwrap_or(0);
        let st = &obj.data["status"]["snapshot"];
        let published = st["id"].as_str().filter(|id| !id.is_empty()).map(|id| (id.to_string(), st["generation"].as_i64().unwrap_or(-1)));
        let pinned = spec["snapshotManifest"].as_str().filter(|id| !id.is_empty()).map(str::to_string);
        let snapshot = pinned.or_else(|| published.clone().filter(|(_, g)| *g == generation).map(|(id, _)| id));
        let ready = obj.data["status"]["conditions"].as_array().and_then(|c| c.iter().find(|c| c["type"] == "Ready")).cloned().unwrap_or_default();
        let this_generation = ready["observedGeneration"].as_i64() == Some(generation);
        let build_failed = ready["status"] == "False" && ready["reason"] == "BuildFailed" && this_generation;
        let cold_boot_ready = ready["status"] == "True" && ready["reason"] == COLD_BOOT && this_generation;
        let runtime = text("runtime")?;
        let unsnapshotted = thaw_node::runtimes::engine_runtime(&runtime).is_some_and(|r| !r.snapshots());
        Ok(Wanted {
            namespace: ns.clone(),
            generation,
            snapshot,
            published,
            build_failed,
            unsnapshotted,
            cold_boot_ready,
            runtime,
            handler: text("handler")?,
            memory_mb: spec["memory"].as_u64().unwrap_or(128),
            timeout_s: spec["timeout"].as_u64().unwrap_or(3),
            env,
            key: spec["code"]["key"].as_str().ok_or("spec.code.key is missing")?.to_string(),
            description: format!("{MARKER}{ns}/{name}"),
            sha256,
            name,
        })
    }

    /// The node's CodeSha256 of this bundle (base64, as Lambda gives it).
    pub fn code_sha256(&self) -> String {
        let bytes: Vec<u8> = (0..self.sha256.len()).step_by(2).filter_map(|i| u8::from_str_radix(&self.sha256[i..i + 2], 16).ok()).collect();
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }

    pub fn spec(&self, account: &str) -> FunctionSpec {
        FunctionSpec {
            name: self.name.clone(),
            runtime: self.runtime.clone(),
            role: role_arn(account),
            handler: self.handler.clone(),
            description: self.description.clone(),
            timeout_s: self.timeout_s,
            memory_mb: self.memory_mb,
            env: self.env.clone(),
            layers: Vec::new(),
        }
    }
}


/// The execution role a registry function gets (ThawFunctions name none).
fn role_arn(account: &str) -> String {
    format!("arn:aws:iam::{account}:role/thaw-function")
}

/// The ThawFunction of `spec` in namespace `ns`, its bundle at `key` (SHA-256 `sha256`, hex).
pub fn object_of(spec: &FunctionSpec, ns: &str, key: &str, sha256: &str) -> Value {
    let env: Vec<Value> = spec.env.iter().map(|(k, v)| json!({"name": k, "value": v})).collect();
    json!({
        "apiVersion": "thaw.dev/v1alpha1",
        "kind": "ThawFunction",
        "metadata": {"name": spec.name, "namespace": ns},
        "spec": {"runtime": spec.runtime, "handler": spec.handler, "memory": spec.memory_mb, "timeout": spec.timeout_s,
                 "env": env, "code": {"key": key, "sha256": sha256}}
    })
}

/// Where the gateway's registry lives: the ThawFunctions of one namespace, bundles in one store.
pub struct Registry {
    api: Api<DynamicObject>,
    ns: String,
    store: Arc<thaw_store::Store>,
    region: String,
    account: String,
}

/// The Lambda error of a registry operation on function `name` that failed with `e`.
fn kube_error(e: kube::Error, name: &str, arn: &str) -> ApiError {
    match &e {
        kube::Error::Api(a) if a.code == 404 => ApiError::new(StatusCode::NOT_FOUND, "ResourceNotFoundException", format!("Function not found: {arn}")),
        kube::Error::Api(a) if a.code == 409 => ApiError::new(StatusCode::CONFLICT, "ResourceConflictException", format!("Function already exist: {name}")),
        kube::Error::Api(a) if a.code == 422 || a.code == 400 => ApiError::new(StatusCode::BAD_REQUEST, "InvalidParameterValueException", a.message.clone()),
        _ => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "ServiceException", format!("the registry (apiserver) is unavailable: {}", thaw_node::node::error_chain(&e))),
    }
}

impl Registry {
    pub fn new(client: Client, ns: &str, store: Arc<thaw_store::Store>, region: &str, account: &str) -> Registry {
        Registry { api: Api::namespaced_with(client, ns, &thawfunction_resource()), ns: ns.to_string(), store, region: region.into(), account: account.into() }
    }

    pub fn arn(&self, name: &str) -> String {
        format!("arn:aws:lambda:{}:{}:function:{name}", self.region, self.account)
    }

    /// Put `zip` in the store (blocking, off the async threads): (key, sha256 hex).
    async fn put_bundle(&self, zip: Vec<u8>) -> Result<(String, String), ApiError> {
        let store = self.store.clone();
        tokio::task::spawn_blocking(move || store.put_bundle(&zip))
            .await
            .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "ServiceException", e.to_string()))?
            .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "ServiceException", format!("storing the code bundle: {}", thaw_node::node::error_chain(&e))))
    }

    /// CreateFunction: the bundle into the store, then the ThawFunction (the commit point).
    pub async fn create(&self, spec: &FunctionSpec, zip: Vec<u8>) -> Result<Value, ApiError> {
        if !spec.layers.is_empty() {
            return Err(ApiError::new(StatusCode::BAD_REQUEST, "InvalidParameterValueException", "Layers are not supported through the gateway yet."));
        }
        let size = zip.len() as u64;
        let (key, sha) = self.put_bundle(zip).await?;
        let obj: DynamicObject = serde_json::from_value(object_of(spec, &self.ns, &key, &sha)).expect("a ThawFunction");
        let created = self.api.create(&PostParams::default(), &obj).await.map_err(|e| kube_error(e, &spec.name, &self.arn(&spec.name)))?;
        self.configuration(&created, Some(size))
    }

    /// UpdateFunctionCode: the new bundle into the store, then the object points at it.
    pub async fn update_code(&self, name: &str, zip: Vec<u8>) -> Result<Value, ApiError> {
        let size = zip.len() as u64;
        self.api.get(name).await.map_err(|e| kube_error(e, name, &self.arn(name)))?;
        let (key, sha) = self.put_bundle(zip).await?;
        let patch = json!({"spec": {"code": {"key": key, "sha256": sha}}});
        let obj = self.api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(|e| kube_error(e, name, &self.arn(name)))?;
        self.configuration(&obj, Some(size))
    }

    /// UpdateFunctionConfiguration: what the body changes, into the object (runtime,
    /// handler, memory, timeout, environment; layers are refused, role and
    /// description are not kept by the registry).
    pub async fn update_configuration(&self, name: &str, body: &[u8]) -> Result<Value, ApiError> {
        let obj = self.api.get(name).await.map_err(|e| kube_error(e, name, &self.arn(name)))?;
        let w = Wanted::from_object(&obj).map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "ServiceException", e))?;
        let change = thaw_node::api::config_change(body, &w.runtime, &w.handler)?;
        if change.layers.as_ref().is_some_and(|l| !l.is_empty()) {
            return Err(ApiError::new(StatusCode::BAD_REQUEST, "InvalidParameterValueException", "Layers are not supported through the gateway yet."));
        }
        if change.revision_id.as_ref().is_some_and(|r| Some(r) != obj.metadata.resource_version.as_ref()) {
            return Err(ApiError::new(StatusCode::PRECONDITION_FAILED, "PreconditionFailedException", "The RevisionId provided does not match the latest RevisionId for the Lambda function."));
        }
        let mut spec = serde_json::Map::new();
        if let Some(v) = change.runtime {
            spec.insert("runtime".into(), json!(v));
        }
        if let Some(v) = change.handler {
            spec.insert("handler".into(), json!(v));
        }
        if let Some(v) = change.memory_mb {
            spec.insert("memory".into(), json!(v));
        }
        if let Some(v) = change.timeout_s {
            spec.insert("timeout".into(), json!(v));
        }
        if let Some(env) = change.env {
            spec.insert("env".into(), json!(env.iter().map(|(k, v)| json!({"name": k, "value": v})).collect::<Vec<_>>()));
        }
        let patch = json!({"spec": spec});
        let obj = self.api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(|e| kube_error(e, name, &self.arn(name)))?;
        self.configuration(&obj, None)
    }

    pub async fn delete(&self, name: &str) -> Result<(), ApiError> {
        self.api.delete(name, &DeleteParams::default()).await.map(drop).map_err(|e| kube_error(e, name, &self.arn(name)))
    }

    /// The FunctionConfiguration of `name` as the registry has it, if it has it.
    pub async fn get(&self, name: &str) -> Result<Option<Value>, ApiError> {
        match self.api.get_opt(name).await.map_err(|e| kube_error(e, name, &self.arn(name)))? {
            Some(o) => self.configuration(&o, None).map(Some),
            None => Ok(None),
        }
    }

    /// ListFunctions: every function of the registry (those it cannot read are left out).
    pub async fn list(&self) -> Result<Value, ApiError> {
        let all = self.api.list(&ListParams::default()).await.map_err(|e| kube_error(e, "", ""))?;
        let mut fns: Vec<Value> = all.items.iter().filter_map(|o| self.configuration(o, None).ok()).collect();
        fns.sort_by(|a, b| a["FunctionName"].as_str().cmp(&b["FunctionName"].as_str()));
        Ok(json!({"Functions": fns}))
    }

    /// A FunctionConfiguration from a ThawFunction: what the registry knows (the state
    /// of the deploy on the agents is theirs: Pending until an agent answers for it).
    fn configuration(&self, obj: &DynamicObject, code_size: Option<u64>) -> Result<Value, ApiError> {
        let w = Wanted::from_object(obj).map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "ServiceException", e))?;
        let env: serde_json::Map<String, Value> = w.env.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
        Ok(json!({
            "FunctionName": w.name, "FunctionArn": self.arn(&w.name), "Runtime": w.runtime, "Handler": w.handler,
            "Role": role_arn(&self.account), "MemorySize": w.memory_mb, "Timeout": w.timeout_s,
            "CodeSha256": w.code_sha256(), "CodeSize": code_size.unwrap_or(0), "Description": w.description,
            "Environment": {"Variables": env}, "Version": "$LATEST", "PackageType": "Zip", "Architectures": ["x86_64"],
            "State": "Pending", "StateReason": "The function is being deployed on the agents.", "StateReasonCode": "Creating",
            "LastUpdateStatus": "InProgress", "RevisionId": obj.metadata.resource_version.clone().unwrap_or_default(),
            "LastModified": obj.metadata.creation_timestamp.as_ref().map(|t| t.0.to_rfc3339()).unwrap_or_default(),
        }))
    }
}
