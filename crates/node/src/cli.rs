//! `thaw serve` and `thaw status`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use thaw_engine::pageserver::Paging;
use tracing::{info, warn};

use crate::api::{self, App};
use crate::keys::{self, KeySource};
use crate::node::{Node, NodeConfig, SnapshotStore};
use crate::sigv4::Verifier;

/// A clap value parser of seconds (fractions allowed), e.g. `--event-retry-delay 0.5`.
pub fn parse_secs(s: &str) -> Result<Duration, String> {
    let v: f64 = s.parse().map_err(|_| format!("expected seconds, got '{s}'"))?;
    if !(v.is_finite() && v >= 0.0) {
        return Err(format!("expected a non-negative number of seconds, got '{s}'"));
    }
    Ok(Duration::from_secs_f64(v))
}

/// Options of `thaw serve`.
#[derive(Args, Debug, Clone)]
pub struct ServeArgs {
    /// Address of the HTTP API (Lambda API under /2015-03-31/functions, plus /metrics and /thaw/status).
    #[arg(long, default_value = "127.0.0.1:9000")]
    pub listen: String,
    /// Access key id clients sign requests with (AWS Signature V4). With --secret-access-key;
    /// if neither is given, a key pair is generated on first start and kept in <data-dir>/node/credentials.
    #[arg(long, env = "THAW_ACCESS_KEY_ID")]
    pub access_key_id: Option<String>,
    /// Secret access key matching --access-key-id.
    #[arg(long, env = "THAW_SECRET_ACCESS_KEY", hide_env_values = true)]
    pub secret_access_key: Option<String>,
    /// Seconds an idle warm instance is kept before it is destroyed (scale to zero).
    #[arg(long, default_value = "60", value_parser = parse_secs)]
    pub keep_alive: Duration,
    /// Seconds an instance stays idle before the node gives back the pages it copied
    /// from its snapshot's shared memory and holds unchanged (layered snapshots): they
    /// are shared with the function's other instances again, and the instance holds
    /// only what its calls really changed (about a third of a full image's private
    /// memory for Python helloworld, against 60% without). Costs a few milliseconds of
    /// node CPU once per idle period and, at the next call, a copy of each page it
    /// writes again (helloworld's warm call: 0.35-0.55 ms instead of 0.05-0.08), so
    /// a function called more often than this never pays it. 0: never.
    #[arg(long, default_value = "10", value_parser = parse_secs)]
    pub give_back_after: Duration,
    /// Most instances one function may have at once; invocations beyond get TooManyRequestsException.
    #[arg(long, default_value_t = 8)]
    pub max_instances_per_function: usize,
    /// Most instances on this node at once (idle instances of other functions are evicted first).
    #[arg(long, default_value_t = 32)]
    pub max_instances: usize,
    /// Memory budget of the node in MiB: the memory sizes (MemorySize) of all live instances
    /// together may not exceed it; idle instances of other functions are evicted to make room,
    /// then invocations get TooManyRequestsException. Default: MemTotal less 10% (at least 512).
    #[arg(long)]
    pub memory_budget_mb: Option<u64>,
    /// Long-lived threads that restore, boot and kill instances (restores run in parallel up to this).
    #[arg(long, default_value_t = 4)]
    pub workers: usize,
    /// Threads that build snapshots for new code (boot + capture) in parallel.
    #[arg(long, default_value_t = 2)]
    pub build_workers: usize,
    /// How restored instances get their memory (an engine paging mode). auto (default): REAP —
    /// the first restore of a snapshot records its working set, later ones prefetch it with one
    /// read; lazy = each page read on first touch; eager = all pages installed before resuming;
    /// also record, prefetch, ws-cached, parallel.
    #[arg(long, default_value = "auto")]
    pub paging: Paging,
    /// Region of function ARNs, of context.invoked_function_arn and of AWS_REGION in functions
    /// (baked into a snapshot at deploy); signatures for any region are accepted.
    #[arg(long, default_value = "us-east-1")]
    pub region: String,
    /// Seconds before the first retry of a failed asynchronous invocation; later retries double it.
    #[arg(long, default_value = "60", value_parser = parse_secs)]
    pub event_retry_delay: Duration,
    /// Retries of a failed asynchronous invocation before it is dropped (Lambda: 2).
    #[arg(long, default_value_t = 2)]
    pub event_max_retries: u32,
    /// Asynchronous invocations run at the same time.
    #[arg(long, default_value_t = 4)]
    pub event_concurrency: usize,
    /// On SIGINT/SIGTERM, seconds to wait for in-flight invocations before stopping anyway.
    #[arg(long, default_value = "30", value_parser = parse_secs)]
    pub drain_timeout: Duration,
    /// Serve /metrics to any peer. By default it (like /thaw/status) is served to loopback
    /// clients only: it names every function on the node.
    #[arg(long)]
    pub metrics_public: bool,
    /// Run as a cluster agent (the DaemonSet, deploy/): publish this node's ThawNode — its
    /// endpoint, free slots and memory, cached snapshots, idle warm instances — to the
    /// Kubernetes API before taking work, and keep it current (on change, at most once a
    /// second, and every 10 s). Credentials: --kubeconfig, else the pod's service account.
    #[arg(long)]
    pub cluster: bool,
    /// With --cluster: the Kubernetes Node this agent runs on (the ThawNode's name; the
    /// DaemonSet sets THAW_NODE_NAME from the pod's spec.nodeName).
    #[arg(long, env = "THAW_NODE_NAME")]
    pub node_name: Option<String>,
    /// With --cluster: where gateways reach this agent. Default: http://<the address --listen bound>.
    #[arg(long, env = "THAW_AGENT_ENDPOINT")]
    pub agent_endpoint: Option<String>,
    /// With --cluster: the kubeconfig to publish with (default: the pod's service account,
    /// else $KUBECONFIG or ~/.kube/config).
    #[arg(long)]
    pub kubeconfig: Option<std::path::PathBuf>,
    /// Let idle instances run between invocations. By default an idle instance is frozen
    /// (cgroup freezer, as Lambda does): its background threads and child processes use no
    /// CPU until the next invocation thaws it.
    #[arg(long)]
    pub no_freeze_idle: bool,
    /// Where the instances of a layered snapshot map their memory from: `snapshot`, a
    /// file per snapshot (a function's instances share its diff's and its base's pages;
    /// each function's file holds the base's pages again), or `base`, one file per
    /// runtime base for all functions on it (the base counted once; a diff's own pages
    /// are copied into each instance). Measured (Python, one call each, given back):
    /// two functions with one instance each 1702 vs 1052 KB per instance (full images
    /// 1336); four instances each 743 vs 807. Many functions with few instances each:
    /// `base`. `auto` (the default): a function's first two instances map the base's
    /// file, later ones the snapshot's.
    #[arg(long, default_value = "auto", value_parser = ["snapshot", "base", "auto"])]
    pub shared_memory_file: String,
    /// Keep snapshots and stored environment values in clear. By default the node seals
    /// them at rest (AES-256-GCM) with its node key: THAW_NODE_KEY, --key-file, or
    /// DATA_DIR/node.key, created (mode 0600) on first start.
    #[arg(long)]
    pub no_encryption: bool,
    /// CPU the page server may spend serving one instance's page faults, as a share of the
    /// instance's CPU limit averaged over a second; 0 = unbounded. Faults beyond it wait.
    #[arg(long, default_value_t = thaw_engine::pageserver::DEFAULT_FAULT_CPU_SHARE, value_parser = parse_share)]
    pub fault_cpu_share: f64,
    /// Sandboxes kept prepared per sandbox shape (memory size, CPU, runtime): namespaces,
    /// cgroup and root filesystem built ahead, so a cold start only attaches the function's
    /// code (saves most of the sandbox's few milliseconds). A shape is kept from the deploy or
    /// restore that first needs it until unused for 10 minutes; each prepared sandbox holds a small idle process.
    /// 0: every restore creates its own sandbox.
    #[arg(long, default_value_t = 2)]
    pub sandbox_pool: usize,
    /// Publish every snapshot this node builds to an S3-compatible store, s3://BUCKET/PREFIX,
    /// and keep only a bounded cache of them here (DATA_DIR/node/snapshot-cache,
    /// --cache-max-bytes); a snapshot not in the cache is fetched back on its next start.
    /// Store credentials come from AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (/ AWS_SESSION_TOKEN).
    #[arg(long, env = "THAW_SNAPSHOT_STORE")]
    pub snapshot_store: Option<String>,
    /// S3 endpoint of --snapshot-store, e.g. http://127.0.0.1:9000 for MinIO (default: AWS).
    #[arg(long, env = "AWS_ENDPOINT_URL")]
    pub store_endpoint_url: Option<String>,
    /// Region of --snapshot-store (default: AWS_REGION, else us-east-1).
    #[arg(long)]
    pub store_region: Option<String>,
    /// Seconds after which a request to the store gives up: a start that misses the cache
    /// while the store is down falls back to a cold boot within about this long.
    #[arg(long, default_value = "10", value_parser = parse_secs)]
    pub store_timeout: Duration,
    /// Byte bound of the snapshot cache with --snapshot-store (least recently used
    /// snapshots not in use are evicted; one larger than the cache is served uncached).
    #[arg(long, default_value_t = 10 << 30)]
    pub cache_max_bytes: u64,
    /// Create the --snapshot-store bucket at start if it is missing (test and demo servers).
    #[arg(long)]
    pub create_bucket: bool,
    /// Seconds between runs of the --snapshot-store collector, which deletes chunks no
    /// stored snapshot references (after deleted functions and replaced code); 0 = never
    /// (`thaw snapshot gc` by hand). Several nodes may collect one store.
    #[arg(long, default_value = "3600", value_parser = parse_secs)]
    pub store_gc_interval: Duration,
    /// An unreferenced chunk is deleted only by a collection at least this many seconds
    /// after the one that found it (publishes in flight must finish within it).
    #[arg(long, default_value = "3600", value_parser = parse_secs)]
    pub store_gc_grace: Duration,
    /// Capture every snapshot as a full image. By default a function of a runtime that
    /// can be layered (Python, Node.js, Java) is captured as a small diff on its runtime's base
    /// (DATA_DIR/bases), which the node builds on the first deploy that needs it (one
    /// build at a time, a second or so); instances of one runtime then share the base's
    /// memory. A base that cannot be built is logged with why, and the function gets a
    /// full image. With --snapshot-store a diff is published with its base, stored once
    /// for all the diffs on it.
    #[arg(long)]
    pub no_bases: bool,
    /// The default (kept so that older scripts still start): bases are built on demand.
    #[arg(long, hide = true, conflicts_with = "no_bases")]
    pub build_bases: bool,
    /// Keep up to N clean, frozen instances of each runtime base (Python, Node.js) to
    /// serve cold starts by loading the function into one (repurposing): its code
    /// replaces /var/task and its init runs there, with no sandbox built and no process
    /// restored (~2 ms for a small function). A heavy import makes a load slower than a
    /// restore: each function's cold starts then go the way measured cheaper (the pool
    /// first, then one restore, then the cheaper). Instances that came from a base go back to the pool, reset, when the
    /// keep-alive expires. Not for functions with layers or per-invocation isolation.
    /// Pooled instances count against --max-instances and --memory-budget-mb. 0: off.
    #[arg(long, default_value_t = 0, conflicts_with = "no_bases")]
    pub base_pool: usize,
}

