//! The node agent's advertisement (`thaw serve --cluster`, issue #29): the node's
//! ThawNode (deploy/base/crd-thawnode.yaml), written with the agent's own narrow
//! credentials (deploy/base/agent-rbac.yaml: only the ThawNode named after its node,
//! owned by that Node), read by every gateway ([`crate::view`]).
//!
//! What it says: the endpoint gateways reach the agent at; a boot id, new at every
//! start (a gateway ignores a node until its current boot has published, so a
//! restarted agent publishes before it takes work); free instance slots and memory,
//! calls in flight, the snapshots in its cache and the idle warm instances per
//! function. [`Agent::run`] publishes when that changes, at most once per tick
//! (debounced: a burst of calls is one write), and at least once per heartbeat.
//! When the apiserver cannot be reached the node goes on serving; the next tick tries
//! again.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{DynamicObject, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{json, Value};
use tracing::{info, warn};

use crate::view::thawnode_resource;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("the Node {node} is not known to the apiserver (the agent's --node-name must name the node it runs on)")]
    NoNode { node: String },
    #[error("{what} ThawNode {node}: {source}")]
    Kube {
        what: &'static str,
        node: String,
        #[source]
        source: kube::Error,
    },
}

/// A snapshot a node has locally: placement prefers the node for a cold start of its
/// function (the gateway knows functions by name; the id is the stored snapshot's).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord)]
pub struct CachedSnapshot {
    pub function: String,
    /// The stored snapshot's id (None: not in a store).
    pub id: Option<String>,
    pub bytes: u64,
}

/// What a node advertises (the ThawNode's status).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Advert {
    /// Instances the node can still start (`--max-instances` less those alive).
    pub free_instances: u64,
    /// Invocations running now.
    pub in_flight: u64,
    /// Memory left in the node's budget, MiB.
    pub free_memory_mb: u64,
    /// The snapshots the node has locally.
    pub cached: Vec<CachedSnapshot>,
    /// (function, idle warm instances), for functions with any.
    pub warm: Vec<(String, u64)>,
}

impl Advert {
    /// From the node's `/thaw/status` document ([`thaw_node::node::Node::status`]).
    pub fn from_node_status(st: &Value) -> Advert {
        let n = &st["node"];
        let u = |v: &Value| v.as_u64().unwrap_or(0);
        let funcs = st["functions"].as_array().cloned().unwrap_or_default();
        let mut cached: Vec<CachedSnapshot> = funcs
            .iter()
            .filter_map(|f| {
                let s = &f["snapshot"];
                let id = s["stored"].as_str().map(str::to_string);
                (id.is_some() || u(&s["bytes"]) > 0).then(|| CachedSnapshot { function: f["name"].as_str().unwrap_or_default().to_string(), id, bytes: u(&s["bytes"]) })
            })
            .filter(|c| !c.function.is_empty())
            .collect();
        cached.sort();
        let mut warm: Vec<(String, u64)> =
            funcs.iter().filter_map(|f| Some((f["name"].as_str()?.to_string(), u(&f["instances"]["idle"])))).filter(|(_, idle)| *idle > 0).collect();
        warm.sort();
        Advert {
            free_instances: u(&n["max_instances"]).saturating_sub(u(&n["instances_alive"])),
            in_flight: funcs.iter().map(|f| u(&f["instances"]["busy"])).sum(),
            free_memory_mb: u(&n["memory_budget_mb"]).saturating_sub(u(&n["memory_committed_mb"])),
            cached,
            warm,
        }
    }

    fn status(&self, boot_id: &str) -> Value {
        json!({
            "bootId": boot_id,
            "heartbeatTime": now_rfc3339(),
            "freeInstances": self.free_instances,
            "inFlight": self.in_flight,
            "freeMemoryMb": self.free_memory_mb,
            "cachedSnapshots": self.cached.iter().map(|c| json!({"id": c.id.as_deref().unwrap_or(""), "function": c.function, "bytes": c.bytes})).collect::<Vec<_>>(),
            "warm": self.warm.iter().map(|(f, idle)| json!({"function": f, "idle": idle})).collect::<Vec<_>>(),
        })
    }
}

