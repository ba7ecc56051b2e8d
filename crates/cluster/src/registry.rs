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
use thaw_node::api::{alias_json, alias_request, aliases_json, url_config_json, url_request, ApiError};
use thaw_node::node::{changed_alias, changed_url, check_routing, FunctionSpec};
use thaw_node::registry::{AliasRecord, UrlConfig};

use crate::layers::{LayerRef, Layers};

/// The object of a function or layer `name`: the name itself when it is a valid object
/// name and label value (lowercase letters, digits and `-`, at most 63), else one made
/// of it plus a hash of it (Lambda names may have capitals and `_`, objects may not).
pub fn object_name(name: &str) -> String {
    let valid = name.len() <= 63
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-')
        && !name.ends_with('-');
    if valid {
        return name.to_string();
    }
    let cleaned: String = name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).take(40).collect();
    format!("{}-{:016x}", cleaned.trim_matches('-'), crate::hash::hash_str(name)).trim_start_matches('-').to_string()
}

/// What the description of a function deployed from the registry starts with.
pub const MARKER: &str = "ThawFunction ";

/// The Ready condition's reason for a function served by cold boots (its runtime cannot
/// be snapshotted): deployed, and no snapshot will be published.
pub const COLD_BOOT: &str = "ColdBoot";

pub fn thawfunction_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("thaw.dev", "v1alpha1", "ThawFunction"), "thawfunctions")
}

/// Where an environment variable's value comes from (`valueFrom`): a key of a Secret
/// or a ConfigMap in the function's namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnvSource {
    Secret { name: String, key: String },
    ConfigMap { name: String, key: String },
}

impl EnvSource {
    fn from_value_from(v: &Value) -> Option<EnvSource> {
        let pair = |r: &Value| Some((r["name"].as_str()?.to_string(), r["key"].as_str()?.to_string()));
        match (pair(&v["secretKeyRef"]), pair(&v["configMapKeyRef"])) {
            (Some((name, key)), None) => Some(EnvSource::Secret { name, key }),
            (None, Some((name, key))) => Some(EnvSource::ConfigMap { name, key }),
            _ => None,
        }
    }
}

/// A function as its ThawFunction describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct Wanted {
    pub name: String,
    /// Its object's name (the function's, or [`object_name`] of it).
    pub object: String,
    pub runtime: String,
    pub handler: String,
    pub memory_mb: u64,
    pub timeout_s: u64,
    pub env: BTreeMap<String, String>,
    /// Variables whose values come from a Secret or ConfigMap key in the object's
    /// namespace (`valueFrom`), resolved by each agent ([`crate::follow`]).
    pub env_from: BTreeMap<String, EnvSource>,
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
    /// A published version of function `name` (the object `NAME.vN`), not the function.
    pub version: Option<u64>,
    /// A published version's own description.
    pub version_description: String,
    /// The function's aliases (its object's annotation `thaw.dev/aliases`).
    pub aliases: BTreeMap<String, AliasRecord>,
    /// The function's tags (its object's annotation `thaw.dev/tags`).
    pub tags: BTreeMap<String, String>,
    /// Its function URLs' configurations, by alias ("" for $LATEST's) (annotation
    /// `thaw.dev/urls`).
    pub urls: BTreeMap<String, UrlConfig>,
    /// Its reserved concurrency, cluster-wide (annotation `thaw.dev/concurrency`):
    /// each agent enforces its share ([`concurrency_share`]).
    pub reserved_concurrency: Option<u64>,
    /// Its layers, in order (`spec.layers`): each agent installs them from the store
    /// under their cluster version numbers ([`crate::layers`]).
    pub layers: Vec<LayerRef>,
    /// Its provisioned concurrency, cluster-wide, by version (annotation
    /// `thaw.dev/provisioned`): each agent keeps its share ready ([`concurrency_share`]).
    pub provisioned: BTreeMap<u64, u64>,
}

impl Wanted {
    /// Read a ThawFunction. Err: why it cannot be deployed (the apiserver has checked
    /// the schema; what is left is what the node accepts).
    pub fn from_object(obj: &DynamicObject) -> Result<Wanted, String> {
        let object = obj.metadata.name.clone().ok_or("no name")?;
        let ns = obj.metadata.namespace.clone().unwrap_or_default();
        let spec = &obj.data["spec"];
        let version = spec["version"].as_u64();
        // A version's object is NAME.vN; the function is in its spec.
        let name = match version {
            Some(_) => spec["function"].as_str().ok_or("spec.function is missing")?.to_string(),
            // Its own name when the object's cannot be it (`spec.name`).
            None => spec["name"].as_str().map_or_else(|| object.clone(), str::to_string),
        };
        if name.is_empty() || name.len() > 64 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
            return Err(format!("'{name}' is not a Lambda function name (letters, digits, - and _, at most 64)"));
        }
        let text = |k: &str| spec[k].as_str().map(str::to_string).ok_or(format!("spec.{k} is missing"));
        let mut env = BTreeMap::new();
        let mut env_from = BTreeMap::new();
        for e in spec["env"].as_array().map(Vec::as_slice).unwrap_or_default() {
            let var = e["name"].as_str().ok_or("an env entry without a name")?;
            match &e["value"] {
                Value::String(v) => {
                    env.insert(var.to_string(), v.clone());
                }
                _ if !e["valueFrom"].is_null() => {
                    let src = EnvSource::from_value_from(&e["valueFrom"])
                        .ok_or(format!("env {var}: valueFrom names neither a secretKeyRef nor a configMapKeyRef (name and key)"))?;
                    env_from.insert(var.to_string(), src);
                }
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
        let layers: Vec<LayerRef> = match &spec["layers"] {
            Value::Null => Vec::new(),
            l => serde_json::from_value(l.clone()).map_err(|e| format!("spec.layers: {e}"))?,
        };
        if let Some(bad) = layers.iter().find(|l| l.name_and_version().is_none()) {
            return Err(format!("spec.layers: '{}' is not a layer version ARN", bad.arn));
        }
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
            env_from,
            key: spec["code"]["key"].as_str().ok_or("spec.code.key is missing")?.to_string(),
            description: format!("{MARKER}{ns}/{name}"),
            version,
            version_description: spec["description"].as_str().unwrap_or_default().to_string(),
            aliases: aliases_of(obj, &name)?,
            tags: tags_of(obj)?,
            urls: urls_of(obj)?,
            reserved_concurrency: reserved_of(obj)?,
            provisioned: provisioned_of(obj)?.into_iter().map(|(v, p)| (v, p.requested)).collect(),
            layers,
            sha256,
            name,
            object,
        })
    }

    /// The node's CodeSha256 of this bundle (base64, as Lambda gives it).
    pub fn code_sha256(&self) -> String {
        sha256_b64(&self.sha256)
    }

    /// Its layers' version ARNs, in order (as the node's function names them).
    pub fn layer_arns(&self) -> Vec<String> {
        self.layers.iter().map(|l| l.arn.clone()).collect()
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
            layers: self.layer_arns(),
        }
    }
}

