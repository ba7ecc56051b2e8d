//! `thaw gateway`: the Lambda API with SigV4 in front of the node agents.
//!
//! A request is authenticated with the node's own verifier (`thaw_node::sigv4`) and
//! parsed with the node's router (`thaw_node::api::route`). An Invoke is placed by
//! [`ClusterView::place`] over the ThawNode advertisements watched from the apiserver
//! ([`watch_nodes`]) and forwarded unchanged (method, path, query, headers including
//! `Host` and `Authorization`, body) to the chosen agent, which verifies the client's
//! signature again with the same keys; its answer goes back unchanged, plus
//! `x-thaw-node`. Loads are this gateway's own invocations in flight per node.
//!
//! Failures. An agent that refuses the connection never got the request: it is left
//! out of placement (until it publishes a new boot, or for 10 s) and the request is
//! placed again, so a dead agent loses no call. An agent that fails once it has the
//! request (it may have run it) gives a Lambda-shaped 502 `ServiceException` at once,
//! never a second run elsewhere. A node whose heartbeat is older than three of the
//! agent's heartbeats (30 s: partitioned, or killed with no call to notice) is left out
//! too, unless every node's is: then the apiserver is what is away, and the last-known
//! view stays in force (the data plane serves on).
//!
//! Function URLs (`/url/<function>/...`) are placed like an Invoke of their function
//! and forwarded without a signature check at the gateway (the agent enforces the
//! URL's AuthType).
//!
//! The registry ([`Registry`], with `--snapshot-store`): CreateFunction puts the code
//! bundle into the agents' store and writes the ThawFunction (the agents deploy it,
//! [`crate::follow`]); UpdateFunctionCode, UpdateFunctionConfiguration and
//! DeleteFunction change or delete it; ListFunctions reads it; GetFunction asks the
//! placed agent and, before any agent has deployed the function, answers from the
//! registry (State Pending).
//!
//! Asynchronous invocations (`X-Amz-Invocation-Type: Event`) of a function in the
//! registry are queued in the store and run at least once, whichever agent or gateway
//! dies ([`crate::events`]); those of a function the registry does not know (made
//! through an agent's own API) are forwarded to its agent, whose own queue takes them.
//!
//! Versions: PublishVersion writes the version's own ThawFunction (`NAME.vN`, numbered
//! by the registry), ListVersionsByFunction lists them, DeleteFunction with a version
//! qualifier deletes one; the agents publish each under its number
//! ([`crate::follow`]), and Invoke with a qualifier is placed and forwarded as any.
//!
//! Aliases (CreateAlias, UpdateAlias, GetAlias, ListAliases, DeleteAlias) live in the
//! function object's annotation `thaw.dev/aliases`; the agents put them on their node,
//! and an Invoke through an alias is routed by the agent that runs it.
//!
//! Tags (TagResource, UntagResource, ListTags, CreateFunction's Tags) live in the
//! annotation `thaw.dev/tags`, put on every agent's function (`thaw:isolation` among
//! them).
//!
//! Function URL configurations live in the annotation `thaw.dev/urls` (their URLs are the
//! gateway's, `/url/<function>/`, placed like an Invoke), put on every agent.
//!
//! Reserved concurrency (Put/Get/DeleteFunctionConcurrency) is the cluster's: it lives
//! in the annotation `thaw.dev/concurrency`, each agent enforces its share of it (the
//! shares add up to the limit, [`crate::registry::concurrency_share`]), and an Invoke
//! an agent refuses for its share is tried on the next agent ([`send`]).
//!
//! Provisioned concurrency (Put/Get/Delete/ListProvisionedConcurrencyConfig(s)) is the
//! cluster's too: annotation `thaw.dev/provisioned` (version -> count), each agent
//! keeping its share ready; Get asks every agent for its allocation and adds them up.
//! GetAccountSettings adds up the agents' limits and counts the registry's functions.
//!
//! Metrics: `GET /metrics` ([`crate::metrics`]): requests by operation and code,
//! their latency, forwards by agent, agent failures, reserved-concurrency retries,
//! agents advertised and left out. Loopback peers only unless `--metrics-public`.
//!
//! Layers (PublishLayerVersion, Get/List/DeleteLayerVersion, GetLayerVersionByArn,
//! ListLayers) live in ThawLayer objects, their zips in the store ([`crate::layers`]);
//! a function's `Layers` go into its ThawFunction with where their zips are, and each
//! agent installs them under the cluster's version numbers.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::body::{Body, Bytes};
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use clap::Args;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client as HttpClient;
use hyper_util::rt::TokioExecutor;
use futures::future::BoxFuture;
use thaw_node::api::{
    create_spec, function_name, invoke_payload, query_param, query_values, route, tagged_function, tags_in, update_code_zip, url_target, Action, ApiError, MAX_BODY,
    URL_PREFIX,
};
use thaw_node::node::error_chain;
use thaw_node::sigv4::{sign, Credentials, SignedRequest, Verifier};
use thaw_store::events::{Event, EventQueue};

use crate::events::{Deliver, Delivery, Dispatcher, EventArgs};

use crate::hash::Rng;
use crate::placement::{Policy, DEFAULT_LOAD_FACTOR};
use crate::registry::{Qualifier, Registry, StoredProvisioned};
use crate::view::{watch_nodes, ClusterView, NodeAd};

