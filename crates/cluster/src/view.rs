//! The gateway's picture of the cluster: agents' advertisements (`ThawNode` objects,
//! deploy/base/crd-thawnode.yaml) watched from the apiserver, turned into the inputs of
//! [`Placer`].
//!
//! A node takes part in placement only once its agent has published a status with a
//! boot id (an agent that (re)starts republishes before it takes work); a deleted
//! ThawNode (its Node went away, or the agent removed it) leaves placement at the next
//! watch event. When the apiserver is unreachable the watcher retries with backoff and
//! the last view stays in force: the data plane keeps serving from its last-known state.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures::StreamExt;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use serde_json::Value;

use crate::hash::{hash_str, Rng};
use crate::placement::{Decision, Loads, Placer, Policy, Request};
use crate::ring::{Ring, DEFAULT_VNODES};

/// The ThawNode custom resource.
pub fn thawnode_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("thaw.dev", "v1alpha1", "ThawNode"), "thawnodes")
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AdError {
    #[error("ThawNode without a name")]
    NoName,
    #[error("ThawNode {0}: no spec.endpoint")]
    NoEndpoint(String),
    #[error("ThawNode {0}: not published yet (no status.bootId)")]
    Unpublished(String),
}

/// One node's advertisement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAd {
    pub name: String,
    pub endpoint: String,
    pub boot_id: String,
    pub free_instances: u64,
    /// Stored snapshot ids in the node's cache.
    pub cached: Vec<String>,
    /// Functions whose snapshot the node has.
    pub cached_functions: Vec<String>,
    /// (function, idle warm instances)
    pub warm: Vec<(String, u64)>,
    /// When the agent last published (status.heartbeatTime), if it said.
    pub heartbeat: Option<k8s_openapi::chrono::DateTime<k8s_openapi::chrono::Utc>>,
}

impl NodeAd {
    pub fn from_object(o: &DynamicObject) -> Result<NodeAd, AdError> {
        let name = o.metadata.name.clone().ok_or(AdError::NoName)?;
        let endpoint = o.data["spec"]["endpoint"].as_str().ok_or_else(|| AdError::NoEndpoint(name.clone()))?.to_string();
        let st = &o.data["status"];
        let boot_id = st["bootId"].as_str().filter(|s| !s.is_empty()).ok_or_else(|| AdError::Unpublished(name.clone()))?.to_string();
        let list = |v: &Value| v.as_array().cloned().unwrap_or_default();
        Ok(NodeAd {
            endpoint,
            boot_id,
            free_instances: st["freeInstances"].as_u64().unwrap_or(0),
            cached: list(&st["cachedSnapshots"]).iter().filter_map(|c| c["id"].as_str().filter(|s| !s.is_empty()).map(str::to_string)).collect(),
            cached_functions: list(&st["cachedSnapshots"]).iter().filter_map(|c| c["function"].as_str().filter(|s| !s.is_empty()).map(str::to_string)).collect(),
            warm: list(&st["warm"])
                .iter()
                .filter_map(|w| Some((w["function"].as_str()?.to_string(), w["idle"].as_u64().unwrap_or(0))))
                .filter(|(_, idle)| *idle > 0)
                .collect(),
            heartbeat: st["heartbeatTime"].as_str().and_then(|t| k8s_openapi::chrono::DateTime::parse_from_rfc3339(t).ok()).map(|t| t.to_utc()),
            name,
        })
    }
}

/// Placement inputs for a set of advertisements (node index = position in `nodes`,
/// sorted by name so every gateway replica builds the same ring).
#[derive(Debug, Clone)]
pub struct ClusterView {
    nodes: Vec<NodeAd>,
    policy: Policy,
    load_factor: f64,
    placer: Placer,
    warm: HashMap<String, Vec<usize>>,
    /// By stored snapshot id, and by function.
    cached: HashMap<String, Vec<usize>>,
    cached_functions: HashMap<String, Vec<usize>>,
}