/// A SHA-256 in hex as Lambda shows one (base64 of the bytes).
pub(crate) fn sha256_b64(hex: &str) -> String {
    let bytes: Vec<u8> = (0..hex.len()).step_by(2).filter_map(|i| hex.get(i..i + 2).and_then(|b| u8::from_str_radix(b, 16).ok())).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}


/// The execution role a registry function gets (ThawFunctions name none).
fn role_arn(account: &str) -> String {
    format!("arn:aws:iam::{account}:role/thaw-function")
}

/// The ThawFunction of `spec` in namespace `ns`, its bundle at `key` (SHA-256 `sha256`, hex),
/// with `layers` (its `spec.layers` resolved).
pub fn object_of(spec: &FunctionSpec, ns: &str, key: &str, sha256: &str, layers: &[LayerRef]) -> Value {
    let env: Vec<Value> = spec.env.iter().map(|(k, v)| json!({"name": k, "value": v})).collect();
    let mut obj = json!({
        "apiVersion": "thaw.dev/v1alpha1",
        "kind": "ThawFunction",
        "metadata": {"name": object_name(&spec.name), "namespace": ns},
        "spec": {"name": spec.name, "runtime": spec.runtime, "handler": spec.handler, "memory": spec.memory_mb, "timeout": spec.timeout_s,
                 "env": env, "code": {"key": key, "sha256": sha256}}
    });
    if !layers.is_empty() {
        obj["spec"]["layers"] = json!(layers);
    }
    obj
}

/// The label a version's object names its function by (and the one of its number).
pub const FUNCTION_LABEL: &str = "thaw.dev/function";
const VERSION_LABEL: &str = "thaw.dev/version";
/// The function object's annotation of the last version number given (never reused,
/// as Lambda never reuses one, even once its version is deleted).
const LAST_VERSION: &str = "thaw.dev/last-version";

/// The function object's annotation holding its aliases: JSON, alias name ->
/// [`StoredAlias`]. An annotation, not the spec: an alias moves without a new
/// generation of the function (nothing to build).
const ALIASES: &str = "thaw.dev/aliases";

#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
struct StoredAlias {
    version: u64,
    #[serde(default)]
    description: String,
    #[serde(default)]
    weights: BTreeMap<u64, f64>,
    #[serde(default)]
    revision_id: String,
}

/// The JSON map that annotation `key` of `obj` holds (`what` it maps, for the error);
/// empty when there is none.
fn annotation_map<V: serde::de::DeserializeOwned>(obj: &DynamicObject, key: &str, what: &str) -> Result<BTreeMap<String, V>, String> {
    match obj.metadata.annotations.as_ref().and_then(|a| a.get(key)) {
        Some(text) => serde_json::from_str(text).map_err(|e| format!("annotation {key} is not a map of {what}: {e}")),
        None => Ok(BTreeMap::new()),
    }
}

/// The aliases of function `name` as its object `obj` holds them.
fn aliases_of(obj: &DynamicObject, name: &str) -> Result<BTreeMap<String, AliasRecord>, String> {
    let stored: BTreeMap<String, StoredAlias> = annotation_map(obj, ALIASES, "aliases")?;
    Ok(stored
        .into_iter()
        .map(|(a, s)| {
            let rec = AliasRecord { function: name.to_string(), name: a.clone(), version: s.version, description: s.description, weights: s.weights, revision_id: s.revision_id };
            (a, rec)
        })
        .collect())
}

/// The function object's annotation holding its tags (JSON, key -> value).
const TAGS: &str = "thaw.dev/tags";

fn tags_of(obj: &DynamicObject) -> Result<BTreeMap<String, String>, String> {
    annotation_map(obj, TAGS, "tags")
}

/// The function object's annotation holding its URLs' configurations (JSON, alias or
/// "" for $LATEST -> the node's UrlConfig).
const URLS: &str = "thaw.dev/urls";

fn urls_of(obj: &DynamicObject) -> Result<BTreeMap<String, UrlConfig>, String> {
    annotation_map(obj, URLS, "function URLs")
}

/// The function object's annotation holding its concurrency settings (JSON:
/// `{"reserved": N}`, `{}` once deleted). The limit is the cluster's: N split over the
/// agents ([`concurrency_share`]), each enforcing its share.
const CONCURRENCY: &str = "thaw.dev/concurrency";

