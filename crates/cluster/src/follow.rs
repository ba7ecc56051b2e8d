//! The registry follower (issue #29): every agent (`thaw serve --cluster`) deploys
//! the functions the cluster's registry holds, the ThawFunction objects
//! (deploy/base/crd-thawfunction.yaml). Applying one — with kubectl, or from git by a
//! GitOps tool — deploys it on every agent, as CreateFunction would on one node; a
//! change of its code or configuration updates it; deleting it deletes it.
//!
//! A ThawFunction names its code bundle in the agents' snapshot store (`spec.code`:
//! key and SHA-256; `thaw bundle push` puts one there), fetched and checked by each
//! agent. The function's name on the node is the object's name, or `spec.name` when
//! that cannot be an object's (capitals, `_`: the gateway names such an object
//! [`crate::registry::object_name`]): one name in two namespaces is refused until one
//! is left. A function the
//! follower deployed says so in its description (`ThawFunction NAMESPACE/NAME`); it
//! never touches another function of the same name (one made through the node's own
//! Lambda API), and removes its own once their object is gone, also when that
//! happened while the agent was down (found at the next full listing).
//!
//! One build per function version per cluster: the function's *builder* is its home
//! on the placement ring over the agents that advertise themselves (a ThawNode with a
//! boot id and a recent heartbeat), the node a gateway places the function's first
//! cold start on; a starting agent lets the others advertise for [`SETTLE`] first. The builder deploys the function, captures its snapshot, publishes
//! it to the store, and records it in the ThawFunction's status (`status.snapshot`:
//! id, the object generation it was built for, builder; the Ready condition). Every
//! other agent waits for that, then deploys the function serving from the published
//! snapshot (fetched when first needed; the same zip unpacks to the same bundle
//! fingerprint on every node, see `thaw_node::bundle::extract`) instead of capturing
//! its own. An agent captures its own when the published snapshot does not serve
//! there, or when the builder has published nothing after [`BUILD_WAIT`] (gone). A
//! build that fails (the function's init raised, say) is recorded by the builder too
//! (Ready False, reason BuildFailed, the node's reason), and the others stop waiting:
//! their own build fails the same way and their node says why. `spec.snapshotManifest` pins a snapshot for every agent. An update of the
//! code or of what the snapshot holds (runtime, handler, memory, environment) is a new
//! generation: built once again the same way. A function whose runtime is not
//! snapshotted (custom runtimes) is deployed by every agent at once, served by cold
//! boots; its builder records Ready True, reason ColdBoot.
//!
//! What a registry function has besides $LATEST follows its objects too, in this order:
//! its published versions (ThawFunctions `NAME.vN`: each published on the node under
//! its number, from the active revision when that is the version's, else built from
//! its bundle, [`Node::ensure_version`]); its aliases, tags and function URL
//! configurations (annotations of its object, put on the node's function); its share
//! of its reserved concurrency, and of each version's provisioned concurrency. For a
//! registry function the registry is the only source of these: what the node has
//! beyond it (made through the agent's own API) is removed.
//!
//! Layers: a ThawFunction's `spec.layers` name each layer version's ARN and its zip in
//! the store ([`crate::layers`]); the agent installs each it lacks under the cluster's
//! number before it deploys the function or a version ([`Follower::install_layers`]).
//!
//! Environment variables from a Secret or ConfigMap key (`valueFrom`) are read once
//! per generation of the object ([`Follower::with_env`]), as a pod reads them when it
//! starts; one that does not resolve keeps the function undeployed or unchanged.
//!
//! The follower reconciles on every watch event and every [`RESYNC`] (what failed —
//! the store down, a build still running — is tried again then); a failure is logged
//! once per function and cause, and the node serves on.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};
use thaw_node::node::{AliasChange, ConfigChange, Node, VersionSpec, VersionState};
use serde_json::json;
use tracing::{debug, info, warn};

use crate::registry::{thawfunction_resource, EnvSource, Wanted, MARKER};

/// How often everything wanted is checked again (failed fetches, builds in progress).
pub const RESYNC: Duration = Duration::from_secs(5);

/// How long an agent waits for a function's builder to publish its snapshot before
/// capturing its own.
pub const BUILD_WAIT: Duration = Duration::from_secs(60);

/// How long a starting agent gives the others to advertise themselves before it
/// chooses a builder (agents of a new cluster start together: one that chose among the
/// few advertised so far would build what another agent builds too).
pub const SETTLE: Duration = Duration::from_secs(5);

/// An advertisement whose heartbeat is older than this does not count as an agent
/// that can build.
const BUILDER_HEARTBEAT: Duration = Duration::from_secs(60);

/// The agents that can build, on the placement ring as the gateways build it (names
/// sorted, [`crate::ring::DEFAULT_VNODES`]): made once per reconcile.
pub struct Builders {
    names: Vec<String>,
    ring: crate::ring::Ring,
}

impl Builders {
    pub fn new(names: &[String]) -> Builders {
        let mut names = names.to_vec();
        names.sort_unstable();
        names.dedup();
        let ring = crate::ring::Ring::new(&names, crate::ring::DEFAULT_VNODES);
        Builders { names, ring }
    }

    /// The builder of function `name`: its home on the ring.
    pub fn of(&self, name: &str) -> Option<&str> {
        self.ring.homes(crate::hash::hash_str(name), 1).first().map(|&i| self.names[i].as_str())
    }

    /// Where agent `agent` comes in function `name`'s walk of the ring (0: its home),
    /// and how many agents there are; None if it is not one of them.
    pub fn rank(&self, name: &str, agent: &str) -> Option<(usize, usize)> {
        let rank = self.ring.walk(crate::hash::hash_str(name)).position(|i| self.names[i] == agent)?;
        Some((rank, self.names.len()))
    }
}

/// The builder of function `name` among the agents `names` (see [`Builders`]).
pub fn builder_of(name: &str, names: &[String]) -> Option<String> {
    Builders::new(names).of(name).map(str::to_string)
}

/// The `valueFrom` values of one generation of a function's object: (generation, values).
type ResolvedEnv = (i64, BTreeMap<String, String>);

/// The ThawFunctions watched, by (namespace, name).
type Objects = BTreeMap<(String, String), Result<Wanted, String>>;

/// The functions wanted, by name. Function names are cluster-wide on the agents: a name
/// used in two namespaces is refused (not deployed or changed, never deleted) until
/// only one is left, rather than deployed as whichever was seen last.
fn by_name(objects: &Objects) -> BTreeMap<String, Result<Wanted, String>> {
    let mut out: BTreeMap<String, Result<Wanted, String>> = BTreeMap::new();
    let mut spaces: BTreeMap<String, Vec<&str>> = BTreeMap::new();
    for ((ns, object), w) in objects {
        // The function's name (`spec.name` when the object's cannot be it).
        let name = w.as_ref().map_or_else(|_| object.clone(), |w| w.name.clone());
        spaces.entry(name.clone()).or_default().push(ns);
        out.insert(name, w.clone());
    }
    for (name, nss) in spaces.into_iter().filter(|(_, nss)| nss.len() > 1) {
        out.insert(name, Err(format!("is in namespaces {}: function names are cluster-wide, keep one", nss.join(", "))));
    }
    out
}