use crate::now_rfc3339;

/// One node's agent, publishing its ThawNode.
pub struct Agent {
    client: Client,
    node: String,
    endpoint: String,
    boot_id: String,
    /// The ThawNode exists with this agent's endpoint (created or checked once).
    ensured: bool,
}

impl Agent {
    /// The agent of Node `node`, reachable at `endpoint`; a new boot id.
    pub fn new(client: Client, node: &str, endpoint: &str) -> Agent {
        Agent { client, node: node.to_string(), endpoint: endpoint.to_string(), boot_id: uuid::Uuid::new_v4().to_string(), ensured: false }
    }

    pub fn boot_id(&self) -> &str {
        &self.boot_id
    }

    fn api(&self) -> Api<DynamicObject> {
        Api::all_with(self.client.clone(), &thawnode_resource())
    }

    fn kube(&self, what: &'static str) -> impl Fn(kube::Error) -> AgentError + '_ {
        move |source| AgentError::Kube { what, node: self.node.clone(), source }
    }

    /// Create the ThawNode (owned by its Node, so it goes with it), or point the
    /// existing one at this agent's endpoint.
    async fn ensure(&mut self) -> Result<(), AgentError> {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let uid = match nodes.get_opt(&self.node).await.map_err(self.kube("reading the Node of"))? {
            Some(n) => n.metadata.uid.unwrap_or_default(),
            None => return Err(AgentError::NoNode { node: self.node.clone() }),
        };
        let obj: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "thaw.dev/v1alpha1",
            "kind": "ThawNode",
            "metadata": {
                "name": self.node,
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": self.node, "uid": uid}]
            },
            "spec": {"endpoint": self.endpoint}
        }))
        .expect("a ThawNode");
        match self.api().create(&PostParams::default(), &obj).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 409 => {
                let patch = json!({"metadata": {"ownerReferences": obj.metadata.owner_references}, "spec": {"endpoint": self.endpoint}});
                self.api().patch(&self.node, &PatchParams::default(), &Patch::Merge(&patch)).await.map_err(self.kube("updating"))?;
            }
            Err(e) => return Err(self.kube("creating")(e)),
        }
        self.ensured = true;
        Ok(())
    }

    /// Write `ad` as the ThawNode's status (creating the ThawNode first if needed).
    pub async fn publish(&mut self, ad: &Advert) -> Result<(), AgentError> {
        if !self.ensured {
            self.ensure().await?;
        }
        let patch = json!({"status": ad.status(&self.boot_id)});
        match self.api().patch_status(&self.node, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => Ok(()),
            Err(e) => {
                // Deleted meanwhile (by hand, or its Node came back): created again next time.
                if matches!(&e, kube::Error::Api(a) if a.code == 404) {
                    self.ensured = false;
                }
                Err(self.kube("publishing the status of")(e))
            }
        }
    }

    /// Publish what `source` says whenever it changes (checked every `tick`), and at
    /// least every `heartbeat`, until `stop` turns true. Failures are logged and
    /// retried at the next tick; the node serves meanwhile.
    pub async fn run(mut self, source: impl Fn() -> Advert + Send, tick: Duration, heartbeat: Duration, mut stop: tokio::sync::watch::Receiver<bool>) {
        let mut last: Option<(Advert, tokio::time::Instant)> = None;
        let mut failing = false;
        loop {
            let ad = source();
            let due = last.as_ref().is_none_or(|(prev, at)| *prev != ad || at.elapsed() >= heartbeat);
            if due {
                match self.publish(&ad).await {
                    Ok(()) => {
                        if failing {
                            info!(node = %self.node, "ThawNode published again");
                        }
                        failing = false;
                        last = Some((ad, tokio::time::Instant::now()));
                    }
                    Err(e) => {
                        if !failing {
                            warn!(node = %self.node, error = %thaw_node::node::error_chain(&e), "cannot publish the ThawNode; serving on, retrying");
                        }
                        failing = true;
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(tick) => {}
                _ = stop.changed() => return,
            }
        }
    }
}

/// How often `thaw serve --cluster` checks what to publish (a burst is one write).
pub const TICK: Duration = Duration::from_secs(1);
/// Most time between two publications (a gateway may judge a node by its heartbeat age).
pub const HEARTBEAT: Duration = Duration::from_secs(10);
/// How long a starting agent tries to publish before it serves anyway (the apiserver
/// away: gateways' last-known view may still send it calls).
pub const FIRST_PUBLISH_WAIT: Duration = Duration::from_secs(15);

/// `thaw serve --cluster`: the agent of Node `node` run beside the node ([`thaw_node::cli::Beside`]).
/// It publishes the node's new boot before the node takes work (retrying for
/// [`FIRST_PUBLISH_WAIT`]), then keeps the advertisement current and deploys the
/// registry's functions ([`crate::follow`]) until shutdown.
pub fn beside(node: String, endpoint: Option<String>, kubeconfig: Option<std::path::PathBuf>) -> thaw_node::cli::Beside {
    Box::new(move |n: Arc<thaw_node::node::Node>, local: std::net::SocketAddr, stop| {
        Box::pin(async move {
            let endpoint = endpoint.unwrap_or_else(|| format!("http://{local}"));
            let client = crate::kube_client(kubeconfig.as_deref()).await?;
            let mut agent = Agent::new(client.clone(), &node, &endpoint);
            let follower = crate::follow::Follower::new(client, n.clone(), &node);
            let source = move || Advert::from_node_status(&n.status());
            let deadline = tokio::time::Instant::now() + FIRST_PUBLISH_WAIT;
            loop {
                match agent.publish(&source()).await {
                    Ok(()) => {
                        info!(node = %node, %endpoint, boot_id = agent.boot_id(), "ThawNode published; taking work");
                        break;
                    }
                    Err(e) if tokio::time::Instant::now() < deadline => {
                        warn!(node = %node, error = %thaw_node::node::error_chain(&e), "cannot publish the ThawNode yet; retrying before taking work");
                        tokio::time::sleep(Duration::from_millis(500)).await;
                    }
                    Err(e) => {
                        warn!(node = %node, error = %thaw_node::node::error_chain(&e), "serving without a published ThawNode; still trying");
                        break;
                    }
                }
            }
            let follow_stop = stop.clone();
            let both = async move {
                futures::join!(agent.run(source, TICK, HEARTBEAT, stop), follower.run(follow_stop));
            };
            Ok(Box::pin(both) as thaw_node::cli::BoxFuture<()>)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_advert_is_read_from_the_node_status() {
        let st = json!({
            "node": {"instances_alive": 3, "max_instances": 32, "memory_committed_mb": 384, "memory_budget_mb": 1024},
            "functions": [
                {"name": "b", "instances": {"live": 2, "busy": 1, "idle": 1}, "snapshot": {"stored": "s2", "bytes": 20}},
                {"name": "a", "instances": {"live": 1, "busy": 0, "idle": 0}, "snapshot": {"stored": null, "bytes": 5}},
                {"name": "c", "instances": {"live": 0, "busy": 0, "idle": 0}, "snapshot": null},
            ]
        });
        let ad = Advert::from_node_status(&st);
        let cached = vec![
            CachedSnapshot { function: "a".into(), id: None, bytes: 5 },
            CachedSnapshot { function: "b".into(), id: Some("s2".into()), bytes: 20 },
        ];
        assert_eq!(ad, Advert { free_instances: 29, in_flight: 1, free_memory_mb: 640, cached, warm: vec![("b".into(), 1)] });
        assert_eq!(Advert::from_node_status(&json!({})), Advert::default());
    }

    #[test]
    fn heartbeat_times_are_rfc3339() {
        let t = now_rfc3339();
        assert_eq!(t.len(), 20, "{t}");
        assert!(t.starts_with("20") && t.ends_with('Z') && &t[10..11] == "T", "{t}");
    }
}