fn reserved_of(obj: &DynamicObject) -> Result<Option<u64>, String> {
    Ok(annotation_map::<u64>(obj, CONCURRENCY, "concurrency settings")?.get("reserved").copied())
}

/// The function object's annotation holding its provisioned concurrency (JSON: version
/// -> [`StoredProvisioned`]). The count is the cluster's: split over the agents as a
/// reserved concurrency is ([`concurrency_share`]), each keeping its share ready.
const PROVISIONED: &str = "thaw.dev/provisioned";

/// One version's provisioned concurrency as the registry holds it.
#[derive(serde::Serialize, serde::Deserialize, Debug, Clone, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StoredProvisioned {
    pub requested: u64,
    #[serde(default)]
    pub last_modified: String,
}

fn provisioned_of(obj: &DynamicObject) -> Result<BTreeMap<u64, StoredProvisioned>, String> {
    let by_text: BTreeMap<String, StoredProvisioned> = annotation_map(obj, PROVISIONED, "provisioned concurrency settings")?;
    by_text
        .into_iter()
        .map(|(k, p)| k.parse::<u64>().map(|v| (v, p)).map_err(|_| format!("annotation {PROVISIONED}: '{k}' is not a version number")))
        .collect()
}

/// What a request's qualifier (`NAME:Q` or `?Qualifier=Q`) names.
#[derive(Debug, Clone, PartialEq)]
pub enum Qualifier {
    Latest,
    Version(u64),
    Alias(String),
}

impl Qualifier {
    pub fn parse(q: Option<&str>) -> Qualifier {
        match q {
            None | Some("$LATEST") => Qualifier::Latest,
            Some(q) => match q.parse::<u64>() {
                Ok(n) => Qualifier::Version(n),
                Err(_) => Qualifier::Alias(q.to_string()),
            },
        }
    }
}

/// The share of reserved concurrency `n` that the agent at position `rank` of a
/// function's placement walk over `agents` agents enforces: `n` split as evenly as
/// it goes, the larger shares first along the walk (where placement sends the
/// function first). The shares add up to `n`: no more than `n` of its calls run at
/// once in the cluster, while the agents agree on who they are.
pub fn concurrency_share(n: u64, rank: usize, agents: usize) -> u64 {
    if agents == 0 || rank >= agents {
        return 0;
    }
    let (each, extra) = (n / agents as u64, n % agents as u64);
    each + u64::from((rank as u64) < extra)
}

/// The annotation holding provisioned concurrency settings `all`.
fn provisioned_annotation(all: &BTreeMap<u64, StoredProvisioned>) -> String {
    serde_json::to_string(&all.iter().map(|(v, p)| (v.to_string(), p)).collect::<BTreeMap<_, _>>()).expect("settings serialize")
}

/// The annotation holding `aliases`.
fn aliases_annotation(aliases: &BTreeMap<String, AliasRecord>) -> String {
    let stored: BTreeMap<&String, StoredAlias> = aliases
        .iter()
        .map(|(a, r)| (a, StoredAlias { version: r.version, description: r.description.clone(), weights: r.weights.clone(), revision_id: r.revision_id.clone() }))
        .collect();
    serde_json::to_string(&stored).expect("aliases serialize")
}

/// The object of version `n` of the function whose object is `f`.
pub fn version_object_name(function: &str, n: u64) -> String {
    format!("{}.v{n}", object_name(function))
}

/// The spec fields that make a version (code and configuration): equal ones are the
/// same version.
fn version_fields(spec: &Value) -> Value {
    json!([spec["runtime"], spec["handler"], spec["memory"], spec["timeout"], spec["env"], spec["code"], spec["layers"]])
}

/// The error of a registry object that does not read (a hand-edited annotation, say).
pub(crate) fn unreadable(why: String) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "ServiceException", why)
}

/// Put `zip` in `store` (blocking, off the async threads): (key, sha256 hex).
pub(crate) async fn put_bundle(store: &Arc<thaw_store::Store>, zip: Vec<u8>) -> Result<(String, String), ApiError> {
    let store = store.clone();
    tokio::task::spawn_blocking(move || store.put_bundle(&zip))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "ServiceException", e.to_string()))?
        .map_err(|e| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "ServiceException", format!("storing the code bundle: {}", thaw_node::node::error_chain(&e))))
}

/// Where the gateway's registry lives: the ThawFunctions of one namespace, bundles in one store.
pub struct Registry {
    api: Api<DynamicObject>,
    ns: String,
    store: Arc<thaw_store::Store>,
    region: String,
    account: String,
    /// The cluster's layers (ThawLayers), which functions name.
    pub layers: Layers,
}

/// The Lambda error of a registry operation on function `name` that failed with `e`.
pub(crate) fn kube_error(e: kube::Error, name: &str, arn: &str) -> ApiError {
    match &e {
        kube::Error::Api(a) if a.code == 404 => ApiError::new(StatusCode::NOT_FOUND, "ResourceNotFoundException", format!("Function not found: {arn}")),
        kube::Error::Api(a) if a.code == 409 => ApiError::new(StatusCode::CONFLICT, "ResourceConflictException", format!("Function already exist: {name}")),
        kube::Error::Api(a) if a.code == 422 || a.code == 400 => ApiError::new(StatusCode::BAD_REQUEST, "InvalidParameterValueException", a.message.clone()),
        _ => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "ServiceException", format!("the registry (apiserver) is unavailable: {}", thaw_node::node::error_chain(&e))),
    }
}

