//! Prometheus metrics of the node, served at `GET /metrics`.
//!
//! | metric | type | labels |
//! | --- | --- | --- |
//! | `thaw_invocations_total` | counter | function, outcome (ok, function_error, timeout, oom, crash, throttled) |
//! | `thaw_errors_total` | counter | function, kind |
//! | `thaw_starts_total` | counter | kind (boot, restore-lazy, restore-prefetch, restore-eager, repurposed, warm) |
//! | `thaw_resets_total` | counter | `outcome` (done / refused: in-place resets of `thaw:isolation=invocation` functions) |
//! | `thaw_pages_given_back_total` | counter | — (pages idle instances had copied from a snapshot's shared memory and held unchanged, given back: shared again; `--give-back-after`) |
//! | `thaw_restore_fallbacks_total` | counter | — (restores that failed and fell back to a cold boot) |
//! | `thaw_start_seconds` | histogram | kind (time to a ready instance; restore or boot) |
//! | `thaw_invoke_seconds` | histogram | — (engine invoke: request written to result read) |
//! | `thaw_request_seconds` | histogram | — (whole Invoke API call inside the node) |
//! | `thaw_instances_alive` | gauge | — (starting + busy + idle) |
//! | `thaw_memory_committed_bytes` | gauge | — (sum of the live instances' memory sizes, against --memory-budget-mb) |
//! | `thaw_instances_idle` | gauge | — |
//! | `thaw_snapshot_bytes` | gauge | — (bytes of active snapshots) |
//! | `thaw_events_pending` | gauge | — (queued asynchronous invocations) |
//! | `thaw_bases` | gauge | — (runtime bases on the node, layered snapshots) |
//! | `thaw_bases_bytes` | gauge | — (their stored bytes) |
//! | `thaw_shared_memory_bytes` | gauge | — (memory of the shared copies instances map, tmpfs) |
//! | `thaw_restore_sandboxes_total` | counter | outcome (prepared: taken from the sandbox pool; created: none was ready) |
//! | `thaw_sandbox_pool_ready` | gauge | — (prepared sandboxes waiting, all shapes) |
//! | `thaw_network_namespaces_total` | counter | outcome (reused: a sandbox joined one an ended sandbox left unused; created: it made its own) |
//! | `thaw_network_namespaces_checked_total` | counter | outcome (kept: an ended sandbox's showed no use; dropped: it did, or enough are kept) |
//! | `thaw_base_pool_idle` | gauge | — (clean base instances waiting to be repurposed, `--base-pool`) |
//! | `thaw_pageserver_threads` | gauge | — (the node's shared page-server threads; 0 with `THAW_PAGESERVER=thread`) |

use prometheus::{Encoder, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry, TextEncoder};

const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

