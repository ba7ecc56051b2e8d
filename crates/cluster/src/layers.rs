//! The cluster's Lambda layers (issue #29): one ThawLayer object per layer
//! (deploy/base/crd-thawlayer.yaml) holds its versions, each version's zip is in the
//! snapshot store (content-addressed, as function bundles are). The gateway answers
//! PublishLayerVersion, GetLayerVersion, GetLayerVersionByArn, ListLayerVersions,
//! ListLayers and DeleteLayerVersion from them ([`Layers`]).
//!
//! A function that names layers (CreateFunction's or UpdateFunctionConfiguration's
//! `Layers`) gets in its ThawFunction, for each, the version's ARN and where its zip is
//! ([`LayerRef`], resolved here when the gateway writes the function). The agents need
//! nothing else: each installs the zip under the cluster's version number
//! (`Node::install_layer_version`) before it deploys the function, so one ARN names the
//! same files on every agent, and the snapshot one agent builds serves on the others.
//! Deleting a layer version takes it out of its ThawLayer only: its zip stays in the
//! store, so functions that use it keep deploying on new agents, as Lambda keeps a
//! deleted version for the functions that have it.
//!
//! Numbers are never reused: the object keeps the last one given (`spec.lastVersion`),
//! and stays (with no versions) when its last version is deleted.

use std::sync::Arc;

use axum::http::StatusCode;
use kube::api::{DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{Api, Client};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use thaw_node::api::{layer_list_item, layer_matches, layer_version_answer, layer_version_number, page, publish_layer_request, query_param, ApiError};
use thaw_node::node::LayerArns;
use thaw_node::registry::LayerVersionRecord;

use crate::registry::{kube_error, object_name, put_bundle, sha256_b64, unreadable};

pub fn thawlayer_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("thaw.dev", "v1alpha1", "ThawLayer"), "thawlayers")
}

/// A layer version a function uses, as its ThawFunction holds it (`spec.layers[]`):
/// what an agent needs to install it without reading the ThawLayer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerRef {
    /// The version's ARN (`arn:aws:lambda:REGION:ACCOUNT:layer:NAME:N`).
    pub arn: String,
    pub code: StoredCode,
}

/// A zip in the store: key, SHA-256 (hex) and size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredCode {
    pub key: String,
    pub sha256: String,
    #[serde(default)]
    pub size: u64,
}

impl LayerRef {
    /// (layer name, version number) from the ARN; None when it is not a layer version ARN.
    pub fn name_and_version(&self) -> Option<(&str, u64)> {
        let (prefix, v) = self.arn.rsplit_once(':')?;
        let (_, name) = prefix.rsplit_once(":layer:")?;
        Some((name, v.parse().ok()?))
    }
}

/// One version as its ThawLayer holds it (`spec.versions[]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredVersion {
    version: u64,
    #[serde(default)]
    description: String,
    #[serde(default)]
    compatible_runtimes: Vec<String>,
    #[serde(default)]
    compatible_architectures: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    license_info: Option<String>,
    created: String,
    code: StoredCode,
}

impl StoredVersion {
    /// The node's record of it (what the node's answers are made from; no files here).
    fn record(&self, name: &str) -> LayerVersionRecord {
        LayerVersionRecord {
            name: name.to_string(),
            version: self.version,
            description: self.description.clone(),
            compatible_runtimes: self.compatible_runtimes.clone(),
            compatible_architectures: self.compatible_architectures.clone(),
            license_info: self.license_info.clone(),
            code_sha256: sha256_b64(&self.code.sha256),
            code_size: self.code.size,
            unzipped_size: 0,
            created: self.created.clone(),
            dir: Default::default(),
        }
    }
}

/// A ThawLayer's spec.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct LayerSpec {
    name: String,
    #[serde(default)]
    last_version: u64,
    /// Oldest first.
    #[serde(default)]
    versions: Vec<StoredVersion>,
}

fn spec_of(obj: &DynamicObject) -> Result<LayerSpec, ApiError> {
    serde_json::from_value(obj.data["spec"].clone()).map_err(|e| unreadable(format!("ThawLayer {}: {e}", obj.metadata.name.as_deref().unwrap_or("?"))))
}

/// Where the gateway's layers live: the ThawLayers of one namespace, zips in one store.
pub struct Layers {
    api: Api<DynamicObject>,
    ns: String,
    store: Arc<thaw_store::Store>,
    region: String,
    account: String,
}

impl Layers {
    pub fn new(client: Client, ns: &str, store: Arc<thaw_store::Store>, region: &str, account: &str) -> Layers {
        Layers { api: Api::namespaced_with(client, ns, &thawlayer_resource()), ns: ns.to_string(), store, region: region.into(), account: account.into() }
    }