impl Registry {
    pub fn new(client: Client, ns: &str, store: Arc<thaw_store::Store>, region: &str, account: &str) -> Registry {
        Registry {
            api: Api::namespaced_with(client.clone(), ns, &thawfunction_resource()),
            layers: Layers::new(client, ns, store.clone(), region, account),
            ns: ns.to_string(),
            store,
            region: region.into(),
            account: account.into(),
        }
    }

    pub fn arn(&self, name: &str) -> String {
        format!("arn:aws:lambda:{}:{}:function:{name}", self.region, self.account)
    }

    /// CreateFunction: the bundle into the store, then the ThawFunction (the commit point),
    /// with its `tags`.
    pub async fn create(&self, spec: &FunctionSpec, zip: Vec<u8>, tags: &BTreeMap<String, String>) -> Result<Value, ApiError> {
        thaw_node::node::check_tags(tags).map_err(|e| ApiError::invalid(e.to_string()))?;
        let layers = self.layers.resolve(&spec.layers).await?;
        let size = zip.len() as u64;
        let (key, sha) = put_bundle(&self.store, zip).await?;
        let mut obj = object_of(spec, &self.ns, &key, &sha, &layers);
        obj["spec"]["code"]["size"] = json!(size);
        if !tags.is_empty() {
            obj["metadata"]["annotations"] = json!({TAGS: serde_json::to_string(tags).expect("tags serialize")});
        }
        let obj: DynamicObject = serde_json::from_value(obj).expect("a ThawFunction");
        let created = self.api.create(&PostParams::default(), &obj).await.map_err(|e| kube_error(e, &spec.name, &self.arn(&spec.name)))?;
        self.configuration(&created, Some(size))
    }

    /// UpdateFunctionCode: the new bundle into the store, then the object points at it.
    pub async fn update_code(&self, name: &str, zip: Vec<u8>) -> Result<Value, ApiError> {
        let size = zip.len() as u64;
        self.api.get(&object_name(name)).await.map_err(|e| kube_error(e, name, &self.arn(name)))?;
        let (key, sha) = put_bundle(&self.store, zip).await?;
        let patch = json!({"spec": {"code": {"key": key, "sha256": sha, "size": size}}});
        let obj = self.api.patch(&object_name(name), &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(|e| kube_error(e, name, &self.arn(name)))?;
        self.configuration(&obj, Some(size))
    }

    /// UpdateFunctionConfiguration: what the body changes, into the object (runtime,
    /// handler, memory, timeout, environment, layers; role and description are not
    /// kept by the registry).
    pub async fn update_configuration(&self, name: &str, body: &[u8]) -> Result<Value, ApiError> {
        let obj = self.api.get(&object_name(name)).await.map_err(|e| kube_error(e, name, &self.arn(name)))?;
        let w = Wanted::from_object(&obj).map_err(unreadable)?;
        let change = thaw_node::api::config_change(body, &w.runtime, &w.handler)?;
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
        if let Some(arns) = change.layers {
            spec.insert("layers".into(), json!(self.layers.resolve(&arns).await?));
        }
        let patch = json!({"spec": spec});
        let obj = self.api.patch(&object_name(name), &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(|e| kube_error(e, name, &self.arn(name)))?;
        self.configuration(&obj, None)
    }

    /// DeleteFunction: the function's object and those of its versions.
    pub async fn delete(&self, name: &str) -> Result<(), ApiError> {
        self.api.delete(&object_name(name), &DeleteParams::default()).await.map(drop).map_err(|e| kube_error(e, name, &self.arn(name)))?;
        for (n, _) in self.versions(name).await? {
            self.delete_version(name, n).await?;
        }
        Ok(())
    }

    /// DeleteFunction with a version qualifier: that version's object (refused while
    /// an alias routes to it, as Lambda refuses it).
    pub async fn delete_version(&self, name: &str, n: u64) -> Result<(), ApiError> {
        let arn = format!("{}:{n}", self.arn(name));
        if let Some(f) = self.api.get_opt(&object_name(name)).await.map_err(|e| kube_error(e, name, &arn))? {
            let aliases = aliases_of(&f, name).map_err(unreadable)?;
            let users: Vec<&str> = aliases.values().filter(|a| a.version == n || a.weights.contains_key(&n)).map(|a| a.name.as_str()).collect();
            if !users.is_empty() {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "ResourceConflictException",
                    format!("Unable to delete version because the following aliases reference it: [{}]", users.join(", ")),
                ));
            }
        }
        self.api.delete(&version_object_name(name, n), &DeleteParams::default()).await.map(drop).map_err(|e| kube_error(e, name, &arn))?;
        // Its provisioned concurrency goes with it (as in Lambda).
        match self.update_annotation(name, PROVISIONED, |f, _| {
            let mut all = provisioned_of(f).map_err(unreadable)?;
            Ok((all.remove(&n).map(|_| provisioned_annotation(&all)), ()))
        })
        .await
        {
            Err(e) if e.status == StatusCode::NOT_FOUND => Ok(()),
            other => other,
        }
    }

    /// The version objects of `name`, by number.
    async fn versions(&self, name: &str) -> Result<BTreeMap<u64, DynamicObject>, ApiError> {
        let lp = ListParams::default().labels(&format!("{FUNCTION_LABEL}={}", object_name(name)));
        let all = self.api.list(&lp).await.map_err(|e| kube_error(e, name, &self.arn(name)))?;
        Ok(all.items.into_iter().filter(|o| o.data["spec"]["function"] == name).filter_map(|o| Some((o.data["spec"]["version"].as_u64()?, o))).collect())
    }