/// The published versions wanted, by (function, number).
type Versions = BTreeMap<(String, u64), Wanted>;

/// The objects of functions, and the versions (objects `NAME.vN`, `spec.version`).
fn split_versions(objects: &Objects) -> (Objects, Versions) {
    let mut functions = Objects::new();
    let mut versions = Versions::new();
    for (k, w) in objects {
        match w {
            Ok(v) if v.version.is_some() => {
                versions.insert((v.name.clone(), v.version.unwrap_or_default()), v.clone());
            }
            _ => {
                functions.insert(k.clone(), w.clone());
            }
        }
    }
    (functions, versions)
}

/// What one reconcile of a function found to do.
#[derive(Debug, PartialEq, Eq)]
enum Step {
    Create,
    UpdateCode,
    Configure,
    /// Deployed as wanted.
    Nothing,
    /// A function of that name that the registry did not deploy.
    Foreign,
}

/// What the node has of a function (from its record).
struct Have<'a> {
    description: &'a str,
    code_sha256: &'a str,
    runtime: &'a str,
    handler: &'a str,
    memory_mb: u64,
    timeout_s: u64,
    env: &'a BTreeMap<String, String>,
    layers: &'a [String],
}

impl<'a> From<&'a thaw_node::registry::FunctionRecord> for Have<'a> {
    fn from(r: &'a thaw_node::registry::FunctionRecord) -> Have<'a> {
        Have {
            description: &r.description,
            code_sha256: &r.code_sha256,
            runtime: &r.runtime,
            handler: &r.handler,
            memory_mb: r.memory_mb,
            timeout_s: r.timeout_s,
            env: &r.env,
            layers: &r.layers,
        }
    }
}

/// The next step for `w` given what the node has of its function, if anything.
fn step(w: &Wanted, have: Option<Have>) -> Step {
    let Some(r) = have else { return Step::Create };
    if !r.description.starts_with(MARKER) {
        return Step::Foreign;
    }
    if r.code_sha256 != w.code_sha256() {
        return Step::UpdateCode;
    }
    if r.runtime != w.runtime || r.handler != w.handler || r.memory_mb != w.memory_mb || r.timeout_s != w.timeout_s || *r.env != w.env || r.description != w.description
        || w.layers.iter().map(|l| l.arn.as_str()).ne(r.layers.iter().map(String::as_str))
    {
        return Step::Configure;
    }
    Step::Nothing
}

pub struct Follower {
    client: Client,
    /// The ThawNodes, as a watch keeps them (not listed at every reconcile: with N
    /// agents that was N lists of every ThawNode each [`RESYNC`]).
    nodes: tokio::sync::watch::Receiver<Arc<crate::view::ClusterView>>,
    node: Arc<Node>,
    /// The Node this agent runs on (its ThawNode's name).
    node_name: String,
    /// (function, cause) last complained about, so a cause is logged once.
    complained: HashMap<String, String>,
    /// Since when each (function, generation) has waited for its builder's snapshot.
    waiting: HashMap<(String, i64), Instant>,
    /// The values of each function's (or version's) `valueFrom` variables, resolved
    /// for one generation of its object: (function, version) -> (generation, values).
    resolved: HashMap<(String, Option<u64>), ResolvedEnv>,
    started: Instant,
}

impl Follower {
    /// A follower for `node` (Node `node_name`); it starts its watch of the ThawNodes
    /// (on the current tokio runtime).
    pub fn new(client: Client, node: Arc<Node>, node_name: &str) -> Follower {
        let empty = crate::view::ClusterView::new(Vec::new(), crate::placement::Policy::Thaw, crate::placement::DEFAULT_LOAD_FACTOR);
        let (tx, nodes) = tokio::sync::watch::channel(Arc::new(empty));
        tokio::spawn(crate::view::watch_nodes(client.clone(), crate::placement::Policy::Thaw, crate::placement::DEFAULT_LOAD_FACTOR, tx));
        Follower {
            client,
            nodes,
            node,
            node_name: node_name.to_string(),
            complained: HashMap::new(),
            waiting: HashMap::new(),
            resolved: HashMap::new(),
            started: Instant::now(),
        }
    }

    /// The agents that advertise themselves (published, heartbeat recent), from the
    /// watch. None: it has not listed them yet — this agent publishes its own ThawNode
    /// before it follows, so a view without it is one not synced — (then every agent
    /// builds for itself).
    fn agents(&self) -> Option<Vec<String>> {
        let view = self.nodes.borrow().clone();
        if !view.nodes().iter().any(|ad| ad.name == self.node_name) {
            return None;
        }
        let now = k8s_openapi::chrono::Utc::now();
        let fresh = |ad: &&crate::view::NodeAd| ad.heartbeat.is_none_or(|h| (now - h).to_std().unwrap_or_default() < BUILDER_HEARTBEAT);
        Some(view.nodes().iter().filter(fresh).map(|ad| ad.name.clone()).collect())
    }