#[derive(Args, Debug)]
pub struct GatewayArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:9000")]
    pub listen: String,
    /// Kubeconfig for the apiserver (default: in-cluster service account, or ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<PathBuf>,
    /// Access key id clients sign with (the agents accept the same keys). Env: THAW_ACCESS_KEY_ID.
    #[arg(long, env = "THAW_ACCESS_KEY_ID")]
    pub access_key_id: String,
    /// Secret access key. Env: THAW_SECRET_ACCESS_KEY.
    #[arg(long, env = "THAW_SECRET_ACCESS_KEY", hide_env_values = true)]
    pub secret_access_key: String,
    /// Placement policy (thaw, hash, least-loaded, random).
    #[arg(long, default_value = "thaw")]
    pub policy: Policy,
    /// Load bound factor of the thaw policy.
    #[arg(long, default_value_t = DEFAULT_LOAD_FACTOR)]
    pub load_factor: f64,
    /// The snapshot store the agents use (s3://BUCKET/PREFIX, their --snapshot-store):
    /// CreateFunction and UpdateFunctionCode put code bundles there. Without it the
    /// gateway serves Invoke and function URLs only. Credentials from AWS_ACCESS_KEY_ID /
    /// AWS_SECRET_ACCESS_KEY.
    #[arg(long, env = "THAW_SNAPSHOT_STORE")]
    pub snapshot_store: Option<String>,
    /// S3 endpoint of --snapshot-store, e.g. http://127.0.0.1:9000 for MinIO (default: AWS).
    #[arg(long, env = "AWS_ENDPOINT_URL")]
    pub store_endpoint_url: Option<String>,
    /// Namespace of the ThawFunctions the gateway writes and lists.
    #[arg(long, default_value = "default")]
    pub namespace: String,
    /// Region of function ARNs (as the agents' --region).
    #[arg(long, default_value = "us-east-1")]
    pub region: String,
    #[command(flatten)]
    pub events: EventArgs,
    /// Serve /metrics to any peer (default: loopback peers only, as the agents do).
    #[arg(long)]
    pub metrics_public: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error(transparent)]
    Client(#[from] crate::KubeClientError),
    #[error("the snapshot store")]
    Store(#[source] Box<thaw_store::StoreError>),
    #[error("{what}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

type Http = HttpClient<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>;

struct Gateway {
    view: tokio::sync::watch::Receiver<Arc<ClusterView>>,
    verifier: Verifier,
    http: Http,
    in_flight: Mutex<HashMap<String, u32>>,
    rng: Mutex<Rng>,
    /// Agents a connection to failed: (boot id then, since when). Left out of placement
    /// until they publish a new boot or [`DOWN_FOR`] passes.
    down: Mutex<HashMap<String, (String, Instant)>>,
    /// The view placement last used with nodes left out, and what it was made from.
    usable: Mutex<Option<Usable>>,
    /// The function registry (None: no --snapshot-store, Invoke and URLs only).
    registry: Option<Registry>,
    /// Asynchronous invocations queued in the store (with the registry).
    events: Option<Arc<Dispatcher>>,
    /// The key and region the gateway signs its own Invokes with (queued events).
    signer: Credentials,
    region: String,
    metrics: crate::metrics::GatewayMetrics,
    metrics_public: bool,
}

/// (the watched view, the nodes left out of it, the view without them)
type Usable = (Arc<ClusterView>, Vec<String>, Arc<ClusterView>);

/// How long an agent that refused a connection is left out (unless it restarts sooner).
const DOWN_FOR: Duration = Duration::from_secs(10);
/// A node whose last heartbeat is older than this is left out (silent: partitioned, or
/// its agent killed without a connection to tell). Three of the agent's heartbeats.
const STALE_AFTER: Duration = Duration::from_secs(3 * crate::agent::HEARTBEAT.as_secs());
/// Placements of one request whose connection is refused: its first node and, when
/// connecting to it failed (the request never reached it, so it never ran), others.
const ATTEMPTS: usize = 3;

impl Gateway {
    /// The watched view without the nodes found down or gone silent.
    fn usable_view(&self) -> Arc<ClusterView> {
        let view = self.view.borrow().clone();
        let names = {
            let down = self.down.lock().unwrap_or_else(|e| e.into_inner());
            left_out(view.nodes(), &down, Instant::now(), k8s_openapi::chrono::Utc::now())
        };
        if names.is_empty() {
            return view;
        }
        let mut cache = self.usable.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((from, was, usable)) = cache.as_ref() {
            if Arc::ptr_eq(from, &view) && *was == names {
                return usable.clone();
            }
        }
        tracing::info!(left_out = ?names, "placing without agents found down or silent");
        let usable = Arc::new(view.without(|n| names.contains(&n.name)));
        *cache = Some((view, names, usable.clone()));
        usable
    }

    fn mark_down(&self, node: &Placed) {
        self.metrics.agent_failures.with_label_values(&["refused"]).inc();
        tracing::warn!(node = %node.name, endpoint = %node.endpoint, "agent refused the connection; placing elsewhere for {} s or until it republishes", DOWN_FOR.as_secs());
        self.down.lock().unwrap_or_else(|e| e.into_inner()).insert(node.name.clone(), (node.boot_id.clone(), Instant::now()));
    }
}

/// The nodes placement leaves out: those `down` names under the boot they had then,
/// for [`DOWN_FOR`], and those whose heartbeat is older than [`STALE_AFTER`] — unless
/// every heartbeat is: then the apiserver is what is away (agents cannot publish), and
/// the last-known view stays in force.
fn left_out(nodes: &[NodeAd], down: &HashMap<String, (String, Instant)>, now: Instant, wall: k8s_openapi::chrono::DateTime<k8s_openapi::chrono::Utc>) -> Vec<String> {
    let stale = |n: &NodeAd| n.heartbeat.is_some_and(|h| (wall - h).num_seconds() > STALE_AFTER.as_secs() as i64);
    let judge_heartbeats = nodes.iter().any(|n| !stale(n));
    nodes
        .iter()
        .filter(|n| down.get(&n.name).is_some_and(|(boot, at)| *boot == n.boot_id && now.duration_since(*at) < DOWN_FOR) || (judge_heartbeats && stale(n)))
        .map(|n| n.name.clone())
        .collect()
}

/// Where a request was placed (of the node's advertisement, what forwarding needs).
struct Placed {
    name: String,
    endpoint: String,
    boot_id: String,
}

impl Placed {
    /// The Lambda-shaped 502 of an agent that failed with `e`.
    fn failed(&self, e: &dyn std::fmt::Display, request_id: &str) -> ApiError {
        ApiError::new(StatusCode::BAD_GATEWAY, "ServiceException", format!("node agent {} ({}) failed: {e} (request {request_id})", self.name, self.endpoint))
    }
}

/// Runs the gateway until the process is stopped.
pub fn run(args: GatewayArgs) -> Result<(), GatewayError> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .map_err(|source| GatewayError::Io { what: "starting the tokio runtime".into(), source })?;
    // The store's client owns a runtime of its own: opened outside the gateway's.
    let store = match &args.snapshot_store {
        Some(url) => {
            let url = thaw_store::StoreUrl::parse(url).map_err(|e| GatewayError::Store(Box::new(e)))?;
            let cfg = thaw_store::StoreConfig { endpoint: args.store_endpoint_url.clone(), region: Some(args.region.clone()), ..Default::default() };
            Some(Arc::new(thaw_store::Store::open(&url, &cfg).map_err(|e| GatewayError::Store(Box::new(e)))?))
        }
        None => None,
    };
    rt.block_on(serve(args, store))
}

async fn serve(args: GatewayArgs, store: Option<Arc<thaw_store::Store>>) -> Result<(), GatewayError> {
    let client = crate::kube_client(args.kubeconfig.as_deref()).await?;
    let registry = store.clone().map(|s| Registry::new(client.clone(), &args.namespace, s, &args.region, thaw_node::node::ACCOUNT));
    let (tx, rx) = tokio::sync::watch::channel(Arc::new(ClusterView::new(Vec::new(), args.policy, args.load_factor)));
    tokio::spawn(watch_nodes(client, args.policy, args.load_factor, tx));
    let keys = vec![Credentials { access_key_id: args.access_key_id.clone(), secret_access_key: args.secret_access_key.clone() }];
    let signer = keys[0].clone();
    let gw = Arc::new_cyclic(|me: &std::sync::Weak<Gateway>| Gateway {
        view: rx,
        events: store.map(|s| Dispatcher::new(EventQueue::new(s), args.events.clone(), Arc::new(Deliverer(me.clone())))),
        signer,
        region: args.region.clone(),
        verifier: Verifier::new("lambda", keys),
        http: HttpClient::builder(TokioExecutor::new()).build_http(),
        in_flight: Mutex::new(HashMap::new()),
        rng: Mutex::new(Rng::new(std::process::id().into())),
        down: Mutex::new(HashMap::new()),
        usable: Mutex::new(None),
        registry,
        metrics: crate::metrics::GatewayMetrics::new(),
        metrics_public: args.metrics_public,
    });
    let listener = tokio::net::TcpListener::bind(&args.listen)
        .await
        .map_err(|source| GatewayError::Io { what: format!("listening on {}", args.listen), source })?;
    if let Some(d) = &gw.events {
        tokio::spawn(d.clone().sweep());
    }
    tracing::info!(listen = %args.listen, policy = %args.policy, "gateway listening");
    let app = axum::Router::new().fallback(handle).with_state(gw);
    axum::serve(listener, app.into_make_service_with_connect_info::<std::net::SocketAddr>())
        .await
        .map_err(|source| GatewayError::Io { what: "serving".into(), source })
}

/// Counts an invocation in flight on a node for as long as it lives.
struct InFlight<'a>(&'a Gateway, String);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut m = self.0.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = m.get_mut(&self.1) {
            *n = n.saturating_sub(1);
        }
    }
}

