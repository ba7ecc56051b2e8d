//! Lambda layers (issue #16): PublishLayerVersion, Get/List/DeleteLayerVersion,
//! ListLayers, and a function's `Layers` extracted under `/opt`.
//!
//! A published version is unpacked once under `<state>/layers/`. A revision whose
//! function names layers gets its own `opt/` beside `code/`: the layers copied in
//! the order given, a later one replacing an earlier one's files at the same path,
//! as Lambda does. The sandbox mounts it read-only at `/opt`, and the snapshot's
//! fingerprint covers it. Because each revision holds its copy, deleting a layer
//! version never breaks a function already using it (Lambda keeps it too).

use std::path::{Path, PathBuf};

use thiserror::Error;

use super::{timestamp, Node};
use crate::bundle::{BundleError, MAX_UNZIPPED};
use crate::registry::{LayerVersionRecord, RegistryError};

/// At most this many layers per function (Lambda's limit).
pub const MAX_LAYERS: usize = 5;

#[derive(Debug, Error)]
pub enum LayerError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error(transparent)]
    Registry(#[from] RegistryError),
    #[error("{what} {path}")]
    Io { what: &'static str, path: PathBuf, #[source] source: std::io::Error },
    #[error("unpacking the layer")]
    Join(#[source] tokio::task::JoinError),
}

/// What PublishLayerVersion asks for.
#[derive(Debug, Clone, Default)]
pub struct PublishLayer {
    pub description: String,
    pub compatible_runtimes: Vec<String>,
    pub compatible_architectures: Vec<String>,
    pub license_info: Option<String>,
}

/// A layer name as Lambda accepts it: 1-140 of `[a-zA-Z0-9-_]`.
fn check_name(name: &str) -> Result<(), LayerError> {
    if name.is_empty() || name.len() > 140 || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        return Err(LayerError::Invalid(format!(
            "1 validation error detected: Value '{name}' at 'layerName' failed to satisfy constraint: Member must satisfy regular expression pattern: [a-zA-Z0-9-_]+ and have length at most 140"
        )));
    }
    Ok(())
}

/// Layer names and ARNs of one region and account, as a node or a cluster's gateways
/// serve them (`serves`: "node" or "cluster", named when an ARN is another's).
#[derive(Debug, Clone, Copy)]
pub struct LayerArns<'a> {
    pub region: &'a str,
    pub account: &'a str,
    pub serves: &'static str,
}

impl LayerArns<'_> {
    /// `arn:aws:lambda:<region>:<account>:layer:<name>`.
    pub fn layer_arn(&self, name: &str) -> String {
        format!("arn:aws:lambda:{}:{}:layer:{name}", self.region, self.account)
    }

    pub fn layer_version_arn(&self, name: &str, version: u64) -> String {
        format!("{}:{version}", self.layer_arn(name))
    }

    /// A LayerName parameter (a name, or a layer ARN of this region and account) to a name.
    pub fn layer_name(&self, input: &str) -> Result<String, LayerError> {
        let name = match input.strip_prefix(self.layer_arn("").as_str()) {
            Some(n) => n,
            None if input.starts_with("arn:") => {
                return Err(LayerError::NotFound(format!("Layer not found: {input} (this {} serves only its own region and account)", self.serves)))
            }
            None => input,
        };
        check_name(name)?;
        Ok(name.to_string())
    }

    /// A layer version ARN to (name, version); `Invalid` when it is not of this region
    /// and account.
    pub fn parse_version_arn(&self, arn: &str) -> Result<(String, u64), LayerError> {
        let bad = || {
            LayerError::Invalid(format!(
                "1 validation error detected: Value '{arn}' at 'layers' failed to satisfy constraint: Member must satisfy regular expression pattern: arn:[a-zA-Z0-9-]+:lambda:[a-zA-Z0-9-]+:\\d{{12}}:layer:[a-zA-Z0-9-_]+:[0-9]+"
            ))
        };
        let (prefix, version) = arn.rsplit_once(':').ok_or_else(bad)?;
        let version: u64 = version.parse().map_err(|_| bad())?;
        let parts: Vec<&str> = prefix.split(':').collect();
        let ["arn", _, "lambda", _, _, "layer", name] = parts.as_slice() else { return Err(bad()) };
        if prefix != self.layer_arn(name) {
            return Err(LayerError::Invalid(format!("Layer version {arn} does not exist.")));
        }
        Ok((name.to_string(), version))
    }

    /// A function's `Layers` checked as Lambda checks them: at most [`MAX_LAYERS`], each a
    /// version ARN of this region and account, no layer twice. (name, version) of each,
    /// in order; whether each exists is the caller's to check.
    pub fn function_layers(&self, arns: &[String]) -> Result<Vec<(String, u64)>, LayerError> {
        if arns.len() > MAX_LAYERS {
            return Err(LayerError::Invalid(format!(
                "1 validation error detected: Value '[{}]' at 'layers' failed to satisfy constraint: Member must have length less than or equal to {MAX_LAYERS}",
                arns.join(", ")
            )));
        }
        let mut out: Vec<(String, u64)> = Vec::with_capacity(arns.len());
        for arn in arns {
            let (name, version) = self.parse_version_arn(arn)?;
            if out.iter().any(|(n, _)| *n == name) {
                return Err(LayerError::Invalid(format!("Two different versions of the same layer are not allowed to be referenced in the same function. {}", self.layer_arn(&name))));
            }
            out.push((name, version));
        }
        Ok(out)
    }
}

