//! deploy/ against a real etcd + kube-apiserver (+ garbage collector) started here:
//! every rendered object passes a server-side dry-run, then is applied; the ThawFunction
//! schema refuses bad specs; RBAC and the agent admission policy refuse, for real, an
//! agent writing another node's advertisement; an advertisement is garbage-collected
//! with its Node.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod, Secret};
use kube::api::{ApiResource, DeleteParams, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::{Discovery, Scope};
use kube::{Api, Client};
use serde_json::{json, Value};
use thaw_cluster::controlplane::{binary, ControlPlane};
use thaw_cluster::hash::Rng;
use thaw_cluster::placement::{Policy, Reason};
use thaw_cluster::view::{watch_nodes, ClusterView};

const NS: &str = "thaw-system";

fn deploy_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../deploy")
}

/// `kubectl kustomize` (the kubectl scripts/build-k8s.sh builds) → objects.
fn render(overlay: &str) -> Vec<Value> {
    let kubectl = binary("kubectl").unwrap_or_else(|e| panic!("{e}"));
    let out = Command::new(kubectl).arg("kustomize").arg(deploy_dir().join(overlay)).output().expect("running kubectl kustomize");
    assert!(out.status.success(), "kubectl kustomize {overlay}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| {
            let v: serde_yaml::Value = serde::Deserialize::deserialize(doc).unwrap();
            serde_json::to_value(v).unwrap()
        })
        .filter(|v| !v.is_null())
        .collect()
}

fn name_of(o: &Value) -> String {
    format!("{}/{}", o["kind"].as_str().unwrap_or("?"), o["metadata"]["name"].as_str().unwrap_or("?"))
}

/// Server-side apply of `obj` (dry-run or for real).
async fn apply(client: &Client, discovery: &Discovery, obj: &Value, dry_run: bool) -> Result<(), kube::Error> {
    let (group, version) = match obj["apiVersion"].as_str().unwrap().split_once('/') {
        Some((g, v)) => (g.to_string(), v.to_string()),
        None => (String::new(), obj["apiVersion"].as_str().unwrap().to_string()),
    };
    let gvk = GroupVersionKind::gvk(&group, &version, obj["kind"].as_str().unwrap());
    let (ar, caps) = discovery.resolve_gvk(&gvk).unwrap_or_else(|| panic!("{}: unknown kind {gvk:?}", name_of(obj)));
    let api: Api<DynamicObject> = match caps.scope {
        Scope::Namespaced => Api::namespaced_with(client.clone(), obj["metadata"]["namespace"].as_str().unwrap_or("default"), &ar),
        Scope::Cluster => Api::all_with(client.clone(), &ar),
    };
    let mut pp = PatchParams::apply("thaw-deploy-test").force();
    pp.dry_run = dry_run;
    api.patch(obj["metadata"]["name"].as_str().unwrap(), &pp, &Patch::Apply(obj)).await.map(|_| ())
}

fn thawnodes(client: &Client) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("thaw.dev", "v1alpha1", "ThawNode"), "thawnodes");
    Api::all_with(client.clone(), &ar)
}

fn thawfunctions(client: &Client) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("thaw.dev", "v1alpha1", "ThawFunction"), "thawfunctions");
    Api::namespaced_with(client.clone(), "default", &ar)
}

fn thawlayers(client: &Client) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk("thaw.dev", "v1alpha1", "ThawLayer"), "thawlayers");
    Api::namespaced_with(client.clone(), "default", &ar)
}

/// The error of a refused request: (HTTP code, message).
fn refused<T: std::fmt::Debug>(what: &str, r: Result<T, kube::Error>) -> (u16, String) {
    match r {
        Err(kube::Error::Api(e)) => (e.code, e.message),
        other => panic!("{what}: expected a refusal from the apiserver, got {other:?}"),
    }
}

fn advert(node: &str, node_uid: &str) -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "thaw.dev/v1alpha1",
        "kind": "ThawNode",
        "metadata": {
            "name": node,
            "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid}]
        },
        "spec": {"endpoint": format!("http://{node}.example:9000")}
    }))
    .unwrap()
}