async fn handle(State(gw): State<Arc<Gateway>>, ConnectInfo(peer): ConnectInfo<std::net::SocketAddr>, req: Request) -> Response {
    let request_id = uuid::Uuid::new_v4().to_string();
    let path = req.uri().path();
    if path == "/metrics" && req.method() == axum::http::Method::GET {
        return metrics(&gw, &peer).unwrap_or_else(|e| e.into_response(&request_id));
    }
    // Routed once: the label, and what `forward` runs (a function URL is none).
    let action = if path.starts_with(URL_PREFIX) { None } else { route(req.method(), path) };
    let operation = if path.starts_with(URL_PREFIX) { "Url".to_string() } else { crate::metrics::operation(action.as_ref()) };
    let t0 = Instant::now();
    let r = match forward(&gw, req, action, &request_id).await {
        Ok(r) => r,
        Err(e) => {
            if e.status.is_server_error() {
                tracing::warn!(error = %e, request_id, "request failed");
            }
            e.into_response(&request_id)
        }
    };
    gw.metrics.requests.with_label_values(&[&operation, r.status().as_str()]).inc();
    gw.metrics.request_seconds.with_label_values(&[&operation]).observe(t0.elapsed().as_secs_f64());
    r
}

/// `GET /metrics`: loopback peers only unless `--metrics-public`.
fn metrics(gw: &Gateway, peer: &std::net::SocketAddr) -> Result<Response, ApiError> {
    if !gw.metrics_public && !peer.ip().is_loopback() {
        return Err(ApiError::new(StatusCode::FORBIDDEN, "AccessDeniedException", "/metrics is only served to loopback clients (start the gateway with --metrics-public to serve it to any peer)"));
    }
    let (all, usable) = (gw.view.borrow().nodes().len(), gw.usable_view().nodes().len());
    gw.metrics.agents.set(all as i64);
    gw.metrics.agents_left_out.set(all.saturating_sub(usable) as i64);
    Ok(([(axum::http::header::CONTENT_TYPE, "text/plain; version=0.0.4")], gw.metrics.render()).into_response())
}