impl ClusterView {
    pub fn new(mut nodes: Vec<NodeAd>, policy: Policy, load_factor: f64) -> ClusterView {
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        nodes.dedup_by(|a, b| a.name == b.name);
        let names: Vec<&str> = nodes.iter().map(|n| n.name.as_str()).collect();
        let placer = Placer::new(policy, Ring::new(&names, DEFAULT_VNODES), load_factor);
        let mut warm: HashMap<String, Vec<usize>> = HashMap::new();
        let mut cached: HashMap<String, Vec<usize>> = HashMap::new();
        let mut cached_functions: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, n) in nodes.iter().enumerate() {
            for (f, _) in &n.warm {
                warm.entry(f.clone()).or_default().push(i);
            }
            for s in &n.cached {
                cached.entry(s.clone()).or_default().push(i);
            }
            for f in &n.cached_functions {
                cached_functions.entry(f.clone()).or_default().push(i);
            }
        }
        ClusterView { nodes, policy, load_factor, placer, warm, cached, cached_functions }
    }

    /// This view without the nodes `leave_out` says (an agent found down, a heartbeat too old).
    pub fn without(&self, leave_out: impl Fn(&NodeAd) -> bool) -> ClusterView {
        ClusterView::new(self.nodes.iter().filter(|n| !leave_out(n)).cloned().collect(), self.policy, self.load_factor)
    }

    pub fn nodes(&self) -> &[NodeAd] {
        &self.nodes
    }

    /// The nodes in `function`'s walk of the placement ring, its home first.
    pub fn walk<'a>(&'a self, function: &str) -> impl Iterator<Item = &'a NodeAd> + 'a {
        self.placer.ring().walk(hash_str(function)).map(move |i| &self.nodes[i])
    }

    /// Chooses the node for an invocation of `function` whose snapshot id is `snapshot`
    /// (empty: not known to the caller; the nodes that have the function's snapshot
    /// are then those that say so) (`loads[i]`: invocations this gateway has in flight
    /// on node i).
    pub fn place<L: Loads + ?Sized>(&self, function: &str, snapshot: &str, loads: &L, rng: &mut Rng) -> Option<(&NodeAd, Decision)> {
        let empty = Vec::new();
        let cached = match self.cached.get(snapshot) {
            Some(c) if !snapshot.is_empty() => c,
            _ => self.cached_functions.get(function).unwrap_or(&empty),
        };
        let req = Request { key: hash_str(function), warm: self.warm.get(function).unwrap_or(&empty), cached };
        let d = self.placer.place(&req, loads, rng)?;
        Some((&self.nodes[d.node], d))
    }
}