    /// PublishVersion: $LATEST's code and configuration as the next version, an object
    /// of its own (or the latest version again when nothing changed since it was
    /// published, as Lambda does). `body`: Description, CodeSha256 and RevisionId
    /// (preconditions), all optional.
    pub async fn publish_version(&self, name: &str, body: &[u8]) -> Result<Value, ApiError> {
        #[derive(serde::Deserialize, Default)]
        #[serde(rename_all = "PascalCase")]
        struct Publish {
            description: Option<String>,
            code_sha256: Option<String>,
            revision_id: Option<String>,
        }
        let p: Publish = if body.is_empty() { Publish::default() } else { thaw_node::api::parse_json(body)? };
        if p.description.as_ref().is_some_and(|d| d.len() > 256) {
            return Err(ApiError::invalid("Description must be at most 256 characters"));
        }
        for _ in 0..5 {
            let (f, _) = self.function_object(name).await?;
            let w = Wanted::from_object(&f).map_err(unreadable)?;
            if let Some(c) = p.code_sha256.as_ref().filter(|c| **c != w.code_sha256()) {
                return Err(ApiError::new(
                    StatusCode::PRECONDITION_FAILED,
                    "PreconditionFailedException",
                    format!("CodeSHA256 ({c}) is different from current CodeSHA256 in $LATEST ({}). Please try again with the CodeSHA256 in $LATEST.", w.code_sha256()),
                ));
            }
            if p.revision_id.as_ref().is_some_and(|r| Some(r) != f.metadata.resource_version.as_ref()) {
                return Err(ApiError::new(StatusCode::PRECONDITION_FAILED, "PreconditionFailedException", "The Revision Id provided does not match the latest Revision Id. Call the GetFunction/GetAlias API to retrieve the latest Revision Id"));
            }
            let versions = self.versions(name).await?;
            if let Some((_, latest)) = versions.iter().next_back() {
                let same_description = p.description.as_ref().is_none_or(|d| latest.data["spec"]["description"].as_str() == Some(d));
                if version_fields(&latest.data["spec"]) == version_fields(&f.data["spec"]) && same_description {
                    return self.configuration(latest, None);
                }
            }
            let given = f.metadata.annotations.as_ref().and_then(|a| a.get(LAST_VERSION)).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            let n = given.max(versions.keys().next_back().copied().unwrap_or(0)) + 1;
            // Take the number: the annotation written over the object as read (a
            // concurrent publish through another gateway gets a conflict and tries again).
            let claim = json!({"metadata": {"resourceVersion": f.metadata.resource_version, "annotations": {LAST_VERSION: n.to_string()}}});
            match self.api.patch(&object_name(name), &PatchParams::default(), &Patch::Merge(&claim)).await {
                Ok(_) => {}
                Err(kube::Error::Api(a)) if a.code == 409 => continue,
                Err(e) => return Err(kube_error(e, name, &self.arn(name))),
            }
            let mut spec = f.data["spec"].clone();
            spec["function"] = json!(name);
            spec["version"] = json!(n);
            spec["description"] = json!(p.description.clone().unwrap_or_default());
            if let Some(m) = spec.as_object_mut() {
                m.remove("snapshotManifest");
            }
            let obj = json!({
                "apiVersion": "thaw.dev/v1alpha1", "kind": "ThawFunction",
                "metadata": {"name": version_object_name(name, n), "namespace": self.ns,
                             "labels": {FUNCTION_LABEL: object_name(name), VERSION_LABEL: n.to_string()}},
                "spec": spec,
            });
            let obj: DynamicObject = serde_json::from_value(obj).expect("a ThawFunction");
            match self.api.create(&PostParams::default(), &obj).await {
                Ok(created) => return self.configuration(&created, None),
                Err(kube::Error::Api(a)) if a.code == 409 => continue,
                Err(e) => return Err(kube_error(e, name, &self.arn(name))),
            }
        }
        Err(ApiError::new(StatusCode::CONFLICT, "ResourceConflictException", format!("versions of {name} are being published concurrently; try again")))
    }

    /// The function object of `name` and its aliases (a version's object is not one).
    async fn function_object(&self, name: &str) -> Result<(DynamicObject, BTreeMap<String, AliasRecord>), ApiError> {
        let f = self.api.get(&object_name(name)).await.map_err(|e| kube_error(e, name, &self.arn(name)))?;
        if !f.data["spec"]["version"].is_null() || f.data["spec"]["name"].as_str().is_some_and(|n| n != name) {
            return Err(ApiError::not_found(format!("Function not found: {}", self.arn(name))));
        }
        let aliases = aliases_of(&f, name).map_err(unreadable)?;
        Ok((f, aliases))
    }

    /// Change the annotation `key` of function `name`'s object: `change` gets the object
    /// as read and its aliases and gives the annotation's new text (None: nothing to
    /// write) and what to answer; the object is written over the version read (a
    /// concurrent change through another gateway is a conflict: read and try again).
    async fn update_annotation<T>(
        &self,
        name: &str,
        key: &str,
        change: impl Fn(&DynamicObject, BTreeMap<String, AliasRecord>) -> Result<(Option<String>, T), ApiError>,
    ) -> Result<T, ApiError> {
        for _ in 0..5 {
            let (f, aliases) = self.function_object(name).await?;
            let (text, answer) = change(&f, aliases)?;
            let Some(text) = text else { return Ok(answer) };
            let patch = json!({"metadata": {"resourceVersion": f.metadata.resource_version, "annotations": {key: text}}});
            match self.api.patch(&object_name(name), &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => return Ok(answer),
                Err(kube::Error::Api(a)) if a.code == 409 => continue,
                Err(e) => return Err(kube_error(e, name, &self.arn(name))),
            }
        }
        Err(ApiError::new(StatusCode::CONFLICT, "ResourceConflictException", format!("{name} is being changed concurrently; try again")))
    }