fn status(free: i64) -> Patch<Value> {
    Patch::Merge(json!({"status": {"bootId": "b1", "freeInstances": free, "cachedSnapshots": [{"id": "s1", "bytes": 1}]}}))
}

/// A Node and an agent Pod on it (never runs: there is no kubelet); returns (node uid, pod uid).
async fn node_with_agent_pod(admin: &Client, node: &str) -> (String, String) {
    let nodes: Api<Node> = Api::all(admin.clone());
    let n = nodes.create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": node}})).unwrap()).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), NS);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": format!("agent-{node}")},
        "spec": {"nodeName": node, "serviceAccountName": "thaw-agent", "containers": [{"name": "agent", "image": "thaw:test"}]}
    }))
    .unwrap();
    let p = pods.create(&PostParams::default(), &pod).await.unwrap();
    (n.metadata.uid.unwrap(), p.metadata.uid.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manifests_apply_and_agents_only_write_their_own_node() {
    let cp = tokio::task::spawn_blocking(ControlPlane::shared).await.unwrap();
    let admin = cp.client().await.unwrap();

    // --- Render and dry-run every object.
    let objs = render("overlays/example");
    let kinds: Vec<String> = objs.iter().map(name_of).collect();
    for want in [
        "Namespace/thaw-system",
        "CustomResourceDefinition/thawfunctions.thaw.dev",
        "CustomResourceDefinition/thawlayers.thaw.dev",
        "CustomResourceDefinition/thawnodes.thaw.dev",
        "ValidatingAdmissionPolicy/thaw-agent-own-node",
        "ValidatingAdmissionPolicyBinding/thaw-agent-own-node",
        "DaemonSet/thaw-agent",
        "Deployment/thaw-gateway",
        "Service/thaw-gateway",
    ] {
        assert!(kinds.iter().any(|k| k == want), "{want} missing from the rendered overlay: {kinds:?}");
    }
    assert!(!objs.iter().any(|o| o["kind"] == "ClusterRoleBinding" && o["roleRef"]["name"] == "cluster-admin"), "nothing may be cluster-admin");
    let discovery = Discovery::new(admin.clone()).run().await.unwrap();
    // Namespaced objects can only be dry-run into an existing namespace.
    let ns_obj = objs.iter().find(|o| o["kind"] == "Namespace").unwrap();
    apply(&admin, &discovery, ns_obj, false).await.unwrap();
    for o in &objs {
        apply(&admin, &discovery, o, true).await.unwrap_or_else(|e| panic!("server-side dry-run of {} refused: {e}", name_of(o)));
    }
    // The dry-run validates: a broken object is refused.
    let mut broken = objs.iter().find(|o| o["kind"] == "DaemonSet").unwrap().clone();
    broken["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = json!(70000);
    let (code, msg) = refused("dry-run of a DaemonSet with port 70000", apply(&admin, &discovery, &broken, true).await);
    assert_eq!(code, 422, "{msg}");
    assert!(msg.contains("containerPort"), "{msg}");
    // Dry-run created nothing.
    assert!(Api::<Secret>::namespaced(admin.clone(), NS).list(&ListParams::default()).await.unwrap().items.iter().all(|s| !s.metadata.name.as_deref().unwrap_or("").starts_with("thaw-store")));

    // --- Apply for real; wait until the CRDs serve.
    for o in &objs {
        apply(&admin, &discovery, o, false).await.unwrap_or_else(|e| panic!("applying {}: {e}", name_of(o)));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while thawnodes(&admin).list(&ListParams::default()).await.is_err()
        || thawfunctions(&admin).list(&ListParams::default()).await.is_err()
        || thawlayers(&admin).list(&ListParams::default()).await.is_err()
    {
        assert!(Instant::now() < deadline, "CRDs not served after 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // --- The ThawFunction schema.
    let func = |spec: Value| -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "thaw.dev/v1alpha1", "kind": "ThawFunction", "metadata": {"name": "hello"}, "spec": spec})).unwrap()
    };
    let sha = "0".repeat(64);
    let good = func(json!({"runtime": "python3.11", "handler": "app.handler", "code": {"key": "code/hello.zip", "sha256": sha},
        "env": [{"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "hello", "key": "token"}}}]}));
    let created = thawfunctions(&admin).create(&PostParams::default(), &good).await.unwrap();
    assert_eq!(created.data["spec"]["memory"], json!(128), "defaults applied");
    assert_eq!(created.data["spec"]["timeout"], json!(3));
    let bad = func(json!({"runtime": "python3.11", "handler": "app.handler", "memory": 64, "code": {"key": "k", "sha256": sha}}));
    let (code, msg) = refused("memory 64", thawfunctions(&admin).create(&PostParams { dry_run: true, ..Default::default() }, &bad).await);
    assert_eq!(code, 422, "{msg}");
    assert!(msg.contains("spec.memory"), "{msg}");
    let bad = func(json!({"runtime": "python3.11", "handler": "h", "code": {"key": "k", "sha256": sha},
        "env": [{"name": "A", "value": "x", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}]}));
    let (_, msg) = refused("value and valueFrom", thawfunctions(&admin).create(&PostParams { dry_run: true, ..Default::default() }, &bad).await);
    assert!(msg.contains("value and valueFrom are exclusive"), "{msg}");

    // --- Two nodes, an agent pod on each, each agent with its pod-bound token.
    let (node_a, pod_a) = node_with_agent_pod(&admin, "node-a").await;
    let (node_b, pod_b) = node_with_agent_pod(&admin, "node-b").await;
    let tok_a = cp.service_account_token(NS, "thaw-agent", Some(("agent-node-a", &pod_a))).await.unwrap();
    let tok_b = cp.service_account_token(NS, "thaw-agent", Some(("agent-node-b", &pod_b))).await.unwrap();
    let agent_a = cp.client_for_token(&tok_a).await.unwrap();
    let agent_b = cp.client_for_token(&tok_b).await.unwrap();
    let pp = PostParams::default();
    let mp = PatchParams::default();

    // Agent A publishes its own advertisement.
    thawnodes(&agent_a).create(&pp, &advert("node-a", &node_a)).await.expect("agent A creates node-a's ThawNode");
    let st = thawnodes(&agent_a).patch_status("node-a", &mp, &status(7)).await.expect("agent A updates its status");
    assert_eq!(st.data["status"]["freeInstances"], json!(7));

    // ... but not node B's: the admission policy refuses, naming both nodes.
    let (code, msg) = refused("agent A creates node-b", thawnodes(&agent_a).create(&pp, &advert("node-b", &node_b)).await);
    assert_eq!(code, 403, "{msg}");
    assert!(msg.contains("thaw-agent-own-node") && msg.contains("only write the ThawNode of its own node (node-a), not node-b"), "{msg}");
    thawnodes(&agent_b).create(&pp, &advert("node-b", &node_b)).await.expect("agent B creates its own");
    let (code, _) = refused("agent A patches node-b's status", thawnodes(&agent_a).patch_status("node-b", &mp, &status(0)).await);
    assert_eq!(code, 403);
    let (code, _) = refused("agent A patches node-b", thawnodes(&agent_a).patch("node-b", &mp, &Patch::Merge(json!({"spec": {"endpoint": "http://evil:9000"}}))).await);
    assert_eq!(code, 403);
    let (code, _) = refused("agent A deletes node-b", thawnodes(&agent_a).delete("node-b", &DeleteParams::default()).await);
    assert_eq!(code, 403);
    let b = thawnodes(&admin).get("node-b").await.unwrap();
    assert_eq!(b.data["spec"]["endpoint"], json!("http://node-b.example:9000"), "node-b untouched");

    // An advertisement must stay owned by its Node (else it would outlive the node).
    let (code, msg) = refused(
        "agent A drops its ownerReference",
        thawnodes(&agent_a).patch("node-a", &mp, &Patch::Merge(json!({"metadata": {"ownerReferences": null}}))).await,
    );
    assert_eq!(code, 422, "{msg}");
    assert!(msg.contains("must be owned by its Node"), "{msg}");

    // A thaw-agent token not bound to a pod names no node: no writes at all.
    let unbound = cp.client_for_token(&cp.service_account_token(NS, "thaw-agent", None).await.unwrap()).await.unwrap();
    let (code, msg) = refused("unbound agent token", thawnodes(&unbound).patch_status("node-a", &mp, &status(1)).await);
    assert_eq!(code, 403);
    assert!(msg.contains("its token names no node"), "{msg}");

    // RBAC: agents read functions but cannot create them, nor read Secrets.
    let (code, _) = refused("agent creates a ThawFunction", thawfunctions(&agent_a).create(&pp, &good).await);
    assert_eq!(code, 403);
    assert!(thawfunctions(&agent_a).get("hello").await.is_ok());
    let (code, _) = refused("agent lists secrets", Api::<Secret>::namespaced(agent_a.clone(), NS).list(&ListParams::default()).await);
    assert_eq!(code, 403);
    // It gets the one a function's valueFrom names (thaw-agent-function-env); the gateway does not.
    let secret: Secret = serde_json::from_value(json!({"metadata": {"name": "hello"}, "stringData": {"token": "t0"}})).unwrap();
    Api::<Secret>::namespaced(admin.clone(), NS).create(&PostParams::default(), &secret).await.unwrap();
    let got = Api::<Secret>::namespaced(agent_a.clone(), NS).get("hello").await.expect("an agent reads a Secret a function names");
    assert_eq!(got.data.unwrap()["token"].0, b"t0");

    // The gateway reads advertisements, and reads and writes functions (CreateFunction),
    // never their status (the agents') nor an advertisement.
    let gw = cp.client_for_token(&cp.service_account_token(NS, "thaw-gateway", None).await.unwrap()).await.unwrap();
    let seen: Vec<String> = thawnodes(&gw).list(&ListParams::default()).await.unwrap().items.into_iter().filter_map(|o| o.metadata.name).collect();
    assert!(seen.contains(&"node-a".to_string()) && seen.contains(&"node-b".to_string()), "{seen:?}");
    let (code, _) = refused("gateway patches a ThawNode", thawnodes(&gw).patch_status("node-a", &mp, &status(0)).await);
    assert_eq!(code, 403);
    let (code, _) = refused("gateway deletes a ThawNode", thawnodes(&gw).delete("node-b", &DeleteParams::default()).await);
    assert_eq!(code, 403);
    let (code, _) = refused("gateway reads a Secret", Api::<Secret>::namespaced(gw.clone(), NS).get("hello").await);
    assert_eq!(code, 403);
    let (code, _) = refused("gateway writes a ThawFunction's status", thawfunctions(&gw).patch_status("hello", &mp, &Patch::Merge(json!({"status": {"observedGeneration": 1}}))).await);
    assert_eq!(code, 403);
    let touched = json!({"metadata": {"labels": {"thaw.dev/touched-by": "gateway"}}});
    thawfunctions(&gw).patch("hello", &mp, &Patch::Merge(&touched)).await.expect("the gateway updates a ThawFunction");
    // Layers are the gateway's (PublishLayerVersion); the agents never touch them (a
    // function's object carries what it uses).
    let layer: DynamicObject = serde_json::from_value(json!({"apiVersion": "thaw.dev/v1alpha1", "kind": "ThawLayer", "metadata": {"name": "deps"},
        "spec": {"name": "deps", "lastVersion": 1, "versions": [{"version": 1, "created": "2026-11-27T00:00:00Z", "code": {"key": "bundles/d.zip", "sha256": sha, "size": 3}}]}}))
    .unwrap();
    thawlayers(&gw).create(&pp, &layer).await.expect("the gateway creates a ThawLayer");
    let (code, _) = refused("agent reads a ThawLayer", thawlayers(&agent_a).get("deps").await);
    assert_eq!(code, 403);
    let mut bad = layer.clone();
    bad.metadata.name = Some("bad".into());
    bad.data["spec"]["versions"][0]["code"]["sha256"] = json!("not-hex");
    let (code, msg) = refused("a layer version's sha256 not hex", thawlayers(&gw).create(&PostParams { dry_run: true, ..Default::default() }, &bad).await);
    assert!(code == 422 && msg.contains("sha256"), "{msg}");

    // --- The advertisement goes with its Node (ownerReference, garbage collector).
    Api::<Node>::all(admin.clone()).delete("node-a", &DeleteParams::default()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        match thawnodes(&admin).get_opt("node-a").await.unwrap() {
            None => break,
            Some(_) => assert!(Instant::now() < deadline, "node-a's ThawNode still there 90 s after its Node was deleted"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(thawnodes(&admin).get_opt("node-b").await.unwrap().is_some(), "node-b's ThawNode must stay");
}

/// Installs the two CRDs (server-side apply: idempotent, the other test may do it too).
async fn install_crds(admin: &Client) {
    let discovery = Discovery::new(admin.clone()).run().await.unwrap();
    for o in render("base").iter().filter(|o| o["kind"] == "CustomResourceDefinition") {
        apply(admin, &discovery, o, false).await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    while thawnodes(admin).list(&ListParams::default()).await.is_err() {
        assert!(Instant::now() < deadline, "ThawNode CRD not served after 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Waits until the watched view satisfies `pred`.
async fn view_until(rx: &mut tokio::sync::watch::Receiver<std::sync::Arc<ClusterView>>, what: &str, pred: impl Fn(&ClusterView) -> bool) {
    let r = tokio::time::timeout(Duration::from_secs(30), rx.wait_for(|v| pred(v))).await;
    assert!(matches!(r, Ok(Ok(_))), "the gateway's view never showed: {what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_view_follows_advertisements() {
    let cp = tokio::task::spawn_blocking(ControlPlane::shared).await.unwrap();
    let admin = cp.client().await.unwrap();
    install_crds(&admin).await;
    let names = |v: &ClusterView| v.nodes().iter().map(|n| n.name.clone()).filter(|n| n.starts_with("view-")).collect::<Vec<_>>();

    let (tx, mut rx) = tokio::sync::watch::channel(std::sync::Arc::new(ClusterView::new(vec![], Policy::Thaw, 1.25)));
    let watcher = tokio::spawn(watch_nodes(admin.clone(), Policy::Thaw, 1.25, tx));
    let api = thawnodes(&admin);
    let pp = PostParams::default();
    let publish = |warm: Vec<&'static str>, cached: Vec<&'static str>| {
        Patch::Merge(json!({"status": {"bootId": "boot-1", "freeInstances": 8,
            "warm": warm.iter().map(|f| json!({"function": f, "idle": 1})).collect::<Vec<_>>(),
            "cachedSnapshots": cached.iter().map(|s| json!({"id": s, "bytes": 1})).collect::<Vec<_>>()}}))
    };
    for n in ["view-1", "view-2", "view-3"] {
        // Owned by nothing here (no Node objects needed for the view).
        let o: DynamicObject = serde_json::from_value(json!({"apiVersion": "thaw.dev/v1alpha1", "kind": "ThawNode",
            "metadata": {"name": n}, "spec": {"endpoint": format!("http://{n}.example:9000")}})).unwrap();
        api.create(&pp, &o).await.unwrap();
    }
    // Not published yet (no status): not in placement.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(names(&rx.borrow()).is_empty(), "unpublished nodes must not be placed on: {:?}", names(&rx.borrow()));

    api.patch_status("view-1", &PatchParams::default(), &publish(vec![], vec![])).await.unwrap();
    api.patch_status("view-2", &PatchParams::default(), &publish(vec!["hot"], vec![])).await.unwrap();
    api.patch_status("view-3", &PatchParams::default(), &publish(vec![], vec!["snap-cold"])).await.unwrap();
    view_until(&mut rx, "3 published nodes", |v| names(v).len() == 3).await;
    {
        let v = rx.borrow().clone();
        let loads = vec![0u32; v.nodes().len()];
        let mut rng = Rng::new(1);
        let (n, d) = v.place("hot", "snap-hot", &loads[..], &mut rng).unwrap();
        assert_eq!((n.name.as_str(), d.reason), ("view-2", Reason::Warm), "warm instance first");
        assert_eq!(n.endpoint, "http://view-2.example:9000");
        let (n, d) = v.place("cold", "snap-cold", &loads[..], &mut rng).unwrap();
        assert_eq!((n.name.as_str(), d.reason), ("view-3", Reason::Cached), "then the node caching the snapshot");
    }

    // The warm instance goes away on view-2 and view-3 disappears: placement follows.
    api.patch_status("view-2", &PatchParams::default(), &publish(vec![], vec![])).await.unwrap();
    api.delete("view-3", &DeleteParams::default()).await.unwrap();
    view_until(&mut rx, "view-3 gone and view-2 without warm instances", |v| {
        names(v) == ["view-1", "view-2"] && v.nodes().iter().all(|n| n.warm.is_empty() || !n.name.starts_with("view-"))
    })
    .await;
    let v = rx.borrow().clone();
    let loads = vec![0u32; v.nodes().len()];
    let (n, d) = v.place("cold", "snap-cold", &loads[..], &mut Rng::new(1)).unwrap();
    assert!(matches!(d.reason, Reason::Ring(_)), "{d:?}");
    assert_ne!(n.name, "view-3");
    watcher.abort();
    for n in ["view-1", "view-2"] {
        api.delete(n, &DeleteParams::default()).await.unwrap();
    }
}

/// Installs what an agent needs to write its ThawNode: the namespace, the CRDs, the
/// agent's ServiceAccount, RBAC and admission policy (server-side apply: idempotent,
/// the other tests may apply them too).
async fn install_agent_identity(admin: &Client) {
    const KINDS: [&str; 7] = ["Namespace", "CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
        "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding"];
    let discovery = Discovery::new(admin.clone()).run().await.unwrap();
    let objs = render("base");
    for kind in KINDS {
        for o in objs.iter().filter(|o| o["kind"] == kind && (kind != "ServiceAccount" || o["metadata"]["name"] == "thaw-agent")) {
            let mut o = o.clone();
            if o["metadata"]["namespace"].is_null() && kind == "ServiceAccount" {
                o["metadata"]["namespace"] = json!(NS);
            }
            apply(admin, &discovery, &o, false).await.unwrap_or_else(|e| panic!("applying {}: {e}", name_of(&o)));
        }
    }
    install_crds(admin).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_publishes_its_node_and_republishes_after_a_restart() {
    use thaw_cluster::agent::{Advert, Agent, CachedSnapshot};
    let cp = tokio::task::spawn_blocking(ControlPlane::shared).await.unwrap();
    let admin = cp.client().await.unwrap();
    install_agent_identity(&admin).await;
    let (node_uid, pod) = node_with_agent_pod(&admin, "pub-node").await;
    let token = cp.service_account_token(NS, "thaw-agent", Some(("agent-pub-node", &pod))).await.unwrap();
    let client = cp.client_for_token(&token).await.unwrap();
    let (tx, mut rx) = tokio::sync::watch::channel(std::sync::Arc::new(ClusterView::new(vec![], Policy::Thaw, 1.25)));
    let watcher = tokio::spawn(watch_nodes(admin.clone(), Policy::Thaw, 1.25, tx));

    // First start: the ThawNode is created, owned by its Node, with the status.
    let mut agent = Agent::new(client.clone(), "pub-node", "http://10.1.2.3:9000");
    let ad = Advert { free_instances: 30, in_flight: 1, free_memory_mb: 900, cached: vec![CachedSnapshot { function: "fn-a".into(), id: Some("snap-1".into()), bytes: 4096 }], warm: vec![("fn-a".into(), 2)] };
    agent.publish(&ad).await.expect("the agent publishes with its own credentials");
    let o = thawnodes(&admin).get("pub-node").await.unwrap();
    let owner = &o.metadata.owner_references.as_ref().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()), ("Node", "pub-node", node_uid.as_str()));
    assert_eq!(o.data["spec"]["endpoint"], json!("http://10.1.2.3:9000"));
    let st = &o.data["status"];
    assert_eq!(st["bootId"], json!(agent.boot_id()));
    assert_eq!((st["freeInstances"].clone(), st["inFlight"].clone(), st["freeMemoryMb"].clone()), (json!(30), json!(1), json!(900)));
    assert_eq!(st["cachedSnapshots"], json!([{"id": "snap-1", "function": "fn-a", "bytes": 4096}]));
    assert!(st["heartbeatTime"].as_str().is_some_and(|t| t.ends_with('Z')), "{st}");
    view_until(&mut rx, "pub-node with fn-a warm and snap-1 cached", |v| {
        v.nodes().iter().any(|n| n.name == "pub-node" && n.warm == [("fn-a".to_string(), 2)] && n.cached == ["snap-1"] && n.cached_functions == ["fn-a"])
    })
    .await;

    // A restart: a new boot id and endpoint; the existing ThawNode is taken over.
    let first_boot = agent.boot_id().to_string();
    let mut agent = Agent::new(client.clone(), "pub-node", "http://10.1.2.4:9000");
    assert_ne!(agent.boot_id(), first_boot);
    agent.publish(&Advert { free_instances: 32, ..Default::default() }).await.expect("republished after the restart");
    view_until(&mut rx, "pub-node's new boot, nothing warm", |v| {
        v.nodes().iter().any(|n| n.name == "pub-node" && n.boot_id != first_boot && n.endpoint == "http://10.1.2.4:9000" && n.warm.is_empty())
    })
    .await;

    // Running: a change is published within a tick; the heartbeat advances.
    let now = std::sync::Arc::new(std::sync::Mutex::new(Advert::default()));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let source = {
        let now = now.clone();
        move || now.lock().unwrap().clone()
    };
    let running = tokio::spawn(agent.run(source, Duration::from_millis(100), Duration::from_secs(1), stop_rx));
    now.lock().unwrap().warm = vec![("fn-b".into(), 1)];
    view_until(&mut rx, "fn-b warm on pub-node", |v| v.nodes().iter().any(|n| n.name == "pub-node" && n.warm == [("fn-b".to_string(), 1)])).await;
    let beat = || async { thawnodes(&admin).get("pub-node").await.unwrap().data["status"]["heartbeatTime"].as_str().unwrap().to_string() };
    let first_beat = beat().await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while beat().await == first_beat {
        assert!(Instant::now() < deadline, "no heartbeat in 10 s with a 1 s heartbeat");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop_tx.send(true).unwrap();
    running.await.unwrap();

    // Its credentials name its node: publishing as another node is refused, clearly,
    // and so is a node that does not exist.
    Api::<Node>::all(admin.clone()).create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "pub-other"}})).unwrap()).await.unwrap();
    let mut impostor = Agent::new(client.clone(), "pub-other", "http://10.9.9.9:9000");
    let e = thaw_node::node::error_chain(&impostor.publish(&Advert::default()).await.unwrap_err());
    assert!(e.contains("creating ThawNode pub-other") && e.contains("only write the ThawNode of its own node (pub-node), not pub-other"), "{e}");
    assert!(thawnodes(&admin).get_opt("pub-other").await.unwrap().is_none());
    let e = Agent::new(client, "no-such-node", "http://10.9.9.9:9000").publish(&Advert::default()).await.unwrap_err().to_string();
    assert!(e.contains("Node no-such-node is not known"), "{e}");
    watcher.abort();
}
