//! The gateway's Prometheus metrics (`GET /metrics` on a gateway; loopback peers only
//! unless `--metrics-public`, as on the agents). Labels name operations, status codes
//! and agents, never functions (their names are the users', and unbounded).

use prometheus::{HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge, Opts, Registry};

pub struct GatewayMetrics {
    registry: Registry,
    /// Requests answered, by Lambda operation and status code.
    pub requests: IntCounterVec,
    /// Time from a request's arrival to its answer, by operation.
    pub request_seconds: HistogramVec,
    /// Requests forwarded, by agent.
    pub forwarded: IntCounterVec,
    /// Agents that failed a forwarded request: `refused` (never got it; placed again)
    /// or `failed` (had it: a 502).
    pub agent_failures: IntCounterVec,
    /// Invokes an agent refused for its share of a reserved concurrency, tried on the next.
    pub reserved_retries: IntCounter,
    /// Agents advertised, and those placement leaves out (down or silent).
    pub agents: IntGauge,
    pub agents_left_out: IntGauge,
}

impl GatewayMetrics {
    #[allow(clippy::new_without_default)]
    pub fn new() -> GatewayMetrics {
        let registry = Registry::new();
        let request_seconds = HistogramVec::new(
            HistogramOpts::new("thaw_gateway_request_seconds", "Time from a request's arrival at the gateway to its answer")
                .buckets(vec![0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0]),
            &["operation"],
        );
        let counter = |name: &str, help: &str, labels: &[&str]| registered(&registry, IntCounterVec::new(Opts::new(name, help), labels));
        let gauge = |name: &str, help: &str| registered(&registry, IntGauge::new(name, help));
        GatewayMetrics {
            requests: counter("thaw_gateway_requests_total", "Requests answered by the gateway, by Lambda operation and status code", &["operation", "code"]),
            request_seconds: registered(&registry, request_seconds),
            forwarded: counter("thaw_gateway_forwarded_total", "Requests forwarded to an agent, by agent", &["node"]),
            agent_failures: counter("thaw_gateway_agent_failures_total", "Forwarded requests an agent refused (never got it, placed again) or failed (a 502)", &["kind"]),
            reserved_retries: registered(
                &registry,
                IntCounter::new("thaw_gateway_reserved_concurrency_retries_total", "Invokes an agent refused for its share of a reserved concurrency, tried on the next agent"),
            ),
            agents: gauge("thaw_gateway_agents", "Agents advertised (ThawNodes)"),
            agents_left_out: gauge("thaw_gateway_agents_left_out", "Agents placement leaves out (found down, or silent)"),
            registry,
        }
    }

    /// The text exposition format.
    pub fn render(&self) -> String {
        thaw_node::metrics::text(&self.registry)
    }
}

/// `metric`, made (names and labels are constants: valid) and registered in `registry`.
fn registered<C: prometheus::core::Collector + Clone + 'static>(registry: &Registry, metric: prometheus::Result<C>) -> C {
    let metric = metric.expect("valid metric");
    registry.register(Box::new(metric.clone())).expect("unique metric");
    metric
}

/// A request's operation for the labels: the Lambda action's name without its
/// arguments (`Invoke`, `CreateFunction`...), `Unknown` when it names none.
pub fn operation(action: Option<&thaw_node::api::Action>) -> String {
    match action {
        Some(a) => format!("{a:?}").split(['(', ' ', '{']).next().unwrap_or("Unknown").to_string(),
        None => "Unknown".into(),
    }
}