    /// Follow the registry until `stop` turns true.
    pub async fn run(mut self, mut stop: tokio::sync::watch::Receiver<bool>) {
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &thawfunction_resource());
        let mut events = watcher::watcher(api, watcher::Config::default()).default_backoff().boxed();
        let mut wanted: Objects = BTreeMap::new();
        let mut listing: Option<Objects> = None;
        let mut tick = tokio::time::interval(RESYNC);
        let mut listed = false;
        let mut failing = false;
        loop {
            tokio::select! {
                ev = events.next() => match ev {
                    Some(Err(e)) => {
                        if !failing {
                            warn!(error = %e, "watching ThawFunctions failed; retrying (deployed functions keep serving)");
                        }
                        failing = true;
                    }
                    Some(Ok(ev)) => {
                        if std::mem::take(&mut failing) {
                            info!("watching ThawFunctions again");
                        }
                        Self::note(ev, &mut wanted, &mut listing, &mut listed);
                    }
                    None => return,
                },
                _ = tick.tick() => {}
                _ = stop.changed() => return,
            }
            if listed {
                let (functions, versions) = split_versions(&wanted);
                let functions = by_name(&functions);
                self.reconcile(&functions).await;
                self.reconcile_versions(&functions, &versions).await;
            }
        }
    }

    /// Take in a watch event: the ThawFunctions as of a full listing, then changes.
    fn note(ev: Event<DynamicObject>, objects: &mut Objects, listing: &mut Option<Objects>, listed: &mut bool) {
        let key = |o: &DynamicObject| Some((o.metadata.namespace.clone().unwrap_or_default(), o.metadata.name.clone()?));
        match ev {
            Event::Init => *listing = Some(BTreeMap::new()),
            Event::InitApply(o) => {
                if let (Some(l), Some(k)) = (listing.as_mut(), key(&o)) {
                    l.insert(k, Wanted::from_object(&o));
                }
            }
            Event::InitDone => {
                *objects = listing.take().unwrap_or_default();
                *listed = true;
            }
            Event::Apply(o) => {
                if let Some(k) = key(&o) {
                    objects.insert(k, Wanted::from_object(&o));
                }
            }
            Event::Delete(o) => {
                if let Some(k) = key(&o) {
                    objects.remove(&k);
                }
            }
        }
    }

    /// Bring the node's registry functions in line with `wanted`.
    async fn reconcile(&mut self, wanted: &BTreeMap<String, Result<Wanted, String>>) {
        let agents = self.agents().map(|a| Builders::new(&a));
        for (name, w) in wanted {
            let outcome = match w {
                Ok(w) => match self.with_env(w).await {
                    Ok(w) => match self.apply(&w, agents.as_ref()).await {
                        Ok(()) => self.publish_status(&w, agents.as_ref()).await,
                        Err(e) => Err(e),
                    },
                    Err(e) => Err(e),
                },
                Err(why) => Err(format!("cannot be deployed: {why}")),
            };
            if let Some(why) = self.first_complaint(name.clone(), outcome) {
                warn!(function = %name, "ThawFunction {name} {why}");
            }
        }
        self.reconcile_concurrency(wanted, agents.as_ref());
        // Ours, and no longer wanted (deleted, perhaps while this agent was down).
        for r in self.node.records() {
            if r.description.starts_with(MARKER) && !wanted.contains_key(&r.name) {
                match self.node.delete_function(&r.name) {
                    Ok(()) => info!(function = %r.name, "deleted: its ThawFunction is gone"),
                    Err(e) => warn!(function = %r.name, error = %thaw_node::node::error_chain(&e), "cannot delete a function whose ThawFunction is gone"),
                }
            }
        }
    }

    /// `w` with the values of its `valueFrom` variables (Secret and ConfigMap keys in
    /// its object's namespace), read once per generation of the object, as a pod's are
    /// read once when it starts: a Secret changed later is picked up by the object's
    /// next generation. Err: one that does not resolve (a missing Secret, ConfigMap or
    /// key, a Secret value that is not UTF-8, the apiserver away): the function is
    /// neither deployed nor changed meanwhile, never deployed without the variable.
    async fn with_env<'a>(&mut self, w: &'a Wanted) -> Result<Cow<'a, Wanted>, String> {
        if w.env_from.is_empty() {
            return Ok(Cow::Borrowed(w));
        }
        let mut w = w.clone();
        let id = (w.name.clone(), w.version);
        let values = match self.resolved.get(&id) {
            Some((generation, values)) if *generation == w.generation => values.clone(),
            _ => {
                let mut values = BTreeMap::new();
                for (var, src) in &w.env_from {
                    values.insert(var.clone(), self.env_value(&w.namespace, var, src).await?);
                }
                self.resolved.insert(id, (w.generation, values.clone()));
                values
            }
        };
        w.env.extend(values);
        Ok(Cow::Owned(w))
    }

    /// The value `src` gives variable `var` of a function in namespace `ns`.
    async fn env_value(&self, ns: &str, var: &str, src: &EnvSource) -> Result<String, String> {
        use k8s_openapi::api::core::v1::{ConfigMap, Secret};
        match src {
            EnvSource::Secret { name, key } => {
                let api: Api<Secret> = Api::namespaced(self.client.clone(), ns);
                let s = api.get_opt(name).await.map_err(|e| format!("env {var}: reading Secret {ns}/{name}: {e}"))?;
                let s = s.ok_or_else(|| format!("env {var}: Secret {ns}/{name} does not exist"))?;
                let bytes = s.data.and_then(|mut d| d.remove(key)).ok_or_else(|| format!("env {var}: Secret {ns}/{name} has no key {key}"))?;
                String::from_utf8(bytes.0).map_err(|_| format!("env {var}: key {key} of Secret {ns}/{name} is not UTF-8 text"))
            }
            EnvSource::ConfigMap { name, key } => {
                let api: Api<ConfigMap> = Api::namespaced(self.client.clone(), ns);
                let c = api.get_opt(name).await.map_err(|e| format!("env {var}: reading ConfigMap {ns}/{name}: {e}"))?;
                let c = c.ok_or_else(|| format!("env {var}: ConfigMap {ns}/{name} does not exist"))?;
                c.data.and_then(|mut d| d.remove(key)).ok_or_else(|| format!("env {var}: ConfigMap {ns}/{name} has no key {key}"))
            }
        }
    }

    /// Note how the step `key` (a function, or one of its versions, aliases, URLs) went:
    /// a failure's cause is returned to be logged only the first time it is seen.
    fn first_complaint(&mut self, key: String, outcome: Result<(), String>) -> Option<String> {
        match outcome {
            Ok(()) => {
                self.complained.remove(&key);
                None
            }
            Err(why) if self.complained.get(&key) == Some(&why) => None,
            Err(why) => {
                self.complained.insert(key, why.clone());
                Some(why)
            }
        }
    }

    /// Whether the node's function `name` is one the follower deployed from the registry.
    fn ours(&self, name: &str) -> bool {
        self.node.record(name).is_some_and(|r| r.description.starts_with(MARKER))
    }

    /// Bring the published versions of the node's registry functions in line with
    /// `versions`: each made under its number (from the active revision when that is
    /// its code and configuration, else built from its bundle); those the registry no
    /// longer has deleted.
    async fn reconcile_versions(&mut self, functions: &BTreeMap<String, Result<Wanted, String>>, versions: &Versions) {
        let account = self.node.cfg.account.clone();
        let builders = self.agents().map(|a| Builders::new(&a));
        let err = |e: thaw_node::node::DeployError| thaw_node::node::error_chain(&e);
        for ((name, n), v) in versions {
            // Versions of a function this agent deployed from the registry.
            if !self.ours(name) || !matches!(functions.get(name), Some(Ok(_))) {
                continue;
            }
            let v = match self.with_env(v).await {
                Ok(v) => v,
                Err(why) => {
                    if let Some(why) = self.first_complaint(format!("{name}:{n}"), Err(why)) {
                        warn!(function = %name, version = n, "version {n} of {name} cannot be published here: {why}");
                    }
                    continue;
                }
            };
            let mut spec = v.spec(&account);
            spec.description = v.version_description.clone();
            // A snapshot of the version another agent published (its object's status):
            // a revision built for it here serves from that instead of capturing.
            let vs = VersionSpec { version: *n, spec, code_sha256: v.code_sha256(), snapshot: v.snapshot.clone() };
            let outcome = match self.install_layers(&v).await {
                Ok(()) => self.node.ensure_version(name, &vs, None).await.map_err(err),
                Err(e) => Err(e),
            };
            let outcome = match outcome {
                Ok(VersionState::NeedsCode) => match self.bundle(&v).await {
                    Ok(zip) => self.node.ensure_version(name, &vs, Some(zip)).await.map(drop).map_err(err),
                    Err(e) => Err(e),
                },
                other => other.map(drop),
            };
            let outcome = match outcome {
                Ok(()) => self.publish_version_snapshot(&v, *n, builders.as_ref()).await,
                Err(e) => Err(e),
            };
            if let Some(why) = self.first_complaint(format!("{name}:{n}"), outcome) {
                warn!(function = %name, version = n, "version {n} of {name} cannot be published here: {why}");
            }
        }
        self.reconcile_aliases(functions);
        self.reconcile_tags(functions);
        self.reconcile_urls(functions);
        self.reconcile_provisioned(functions, builders.as_ref());
        for r in self.node.records().into_iter().filter(|r| r.description.starts_with(MARKER)) {
            let Ok(have) = self.node.versions(&r.name) else { continue };
            for n in have.iter().map(|v| v.version.version).filter(|n| !versions.contains_key(&(r.name.clone(), *n))) {
                match self.node.delete_version(&r.name, n) {
                    Ok(()) => info!(function = %r.name, version = n, "version deleted: its ThawFunction is gone"),
                    Err(e) => warn!(function = %r.name, version = n, error = %e, "cannot delete a version whose ThawFunction is gone"),
                }
            }
        }
    }

    /// Give the node's registry functions the URL configurations their objects hold
    /// (after the aliases they may belong to).
    fn reconcile_urls(&mut self, functions: &BTreeMap<String, Result<Wanted, String>>) {
        for (name, w) in functions {
            let Ok(w) = w else { continue };
            if !self.ours(name) {
                continue;
            }
            let Ok(settings) = self.node.settings(name) else { continue };
            let mut have: BTreeMap<String, thaw_node::registry::UrlConfig> = settings.alias_urls.clone();
            if let Some(u) = settings.url.clone() {
                have.insert(String::new(), u);
            }
            for (key, want) in &w.urls {
                let alias = (!key.is_empty()).then_some(key.as_str());
                let old = have.get(key);
                if old.is_some_and(|h| h.auth_type == want.auth_type && h.cors == want.cors) {
                    continue;
                }
                // Replaced whole (Cors removed must go too).
                if old.is_some() {
                    let _ = self.node.delete_url(name, alias);
                }
                let put = self.node.put_url(name, alias, Some(want.auth_type.clone()), want.cors.clone(), true);
                if put.is_ok() {
                    info!(function = %name, alias = ?alias, auth = %want.auth_type, "function URL configured from its ThawFunction");
                }
                if let Some(why) = self.first_complaint(format!("{name} url {key}"), put.map(drop).map_err(|e| e.to_string())) {
                    warn!(function = %name, alias = ?alias, "the function URL of its ThawFunction cannot be configured here yet: {why}");
                }
            }
            for key in have.keys().filter(|k| !w.urls.contains_key(*k)) {
                let alias = (!key.is_empty()).then_some(key.as_str());
                match self.node.delete_url(name, alias) {
                    Ok(()) => info!(function = %name, alias = ?alias, "function URL removed: its ThawFunction no longer has it"),
                    Err(e) => warn!(function = %name, alias = ?alias, error = %e, "cannot remove a function URL the registry no longer has"),
                }
            }
        }
    }

    /// Give the node's registry functions this agent's share of the reserved
    /// concurrency their objects hold ([`crate::registry::concurrency_share`], by this
    /// agent's place in the function's walk of the ring the gateways place on; a
    /// gateway whose agent refuses a call for its share tries the next along that
    /// walk), or none. Before this agent knows the agents (its ThawNode not yet
    /// listed), it holds the whole limit: never more than the function's own.
    fn reconcile_concurrency(&mut self, functions: &BTreeMap<String, Result<Wanted, String>>, agents: Option<&Builders>) {
        for (name, w) in functions {
            let Ok(w) = w else { continue };
            if !self.ours(name) {
                continue;
            }
            let Ok(have) = self.node.settings(name).map(|s| s.reserved_concurrency) else { continue };
            let want = w.reserved_concurrency.map(|n| self.share(name, n, agents));
            let want = want.map(|n| u32::try_from(n).unwrap_or(u32::MAX));
            if have == want {
                continue;
            }
            let done = match want {
                // A share the node cannot set aside (its own pool too small) fails
                // closed: none of the function's calls run here (the gateways take
                // them elsewhere), never more than the limit in the cluster.
                Some(n) => self.node.put_reserved_concurrency(name, n).map(drop).inspect_err(|_| {
                    let _ = self.node.put_reserved_concurrency(name, 0);
                }),
                None => self.node.delete_reserved_concurrency(name),
            };
            let outcome = done.map_err(|e| e.to_string());
            if outcome.is_ok() {
                info!(function = %name, share = ?want, cluster = ?w.reserved_concurrency, "reserved concurrency put from its ThawFunction");
            }
            if let Some(why) = self.first_complaint(format!("{name} concurrency"), outcome) {
                warn!(function = %name, "the reserved concurrency of its ThawFunction cannot be put here: {why}");
            }
        }
    }

    /// This agent's share of `n` (a reserved or provisioned concurrency of function
    /// `name`, the cluster's), by its rank on the function's walk
    /// ([`crate::registry::concurrency_share`]); all of it while there is no view of
    /// the agents.
    fn share(&self, name: &str, n: u64, agents: Option<&Builders>) -> u64 {
        match agents.and_then(|a| a.rank(name, &self.node_name)) {
            Some((rank, count)) => crate::registry::concurrency_share(n, rank, count),
            None => n,
        }
    }

    /// Give the node's registry functions their share of each version's provisioned
    /// concurrency (after the versions and aliases: it is set on published versions),
    /// split as a reserved concurrency is; remove what the registry no longer has.
    fn reconcile_provisioned(&mut self, functions: &BTreeMap<String, Result<Wanted, String>>, agents: Option<&Builders>) {
        for (name, w) in functions {
            let Ok(w) = w else { continue };
            if !self.ours(name) {
                continue;
            }
            let Ok(have) = self.node.provisioned_all(name) else { continue };
            for (v, n) in &w.provisioned {
                let want = self.share(name, *n, agents) as usize;
                let now = have.iter().find(|p| p.version == *v).map(|p| p.requested);
                if now == Some(want) || (want == 0 && now.is_none()) {
                    continue;
                }
                let done = match want {
                    0 => self.node.delete_provisioned(name, *v),
                    _ => self.node.put_provisioned(name, *v, want).map(drop),
                };
                if done.is_ok() {
                    info!(function = %name, version = v, share = want, cluster = n, "provisioned concurrency put from its ThawFunction");
                }
                if let Some(why) = self.first_complaint(format!("{name}:{v} provisioned"), done.map_err(|e| e.to_string())) {
                    warn!(function = %name, version = v, "the provisioned concurrency of its ThawFunction cannot be put here: {why}");
                }
            }
            for p in have.iter().filter(|p| !w.provisioned.contains_key(&p.version)) {
                match self.node.delete_provisioned(name, p.version) {
                    Ok(()) => info!(function = %name, version = p.version, "provisioned concurrency removed: its ThawFunction no longer has it"),
                    Err(e) => warn!(function = %name, version = p.version, error = %e, "cannot remove a provisioned concurrency the registry no longer has"),
                }
            }
        }
    }

    /// Give the node's registry functions the tags their objects hold.
    fn reconcile_tags(&mut self, functions: &BTreeMap<String, Result<Wanted, String>>) {
        for (name, w) in functions {
            let Ok(w) = w else { continue };
            if !self.ours(name) {
                continue;
            }
            let Ok(have) = self.node.settings(name).map(|s| s.tags) else { continue };
            if have == w.tags {
                continue;
            }
            let gone: Vec<String> = have.keys().filter(|k| !w.tags.contains_key(*k)).cloned().collect();
            let done = self.node.untag(name, &gone).and_then(|()| self.node.tag(name, &w.tags));
            match done {
                Ok(()) => info!(function = %name, tags = w.tags.len(), "tags put from its ThawFunction"),
                Err(e) => warn!(function = %name, error = %e, "cannot put the tags of its ThawFunction"),
            }
        }
    }

    /// Put the aliases of the node's registry functions as their objects hold them
    /// (after their versions: an alias routes to published versions only); remove
    /// those the registry no longer has.
    fn reconcile_aliases(&mut self, functions: &BTreeMap<String, Result<Wanted, String>>) {
        for (name, w) in functions {
            let Ok(w) = w else { continue };
            if !self.ours(name) {
                continue;
            }
            let Ok(have) = self.node.aliases(name) else { continue };
            let have: BTreeMap<&str, &thaw_node::registry::AliasRecord> = have.iter().map(|a| (a.name.as_str(), a)).collect();
            for (alias, want) in &w.aliases {
                let same = have.get(alias.as_str()).is_some_and(|h| h.version == want.version && h.weights == want.weights && h.description == want.description);
                if same {
                    continue;
                }
                let change = AliasChange { version: Some(want.version), description: Some(want.description.clone()), weights: Some(want.weights.clone()), revision_id: None };
                let put = self.node.put_alias(name, alias, change, !have.contains_key(alias.as_str()));
                if put.is_ok() {
                    info!(function = %name, alias = %alias, version = want.version, "alias put from its ThawFunction");
                }
                if let Some(why) = self.first_complaint(format!("{name}@{alias}"), put.map(drop).map_err(|e| e.to_string())) {
                    warn!(function = %name, alias = %alias, "alias {alias} of {name} cannot be put here yet: {why}");
                }
            }
            for alias in have.keys().filter(|a| !w.aliases.contains_key(**a)) {
                match self.node.delete_alias(name, alias) {
                    Ok(()) => info!(function = %name, alias = %alias, "alias deleted: its ThawFunction no longer has it"),
                    Err(e) => warn!(function = %name, alias = %alias, error = %e, "cannot delete an alias the registry no longer has"),
                }
            }
        }
    }

    async fn apply(&mut self, w: &Wanted, agents: Option<&Builders>) -> Result<(), String> {
        let account = self.node.cfg.account.clone();
        let err = |e: thaw_node::node::DeployError| thaw_node::node::error_chain(&e);
        let next = step(w, self.node.record(&w.name).as_ref().map(Have::from));
        if matches!(next, Step::Create | Step::UpdateCode | Step::Configure) {
            self.install_layers(w).await?;
        }
        match next {
            Step::Nothing => Ok(()),
            Step::Foreign => Err("is not deployed here: a function of that name exists that the registry did not deploy".into()),
            Step::Create => {
                let Some(adopt) = self.snapshot_to_use(w, agents) else { return Ok(()) };
                let zip = self.bundle(w).await?;
                let how = if adopt.is_some() { "serving the snapshot its builder published" } else { "capturing its snapshot" };
                self.node.create_function_adopting(w.spec(&account), zip, adopt).await.map_err(err)?;
                info!(function = %w.name, bundle = %w.key, "deployed from its ThawFunction, {how}");
                Ok(())
            }
            Step::UpdateCode => {
                let Some(adopt) = self.snapshot_to_use(w, agents) else { return Ok(()) };
                let zip = self.bundle(w).await?;
                self.node.update_code_adopting(&w.name, zip, adopt).await.map_err(err)?;
                info!(function = %w.name, bundle = %w.key, "code updated from its ThawFunction");
                Ok(())
            }
            Step::Configure => {
                let change = ConfigChange {
                    runtime: Some(w.runtime.clone()),
                    handler: Some(w.handler.clone()),
                    memory_mb: Some(w.memory_mb),
                    timeout_s: Some(w.timeout_s),
                    env: Some(w.env.clone()),
                    description: Some(w.description.clone()),
                    layers: Some(w.layer_arns()),
                    ..ConfigChange::default()
                };
                // A change the snapshot does not hold (timeout, description) needs no build.
                let adopt = if self.node.record(&w.name).is_some_and(|r| change.rebuilds(&r)) {
                    let Some(adopt) = self.snapshot_to_use(w, agents) else { return Ok(()) };
                    adopt
                } else {
                    None
                };
                self.node.update_configuration_adopting(&w.name, change, adopt).await.map_err(err)?;
                info!(function = %w.name, "configuration updated from its ThawFunction");
                Ok(())
            }
        }
    }

    /// How this agent deploys `w` now: Some(Some(id)) serving the snapshot its builder
    /// published for this generation, Some(None) capturing its own (it is the builder,
    /// there is no view of the agents, or the builder published nothing in
    /// [`BUILD_WAIT`]), None not yet (waiting for the builder).
    fn snapshot_to_use(&mut self, w: &Wanted, agents: Option<&Builders>) -> Option<Option<String>> {
        if w.snapshot.is_some() || w.unsnapshotted {
            // A runtime that is not snapshotted: every agent boots it, no build to wait for.
            self.waiting.retain(|(f, _), _| *f != w.name);
            return Some(w.snapshot.clone().filter(|_| !w.unsnapshotted));
        }
        if agents.is_some() && self.started.elapsed() < SETTLE && !w.build_failed {
            debug!(function = %w.name, "letting the other agents advertise before choosing its builder");
            return None;
        }
        let builder = agents.and_then(|a| a.of(&w.name));
        if let Some(b) = builder.filter(|b| *b != self.node_name && !w.build_failed) {
            let since = *self.waiting.entry((w.name.clone(), w.generation)).or_insert_with(Instant::now);
            if since.elapsed() < BUILD_WAIT {
                debug!(function = %w.name, builder = b, "waiting for the builder to publish the snapshot");
                return None;
            }
            warn!(function = %w.name, builder = b, wait_s = BUILD_WAIT.as_secs(), "the builder published no snapshot in time; capturing one here");
        }
        self.waiting.retain(|(f, _), _| *f != w.name);
        Some(None)
    }

    /// The builder of `w` (or any agent when none has): once its function is deployed
    /// as wanted and serves from a snapshot it published itself, record that snapshot
    /// in the ThawFunction's status for the other agents (and `kubectl get`).
    async fn publish_status(&self, w: &Wanted, agents: Option<&Builders>) -> Result<(), String> {
        let Some(rec) = self.node.record(&w.name) else { return Ok(()) };
        let builder = agents.and_then(|a| a.of(&w.name));
        // Deployed as wanted (this generation's code and configuration).
        let current = step(w, Some(Have::from(&rec))) == Step::Nothing;
        // The builder's build of this generation failed: say so, with the node's reason.
        if rec.last_update_status == "Failed"
            && current
            && builder.is_none_or(|b| b == self.node_name)
            && !w.build_failed
            && w.published.as_ref().is_none_or(|(_, g)| *g != w.generation)
        {
            let reason = rec.last_update_status_reason.clone().unwrap_or_default();
            let condition = json!({"type": "Ready", "status": "False", "reason": "BuildFailed", "message": format!("the build on {} failed: {reason}", self.node_name)});
            self.patch_status(w, None, condition).await.map_err(|e| format!("recording its failed build in its status: {e}"))?;
            warn!(function = %w.name, generation = w.generation, reason = %reason, "the build failed; recorded in the ThawFunction's status");
            return Ok(());
        }
        // Only once the function serves this generation (not while a build of it runs:
        // the revision serving meanwhile is an older one).
        if rec.state != "Active" || rec.last_update_status != "Successful" || !current {
            return Ok(());
        }
        // Served by cold boots: the builder says it is ready, and that no snapshot comes.
        if w.unsnapshotted {
            if !w.cold_boot_ready && builder.is_none_or(|b| b == self.node_name) {
                let condition = json!({"type": "Ready", "status": "True", "reason": crate::registry::COLD_BOOT, "message": format!("deployed; served by cold boots ({})", thaw_node::api::UNSNAPSHOTTED)});
                self.patch_status(w, None, condition).await.map_err(|e| format!("recording in its status that it is served by cold boots: {e}"))?;
                info!(function = %w.name, generation = w.generation, "served by cold boots (its runtime is not snapshotted); recorded in the ThawFunction's status");
            }
            return Ok(());
        }
        // An agent serving the builder's snapshot follows it when published again.
        if let (Some(id), Some((have, true))) = (&w.snapshot, self.node.active_snapshot(&w.name)) {
            if *id != have && self.node.readopt(&w.name, id) {
                info!(function = %w.name, snapshot = %id, replaces = %have, "serving the snapshot its builder published again");
            }
            return Ok(());
        }
        if builder.is_some_and(|b| b != self.node_name) && w.published.as_ref().is_some_and(|(_, g)| *g == w.generation) {
            return Ok(());
        }
        let Some((id, false)) = self.node.active_snapshot(&w.name) else { return Ok(()) };
        if w.published.as_ref() == Some(&(id.clone(), w.generation)) {
            return Ok(());
        }
        let snapshot = json!({"id": id, "generation": w.generation, "builtBy": self.node_name, "publishedAt": crate::now_rfc3339()});
        let condition = json!({"type": "Ready", "status": "True", "reason": "SnapshotPublished", "message": format!("snapshot built by {} and published", self.node_name)});
        self.patch_status(w, Some(snapshot), condition).await.map_err(|e| format!("recording its snapshot in its status: {e}"))?;
        info!(function = %w.name, snapshot = %id, generation = w.generation, "snapshot recorded in the ThawFunction's status");
        Ok(())
    }

    /// Record in version `n`'s object (`v`) the stored snapshot this agent serves it
    /// from, when this agent is its function's builder (the one that captured it, as a
    /// rule: the version was published from the revision it built) and the object
    /// records another or none (the builder publishes a snapshot again once its first
    /// invocation recorded a working set, and deletes the old one: recorded again then).
    /// An agent that has to build a revision for the version later (one that joins after
    /// $LATEST moved on) serves from it instead of capturing: one capture per version
    /// per cluster. (One that finds it gone from the store captures its own.) Another
    /// agent serving the recorded snapshot follows it when it is recorded anew
    /// (`Node::readopt_version`), as $LATEST's do.
    async fn publish_version_snapshot(&self, v: &Wanted, n: u64, agents: Option<&Builders>) -> Result<(), String> {
        if agents.and_then(|a| a.of(&v.name)) != Some(self.node_name.as_str()) {
            // Another agent's: one serving the snapshot the builder recorded follows it
            // when recorded anew (the builder deletes the old one after a grace).
            if let Some(id) = &v.snapshot {
                if self.node.readopt_version(&v.name, n, id) {
                    info!(function = %v.name, version = n, snapshot = %id, "serving the version's snapshot its builder published again");
                }
            }
            return Ok(());
        }
        let Some(id) = self.node.version_snapshot(&v.name, n) else { return Ok(()) };
        if v.published.as_ref().is_some_and(|(have, _)| *have == id) {
            return Ok(());
        }
        let snapshot = json!({"id": id, "generation": v.generation, "builtBy": self.node_name, "publishedAt": crate::now_rfc3339()});
        let condition = json!({"type": "Ready", "status": "True", "reason": "SnapshotPublished", "message": format!("version {n}'s snapshot recorded by {}", self.node_name)});
        self.patch_status(v, Some(snapshot), condition).await.map_err(|e| format!("recording its snapshot in its status: {e}"))?;
        info!(function = %v.name, version = n, snapshot = %id, "version snapshot recorded in its ThawFunction's status");
        Ok(())
    }

    /// Write `w`'s status for its generation: its Ready `condition` (stamped with the
    /// time and the generation) and, if given, the published `snapshot`.
    async fn patch_status(&self, w: &Wanted, snapshot: Option<serde_json::Value>, mut condition: serde_json::Value) -> Result<(), kube::Error> {
        condition["lastTransitionTime"] = json!(crate::now_rfc3339());
        condition["observedGeneration"] = json!(w.generation);
        let mut status = json!({"observedGeneration": w.generation, "conditions": [condition]});
        if let Some(s) = snapshot {
            status["snapshot"] = s;
        }
        let api: Api<DynamicObject> = Api::namespaced_with(self.client.clone(), &w.namespace, &thawfunction_resource());
        let object = &w.object;
        api.patch_status(object, &PatchParams::default(), &Patch::Merge(&json!({"status": status}))).await.map(drop)
    }

    /// The function's bundle from the node's snapshot store, checked.
    async fn bundle(&self, w: &Wanted) -> Result<Vec<u8>, String> {
        self.fetch(&w.key, &w.sha256, "its bundle").await
    }

    /// The zip at `key` in the node's snapshot store, checked against `sha256` (hex).
    async fn fetch(&self, key: &str, sha256: &str, what: &str) -> Result<Vec<u8>, String> {
        let store = self.node.cfg.snapshot_store.clone().ok_or(format!("cannot be deployed: this agent has no --snapshot-store to fetch {what} from"))?;
        let (key, sha) = (key.to_string(), sha256.to_string());
        tokio::task::spawn_blocking(move || store.bundle(&key, &sha))
            .await
            .map_err(|e| format!("fetching {what}: {e}"))?
            .map_err(|e| format!("fetching {what}: {}", thaw_node::node::error_chain(&e)))
    }

    /// Install the layers `w` names on the node, under their cluster version numbers
    /// (so their ARNs name the same files on every agent), from their zips in the store:
    /// those the node does not have with the same code.
    async fn install_layers(&self, w: &Wanted) -> Result<(), String> {
        for l in &w.layers {
            let (name, version) = self.node.parse_layer_version_arn(&l.arn).map_err(|e| format!("layer {}: {e}", l.arn))?;
            if self.node.has_layer_version(&name, version, &crate::registry::sha256_b64(&l.code.sha256)) {
                continue;
            }
            let zip = self.fetch(&l.code.key, &l.code.sha256, &format!("layer {}", l.arn)).await?;
            self.node
                .install_layer_version(&name, version, zip, thaw_node::node::PublishLayer::default())
                .await
                .map_err(|e| format!("installing layer {}: {}", l.arn, thaw_node::node::error_chain(&e)))?;
            info!(function = %w.name, layer = %l.arn, "layer installed from the store");
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::Engine;
    use serde_json::{json, Value};

    fn object(spec: Value) -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "thaw.dev/v1alpha1", "kind": "ThawFunction",
            "metadata": {"name": "hello", "namespace": "team-a"}, "spec": spec}))
        .unwrap()
    }

    #[test]
    fn a_thawfunction_reads_as_a_function() {
        let sha = "ab".repeat(32);
        let w = Wanted::from_object(&object(json!({"runtime": "python3.12", "handler": "h.handler", "memory": 256,
            "env": [{"name": "A", "value": "1"}], "code": {"key": "bundles/x.zip", "sha256": sha}})))
        .unwrap();
        assert_eq!((w.name.as_str(), w.memory_mb, w.timeout_s, w.description.as_str()), ("hello", 256, 3, "ThawFunction team-a/hello"));
        assert_eq!(w.env.get("A").map(String::as_str), Some("1"));
        assert_eq!(w.code_sha256(), base64::engine::general_purpose::STANDARD.encode([0xab; 32]));
        let from_secret = object(json!({"runtime": "python3.12", "handler": "h.handler", "code": {"key": "k", "sha256": sha},
            "env": [{"name": "S", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}));
        let w = Wanted::from_object(&from_secret).unwrap();
        assert_eq!(w.env_from.get("S"), Some(&EnvSource::Secret { name: "s".into(), key: "k".into() }), "read, resolved by the agent");
        assert!(!w.env.contains_key("S"));
        let bad_sha = object(json!({"runtime": "python3.12", "handler": "h.handler", "code": {"key": "k", "sha256": "AB"}}));
        assert!(Wanted::from_object(&bad_sha).is_err());
    }

    #[test]
    fn a_version_object_is_a_version_of_its_function_not_a_function() {
        let sha = "ab".repeat(32);
        let spec = json!({"runtime": "python3.12", "handler": "h.handler", "code": {"key": "k", "sha256": sha}});
        let mut v = object(json!({"runtime": "python3.12", "handler": "h.handler", "code": {"key": "k", "sha256": sha},
            "function": "hello", "version": 3, "description": "third"}));
        v.metadata.name = Some("hello.v3".into());
        let w = Wanted::from_object(&v).unwrap();
        assert_eq!((w.name.as_str(), w.version, w.version_description.as_str()), ("hello", Some(3), "third"));
        assert_eq!(w.description, "ThawFunction team-a/hello", "deployed as part of its function");
        let mut objects: Objects = BTreeMap::new();
        objects.insert(("team-a".into(), "hello".into()), Wanted::from_object(&object(spec)));
        objects.insert(("team-a".into(), "hello.v3".into()), Ok(w));
        let (functions, versions) = split_versions(&objects);
        assert_eq!(functions.len(), 1);
        assert!(by_name(&functions)["hello"].is_ok(), "the version is not a second function of that name");
        assert_eq!(versions.keys().collect::<Vec<_>>(), [&("hello".to_string(), 3)]);
        let mut nameless = v.clone();
        nameless.data["spec"]["function"] = json!("not a name");
        assert!(Wanted::from_object(&nameless).is_err());
    }

    #[test]
    fn a_function_has_one_builder_whatever_the_order_of_the_agents() {
        let names: Vec<String> = ["c", "a", "b"].iter().map(|s| s.to_string()).collect();
        let mut shuffled = names.clone();
        shuffled.reverse();
        let picks: Vec<String> = (0..50).map(|i| builder_of(&format!("fn-{i}"), &names).unwrap()).collect();
        assert!((0..50).all(|i| builder_of(&format!("fn-{i}"), &shuffled).as_ref() == Some(&picks[i])), "the same on every agent");
        assert!(["a", "b", "c"].iter().all(|n| picks.iter().any(|p| p == n)), "spread over the agents: {picks:?}");
        assert_eq!(builder_of("f", &[]), None);
    }

    /// Every agent computes its own share of a reserved concurrency; together they are
    /// the limit, the function's home holds the largest, and the home is its builder.
    #[test]
    fn the_agents_shares_of_a_reserved_concurrency_add_up_to_it() {
        let names: Vec<String> = ["c", "a", "b", "d"].iter().map(|s| s.to_string()).collect();
        let agents = Builders::new(&names);
        for f in ["fn-1", "fn-2", "limited"] {
            for n in [0, 1, 2, 3, 5, 8, 100] {
                let shares: Vec<u64> = names.iter().map(|a| {
                    let (rank, count) = agents.rank(f, a).unwrap();
                    crate::registry::concurrency_share(n, rank, count)
                }).collect();
                assert_eq!(shares.iter().sum::<u64>(), n, "{f} {n}: {shares:?}");
                assert!(shares.iter().max().unwrap() - shares.iter().min().unwrap() <= 1, "{f} {n}: {shares:?}");
                let home = agents.of(f).unwrap();
                let (rank, count) = agents.rank(f, home).unwrap();
                assert_eq!((rank, crate::registry::concurrency_share(n, rank, count)), (0, *shares.iter().max().unwrap()), "{f} {n}");
            }
        }
        assert_eq!(agents.rank("f", "not-an-agent"), None);
    }

    #[test]
    fn the_builders_snapshot_counts_for_the_generation_it_was_built_for() {
        let mut o = object(json!({"runtime": "python3.12", "handler": "h.handler", "code": {"key": "k", "sha256": "00".repeat(32)}}));
        o.metadata.generation = Some(2);
        o.data["status"] = json!({"snapshot": {"id": "s1", "generation": 1, "builtBy": "n"}});
        let w = Wanted::from_object(&o).unwrap();
        assert_eq!((w.snapshot, w.published), (None, Some(("s1".to_string(), 1))), "built for the spec before");
        o.data["status"]["snapshot"]["generation"] = json!(2);
        assert_eq!(Wanted::from_object(&o).unwrap().snapshot.as_deref(), Some("s1"));
        o.data["spec"]["snapshotManifest"] = json!("pinned");
        assert_eq!(Wanted::from_object(&o).unwrap().snapshot.as_deref(), Some("pinned"), "a pin wins");
    }

    #[test]
    fn a_name_in_two_namespaces_is_refused_not_flapped() {
        let w = |ns: &str| {
            let mut o = object(json!({"runtime": "python3.12", "handler": "h.handler", "code": {"key": "k", "sha256": "00".repeat(32)}}));
            o.metadata.namespace = Some(ns.into());
            Wanted::from_object(&o)
        };
        let mut objects: Objects = BTreeMap::new();
        objects.insert(("team-a".into(), "hello".into()), w("team-a"));
        assert!(by_name(&objects)["hello"].is_ok());
        objects.insert(("team-b".into(), "hello".into()), w("team-b"));
        let e = by_name(&objects)["hello"].clone().unwrap_err();
        assert!(e.contains("team-a, team-b"), "{e}");
        objects.remove(&("team-a".to_string(), "hello".to_string()));
        assert_eq!(by_name(&objects)["hello"].as_ref().unwrap().description, "ThawFunction team-b/hello");
    }

    #[test]
    fn names_that_cannot_be_object_names_are_mapped_and_kept_in_the_spec() {
        use crate::registry::object_name;
        assert_eq!(object_name("shared-deps"), "shared-deps", "a valid object name is itself");
        let odd = object_name("My_Func");
        assert!(odd.starts_with("my-func-") && odd.len() == "my-func-".len() + 16, "{odd}");
        assert_ne!(object_name("my_func"), odd, "names differing only in case are two objects");
        assert_ne!(object_name("my_func"), "my-func", "nor the name it looks like");
        assert!(object_name(&"x".repeat(64)).len() <= 63, "a label value too");
        assert!(!object_name("_a").starts_with('-'));
        let spec = thaw_node::node::FunctionSpec {
            name: "My_Func".into(),
            runtime: "python3.12".into(),
            role: String::new(),
            handler: "h.handler".into(),
            description: String::new(),
            timeout_s: 3,
            memory_mb: 128,
            env: BTreeMap::new(),
            layers: Vec::new(),
        };
        let made = crate::registry::object_of(&spec, "team-a", "k", &"00".repeat(32), &[]);
        assert_eq!(made["metadata"]["name"].as_str(), Some(odd.as_str()));
        let mut obj = object(made["spec"].clone());
        obj.metadata.name = Some(odd.clone());
        let w = Wanted::from_object(&obj).unwrap();
        assert_eq!((w.name.as_str(), w.object.as_str()), ("My_Func", odd.as_str()));
        // The agents want it by its own name (what the node calls it), not its object's.
        let objects: Objects = [(("team-a".to_string(), odd.clone()), Ok(w))].into();
        assert_eq!(by_name(&objects).keys().collect::<Vec<_>>(), ["My_Func"]);
        assert_eq!(crate::registry::version_object_name("My_Func", 2), format!("{odd}.v2"));
    }

    #[test]
    fn steps_follow_the_record() {
        let w = Wanted::from_object(&object(json!({"runtime": "python3.12", "handler": "h.handler",
            "code": {"key": "k", "sha256": "00".repeat(32)}})))
        .unwrap();
        assert_eq!(step(&w, None), Step::Create);
        let (code, env) = (w.code_sha256(), BTreeMap::new());
        let have = |description: &'static str, code: &str, memory_mb: u64| {
            step(&w, Some(Have { description, code_sha256: code, runtime: "python3.12", handler: "h.handler", memory_mb, timeout_s: 3, env: &env, layers: &[] }))
        };
        assert_eq!(have("ThawFunction team-a/hello", &code, 128), Step::Nothing);
        // Layers: the node's function names other layer versions than the object's.
        let arn = "arn:aws:lambda:us-east-1:000000000000:layer:deps:2".to_string();
        let layered = Wanted::from_object(&object(json!({"runtime": "python3.12", "handler": "h.handler", "code": {"key": "k", "sha256": "00".repeat(32)},
            "layers": [{"arn": arn, "code": {"key": "bundles/l.zip", "sha256": "11".repeat(32), "size": 9}}]})))
        .unwrap();
        assert_eq!(layered.spec("000000000000").layers, std::slice::from_ref(&arn));
        let with = |layers: &[String]| {
            step(&layered, Some(Have { description: "ThawFunction team-a/hello", code_sha256: &code, runtime: "python3.12", handler: "h.handler", memory_mb: 128, timeout_s: 3, env: &env, layers }))
        };
        assert_eq!(with(&[]), Step::Configure);
        assert_eq!(with(&[arn.replace(":2", ":1")]), Step::Configure);
        assert_eq!(with(std::slice::from_ref(&arn)), Step::Nothing);
        let bad = Wanted::from_object(&object(json!({"runtime": "python3.12", "handler": "h.handler", "code": {"key": "k", "sha256": "00".repeat(32)},
            "layers": [{"arn": "not-an-arn", "code": {"key": "k", "sha256": "11".repeat(32)}}]})));
        assert!(bad.unwrap_err().contains("not a layer version ARN"));
        assert_eq!(have("ThawFunction team-a/hello", &code, 512), Step::Configure);
        assert_eq!(have("ThawFunction team-a/hello", "other", 128), Step::UpdateCode);
        assert_eq!(have("made through the Lambda API", &code, 128), Step::Foreign);
    }
}