    /// The cluster's layer names and ARNs (the node's vocabulary, for the gateway's
    /// region and account).
    fn arns(&self) -> LayerArns<'_> {
        LayerArns { region: &self.region, account: &self.account, serves: "cluster" }
    }

    pub fn layer_arn(&self, name: &str) -> String {
        self.arns().layer_arn(name)
    }

    /// A LayerName parameter (a name, or a layer ARN of this region and account) to a name.
    pub fn layer_name(&self, input: &str) -> Result<String, ApiError> {
        Ok(self.arns().layer_name(input)?)
    }

    /// The object of layer `name` and its spec, if there is one.
    async fn layer(&self, name: &str) -> Result<Option<(DynamicObject, LayerSpec)>, ApiError> {
        let arn = self.layer_arn(name);
        let Some(obj) = self.api.get_opt(&object_name(name)).await.map_err(|e| kube_error(e, name, &arn))? else { return Ok(None) };
        let spec = spec_of(&obj)?;
        // Another name that maps to the same object name (a hash collision): not this layer.
        Ok((spec.name == name).then_some((obj, spec)))
    }

    /// PublishLayerVersion: the zip into the store, then the next number in the layer's
    /// object (created with the first version). A concurrent publish through another
    /// gateway is a conflict on the object: read and try again.
    pub async fn publish(&self, input: &str, body: &[u8]) -> Result<Value, ApiError> {
        let name = self.layer_name(input)?;
        let (zip, p) = publish_layer_request(body)?;
        let size = zip.len() as u64;
        let (key, sha256) = put_bundle(&self.store, zip).await?;
        let arn = self.layer_arn(&name);
        for _ in 0..5 {
            let existing = self.layer(&name).await?;
            let mut spec = existing.as_ref().map(|(_, s)| s.clone()).unwrap_or_else(|| LayerSpec { name: name.clone(), ..Default::default() });
            let version = spec.last_version.max(spec.versions.iter().map(|v| v.version).max().unwrap_or(0)) + 1;
            let stored = StoredVersion {
                version,
                description: p.description.clone(),
                compatible_runtimes: p.compatible_runtimes.clone(),
                compatible_architectures: p.compatible_architectures.clone(),
                license_info: p.license_info.clone(),
                created: thaw_node::node::timestamp(),
                code: StoredCode { key: key.clone(), sha256: sha256.clone(), size },
            };
            spec.last_version = version;
            spec.versions.push(stored.clone());
            let written = match existing {
                Some((obj, _)) => {
                    let patch = json!({"metadata": {"resourceVersion": obj.metadata.resource_version}, "spec": spec});
                    self.api.patch(&object_name(&name), &PatchParams::default(), &Patch::Merge(&patch)).await.map(drop)
                }
                None => {
                    let obj = json!({"apiVersion": "thaw.dev/v1alpha1", "kind": "ThawLayer", "metadata": {"name": object_name(&name), "namespace": self.ns}, "spec": spec});
                    let obj: DynamicObject = serde_json::from_value(obj).expect("a ThawLayer");
                    self.api.create(&PostParams::default(), &obj).await.map(drop)
                }
            };
            match written {
                Ok(()) => {
                    tracing::info!(layer = %name, version, key = %key, "layer version published");
                    return Ok(layer_version_answer(&arn, &stored.record(&name)));
                }
                Err(kube::Error::Api(a)) if a.code == 409 => continue,
                Err(e) => return Err(kube_error(e, &name, &arn)),
            }
        }
        Err(ApiError::new(StatusCode::CONFLICT, "ResourceConflictException", format!("versions of layer {name} are being published concurrently; try again")))
    }

    /// Version `v` of layer `name`, or Lambda's not-found error.
    async fn version(&self, name: &str, v: u64) -> Result<StoredVersion, ApiError> {
        let missing = || ApiError::not_found(format!("The resource you requested does not exist. ({}:{v})", self.layer_arn(name)));
        let (_, spec) = self.layer(name).await?.ok_or_else(missing)?;
        spec.versions.into_iter().find(|s| s.version == v).ok_or_else(missing)
    }

    /// GetLayerVersion.
    pub async fn get(&self, input: &str, v: &str) -> Result<Value, ApiError> {
        let name = self.layer_name(input)?;
        let stored = self.version(&name, layer_version_number(v)?).await?;
        Ok(layer_version_answer(&self.layer_arn(&name), &stored.record(&name)))
    }

    /// ListLayers (`raw_query`: CompatibleRuntime, CompatibleArchitecture, Marker,
    /// MaxItems), or GetLayerVersionByArn, which shares its path (`?find=LayerVersion&Arn=`).
    pub async fn list(&self, raw_query: Option<&str>) -> Result<Value, ApiError> {
        if query_param(raw_query, "find").as_deref() == Some("LayerVersion") {
            let arn = query_param(raw_query, "Arn").ok_or_else(|| ApiError::invalid("Arn is required."))?;
            let (prefix, v) = arn.rsplit_once(':').ok_or_else(|| ApiError::invalid(format!("Invalid layer version ARN: {arn}")))?;
            return self.get(prefix, v).await;
        }
        let (runtime, arch) = (query_param(raw_query, "CompatibleRuntime"), query_param(raw_query, "CompatibleArchitecture"));
        let all = self.api.list(&ListParams::default()).await.map_err(|e| kube_error(e, "", ""))?;
        let mut latest: Vec<LayerVersionRecord> = all
            .items
            .iter()
            .filter_map(|o| spec_of(o).ok())
            .filter_map(|s| s.versions.iter().rev().map(|v| v.record(&s.name)).find(|r| layer_matches(r, runtime.as_deref(), arch.as_deref())))
            .collect();
        latest.sort_by(|a, b| a.name.cmp(&b.name));
        let (items, next) = page(latest, raw_query, |l| l.name.clone())?;
        let list: Vec<Value> = items
            .iter()
            .map(|l| json!({"LayerName": l.name, "LayerArn": self.layer_arn(&l.name), "LatestMatchingVersion": layer_list_item(&format!("{}:{}", self.layer_arn(&l.name), l.version), l)}))
            .collect();
        let mut v = json!({"Layers": list});
        if let Some(n) = next {
            v["NextMarker"] = json!(n);
        }
        Ok(v)
    }

    /// ListLayerVersions: newest first.
    pub async fn list_versions(&self, input: &str, raw_query: Option<&str>) -> Result<Value, ApiError> {
        let name = self.layer_name(input)?;
        let (runtime, arch) = (query_param(raw_query, "CompatibleRuntime"), query_param(raw_query, "CompatibleArchitecture"));
        let versions = self.layer(&name).await?.map(|(_, s)| s.versions).unwrap_or_default();
        let all: Vec<LayerVersionRecord> =
            versions.iter().rev().map(|v| v.record(&name)).filter(|r| layer_matches(r, runtime.as_deref(), arch.as_deref())).collect();
        let (items, next) = page(all, raw_query, |r| r.version.to_string())?;
        let arn = self.layer_arn(&name);
        let mut v = json!({"LayerVersions": items.iter().map(|r| layer_list_item(&format!("{arn}:{}", r.version), r)).collect::<Vec<_>>()});
        if let Some(n) = next {
            v["NextMarker"] = json!(n);
        }
        Ok(v)
    }

    /// DeleteLayerVersion: out of its object (one that is not there is no error, as in
    /// Lambda). Its zip stays in the store for the functions that use it.
    pub async fn delete(&self, input: &str, v: &str) -> Result<(), ApiError> {
        let name = self.layer_name(input)?;
        let n = layer_version_number(v)?;
        let arn = self.layer_arn(&name);
        for _ in 0..5 {
            let Some((obj, mut spec)) = self.layer(&name).await? else { return Ok(()) };
            let before = spec.versions.len();
            spec.versions.retain(|s| s.version != n);
            if spec.versions.len() == before {
                return Ok(());
            }
            let patch = json!({"metadata": {"resourceVersion": obj.metadata.resource_version}, "spec": spec});
            match self.api.patch(&object_name(&name), &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => {
                    tracing::info!(layer = %name, version = n, "layer version deleted (its zip stays in the store for the functions that use it)");
                    return Ok(());
                }
                Err(kube::Error::Api(a)) if a.code == 409 => continue,
                Err(e) => return Err(kube_error(e, &name, &arn)),
            }
        }
        Err(ApiError::new(StatusCode::CONFLICT, "ResourceConflictException", format!("layer {name} is being changed concurrently; try again")))
    }

    /// A function's `Layers` (version ARNs) as its ThawFunction holds them: checked as
    /// the node checks them ([`LayerArns::function_layers`]), each a version the
    /// registry has; in order.
    pub async fn resolve(&self, arns: &[String]) -> Result<Vec<LayerRef>, ApiError> {
        let mut out: Vec<LayerRef> = Vec::with_capacity(arns.len());
        for ((name, n), arn) in self.arns().function_layers(arns)?.into_iter().zip(arns) {
            let invalid = || ApiError::invalid(format!("Layer version {arn} does not exist."));
            let stored = self.version(&name, n).await.map_err(|e| if e.status == StatusCode::NOT_FOUND { invalid() } else { e })?;
            out.push(LayerRef { arn: arn.clone(), code: stored.code });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_layer_ref_names_its_layer_and_version() {
        let r = LayerRef { arn: "arn:aws:lambda:us-east-1:000000000000:layer:deps:3".into(), code: StoredCode { key: "k".into(), sha256: "s".into(), size: 1 } };
        assert_eq!(r.name_and_version(), Some(("deps", 3)));
        let bad = LayerRef { arn: "arn:aws:lambda:us-east-1:000000000000:function:f".into(), ..r };
        assert_eq!(bad.name_and_version(), None);
    }
}