impl Node {
    /// This node's layer names and ARNs.
    pub fn layer_arns(&self) -> LayerArns<'_> {
        LayerArns { region: &self.cfg.region, account: &self.cfg.account, serves: "node" }
    }

    pub fn layer_arn(&self, name: &str) -> String {
        self.layer_arns().layer_arn(name)
    }

    pub fn layer_version_arn(&self, name: &str, version: u64) -> String {
        self.layer_arns().layer_version_arn(name, version)
    }

    /// A LayerName parameter (a name, or this node's layer ARN) to a name.
    pub fn layer_name(&self, input: &str) -> Result<String, LayerError> {
        self.layer_arns().layer_name(input)
    }

    /// A layer version ARN to (name, version); `Invalid` when it is not this node's.
    pub fn parse_layer_version_arn(&self, arn: &str) -> Result<(String, u64), LayerError> {
        self.layer_arns().parse_version_arn(arn)
    }

    /// Unpack `zip` and record it as the next version of `name`.
    pub async fn publish_layer_version(&self, name: &str, zip: Vec<u8>, p: PublishLayer) -> Result<LayerVersionRecord, LayerError> {
        let mut rec = self.unpack_layer(name, zip, p).await?;
        match self.registry.insert_layer_version(&rec) {
            Ok(v) => rec.version = v,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&rec.dir);
                return Err(e.into());
            }
        }
        tracing::info!(layer = name, version = rec.version, bytes = rec.unzipped_size, "layer version published");
        Ok(rec)
    }

    /// Whether this node has version `version` of layer `name` with the code whose
    /// CodeSha256 (base64) is `code_sha256`.
    pub fn has_layer_version(&self, name: &str, version: u64, code_sha256: &str) -> bool {
        matches!(self.registry.get_layer_version(name, version), Ok(Some(l)) if l.code_sha256 == code_sha256)
    }

    /// Unpack `zip` and record it as version `version` of `name`, the number a
    /// cluster's registry gave it (a `thaw serve --cluster` agent installs the layers
    /// of the functions it deploys this way, so their layer ARNs name the same code on
    /// every agent). A version of that number the node had with other code is replaced
    /// (its files go; functions keep their copies), and a version published on this
    /// node later never takes the number.
    pub async fn install_layer_version(&self, name: &str, version: u64, zip: Vec<u8>, p: PublishLayer) -> Result<LayerVersionRecord, LayerError> {
        let mut rec = self.unpack_layer(name, zip, p).await?;
        rec.version = version;
        match self.registry.install_layer_version(&rec) {
            Ok(Some(old)) if old.dir != rec.dir => {
                if let Err(e) = std::fs::remove_dir_all(&old.dir) {
                    tracing::warn!(dir = %old.dir.display(), error = %e, "removing a replaced layer version's files");
                }
            }
            Ok(_) => {}
            Err(e) => {
                let _ = std::fs::remove_dir_all(&rec.dir);
                return Err(e.into());
            }
        }
        tracing::info!(layer = name, version, bytes = rec.unzipped_size, "layer version installed");
        Ok(rec)
    }

    /// `zip` unpacked under the state directory: the record of a version of `name` to
    /// be (number 0).
    async fn unpack_layer(&self, name: &str, zip: Vec<u8>, p: PublishLayer) -> Result<LayerVersionRecord, LayerError> {
        check_name(name)?;
        let dir = self.cfg.state_dir.join("layers").join(format!("{name}-{}", uuid::Uuid::new_v4().simple()));
        let sha = crate::bundle::code_sha256(&zip);
        let size = zip.len() as u64;
        let d = dir.clone();
        let unzipped = match tokio::task::spawn_blocking(move || crate::bundle::extract(&zip, &d)).await.map_err(LayerError::Join)? {
            Ok(n) => n,
            Err(e) => {
                let _ = std::fs::remove_dir_all(&dir);
                return Err(e.into());
            }
        };
        Ok(LayerVersionRecord {
            name: name.to_string(),
            version: 0,
            description: p.description,
            compatible_runtimes: p.compatible_runtimes,
            compatible_architectures: p.compatible_architectures,
            license_info: p.license_info,
            code_sha256: sha,
            code_size: size,
            unzipped_size: unzipped,
            created: timestamp(),
            dir,
        })
    }

    pub fn layer_version(&self, name: &str, version: u64) -> Result<LayerVersionRecord, LayerError> {
        self.registry.get_layer_version(name, version)?.ok_or_else(|| {
            LayerError::NotFound(format!("The resource you requested does not exist. ({})", self.layer_version_arn(name, version)))
        })
    }

    /// A layer's versions, newest first (empty if the layer has none).
    pub fn layer_versions(&self, name: &str) -> Result<Vec<LayerVersionRecord>, LayerError> {
        Ok(self.registry.list_layer_versions(name)?)
    }

    /// Every layer's newest version that `wanted` accepts (ListLayers'
    /// LatestMatchingVersion), by layer name.
    pub fn layers(&self, wanted: impl Fn(&LayerVersionRecord) -> bool) -> Result<Vec<LayerVersionRecord>, LayerError> {
        let mut out: Vec<LayerVersionRecord> = Vec::new();
        for l in self.registry.all_layer_versions()? {
            if !wanted(&l) {
                continue;
            }
            if out.last().is_some_and(|p| p.name == l.name) {
                continue;
            }
            out.push(l);
        }
        Ok(out)
    }

    /// Delete a layer version (its files go; functions keep their copies). Deleting
    /// one that does not exist succeeds, as in Lambda.
    pub fn delete_layer_version(&self, name: &str, version: u64) -> Result<(), LayerError> {
        if let Some(rec) = self.registry.delete_layer_version(name, version)? {
            if let Err(e) = std::fs::remove_dir_all(&rec.dir) {
                tracing::warn!(dir = %rec.dir.display(), error = %e, "removing a deleted layer version's files");
            }
            tracing::info!(layer = name, version, "layer version deleted");
        }
        Ok(())
    }

    /// Check a function's `Layers` (at most five, each an existing version of this
    /// node's layers, no layer twice) and return their records in order.
    pub fn resolve_layers(&self, arns: &[String]) -> Result<Vec<LayerVersionRecord>, LayerError> {
        let mut out: Vec<LayerVersionRecord> = Vec::with_capacity(arns.len());
        for ((name, version), arn) in self.layer_arns().function_layers(arns)?.into_iter().zip(arns) {
            let rec = self
                .registry
                .get_layer_version(&name, version)?
                .ok_or_else(|| LayerError::Invalid(format!("Layer version {arn} does not exist.")))?;
            out.push(rec);
        }
        Ok(out)
    }

    /// Build `dest` (a revision's `opt/`) from `layers` in order, after checking that
    /// they fit beside `code_bytes` of unzipped code in Lambda's 250 MB limit.
    pub async fn materialize_layers(&self, layers: Vec<LayerVersionRecord>, dest: PathBuf, code_bytes: u64) -> Result<(), LayerError> {
        let total = code_bytes + layers.iter().map(|l| l.unzipped_size).sum::<u64>();
        if total > MAX_UNZIPPED {
            return Err(LayerError::Invalid(format!(
                "Function code combined with layers exceeds the maximum allowed size of {MAX_UNZIPPED} bytes. The actual size is {total} bytes."
            )));
        }
        tokio::task::spawn_blocking(move || {
            for l in &layers {
                crate::bundle::overlay_tree(&l.dir, &dest).map_err(|source| LayerError::Io {
                    what: "copying a layer's files into",
                    path: dest.clone(),
                    source,
                })?;
            }
            Ok(())
        })
        .await
        .map_err(LayerError::Join)?
    }
}

/// The bytes of the files under `dir` (a revision's code).
pub fn tree_bytes(dir: &Path) -> u64 {
    let mut total = 0;
    let Ok(rd) = std::fs::read_dir(dir) else { return 0 };
    for e in rd.flatten() {
        match e.file_type() {
            Ok(t) if t.is_dir() => total += tree_bytes(&e.path()),
            Ok(t) if t.is_file() => total += e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => {}
        }
    }
    total
}