/// A share between 0 and 1 (NaN and infinities refused).
pub fn parse_share(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if (0.0..=1.0).contains(&v) => Ok(v),
        Ok(_) => Err(format!("expected a share between 0 and 1, got '{s}'")),
        Err(e) => Err(format!("expected a number between 0 and 1, got '{s}': {e}")),
    }
}

/// Options of `thaw status`.
#[derive(Args, Debug, Clone)]
pub struct StatusArgs {
    /// Address of the node's HTTP API.
    #[arg(long, default_value = "127.0.0.1:9000")]
    pub endpoint: String,
    /// Print the raw JSON document instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// A future that runs beside the node, boxed.
pub type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

/// Something started beside the node once it listens (`thaw serve --cluster`: the
/// cluster agent). Called with the node, the bound address and a receiver that turns
/// true at shutdown; its future is awaited *before* the node takes work (an agent
/// publishes its new boot first), and resolves to what then runs until shutdown.
pub type Beside = Box<dyn FnOnce(Arc<Node>, SocketAddr, tokio::sync::watch::Receiver<bool>) -> BoxFuture<Result<BoxFuture<()>>> + Send>;

pub fn serve(args: ServeArgs, data_dir: &Path) -> Result<()> {
    serve_with(args, data_dir, None)
}

/// [`serve`], with `beside` started once the node listens.
pub fn serve_with(args: ServeArgs, data_dir: &Path, beside: Option<Beside>) -> Result<()> {
    if args.cluster && beside.is_none() {
        bail!("--cluster: this build has no cluster agent to run beside the node");
    }
    let state_dir = data_dir.join("node");
    std::fs::create_dir_all(&state_dir).with_context(|| format!("creating the node directory {}", state_dir.display()))?;
    let runtime_dir = thaw_runtime::runtimes::install_shims(data_dir).context("installing the runtime shims")?;
    let (creds, source) = keys::load_or_create(&state_dir, args.access_key_id.as_deref(), args.secret_access_key.as_deref())?;
    if source == KeySource::Generated {
        println!(
            "Generated an access key for this node (stored in {}, mode 0600):\n  AWS_ACCESS_KEY_ID={}\n  AWS_SECRET_ACCESS_KEY={}",
            state_dir.join("credentials").display(),
            creds.access_key_id,
            creds.secret_access_key
        );
    }
    let listen: SocketAddr = args.listen.parse().with_context(|| format!("--listen {}: expected HOST:PORT", args.listen))?;
    if args.max_instances == 0 || args.max_instances_per_function == 0 {
        bail!("--max-instances and --max-instances-per-function must be at least 1");
    }
    let snapshot_store = open_snapshot_store(&args, &state_dir)?;
    let bases = (!args.no_bases).then(|| crate::node::layered::Bases { dir: data_dir.join("bases") });
    let cfg = NodeConfig {
        bases,
        base_pool: args.base_pool,
        snapshot_store: snapshot_store.clone(),
        state_dir,
        runtime_dir,
        region: args.region.clone(),
        account: crate::node::ACCOUNT.into(),
        keep_alive: args.keep_alive,
        max_per_function: args.max_instances_per_function,
        max_instances: args.max_instances,
        memory_budget_mb: match args.memory_budget_mb {
            Some(mb) => mb,
            None => crate::admission::default_budget_mb().context("reading MemTotal from /proc/meminfo for the default --memory-budget-mb")?,
        },
        instance_workers: args.workers.max(1),
        build_workers: args.build_workers.max(1),
        paging: args.paging,
        event_retry_delay: args.event_retry_delay,
        event_max_retries: args.event_max_retries,
        event_concurrency: args.event_concurrency.max(1),
        freeze_idle: !args.no_freeze_idle,
        give_back_after: (!args.give_back_after.is_zero()).then_some(args.give_back_after),
        shared_memory_auto: args.shared_memory_file == "auto",
        fault_cpu_share: args.fault_cpu_share,
        sandbox_pool: match args.sandbox_pool {
            0 => None,
            n => Some(Arc::new(thaw_sandbox::SandboxPool::new(n).context("starting the sandbox pool thread")?)),
        },
    };
    thaw_engine::sharedmem::use_base_files(args.shared_memory_file == "base");
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().thread_name("thaw-node").build().context("starting the async runtime")?;
    if let Some(store) = snapshot_store.clone().filter(|_| !args.store_gc_interval.is_zero()) {
        let (interval, grace) = (args.store_gc_interval, args.store_gc_grace);
        rt.spawn(async move {
            loop {
                tokio::time::sleep(interval).await;
                let s = store.clone();
                let _ = tokio::task::spawn_blocking(move || s.collect(grace)).await;
            }
        });
    }
    let pool = cfg.sandbox_pool.clone();
    let result = rt.block_on(run(cfg, listen, creds, args.drain_timeout, args.metrics_public, beside));
    // The instances are gone: remove the sandboxes still prepared.
    if let Some(p) = pool {
        p.shutdown();
    }
    // The store owns a runtime of its own, which may not be dropped inside the node's:
    // the node's runtime goes first, so the last reference is this one.
    drop(rt);
    drop(snapshot_store);
    result
}

/// `--snapshot-store`: the store and this node's cache of it (no request is made: a
/// store that is down at start does not stop the node).
fn open_snapshot_store(args: &ServeArgs, state_dir: &Path) -> Result<Option<Arc<SnapshotStore>>> {
    let Some(url) = &args.snapshot_store else { return Ok(None) };
    let url = thaw_store::StoreUrl::parse(url).context("--snapshot-store")?;
    let cfg = thaw_store::StoreConfig {
        endpoint: args.store_endpoint_url.clone(),
        region: args.store_region.clone(),
        timeout: Some(args.store_timeout.max(Duration::from_secs(1))),
        ..Default::default()
    };
    let cache_dir = state_dir.join("snapshot-cache");
    let store = SnapshotStore::open(&url, &cfg, &cache_dir, args.cache_max_bytes)
        .with_context(|| format!("opening the snapshot store {url} (cache {})", cache_dir.display()))?;
    if args.create_bucket {
        // The store may be down now; the node starts anyway (misses boot cold meanwhile).
        if let Err(e) = store.ensure_bucket() {
            warn!(store = %url, error = %crate::node::error_chain(&e), "cannot create the bucket (is the store up?); continuing");
        }
    }
    info!(store = %url, cache = %cache_dir.display(), cache_max_bytes = args.cache_max_bytes, "snapshot store");
    Ok(Some(Arc::new(store)))
}

async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
    }
}