    /// CreateAlias (`alias` None: named in the body) or UpdateAlias, into the function
    /// object's annotation.
    pub async fn put_alias(&self, name: &str, alias: Option<&str>, body: &[u8]) -> Result<Value, ApiError> {
        let arn = self.arn(name);
        let (alias, change, create) = alias_request(&arn, alias, body)?;
        let versions = self.versions(name).await?;
        self.update_annotation(name, ALIASES, |_, mut aliases| {
            let rec = changed_alias(&arn, name, &alias, aliases.get(&alias).cloned(), change.clone(), create)?;
            check_routing(&arn, rec.version, &rec.weights, |v| versions.contains_key(&v))?;
            let answer = alias_json(&arn, &rec);
            aliases.insert(alias.clone(), rec);
            Ok((Some(aliases_annotation(&aliases)), answer))
        })
        .await
    }

    /// GetAlias.
    pub async fn get_alias(&self, name: &str, alias: &str) -> Result<Value, ApiError> {
        let (_, aliases) = self.function_object(name).await?;
        let a = aliases.get(alias).ok_or_else(|| ApiError::not_found(format!("Function not found: {}:{alias}", self.arn(name))))?;
        Ok(alias_json(&self.arn(name), a))
    }

    /// ListAliases (those routing to `function_version` when given).
    pub async fn list_aliases(&self, name: &str, function_version: Option<&str>) -> Result<Value, ApiError> {
        let (_, aliases) = self.function_object(name).await?;
        Ok(aliases_json(&self.arn(name), aliases.values(), function_version))
    }

    /// DeleteAlias (one that is not there is no error); its function URL goes with it
    /// (as in Lambda).
    pub async fn delete_alias(&self, name: &str, alias: &str) -> Result<(), ApiError> {
        self.update_annotation(name, ALIASES, |_, mut aliases| Ok((aliases.remove(alias).map(|_| aliases_annotation(&aliases)), ()))).await?;
        self.update_annotation(name, URLS, |f, _| {
            let mut urls = urls_of(f).map_err(unreadable)?;
            Ok((urls.remove(alias).map(|_| serde_json::to_string(&urls).expect("URLs serialize")), ()))
        })
        .await
    }

    /// TagResource (`add`) or UntagResource (`remove`) on function `name`.
    pub async fn retag(&self, name: &str, add: &BTreeMap<String, String>, remove: &[String]) -> Result<(), ApiError> {
        self.update_annotation(name, TAGS, |f, _| {
            let mut tags = tags_of(f).map_err(unreadable)?;
            for k in remove {
                tags.remove(k);
            }
            tags.extend(add.iter().map(|(k, v)| (k.clone(), v.clone())));
            thaw_node::node::check_tags(&tags).map_err(|e| ApiError::invalid(e.to_string()))?;
            Ok((Some(serde_json::to_string(&tags).expect("tags serialize")), ()))
        })
        .await
    }

    /// Create/UpdateFunctionUrlConfig (`create`) of function `name` (or its `alias`);
    /// the answer shows the URL at `host` (the gateway's).
    pub async fn put_url(&self, name: &str, alias: Option<&str>, body: &[u8], create: bool, host: &str) -> Result<Value, ApiError> {
        let (auth_type, cors) = url_request(body)?;
        let url_arn = self.url_arn(name, alias);
        self.update_annotation(name, URLS, |f, aliases| {
            if let Some(a) = alias.filter(|a| !aliases.contains_key(*a)) {
                return Err(ApiError::not_found(format!("The resource you requested does not exist. (Alias {a} of {})", self.arn(name))));
            }
            let mut urls = urls_of(f).map_err(unreadable)?;
            let key = alias.unwrap_or_default().to_string();
            let u = changed_url(&url_arn, urls.remove(&key), auth_type.clone(), cors.clone(), create).map_err(ApiError::from)?;
            let answer = url_config_json(&url_arn, name, alias, host, &u);
            urls.insert(key, u);
            Ok((Some(serde_json::to_string(&urls).expect("URLs serialize")), answer))
        })
        .await
    }

    /// DeleteFunctionUrlConfig.
    pub async fn delete_url(&self, name: &str, alias: Option<&str>) -> Result<(), ApiError> {
        let url_arn = self.url_arn(name, alias);
        self.update_annotation(name, URLS, |f, _| {
            let mut urls = urls_of(f).map_err(unreadable)?;
            if urls.remove(alias.unwrap_or_default()).is_none() {
                return Err(ApiError::not_found(format!("The resource you requested does not exist. (Function URL of {url_arn})")));
            }
            Ok((Some(serde_json::to_string(&urls).expect("URLs serialize")), ()))
        })
        .await
    }

    /// GetFunctionUrlConfig (`alias` Some(..)) or ListFunctionUrlConfigs (None: all).
    pub async fn urls(&self, name: &str, alias: Option<Option<&str>>, host: &str) -> Result<Value, ApiError> {
        let (f, _) = self.function_object(name).await?;
        let urls = urls_of(&f).map_err(unreadable)?;
        let show = |key: &str, u: &UrlConfig| {
            let alias = (!key.is_empty()).then_some(key);
            url_config_json(&self.url_arn(name, alias), name, alias, host, u)
        };
        match alias {
            None => Ok(json!({"FunctionUrlConfigs": urls.iter().map(|(k, u)| show(k, u)).collect::<Vec<_>>()})),
            Some(a) => {
                let key = a.unwrap_or_default();
                let u = urls.get(key).ok_or_else(|| ApiError::not_found(format!("The resource you requested does not exist. (Function URL of {})", self.url_arn(name, a))))?;
                Ok(show(key, u))
            }
        }
    }