/// Watches ThawNodes and sends a new [`ClusterView`] after every change. Runs until the
/// receiver is dropped; API errors are logged and retried with backoff, the last view
/// staying in force meanwhile.
pub async fn watch_nodes(client: Client, policy: Policy, load_factor: f64, tx: tokio::sync::watch::Sender<Arc<ClusterView>>) {
    let api: Api<DynamicObject> = Api::all_with(client, &thawnode_resource());
    let mut stream = watcher::watcher(api, watcher::Config::default()).default_backoff().boxed();
    let mut objs: BTreeMap<String, DynamicObject> = BTreeMap::new();
    let mut init: Option<BTreeMap<String, DynamicObject>> = None;
    while let Some(ev) = stream.next().await {
        let changed = match ev {
            Ok(Event::Init) => {
                init = Some(BTreeMap::new());
                false
            }
            Ok(Event::InitApply(o)) => {
                if let (Some(buf), Some(n)) = (init.as_mut(), o.metadata.name.clone()) {
                    buf.insert(n, o);
                }
                false
            }
            Ok(Event::InitDone) => {
                objs = init.take().unwrap_or_default();
                true
            }
            Ok(Event::Apply(o)) => match o.metadata.name.clone() {
                Some(n) => {
                    objs.insert(n, o);
                    true
                }
                None => false,
            },
            Ok(Event::Delete(o)) => o.metadata.name.as_ref().map(|n| objs.remove(n)).is_some(),
            Err(e) => {
                tracing::warn!(error = %e, "watching ThawNodes failed; keeping the last view");
                false
            }
        };
        if changed {
            let ads: Vec<NodeAd> = objs
                .values()
                .filter_map(|o| NodeAd::from_object(o).map_err(|e| tracing::debug!(error = %e, "node left out of placement")).ok())
                .collect();
            tracing::info!(nodes = ads.len(), "cluster view updated");
            if tx.send(Arc::new(ClusterView::new(ads, policy, load_factor))).is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> DynamicObject {
        serde_json::from_value(v).unwrap()
    }

    fn ad(name: &str, warm: &[&str], cached: &[&str]) -> DynamicObject {
        obj(json!({
            "apiVersion": "thaw.dev/v1alpha1", "kind": "ThawNode", "metadata": {"name": name},
            "spec": {"endpoint": format!("http://{name}:9000")},
            "status": {"bootId": "b", "freeInstances": 4,
                "warm": warm.iter().map(|f| json!({"function": f, "idle": 1})).collect::<Vec<_>>(),
                "cachedSnapshots": cached.iter().map(|s| json!({"id": s, "bytes": 1})).collect::<Vec<_>>()}
        }))
    }

    #[test]
    fn parses_advertisements_and_refuses_unpublished() {
        let a = NodeAd::from_object(&ad("n1", &["f"], &["s1"])).unwrap();
        assert_eq!((a.endpoint.as_str(), a.free_instances, a.cached.clone(), a.warm.clone()), ("http://n1:9000", 4, vec!["s1".to_string()], vec![("f".to_string(), 1)]));
        let bare = obj(json!({"apiVersion": "thaw.dev/v1alpha1", "kind": "ThawNode", "metadata": {"name": "n2"}, "spec": {"endpoint": "http://n2:9000"}}));
        assert_eq!(NodeAd::from_object(&bare), Err(AdError::Unpublished("n2".into())));
        let noep = obj(json!({"apiVersion": "thaw.dev/v1alpha1", "kind": "ThawNode", "metadata": {"name": "n3"}, "spec": {}}));
        assert_eq!(NodeAd::from_object(&noep).unwrap_err().to_string(), "ThawNode n3: no spec.endpoint");
    }

    #[test]
    fn view_prefers_warm_then_cached_and_is_order_independent() {
        let ads: Vec<NodeAd> = [ad("n3", &[], &["snap-f"]), ad("n1", &["f"], &[]), ad("n2", &[], &[])].iter().map(|o| NodeAd::from_object(o).unwrap()).collect();
        let mut rev = ads.clone();
        rev.reverse();
        let (v1, v2) = (ClusterView::new(ads, Policy::Thaw, 1.25), ClusterView::new(rev, Policy::Thaw, 1.25));
        let mut rng = Rng::new(1);
        let loads = [0u32; 3];
        let (n, d) = v1.place("f", "snap-f", &loads[..], &mut rng).unwrap();
        assert_eq!((n.name.as_str(), d.reason), ("n1", crate::placement::Reason::Warm));
        let (n, d) = v1.place("g", "snap-f", &loads[..], &mut rng).unwrap();
        assert_eq!((n.name.as_str(), d.reason), ("n3", crate::placement::Reason::Cached));
        // Known by function (the gateway does not know snapshot ids): the advert says
        // which functions' snapshots a node has.
        let by_fn = |name: &str, f: &str| {
            let mut o = ad(name, &[], &[]);
            o.data["status"]["cachedSnapshots"] = json!([{"id": "", "function": f, "bytes": 1}]);
            NodeAd::from_object(&o).unwrap()
        };
        let v = ClusterView::new(vec![by_fn("n1", "other"), by_fn("n2", "h"), by_fn("n3", "other")], Policy::Thaw, 1.25);
        let (n, d) = v.place("h", "", &loads[..], &mut rng).unwrap();
        assert_eq!((n.name.as_str(), d.reason), ("n2", crate::placement::Reason::Cached));
        assert!(n.cached.is_empty(), "an empty id is no snapshot id");
        for f in 0..50 {
            let f = format!("fn-{f}");
            assert_eq!(v1.place(&f, "", &loads[..], &mut rng).unwrap().0.name, v2.place(&f, "", &loads[..], &mut rng).unwrap().0.name);
        }
        assert!(ClusterView::new(vec![], Policy::Thaw, 1.25).place("f", "", &[] as &[u32], &mut rng).is_none());
    }
}