async fn run(cfg: NodeConfig, listen: SocketAddr, creds: crate::sigv4::Credentials, drain: Duration, metrics_public: bool, beside: Option<Beside>) -> Result<()> {
    let keep_alive = cfg.keep_alive;
    let node = Node::start(cfg).context("starting the node")?;
    let app = Arc::new(App::new(node.clone(), Verifier::new("lambda", vec![creds]), metrics_public));
    let listener = tokio::net::TcpListener::bind(listen).await.with_context(|| format!("listening on {listen}"))?;
    let local = listener.local_addr().context("reading the listening address")?;
    info!(%local, "thaw node listening");
    eprintln!("thaw: node listening on http://{local} (data in {})", node.cfg.state_dir.display());

    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    // Connections wait in the listen backlog until what runs beside is ready.
    let beside = match beside {
        Some(start) => Some(tokio::spawn(start(node.clone(), local, stop_rx.clone()).await?)),
        None => None,
    };
    let events = tokio::spawn(crate::events::run(node.clone(), stop_rx.clone()));
    let reaper = {
        let node = node.clone();
        let mut stop = stop_rx.clone();
        let tick = (keep_alive / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = tokio::time::sleep(tick) => {
                        node.reap_idle();
                        node.provision();
                    }
                    _ = stop.changed() => break,
                }
            }
        })
    };

    let (sig_tx, sig_rx) = tokio::sync::oneshot::channel::<()>();
    let server = axum::serve(listener, api::router(app).into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(async move {
            let _ = sig_rx.await;
        });
    let mut server = tokio::spawn(async move { server.await });
    tokio::select! {
        _ = shutdown_signal() => {}
        r = &mut server => {
            r.context("the HTTP server task")?.context("serving HTTP")?;
            bail!("the HTTP server stopped unexpectedly");
        }
    }
    eprintln!("thaw: shutting down: draining in-flight invocations");
    info!("shutdown requested; draining");
    let _ = sig_tx.send(());
    let _ = stop_tx.send(true);
    let drained = tokio::time::timeout(drain, async {
        let _ = (&mut server).await;
        let _ = events.await;
    })
    .await;
    if drained.is_err() {
        warn!(timeout_s = drain.as_secs_f64(), "in-flight requests did not finish in time; stopping anyway");
    }
    let _ = reaper.await;
    if let Some(b) = beside {
        let _ = b.await;
    }
    node.begin_shutdown();
    let n = node.clone();
    tokio::task::spawn_blocking(move || n.finish_shutdown()).await.context("stopping the worker threads")?;
    info!(instances_alive = node.instances_alive(), "node stopped");
    eprintln!("thaw: node stopped");
    Ok(())
}