pub struct Metrics {
    registry: Registry,
    pub invocations: IntCounterVec,
    pub errors: IntCounterVec,
    pub starts: IntCounterVec,
    pub resets: IntCounterVec,
    pub pages_given_back: IntCounter,
    pub restore_fallbacks: IntCounter,
    pub snapshot_builds: IntCounterVec,
    pub start_seconds: HistogramVec,
    pub invoke_seconds: HistogramVec,
    pub request_seconds: HistogramVec,
    pub instances_alive: IntGauge,
    pub memory_committed: IntGauge,
    pub instances_idle: IntGauge,
    pub snapshot_bytes: IntGauge,
    pub events_pending: IntGauge,
    pub bases: IntGauge,
    pub bases_bytes: IntGauge,
    pub shared_memory_bytes: IntGauge,
    pub restore_sandboxes: IntCounterVec,
    pub sandbox_pool_ready: IntGauge,
    pub network_namespaces: IntCounterVec,
    pub network_namespaces_checked: IntCounterVec,
    pub base_pool_idle: IntGauge,
    pub pageserver_threads: IntGauge,
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let counter = |name: &str, help: &str, labels: &[&str]| {
            let c = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
            registry.register(Box::new(c.clone())).expect("unique metric");
            c
        };
        let hist = |name: &str, help: &str, labels: &[&str]| {
            let h = HistogramVec::new(HistogramOpts::new(name, help).buckets(LATENCY_BUCKETS.to_vec()), labels).expect("valid metric");
            registry.register(Box::new(h.clone())).expect("unique metric");
            h
        };
        let gauge = |name: &str, help: &str| {
            let g = IntGauge::new(name, help).expect("valid metric");
            registry.register(Box::new(g.clone())).expect("unique metric");
            g
        };
        let pages_given_back = IntCounter::new(
            "thaw_pages_given_back_total",
            "Pages idle instances had copied from a snapshot's shared memory and held unchanged, given back (shared again)",
        )
        .expect("valid metric");
        registry.register(Box::new(pages_given_back.clone())).expect("unique metric");
        let restore_fallbacks = IntCounter::new("thaw_restore_fallbacks_total", "Restores that failed and fell back to a cold boot").expect("valid metric");
        registry.register(Box::new(restore_fallbacks.clone())).expect("unique metric");
        Metrics {
            pages_given_back,
            invocations: counter("thaw_invocations_total", "Invocations by function and outcome", &["function", "outcome"]),
            errors: counter("thaw_errors_total", "Failed invocations by function and kind", &["function", "kind"]),
            snapshot_builds: counter(
                "thaw_snapshot_builds_total",
                "Snapshots a deploy gave a revision: captured here, or adopted (published by another node of the cluster)",
                &["how"],
            ),
            starts: counter("thaw_starts_total", "How invocations got their instance: boot, restore-<paging> or warm", &["kind"]),
            resets: counter("thaw_resets_total", "In-place resets after invocations of functions tagged thaw:isolation=invocation: done, or refused (instance discarded)", &["outcome"]),
            restore_fallbacks,
            start_seconds: hist("thaw_start_seconds", "Time to a ready instance (restore or boot)", &["kind"]),
            invoke_seconds: hist("thaw_invoke_seconds", "Engine invoke time (request sent to result received)", &[]),
            request_seconds: hist("thaw_request_seconds", "Invoke API call time inside the node", &[]),
            instances_alive: gauge("thaw_instances_alive", "Instances alive (starting, busy or idle)"),
            memory_committed: gauge("thaw_memory_committed_bytes", "Sum of the memory sizes of the live instances"),
            instances_idle: gauge("thaw_instances_idle", "Idle warm instances"),
            snapshot_bytes: gauge("thaw_snapshot_bytes", "Bytes of the snapshots functions are served from"),
            events_pending: gauge("thaw_events_pending", "Queued asynchronous invocations"),
            bases: gauge("thaw_bases", "Runtime bases on the node (layered snapshots)"),
            bases_bytes: gauge("thaw_bases_bytes", "Stored bytes of the runtime bases"),
            shared_memory_bytes: gauge("thaw_shared_memory_bytes", "Memory of the shared copies of snapshots that instances map (tmpfs)"),
            restore_sandboxes: counter(
                "thaw_restore_sandboxes_total",
                "Sandboxes of restores: prepared (from the sandbox pool) or created (none was ready)",
                &["outcome"],
            ),
            sandbox_pool_ready: gauge("thaw_sandbox_pool_ready", "Prepared sandboxes waiting in the pool"),
            network_namespaces: counter(
                "thaw_network_namespaces_total",
                "Network namespaces of new sandboxes: reused (one an ended sandbox left showing no use) or created",
                &["outcome"],
            ),
            network_namespaces_checked: counter(
                "thaw_network_namespaces_checked_total",
                "Network namespaces of ended sandboxes: kept (no use shows) or dropped",
                &["outcome"],
            ),
            base_pool_idle: gauge("thaw_base_pool_idle", "Clean base instances waiting to be repurposed (--base-pool)"),
            pageserver_threads: gauge("thaw_pageserver_threads", "Shared page-server threads serving every restored instance's faults"),
            registry,
        }
    }

    /// Bring the network-namespace counters up to the sandbox crate's (process-wide,
    /// cumulative) counts.
    pub fn set_network_namespaces(&self, s: &thaw_sandbox::NetnsStats) {
        let up_to = |c: IntCounter, n: u64| c.inc_by(n.saturating_sub(c.get()));
        up_to(self.network_namespaces.with_label_values(&["reused"]), s.reused);
        up_to(self.network_namespaces.with_label_values(&["created"]), s.created);
        up_to(self.network_namespaces_checked.with_label_values(&["kept"]), s.kept);
        up_to(self.network_namespaces_checked.with_label_values(&["dropped"]), s.dropped);
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        text(&self.registry)
    }
}

/// `registry`'s metrics in the text exposition format (the node's and the gateway's).
pub fn text(registry: &Registry) -> String {
    let mut buf = Vec::new();
    TextEncoder::new().encode(&registry.gather(), &mut buf).expect("encoding to a Vec cannot fail");
    String::from_utf8(buf).expect("prometheus text is UTF-8")
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}
