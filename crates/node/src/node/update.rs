//! UpdateFunctionConfiguration (issue #16). A change that is baked into the snapshot
//! (runtime, handler, memory, environment) makes a new revision: the latest code is
//! copied into a new revision directory and its snapshot built in the background
//! while the active revision keeps serving (`LastUpdateStatus` InProgress, then
//! Successful or Failed, as for UpdateFunctionCode). Timeout, description and role
//! are not in the snapshot: they change at once.

use std::collections::BTreeMap;
use std::sync::Arc;

use super::{timestamp, DeployError, Node};
use crate::registry::FunctionRecord;

/// What an UpdateFunctionConfiguration request changes (`None`: unchanged).
#[derive(Debug, Clone, Default)]
pub struct ConfigChange {
    pub runtime: Option<String>,
    pub handler: Option<String>,
    pub memory_mb: Option<u64>,
    pub timeout_s: Option<u64>,
    pub env: Option<BTreeMap<String, String>>,
    pub description: Option<String>,
    pub role: Option<String>,
    /// Layer version ARNs (replacing the list; `Some(vec![])` removes every layer).
    pub layers: Option<Vec<String>>,
    /// Refuse the update unless the function's RevisionId is this one.
    pub revision_id: Option<String>,
}

impl ConfigChange {
    /// Whether applying it to `r` changes what the snapshot holds.
    pub fn rebuilds(&self, r: &FunctionRecord) -> bool {
        self.runtime.as_ref().is_some_and(|v| *v != r.runtime)
            || self.handler.as_ref().is_some_and(|v| *v != r.handler)
            || self.memory_mb.is_some_and(|v| v != r.memory_mb)
            || self.env.as_ref().is_some_and(|v| *v != r.env)
            || self.layers.as_ref().is_some_and(|v| *v != r.layers)
    }
}

impl Node {
    pub async fn update_configuration(self: &Arc<Self>, name: &str, change: ConfigChange) -> Result<FunctionRecord, DeployError> {
        self.update_configuration_adopting(name, change, None).await
    }

    /// [`Node::update_configuration`] serving a new revision from `adopt`, a stored
    /// snapshot of it another node published (see [`Node::create_function_adopting`]).
    pub async fn update_configuration_adopting(self: &Arc<Self>, name: &str, change: ConfigChange, adopt: Option<String>) -> Result<FunctionRecord, DeployError> {
        let f = self.function(name).ok_or_else(|| DeployError::NotFound(self.arn(name)))?;
        let (code, sha, size) = {
            let mut st = f.lock();
            if change.revision_id.as_ref().is_some_and(|r| *r != st.rec.revision_id) {
                return Err(DeployError::RevisionMismatch);
            }
            if st.building.is_some() {
                return Err(DeployError::InProgress(self.arn(name)));
            }
            if !change.rebuilds(&st.rec) {
                let prev = st.rec.clone();
                if let Some(t) = change.timeout_s {
                    st.rec.timeout_s = t;
                }
                if let Some(d) = &change.description {
                    st.rec.description = d.clone();
                }
                if let Some(r) = &change.role {
                    st.rec.role = r.clone();
                }
                st.rec.last_modified = timestamp();
                st.rec.revision_id = uuid::Uuid::new_v4().to_string();
                st.rec.last_update_status = "Successful".into();
                st.rec.last_update_status_reason = None;
                st.rec.last_update_status_reason_code = None;
                if let Err(e) = self.registry.update_function(&st.rec) {
                    st.rec = prev;
                    return Err(e.into());
                }
                return Ok(st.rec.clone());
            }
            let latest = st.rec.latest_revision.or(st.rec.active_revision);
            let rev = latest.and_then(|id| self.registry.get_revision(id).ok().flatten());
            let Some(rev) = rev else { return Err(DeployError::NotFound(self.arn(name))) };
            (rev, st.rec.code_sha256.clone(), st.rec.code_size)
        };
        let (latest, code) = (code.id, code.dir.join("code"));
        let dir = self.new_revision_dir(name);
        let d = dir.clone();
        let copied = tokio::task::spawn_blocking(move || crate::bundle::overlay_tree(&code, &d.join("code"))).await.map_err(DeployError::Join)?;
        if let Err(source) = copied {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(DeployError::Copy { name: name.to_string(), source });
        }
        match &change.layers {
            Some(layers) => {
                let code_bytes = super::layer_versions::tree_bytes(&dir.join("code"));
                self.add_layers(&dir, layers, code_bytes).await?;
            }
            None => self.copy_layers(name, Some(latest), &dir).await?,
        }
        self.start_revision(f, dir, sha, size, adopt, move |spec| {
            if let Some(v) = change.runtime {
                spec.runtime = v;
            }
            if let Some(v) = change.handler {
                spec.handler = v;
            }
            if let Some(v) = change.memory_mb {
                spec.memory_mb = v;
            }
            if let Some(v) = change.timeout_s {
                spec.timeout_s = v;
            }
            if let Some(v) = change.env {
                spec.env = v;
            }
            if let Some(v) = change.description {
                spec.description = v;
            }
            if let Some(v) = change.role {
                spec.role = v;
            }
            if let Some(v) = change.layers {
                spec.layers = v;
            }
        })
    }
}