/// GET a path from the node with a plain HTTP/1.1 request.
fn http_get(endpoint: &str, path: &str) -> Result<(u16, String)> {
    let mut s = TcpStream::connect(endpoint).with_context(|| format!("connecting to the node at {endpoint}"))?;
    s.set_read_timeout(Some(Duration::from_secs(10))).context("setting a read timeout")?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {endpoint}\r\nConnection: close\r\n\r\n").context("sending the request")?;
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).context("reading the response")?;
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").context("malformed HTTP response")?;
    let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).context("malformed HTTP status line")?;
    Ok((code, body.to_string()))
}

pub fn status(args: StatusArgs, _data_dir: &Path) -> Result<()> {
    let (code, body) = http_get(&args.endpoint, "/thaw/status")?;
    if code != 200 {
        bail!("the node answered {code}: {body}");
    }
    if args.json {
        println!("{body}");
        return Ok(());
    }
    let v: serde_json::Value = serde_json::from_str(&body).context("parsing the status document")?;
    let n = &v["node"];
    println!(
        "node pid {}  up {:.0}s  instances {}/{}  (per function {})  memory {}/{} MB  keep-alive {}s  give-back {}  paging {}  builds running {}  events pending {}",
        n["pid"], n["uptime_s"].as_f64().unwrap_or(0.0), n["instances_alive"], n["max_instances"], n["max_per_function"],
        n["memory_committed_mb"], n["memory_budget_mb"],
        n["keep_alive_s"], n["give_back_after_s"].as_f64().map_or("off".to_string(), |s| format!("after {s}s idle")),
        n["paging"].as_str().unwrap_or("?"), n["builds_running"], v["events"]["pending"]
    );
    println!("state: {}", n["state_dir"].as_str().unwrap_or("?"));
    if let Some(st) = v["snapshot_store"].as_object() {
        let c = &st["cache"];
        println!(
            "snapshot store: {}  published {} (failed {})  fetched {} ({:.1} MiB, failed {})  cache {:.1}/{:.1} MiB, {} entries, {} pinned, {} hits, {} evictions",
            st["url"].as_str().unwrap_or("?"), st["published"], st["publish_failures"], st["fetches"],
            st["bytes_fetched"].as_f64().unwrap_or(0.0) / 1048576.0, st["fetch_failures"],
            c["used_bytes"].as_f64().unwrap_or(0.0) / 1048576.0, c["max_bytes"].as_f64().unwrap_or(0.0) / 1048576.0,
            c["entries"], c["pinned"], c["hits"], c["evictions"]
        );
    }
    if v["bases"].is_object() {
        let b = &v["bases"];
        let list = b["bases"].as_array().cloned().unwrap_or_default();
        let names: Vec<String> = list.iter().map(|x| format!("{} {} MB ({:.1} MiB)", x["runtime"].as_str().unwrap_or("?"), x["memory_mb"], x["bytes"].as_f64().unwrap_or(0.0) / 1048576.0)).collect();
        println!("bases: {} ({:.1} MiB){}  (built on demand; --no-bases for full images)", list.len(), b["bytes"].as_f64().unwrap_or(0.0) / 1048576.0,
            if names.is_empty() { String::new() } else { format!(": {}", names.join(", ")) });
    }
    if v["base_pool"].is_object() {
        let p = &v["base_pool"];
        println!(
            "base pool: {} idle (at most {} per base); {} restored for it, {} came back reset, {} resets refused",
            p["idle"], p["max_per_base"], p["restored"], p["returned"], p["resets_refused"]
        );
    }
    if let Some(p) = v["sandbox_pool"].as_object() {
        println!(
            "sandbox pool: {} ready ({} shapes); {} starts took one, {} made their own; {} prepared, {} failed",
            p["ready"], p["shapes"], p["hits"], p["misses"], p["prepared"], p["failures"]
        );
    }
    let ns = &v["network_namespaces"];
    if ns.is_object() {
        println!(
            "network namespaces: {} sandboxes joined one used before, {} made their own; of ended sandboxes' {} kept, {} dropped (used); {} ready",
            ns["reused"], ns["created"], ns["kept"], ns["dropped"], ns["ready"]
        );
    }
    let funcs = v["functions"].as_array().cloned().unwrap_or_default();
    if funcs.is_empty() {
        println!("no functions");
        return Ok(());
    }
    println!(
        "\n{:<24} {:<8} {:<11} {:>4} {:>4} {:>4} {:>8} {:>7} {:>6} {:>6}  SNAPSHOT",
        "FUNCTION", "STATE", "UPDATE", "LIVE", "BUSY", "IDLE", "INVOKES", "ERRORS", "WARM", "COLD"
    );
    for f in funcs {
        let snap = match f["snapshot"].as_object() {
            Some(s) => format!(
                "rev {} {:.1} MiB{}{}",
                s["revision"],
                s["bytes"].as_f64().unwrap_or(0.0) / 1048576.0,
                if s["loaded"].as_bool() == Some(true) { " (open)" } else { "" },
                if s["stored"].is_string() { " stored" } else { "" }
            ),
            None => "-".into(),
        };
        let c = &f["counters"];
        println!(
            "{:<24} {:<8} {:<11} {:>4} {:>4} {:>4} {:>8} {:>7} {:>6} {:>6}  {snap}",
            f["name"].as_str().unwrap_or("?"),
            f["state"].as_str().unwrap_or("?"),
            f["last_update_status"].as_str().unwrap_or("?"),
            f["instances"]["live"], f["instances"]["busy"], f["instances"]["idle"],
            c["invocations"], c["errors"], c["starts_warm"], c["starts_cold"]
        );
        if let Some(r) = f["state_reason"].as_str().filter(|_| f["state"] == "Failed") {
            println!("    reason: {r}");
        }
    }
    Ok(())
}