/// Answer `req`, whose Lambda operation is `action` (routed by [`handle`]; None for a
/// function URL or a path no operation has).
async fn forward(gw: &Gateway, req: Request, action: Option<Action>, request_id: &str) -> Result<Response, ApiError> {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(Body::new(body), MAX_BODY)
        .await
        .map_err(|_| ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "RequestEntityTooLargeException", format!("Request must be smaller than {MAX_BODY} bytes")))?;
    let path = parts.uri.path();
    // A function URL (`/url/<function>/...`) is placed like an Invoke of its function
    // and forwarded unverified: its agent enforces the URL's AuthType (an AWS_IAM URL
    // checks the signature there, a NONE URL is open by design).
    if let Some(rest) = path.strip_prefix(URL_PREFIX) {
        let function = rest.split('/').next().unwrap_or_default().to_string();
        return send(gw, &parts, body, &function, request_id).await;
    }
    let signed = SignedRequest {
        method: parts.method.as_str(),
        raw_path: path,
        raw_query: parts.uri.query(),
        headers: parts.headers.iter().filter_map(|(k, v)| v.to_str().ok().map(|v| (k.as_str(), v))).collect(),
        body: &body,
    };
    gw.verifier.verify(&signed, SystemTime::now())?;
    let action = action.ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, "UnknownOperationException", format!("Unknown operation {} {path}", parts.method)))?;
    let registry = || {
        gw.registry.as_ref().ok_or_else(|| ApiError::new(StatusCode::NOT_IMPLEMENTED, "ServiceException", "this gateway has no --snapshot-store: it serves Invoke and function URLs only"))
    };
    let host = parts.headers.get("host").and_then(|h| h.to_str().ok()).unwrap_or("127.0.0.1").to_string();
    match action {
        Action::Invoke(name) => {
            let (function, _) = function_name(&name, None)?;
            let event = parts.headers.get("x-amz-invocation-type").is_some_and(|v| v == "Event");
            match (&gw.events, &gw.registry) {
                (Some(events), Some(registry)) if event => queue_event(gw, events, registry, &parts, body, &function, request_id).await,
                _ => send(gw, &parts, body, &function, request_id).await,
            }
        }
        Action::CreateFunction => {
            let (spec, zip) = create_spec(&body)?;
            Ok(json(StatusCode::CREATED, &registry()?.create(&spec, zip, &tags_in(&body)?).await?))
        }
        Action::UpdateFunctionCode(name) => {
            let (function, _) = function_name(&name, None)?;
            let zip = update_code_zip(&body)?;
            Ok(json(StatusCode::OK, &registry()?.update_code(&function, zip).await?))
        }
        Action::UpdateFunctionConfiguration(name) => {
            let (function, _) = function_name(&name, None)?;
            Ok(json(StatusCode::OK, &registry()?.update_configuration(&function, &body).await?))
        }
        Action::DeleteFunction(name) => {
            let (function, q) = qualified(&name, &parts)?;
            match q {
                Qualifier::Latest => registry()?.delete(&function).await?,
                Qualifier::Version(n) => registry()?.delete_version(&function, n).await?,
                Qualifier::Alias(a) => return Err(ApiError::invalid(format!("Deleting a function by alias ({a}) is not possible; use DeleteAlias."))),
            }
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        Action::PublishVersion(name) => {
            let (function, _) = function_name(&name, None)?;
            Ok(json(StatusCode::CREATED, &registry()?.publish_version(&function, &body).await?))
        }
        Action::ListVersionsByFunction(name) => {
            let (function, _) = function_name(&name, None)?;
            Ok(json(StatusCode::OK, &registry()?.list_versions(&function).await?))
        }
        Action::CreateAlias(name) => {
            let (function, _) = function_name(&name, None)?;
            Ok(json(StatusCode::CREATED, &registry()?.put_alias(&function, None, &body).await?))
        }
        Action::UpdateAlias(name, alias) => {
            let (function, _) = function_name(&name, None)?;
            Ok(json(StatusCode::OK, &registry()?.put_alias(&function, Some(&alias), &body).await?))
        }
        Action::GetAlias(name, alias) => Ok(json(StatusCode::OK, &registry()?.get_alias(&function_name(&name, None)?.0, &alias).await?)),
        Action::ListAliases(name) => {
            let version = query_param(parts.uri.query(), "FunctionVersion");
            Ok(json(StatusCode::OK, &registry()?.list_aliases(&function_name(&name, None)?.0, version.as_deref()).await?))
        }
        Action::TagResource(arn) => {
            registry()?.retag(&tagged_function(&arn)?, &tags_in(&body)?, &[]).await?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        Action::UntagResource(arn) => {
            let keys = query_values(parts.uri.query(), "tagKeys");
            registry()?.retag(&tagged_function(&arn)?, &BTreeMap::new(), &keys).await?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        Action::CreateFunctionUrlConfig(name) => {
            let (function, alias) = url_target(&name, parts.uri.query())?;
            Ok(json(StatusCode::CREATED, &registry()?.put_url(&function, alias.as_deref(), &body, true, &host).await?))
        }
        Action::UpdateFunctionUrlConfig(name) => {
            let (function, alias) = url_target(&name, parts.uri.query())?;
            Ok(json(StatusCode::OK, &registry()?.put_url(&function, alias.as_deref(), &body, false, &host).await?))
        }
        Action::GetFunctionUrlConfig(name) => {
            let (function, alias) = url_target(&name, parts.uri.query())?;
            Ok(json(StatusCode::OK, &registry()?.urls(&function, Some(alias.as_deref()), &host).await?))
        }
        Action::ListFunctionUrlConfigs(name) => Ok(json(StatusCode::OK, &registry()?.urls(&function_name(&name, None)?.0, None, &host).await?)),
        Action::DeleteFunctionUrlConfig(name) => {
            let (function, alias) = url_target(&name, parts.uri.query())?;
            registry()?.delete_url(&function, alias.as_deref()).await?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        Action::ListTags(arn) => Ok(json(StatusCode::OK, &registry()?.tags(&tagged_function(&arn)?).await?)),
        Action::PutFunctionConcurrency(name) => Ok(json(StatusCode::OK, &registry()?.put_concurrency(&function_name(&name, None)?.0, &body).await?)),
        Action::GetFunctionConcurrency(name) => Ok(json(StatusCode::OK, &registry()?.get_concurrency(&function_name(&name, None)?.0).await?)),
        Action::DeleteFunctionConcurrency(name) => {
            registry()?.delete_concurrency(&function_name(&name, None)?.0).await?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        Action::DeleteAlias(name, alias) => {
            registry()?.delete_alias(&function_name(&name, None)?.0, &alias).await?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        Action::ListFunctions => Ok(json(StatusCode::OK, &registry()?.list().await?)),
        Action::PutProvisionedConcurrency(name) => {
            let (function, q) = qualified(&name, &parts)?;
            Ok(json(StatusCode::ACCEPTED, &registry()?.put_provisioned(&function, &q, &body).await?))
        }
        Action::GetProvisionedConcurrency(name) => provisioned(gw, registry()?, &parts, body, &name).await,
        Action::DeleteProvisionedConcurrency(name) => {
            let (function, q) = qualified(&name, &parts)?;
            registry()?.delete_provisioned(&function, &q).await?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        Action::GetAccountSettings => account_settings(gw, registry()?, &parts, body).await,
        Action::PublishLayerVersion(l) => Ok(json(StatusCode::CREATED, &registry()?.layers.publish(&l, &body).await?)),
        Action::GetLayerVersion(l, v) => Ok(json(StatusCode::OK, &registry()?.layers.get(&l, &v).await?)),
        Action::ListLayerVersions(l) => Ok(json(StatusCode::OK, &registry()?.layers.list_versions(&l, parts.uri.query()).await?)),
        Action::ListLayers => Ok(json(StatusCode::OK, &registry()?.layers.list(parts.uri.query()).await?)),
        Action::DeleteLayerVersion(l, v) => {
            registry()?.layers.delete(&l, &v).await?;
            Ok(StatusCode::NO_CONTENT.into_response())
        }
        Action::GetFunction(name) => get_function(gw, registry()?, &parts, body, &name, true, request_id).await,
        Action::GetFunctionConfiguration(name) => get_function(gw, registry()?, &parts, body, &name, false, request_id).await,
    }
}

/// The function `name` names and its qualifier, from the name or the query.
fn qualified(name: &str, parts: &axum::http::request::Parts) -> Result<(String, Qualifier), ApiError> {
    let (function, q) = function_name(name, query_param(parts.uri.query(), "Qualifier").as_deref())?;
    Ok((function, Qualifier::parse(q.as_deref())))
}

/// GetFunction (`whole`) or GetFunctionConfiguration of `name`: an agent that has
/// deployed the function answers with its state; before any has, the registry
/// answers (State Pending).
async fn get_function(
    gw: &Gateway,
    registry: &Registry,
    parts: &axum::http::request::Parts,
    body: Bytes,
    name: &str,
    whole: bool,
    request_id: &str,
) -> Result<Response, ApiError> {
    let (function, q) = qualified(name, parts)?;
    let answered = send(gw, parts, body, &function, request_id).await?;
    if answered.status() == StatusCode::OK && whole {
        return cluster_concurrency(registry, &function, answered).await;
    }
    if answered.status() != StatusCode::NOT_FOUND {
        return Ok(answered);
    }
    let known = match q {
        Qualifier::Latest => registry.get(&function).await?,
        Qualifier::Version(n) => registry.get_version(&function, n).await?,
        // The registry answers for an alias's configuration only through an agent.
        Qualifier::Alias(_) => None,
    };
    match known {
        Some(config) if whole => Ok(json(StatusCode::OK, &serde_json::json!({"Configuration": config, "Code": {"RepositoryType": "S3"}}))),
        Some(config) => Ok(json(StatusCode::OK, &config)),
        None => Ok(answered),
    }
}

/// The answers of every agent placement may use to the same request (its signature
/// is the client's; each agent checks it), as JSON: those that answered 200.
async fn ask_every_agent(gw: &Gateway, parts: &axum::http::request::Parts, body: Bytes) -> Vec<(String, serde_json::Value)> {
    let view = gw.usable_view();
    let pq = parts.uri.path_and_query().map_or(parts.uri.path(), |p| p.as_str()).to_string();
    let asks = view.nodes().iter().map(|ad| {
        let (name, uri) = (ad.name.clone(), format!("{}{pq}", ad.endpoint.trim_end_matches('/')));
        let mut out = hyper::Request::builder().method(parts.method.clone()).uri(uri);
        for (k, v) in parts.headers.iter().filter(|(k, _)| *k != "connection" && *k != "transfer-encoding") {
            out = out.header(k, v);
        }
        let req = out.body(Full::new(body.clone()));
        async move {
            let resp = tokio::time::timeout(Duration::from_secs(5), gw.http.request(req.ok()?)).await.ok()?.ok()?;
            if resp.status() != StatusCode::OK {
                return None;
            }
            let bytes = resp.into_body().collect().await.ok()?.to_bytes();
            Some((name, serde_json::from_slice(&bytes).ok()?))
        }
    });
    futures::future::join_all(asks).await.into_iter().flatten().collect()
}

/// A version's provisioned concurrency in the cluster: the registry's count, and what
/// the agents report of their shares (allocated summed; FAILED when one failed, with
/// its reason; READY once all are allocated).
fn provisioned_status(stored: &StoredProvisioned, shares: &[&serde_json::Value]) -> serde_json::Value {
    let allocated: u64 = shares.iter().filter_map(|v| v["AllocatedProvisionedConcurrentExecutions"].as_u64()).sum();
    let failed = shares.iter().find(|v| v["Status"] == "FAILED");
    let status = match failed {
        Some(_) => "FAILED",
        None if allocated >= stored.requested => "READY",
        None => "IN_PROGRESS",
    };
    let mut v = serde_json::json!({
        "RequestedProvisionedConcurrentExecutions": stored.requested,
        "AvailableProvisionedConcurrentExecutions": allocated.min(stored.requested),
        "AllocatedProvisionedConcurrentExecutions": allocated.min(stored.requested),
        "Status": status,
        "LastModified": stored.last_modified,
    });
    if let Some(f) = failed {
        v["StatusReason"] = f["StatusReason"].clone();
    }
    v
}

/// Get (or, with `?List=ALL`, List) ProvisionedConcurrencyConfig(s): the registry's
/// settings, with the agents' allocation of their shares.
async fn provisioned(gw: &Gateway, registry: &Registry, parts: &axum::http::request::Parts, body: Bytes, name: &str) -> Result<Response, ApiError> {
    let (function, q) = qualified(name, parts)?;
    if query_param(parts.uri.query(), "List").is_some() {
        let all = registry.list_provisioned(&function).await?;
        let answers = ask_every_agent(gw, parts, body).await;
        let configs: Vec<serde_json::Value> = all
            .iter()
            .map(|(v, stored)| {
                let arn = format!("{}:{v}", registry.arn(&function));
                let shares: Vec<&serde_json::Value> = answers
                    .iter()
                    .flat_map(|(_, a)| a["ProvisionedConcurrencyConfigs"].as_array().into_iter().flatten())
                    .filter(|c| c["FunctionArn"] == arn.as_str())
                    .collect();
                let mut c = provisioned_status(stored, &shares);
                c["FunctionArn"] = serde_json::json!(arn);
                c
            })
            .collect();
        return Ok(json(StatusCode::OK, &serde_json::json!({"ProvisionedConcurrencyConfigs": configs})));
    }
    let (_, stored) = registry.get_provisioned(&function, &q).await?;
    let answers = ask_every_agent(gw, parts, body).await;
    Ok(json(StatusCode::OK, &provisioned_status(&stored, &answers.iter().map(|(_, a)| a).collect::<Vec<_>>())))
}

/// GetAccountSettings of the cluster: the agents' limits added up (concurrent
/// executions, less the registry's reserved concurrency), the registry's usage.
async fn account_settings(gw: &Gateway, registry: &Registry, parts: &axum::http::request::Parts, body: Bytes) -> Result<Response, ApiError> {
    let answers = ask_every_agent(gw, parts, body).await;
    let first = answers.first().map(|(_, a)| a.clone()).ok_or_else(|| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "ServiceException", "no node agent answered"))?;
    let concurrent: u64 = answers.iter().filter_map(|(_, a)| a["AccountLimit"]["ConcurrentExecutions"].as_u64()).sum();
    let (code_size, functions) = registry.usage().await?;
    let mut v = first;
    v["AccountLimit"]["ConcurrentExecutions"] = serde_json::json!(concurrent);
    v["AccountLimit"]["UnreservedConcurrentExecutions"] = serde_json::json!(concurrent.saturating_sub(registry.reserved_total().await?));
    v["AccountUsage"] = serde_json::json!({"TotalCodeSize": code_size, "FunctionCount": functions});
    Ok(json(StatusCode::OK, &v))
}

/// An agent's GetFunction answer `answered` with the function's reserved concurrency
/// as the registry holds it (the cluster's limit; the agent's is its share), when the
/// registry has the function.
async fn cluster_concurrency(registry: &Registry, function: &str, answered: Response) -> Result<Response, ApiError> {
    let Ok(limit) = registry.get_concurrency(function).await else { return Ok(answered) };
    let (parts, body) = answered.into_parts();
    let bytes = axum::body::to_bytes(body, MAX_BODY).await.map_err(|e| ApiError::new(StatusCode::BAD_GATEWAY, "ServiceException", format!("reading the agent's answer: {e}")))?;
    let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return Ok(Response::from_parts(parts, Body::from(bytes)));
    };
    match v.as_object_mut() {
        Some(o) if limit.get("ReservedConcurrentExecutions").is_some() => {
            o.insert("Concurrency".into(), limit);
        }
        Some(o) => {
            o.remove("Concurrency");
        }
        None => {}
    }
    let mut r = Response::from_parts(parts, Body::from(v.to_string()));
    r.headers_mut().remove(axum::http::header::CONTENT_LENGTH);
    Ok(r)
}

/// An asynchronous Invoke of `function`: queued in the store and answered 202 (the
/// event runs at least once, [`crate::events`]); forwarded to an agent when the
/// registry does not know the function (one made through an agent's own API).
async fn queue_event(
    gw: &Gateway,
    events: &Arc<Dispatcher>,
    registry: &Registry,
    parts: &axum::http::request::Parts,
    body: Bytes,
    function: &str,
    request_id: &str,
) -> Result<Response, ApiError> {
    let payload = invoke_payload(&body, "Event")?;
    match registry.get(function).await {
        Ok(Some(_)) => {}
        Ok(None) => return send(gw, parts, body, function, request_id).await,
        // The apiserver away: the data plane serves on; a function that is not there
        // after all is dropped when its event runs.
        Err(e) if e.status == StatusCode::SERVICE_UNAVAILABLE => {}
        Err(e) => return Err(e),
    }
    let path = parts.uri.path_and_query().map_or(parts.uri.path(), |p| p.as_str());
    events.accept(request_id, function, path, payload).await.map_err(|e| {
        ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "ServiceException", format!("the event could not be queued in the snapshot store: {}", error_chain(&e)))
    })?;
    let mut r = StatusCode::ACCEPTED.into_response();
    if let Ok(v) = HeaderValue::from_str(request_id) {
        r.headers_mut().insert("x-amzn-requestid", v);
    }
    Ok(r)
}

/// Runs queued events through the gateway (a weak handle: the gateway owns the queue).
struct Deliverer(std::sync::Weak<Gateway>);

impl Deliver for Deliverer {
    fn deliver<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Delivery> {
        Box::pin(async move {
            match self.0.upgrade() {
                Some(gw) => run_event(&gw, event).await,
                None => Delivery::Retry("the gateway is stopping".into()),
            }
        })
    }
}

/// Run `event` as a synchronous Invoke signed with the gateway's own key, placed and
/// forwarded as a client's would be.
async fn run_event(gw: &Gateway, event: &Event) -> Delivery {
    let (path, query) = match event.path.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (event.path.as_str(), None),
    };
    let base = [("host", "thaw-gateway"), ("x-amz-invocation-type", "RequestResponse"), ("content-type", "application/json")];
    let signed = SignedRequest { method: "POST", raw_path: path, raw_query: query, headers: base.to_vec(), body: event.payload.as_bytes() };
    let added = sign(&gw.signer, &gw.region, "lambda", &signed, SystemTime::now());
    let mut req = axum::http::Request::builder().method("POST").uri(&event.path);
    for (k, v) in base.iter().map(|(k, v)| (*k, v.to_string())).chain(added) {
        req = req.header(k, v);
    }
    let parts = match req.body(()) {
        Ok(r) => r.into_parts().0,
        Err(e) => return Delivery::Dropped(format!("its path {} is not a request: {e}", event.path)),
    };
    let resp = match send(gw, &parts, Bytes::from(event.payload.clone()), &event.function, &event.id).await {
        Ok(r) => r,
        Err(e) => return Delivery::Retry(e.to_string()),
    };
    let status = resp.status();
    let failed = resp.headers().contains_key("x-amz-function-error");
    let node = resp.headers().get("x-thaw-node").and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let body = axum::body::to_bytes(resp.into_body(), MAX_BODY).await.unwrap_or_default();
    let answer: String = String::from_utf8_lossy(&body).chars().take(256).collect();
    match status.as_u16() {
        200 if !failed => {
            tracing::debug!(event = %event.id, function = %event.function, node, answer, "event ran");
            Delivery::Done
        }
        200 => Delivery::FunctionError(format!("on {node}: {answer}")),
        404 => Delivery::Dropped(format!("{status}: {answer}")),
        429 | 500..=599 => Delivery::Retry(format!("{status} from {node}: {answer}")),
        _ => Delivery::Dropped(format!("{status} from {node}: {answer}")),
    }
}

/// A JSON answer.
fn json(status: StatusCode, v: &serde_json::Value) -> Response {
    (status, [(axum::http::header::CONTENT_TYPE, "application/json")], v.to_string()).into_response()
}

/// Place `function` and forward the request to its agent; the answer comes back
/// unchanged, plus `x-thaw-node`. An agent that refuses the connection (the request
/// never reached it) is left out and the request placed again; one that fails once it
/// has the request gives a 502 at once (it may have run: never run twice).
///
/// Reserved concurrency: each agent enforces its share of a function's limit
/// ([`crate::registry::concurrency_share`]). An Invoke that an agent refuses for its
/// share (429, `ReservedFunctionConcurrentInvocationLimitExceeded`: it did not run)
/// is tried on the next agent of the function's walk of the ring not tried yet, and
/// refused with that 429 only once every agent has refused it. Not a function URL's
/// 429, which may be the function's own answer.
async fn send(gw: &Gateway, parts: &axum::http::request::Parts, body: Bytes, function: &str, request_id: &str) -> Result<Response, ApiError> {
    let path = parts.uri.path();
    let retry_throttled = !path.starts_with(URL_PREFIX);
    let mut attempt = 0;
    // Agents that refused this request for their share of the function's reserved concurrency.
    let mut throttled_by: Vec<String> = Vec::new();
    let (rparts, bytes, _guard, ad) = loop {
        let view = gw.usable_view();
        let ad = {
            let mut in_flight = gw.in_flight.lock().unwrap_or_else(|e| e.into_inner());
            let ad = if throttled_by.is_empty() {
                let loads: Vec<u32> = view.nodes().iter().map(|n| in_flight.get(&n.name).copied().unwrap_or(0)).collect();
                let mut rng = gw.rng.lock().unwrap_or_else(|e| e.into_inner());
                // Until snapshots have store ids (#13), agents advertise them by function name.
                view.place(function, "", &loads[..], &mut rng).map(|(ad, _)| ad)
            } else {
                view.walk(function).find(|ad| !throttled_by.contains(&ad.name))
            };
            let ad = ad.ok_or_else(|| ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "ServiceException", "no node agent is available (none advertised, or all found down)"))?;
            *in_flight.entry(ad.name.clone()).or_insert(0) += 1;
            Placed { name: ad.name.clone(), endpoint: ad.endpoint.clone(), boot_id: ad.boot_id.clone() }
        };
        let (node, endpoint) = (&ad.name, &ad.endpoint);
        let guard = InFlight(gw, node.clone());
        gw.metrics.forwarded.with_label_values(&[node]).inc();
        let pq = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or(path);
        let mut out = hyper::Request::builder().method(parts.method.clone()).uri(format!("{}{pq}", endpoint.trim_end_matches('/')));
        for (k, v) in parts.headers.iter() {
            if k != "connection" && k != "transfer-encoding" {
                out = out.header(k, v);
            }
        }
        let out = out.body(Full::new(body.clone())).map_err(|e| ApiError::new(StatusCode::BAD_GATEWAY, "ServiceException", format!("building the request to {node}: {e}")))?;
        let resp = match gw.http.request(out).await {
            Ok(resp) => resp,
            Err(e) => {
                if e.is_connect() {
                    gw.mark_down(&ad);
                    // Only refused connections count: an agent's refusal for its share
                    // of a reserved concurrency (below) is not a failed placement.
                    attempt += 1;
                    if attempt < ATTEMPTS {
                        continue;
                    }
                }
                gw.metrics.agent_failures.with_label_values(&["failed"]).inc();
                return Err(ad.failed(&error_chain(&e), request_id));
            }
        };
        let (rparts, rbody) = resp.into_parts();
        let bytes = rbody.collect().await.map_err(|e| {
            gw.metrics.agent_failures.with_label_values(&["failed"]).inc();
            ad.failed(&e, request_id)
        })?.to_bytes();
        if retry_throttled && refused_for_reserved_concurrency(rparts.status, &bytes) {
            throttled_by.push(ad.name.clone());
            if view.walk(function).any(|n| !throttled_by.contains(&n.name)) {
                gw.metrics.reserved_retries.inc();
                tracing::debug!(node = %ad.name, function, "the agent's share of the reserved concurrency is taken; trying the next agent");
                continue;
            }
        }
        break (rparts, bytes, guard, ad);
    };
    let mut r = (rparts.status, bytes).into_response();
    for (k, v) in rparts.headers.iter() {
        if k != "connection" && k != "transfer-encoding" && k != "content-length" {
            r.headers_mut().append(k, v.clone());
        }
    }
    if let Ok(v) = HeaderValue::from_str(&ad.name) {
        r.headers_mut().insert("x-thaw-node", v);
    }
    Ok(r)
}

/// Whether an agent's answer is its refusal of a call for the function's reserved
/// concurrency (the call did not run there).
fn refused_for_reserved_concurrency(status: StatusCode, body: &[u8]) -> bool {
    status == StatusCode::TOO_MANY_REQUESTS
        && serde_json::from_slice::<serde_json::Value>(body).is_ok_and(|v| v["Reason"] == "ReservedFunctionConcurrentInvocationLimitExceeded")
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::chrono::{TimeDelta, Utc};

    fn ad(name: &str, boot: &str, age_s: Option<i64>) -> NodeAd {
        NodeAd {
            name: name.into(),
            endpoint: format!("http://{name}:9000"),
            boot_id: boot.into(),
            free_instances: 1,
            cached: vec![],
            cached_functions: vec![],
            warm: vec![],
            heartbeat: age_s.map(|s| Utc::now() - TimeDelta::seconds(s)),
        }
    }

    #[test]
    fn silent_and_refusing_nodes_are_left_out_but_not_when_the_apiserver_is_away() {
        let (now, wall) = (Instant::now(), Utc::now());
        let none = HashMap::new();
        let nodes = [ad("a", "1", Some(2)), ad("b", "1", Some(120)), ad("c", "1", None)];
        assert_eq!(left_out(&nodes, &none, now, wall), ["b"], "b's heartbeat is two minutes old");
        // Every heartbeat old: the apiserver is away, not the agents.
        let all_old = [ad("a", "1", Some(100)), ad("b", "1", Some(120))];
        assert!(left_out(&all_old, &none, now, wall).is_empty());
        // Refused a connection: out for DOWN_FOR under that boot; a new boot is back at once.
        let down: HashMap<_, _> = [("a".to_string(), ("1".to_string(), now))].into();
        assert_eq!(left_out(&nodes[..1], &down, now, wall), ["a"]);
        assert!(left_out(&[ad("a", "2", Some(2))], &down, now, wall).is_empty(), "restarted");
        assert!(left_out(&nodes[..1], &down, now + DOWN_FOR, wall).is_empty(), "tried again after DOWN_FOR");
    }
}