    fn url_arn(&self, name: &str, alias: Option<&str>) -> String {
        match alias {
            Some(a) => format!("{}:{a}", self.arn(name)),
            None => self.arn(name),
        }
    }

    /// PutFunctionConcurrency: the cluster-wide reserved concurrency of `name`.
    pub async fn put_concurrency(&self, name: &str, body: &[u8]) -> Result<Value, ApiError> {
        let n = thaw_node::api::reserved_concurrency_request(body)?;
        self.update_annotation(name, CONCURRENCY, |_, _| Ok((Some(json!({"reserved": n}).to_string()), json!({"ReservedConcurrentExecutions": n}))))
            .await
    }

    /// GetFunctionConcurrency (`{}` when none is reserved).
    pub async fn get_concurrency(&self, name: &str) -> Result<Value, ApiError> {
        let (f, _) = self.function_object(name).await?;
        Ok(match reserved_of(&f).map_err(unreadable)? {
            Some(n) => json!({"ReservedConcurrentExecutions": n}),
            None => json!({}),
        })
    }

    /// DeleteFunctionConcurrency.
    pub async fn delete_concurrency(&self, name: &str) -> Result<(), ApiError> {
        self.update_annotation(name, CONCURRENCY, |_, _| Ok((Some("{}".to_string()), ()))).await
    }

    /// The version a provisioned-concurrency call on `name` names: `q` a published
    /// version or an alias of one (not $LATEST), as the node resolves it.
    fn provisioned_version(&self, name: &str, q: &Qualifier, aliases: &BTreeMap<String, AliasRecord>, versions: &BTreeMap<u64, DynamicObject>) -> Result<u64, ApiError> {
        match q {
            Qualifier::Latest => Err(ApiError::invalid("Provisioned concurrency applies to a published version or an alias: give a Qualifier other than $LATEST.")),
            Qualifier::Version(n) if versions.contains_key(n) => Ok(*n),
            Qualifier::Version(n) => Err(ApiError::not_found(format!("Function not found: {}:{n}", self.arn(name)))),
            Qualifier::Alias(a) => match aliases.get(a) {
                Some(r) if r.version == thaw_node::node::LATEST => Err(ApiError::invalid("Provisioned concurrency cannot be configured on an alias of $LATEST.")),
                Some(r) => Ok(r.version),
                None => Err(ApiError::not_found(format!("Function not found: {}:{a}", self.arn(name)))),
            },
        }
    }

    /// PutProvisionedConcurrencyConfig: the cluster's count for the version `q` names
    /// (at most the function's reserved concurrency, with what its other versions
    /// provision). Answers as Lambda does (202, IN_PROGRESS: the agents start them).
    pub async fn put_provisioned(&self, name: &str, q: &Qualifier, body: &[u8]) -> Result<Value, ApiError> {
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Input {
            provisioned_concurrent_executions: i64,
        }
        let i: Input = thaw_node::api::parse_json(body)?;
        let n = u64::try_from(i.provisioned_concurrent_executions).ok().filter(|n| *n >= 1).ok_or_else(|| ApiError::invalid("ProvisionedConcurrentExecutions must be at least 1"))?;
        let versions = self.versions(name).await?;
        self.update_annotation(name, PROVISIONED, |f, aliases| {
            let v = self.provisioned_version(name, q, &aliases, &versions)?;
            let mut all = provisioned_of(f).map_err(unreadable)?;
            let others: u64 = all.iter().filter(|(k, _)| **k != v).map(|(_, p)| p.requested).sum();
            if let Some(cap) = reserved_of(f).map_err(unreadable)? {
                if others + n > cap {
                    return Err(ApiError::invalid(format!(
                        "ProvisionedConcurrentExecutions must be between 1 and {} for this function (its reserved concurrency, minus what other versions provision)",
                        cap.saturating_sub(others)
                    )));
                }
            }
            let p = StoredProvisioned { requested: n, last_modified: thaw_node::node::timestamp() };
            let answer = json!({"RequestedProvisionedConcurrentExecutions": n, "AvailableProvisionedConcurrentExecutions": 0,
                "AllocatedProvisionedConcurrentExecutions": 0, "Status": "IN_PROGRESS", "LastModified": p.last_modified});
            all.insert(v, p);
            Ok((Some(provisioned_annotation(&all)), answer))
        })
        .await
    }

    /// The provisioned concurrency of the version `q` names: (version, its setting).
    pub async fn get_provisioned(&self, name: &str, q: &Qualifier) -> Result<(u64, StoredProvisioned), ApiError> {
        let (f, aliases) = self.function_object(name).await?;
        let v = self.provisioned_version(name, q, &aliases, &self.versions(name).await?)?;
        let p = provisioned_of(&f).map_err(unreadable)?.remove(&v).ok_or_else(|| {
            ApiError::not_found(format!("No Provisioned Concurrency Config found for this function: {}:{v}", self.arn(name)))
        })?;
        Ok((v, p))
    }

    /// Every version's provisioned concurrency of `name`.
    pub async fn list_provisioned(&self, name: &str) -> Result<BTreeMap<u64, StoredProvisioned>, ApiError> {
        let (f, _) = self.function_object(name).await?;
        provisioned_of(&f).map_err(unreadable)
    }

    /// DeleteProvisionedConcurrencyConfig (none there is no error, as on the node).
    pub async fn delete_provisioned(&self, name: &str, q: &Qualifier) -> Result<(), ApiError> {
        let versions = self.versions(name).await?;
        self.update_annotation(name, PROVISIONED, |f, aliases| {
            let v = self.provisioned_version(name, q, &aliases, &versions)?;
            let mut all = provisioned_of(f).map_err(unreadable)?;
            Ok((all.remove(&v).map(|_| provisioned_annotation(&all)), ()))
        })
        .await
    }

    /// The sum of the registry functions' reserved concurrency.
    pub async fn reserved_total(&self) -> Result<u64, ApiError> {
        let all = self.api.list(&ListParams::default()).await.map_err(|e| kube_error(e, "", ""))?;
        Ok(all.items.iter().filter(|o| o.data["spec"]["version"].is_null()).filter_map(|o| reserved_of(o).ok().flatten()).sum())
    }

    /// AccountUsage as the registry knows it: (TotalCodeSize: the distinct bundles of
    /// functions and versions as the gateway stored them, FunctionCount).
    pub async fn usage(&self) -> Result<(u64, u64), ApiError> {
        let all = self.api.list(&ListParams::default()).await.map_err(|e| kube_error(e, "", ""))?;
        let count = all.items.iter().filter(|o| o.data["spec"]["version"].is_null()).count() as u64;
        let sizes: BTreeMap<&str, u64> =
            all.items.iter().filter_map(|o| Some((o.data["spec"]["code"]["key"].as_str()?, o.data["spec"]["code"]["size"].as_u64().unwrap_or(0)))).collect();
        Ok((sizes.values().sum(), count))
    }

    /// ListTags of function `name`.
    pub async fn tags(&self, name: &str) -> Result<Value, ApiError> {
        let (f, _) = self.function_object(name).await?;
        let tags = tags_of(&f).map_err(unreadable)?;
        Ok(json!({"Tags": tags}))
    }

    /// ListVersionsByFunction: $LATEST, then every version, oldest first.
    pub async fn list_versions(&self, name: &str) -> Result<Value, ApiError> {
        let (f, _) = self.function_object(name).await?;
        let mut out = vec![self.configuration(&f, None)?];
        for o in self.versions(name).await?.values() {
            out.push(self.configuration(o, None)?);
        }
        Ok(json!({"Versions": out}))
    }

    /// The FunctionConfiguration of version `n` of `name` as the registry has it.
    pub async fn get_version(&self, name: &str, n: u64) -> Result<Option<Value>, ApiError> {
        let arn = format!("{}:{n}", self.arn(name));
        match self.api.get_opt(&version_object_name(name, n)).await.map_err(|e| kube_error(e, name, &arn))? {
            Some(o) if o.data["spec"]["function"] == name => self.configuration(&o, None).map(Some),
            _ => Ok(None),
        }
    }

    /// The FunctionConfiguration of `name` as the registry has it, if it has it.
    pub async fn get(&self, name: &str) -> Result<Option<Value>, ApiError> {
        match self.api.get_opt(&object_name(name)).await.map_err(|e| kube_error(e, name, &self.arn(name)))? {
            Some(o) if o.data["spec"]["name"].as_str().is_none_or(|n| n == name) => self.configuration(&o, None).map(Some),
            _ => Ok(None),
        }
    }

    /// ListFunctions: every function of the registry (those it cannot read are left out).
    pub async fn list(&self) -> Result<Value, ApiError> {
        let all = self.api.list(&ListParams::default()).await.map_err(|e| kube_error(e, "", ""))?;
        let functions = all.items.iter().filter(|o| o.data["spec"]["version"].is_null());
        let mut fns: Vec<Value> = functions.filter_map(|o| self.configuration(o, None).ok()).collect();
        fns.sort_by(|a, b| a["FunctionName"].as_str().cmp(&b["FunctionName"].as_str()));
        Ok(json!({"Functions": fns}))
    }

    /// A FunctionConfiguration from a ThawFunction: what the registry knows (the state
    /// of the deploy on the agents is theirs: Pending until an agent answers for it).
    fn configuration(&self, obj: &DynamicObject, code_size: Option<u64>) -> Result<Value, ApiError> {
        let w = Wanted::from_object(obj).map_err(unreadable)?;
        let env: serde_json::Map<String, Value> = w.env.iter().map(|(k, v)| (k.clone(), json!(v))).collect();
        let (arn, version, description) = match w.version {
            Some(n) => (format!("{}:{n}", self.arn(&w.name)), n.to_string(), w.version_description.clone()),
            None => (self.arn(&w.name), "$LATEST".to_string(), w.description.clone()),
        };
        let mut v = json!({
            "FunctionName": w.name, "FunctionArn": arn, "Runtime": w.runtime, "Handler": w.handler,
            "Role": role_arn(&self.account), "MemorySize": w.memory_mb, "Timeout": w.timeout_s,
            "CodeSha256": w.code_sha256(), "CodeSize": code_size.or(obj.data["spec"]["code"]["size"].as_u64()).unwrap_or(0), "Description": description,
            "Environment": {"Variables": env}, "Version": version, "PackageType": "Zip", "Architectures": ["x86_64"],
            "State": "Pending", "StateReason": "The function is being deployed on the agents.", "StateReasonCode": "Creating",
            "LastUpdateStatus": "InProgress", "RevisionId": obj.metadata.resource_version.clone().unwrap_or_default(),
            "LastModified": obj.metadata.creation_timestamp.as_ref().map(|t| t.0.to_rfc3339()).unwrap_or_default(),
        });
        if !w.layers.is_empty() {
            v["Layers"] = json!(w.layers.iter().map(|l| json!({"Arn": l.arn, "CodeSize": l.code.size})).collect::<Vec<_>>());
        }
        Ok(v)
    }
}
