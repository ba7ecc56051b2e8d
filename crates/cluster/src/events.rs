//! Asynchronous invocations through the gateways (issue #29): each event runs at least
//! once, whichever agent or gateway dies.
//!
//! An Invoke with `X-Amz-Invocation-Type: Event` at a gateway with a registry is
//! written to the store's queue ([`thaw_store::events`]) before the caller gets its
//! 202; that write is the commit point. The gateway that took the event then runs it
//! as a synchronous Invoke, placed like any other call (warm instances, cached
//! snapshots) and signed with the gateway's own key, and removes it from the queue
//! once the function has answered. What happens after a run, as on one node
//! (`thaw_node::events`):
//!
//! - the function answered: done, removed;
//! - the function failed: retried after `--event-retry-delay`, doubling, up to
//!   `--event-max-retries` retries (Lambda: 2), then dropped with a warning;
//! - the cluster failed (no agent, an agent that died while running it, throttled): not
//!   an attempt; tried again after a short back-off (0.5 s doubling up to 30 s) until
//!   the event is `--event-max-age` old (Lambda: 6 hours), then dropped with a warning;
//! - it can never run (the function was deleted, the payload refused): dropped with a
//!   warning.
//!
//! While a gateway holds an event (running it, or waiting to retry it) it renews the
//! event's lease every third of `--event-lease`. Every gateway sweeps the queue as often:
//! an event whose lease has run out belongs to a gateway that died (or lost the store
//! that long), and the first gateway to write the record over the version it read takes
//! it over (S3 conditional writes: the others learn they lost). So an event is lost only
//! with the store itself, and runs twice only when a run was cut off before its removal.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::Args;
use futures::future::BoxFuture;
use thaw_node::events::backoff;
use thaw_node::node::error_chain;
use thaw_store::events::{Event, EventQueue, Held};
use thaw_store::StoreError;
use tokio::sync::Semaphore;

/// Options of the gateway's asynchronous invocations.
#[derive(Args, Debug, Clone)]
pub struct EventArgs {
    /// Seconds a gateway holds an event it does not renew (at least 1); a dead gateway's
    /// events are taken over by another after this long.
    #[arg(long, default_value = "60", value_parser = thaw_node::cli::parse_secs)]
    pub event_lease: Duration,
    /// Seconds before the first retry of an event whose function failed; later retries double it.
    #[arg(long, default_value = "60", value_parser = thaw_node::cli::parse_secs)]
    pub event_retry_delay: Duration,
    /// Retries of an event whose function failed before it is dropped (Lambda: 2).
    #[arg(long, default_value_t = 2)]
    pub event_max_retries: u32,
    /// Seconds an event may wait for the cluster (no agent, agents failing) before it is
    /// dropped (Lambda's maximum event age: 6 hours).
    #[arg(long, default_value = "21600", value_parser = thaw_node::cli::parse_secs)]
    pub event_max_age: Duration,
    /// Events this gateway runs at the same time (others wait their turn, leased).
    #[arg(long, default_value_t = 32)]
    pub event_concurrency: usize,
}

/// How one run of an event ended.
#[derive(Debug)]
pub enum Delivery {
    /// The function answered.
    Done,
    /// The function ran and failed (an attempt).
    FunctionError(String),
    /// The cluster could not run it now (not an attempt).
    Retry(String),
    /// It can never run.
    Dropped(String),
}

/// Runs an event as a synchronous Invoke somewhere in the cluster (the gateway).
pub trait Deliver: Send + Sync + 'static {
    fn deliver<'a>(&'a self, event: &'a Event) -> BoxFuture<'a, Delivery>;
}

/// Back-off of a run the cluster could not do: 0.5 s doubling, at most 30 s.
const CLUSTER_BACKOFF: Duration = Duration::from_millis(500);
const CLUSTER_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// The gateway's side of the queue.
pub struct Dispatcher {
    queue: EventQueue,
    /// This gateway process, as leases name it.
    me: String,
    cfg: EventArgs,
    deliver: Arc<dyn Deliver>,
    /// The events this gateway holds.
    held: Mutex<HashSet<String>>,
    runs: Arc<Semaphore>,
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

impl Dispatcher {
    pub fn new(queue: EventQueue, mut cfg: EventArgs, deliver: Arc<dyn Deliver>) -> Arc<Dispatcher> {
        // Renewed every third of it: shorter than a second would be a busy loop on the store.
        cfg.event_lease = cfg.event_lease.max(Duration::from_secs(1));
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        let me = format!("{}/{}/{}", host.trim(), std::process::id(), &uuid::Uuid::new_v4().to_string()[..8]);
        let runs = Arc::new(Semaphore::new(cfg.event_concurrency.max(1)));
        Arc::new(Dispatcher { queue, me, cfg, deliver, held: Mutex::new(HashSet::new()), runs })
    }

    /// Queue an event for `function` (an Invoke of `path`: its qualifier) and start it.
    /// Once this returns Ok the event is durable, whatever happens to this gateway.
    pub async fn accept(self: &Arc<Self>, id: &str, function: &str, path: &str, payload: String) -> Result<(), StoreError> {
        let now = now_ms();
        let event = Event {
            id: id.to_string(),
            function: function.to_string(),
            path: path.to_string(),
            payload,
            attempts: 0,
            accepted_ms: now,
            next_attempt_ms: now,
            owner: self.me.clone(),
            lease_until_ms: now + self.cfg.event_lease.as_millis() as u64,
        };
        let held = self.queue.add(event).await?;
        self.start(held);
        Ok(())
    }

    fn start(self: &Arc<Self>, held: Held) {
        self.held.lock().unwrap_or_else(|e| e.into_inner()).insert(held.event.id.clone());
        let d = self.clone();
        tokio::spawn(async move {
            let id = held.event.id.clone();
            d.run(held).await;
            d.held.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
        });
    }

    /// Renew the lease of `held`. false: another gateway took the event over, or it was
    /// removed (stop working on it). A store that does not answer is not a loss: the
    /// lease may run out meanwhile, and the event may then run twice (at least once).
    async fn renew(&self, held: &mut Held) -> bool {
        held.event.owner = self.me.clone();
        held.event.lease_until_ms = now_ms() + self.cfg.event_lease.as_millis() as u64;
        match self.queue.write(held).await {
            Ok(true) => true,
            Ok(false) => {
                tracing::info!(event = %held.event.id, function = %held.event.function, "event taken over by another gateway (or removed); leaving it");
                false
            }
            Err(e) => {
                tracing::warn!(event = %held.event.id, error = %error_chain(&e), "renewing an event's lease in the store");
                true
            }
        }
    }

    /// Wait until `until_ms`, renewing the lease. false: the event was lost meanwhile.
    async fn wait_renewing(&self, held: &mut Held, until_ms: u64) -> bool {
        let tick = self.cfg.event_lease / 3;
        loop {
            let now = now_ms();
            if now >= until_ms {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(until_ms - now).min(tick)).await;
            if now_ms() < until_ms && !self.renew(held).await {
                return false;
            }
        }
    }

    /// Await `f`, renewing the lease of `held` meanwhile. None: the event was lost.
    async fn renewing<T>(&self, held: &mut Held, f: impl std::future::Future<Output = T>) -> Option<T> {
        tokio::pin!(f);
        loop {
            tokio::select! {
                v = &mut f => return Some(v),
                _ = tokio::time::sleep(self.cfg.event_lease / 3) => {
                    if !self.renew(held).await {
                        return None;
                    }
                }
            }
        }
    }

    /// Remove a finished event (tried a few times: one left behind runs again).
    async fn finish(&self, id: &str) {
        for attempt in 1..=3 {
            match self.queue.remove(id).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(event = %id, attempt, error = %error_chain(&e), "removing a finished event from the store");
                    tokio::time::sleep(CLUSTER_BACKOFF * attempt).await;
                }
            }
        }
    }

    /// Run `held` until it is done, dropped, or lost to another gateway.
    async fn run(&self, mut held: Held) {
        let mut cluster_failures = 0u32;
        loop {
            let due = held.event.next_attempt_ms;
            if !self.wait_renewing(&mut held, due).await {
                return;
            }
            let Some(Ok(_permit)) = self.renewing(&mut held, self.runs.acquire()).await else { return };
            if !self.renew(&mut held).await {
                return;
            }
            let t0 = std::time::Instant::now();
            let event = held.event.clone();
            // Lost during the run: the run goes on (it cannot be called back), and its
            // end is the new holder's business.
            let Some(delivery) = self.renewing(&mut held, self.deliver.deliver(&event)).await else { return };
            let (id, function, attempt) = (&event.id, &event.function, event.attempts + 1);
            let ms = t0.elapsed().as_secs_f64() * 1e3;
            match delivery {
                Delivery::Done => {
                    tracing::debug!(event = %id, function = %function, attempt, ms, "event done");
                    self.finish(id).await;
                    return;
                }
                Delivery::Dropped(why) => {
                    tracing::warn!(event = %id, function = %function, error = %why, "event dropped: it cannot run");
                    self.finish(id).await;
                    return;
                }
                Delivery::FunctionError(error) if attempt > self.cfg.event_max_retries => {
                    tracing::warn!(event = %id, function = %function, attempts = attempt, error = %error, "event dropped after its last attempt");
                    self.finish(id).await;
                    return;
                }
                Delivery::FunctionError(error) => {
                    let delay = backoff(self.cfg.event_retry_delay, attempt);
                    tracing::info!(event = %id, function = %function, attempt, retry_in_ms = delay.as_millis() as u64, error = %error, "event failed; will retry");
                    held.event.attempts = attempt;
                    held.event.next_attempt_ms = now_ms() + delay.as_millis() as u64;
                }
                Delivery::Retry(why) => {
                    let age = Duration::from_millis(now_ms().saturating_sub(event.accepted_ms));
                    if age > self.cfg.event_max_age {
                        tracing::warn!(event = %id, function = %function, age_s = age.as_secs(), error = %why, "event dropped: the cluster could not run it within its maximum age");
                        self.finish(id).await;
                        return;
                    }
                    cluster_failures += 1;
                    let delay = backoff(CLUSTER_BACKOFF, cluster_failures).min(CLUSTER_BACKOFF_MAX);
                    tracing::info!(event = %id, function = %function, retry_in_ms = delay.as_millis() as u64, error = %why, "the cluster could not run an event; trying again");
                    held.event.next_attempt_ms = now_ms() + delay.as_millis() as u64;
                }
            }
            if !self.renew(&mut held).await {
                return;
            }
        }
    }

    /// Take over, every third of the lease, the events whose lease has run out (their
    /// gateway died). Runs until the process ends.
    pub async fn sweep(self: Arc<Self>) {
        let lease = self.cfg.event_lease;
        let mut failing = false;
        loop {
            match self.queue.ids().await {
                Ok(ids) => {
                    if failing {
                        tracing::info!("the event queue in the store answers again");
                        failing = false;
                    }
                    for (id, written) in ids {
                        // A record written less than a lease ago has a live lease (give or
                        // take clock skew, which the lease's own time is checked for below).
                        let recent = written.elapsed().map_or(true, |age| age < lease);
                        if recent || self.held.lock().unwrap_or_else(|e| e.into_inner()).contains(&id) {
                            continue;
                        }
                        self.take_over(&id).await;
                    }
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(error = %error_chain(&e), "listing the event queue in the store; trying again");
                        failing = true;
                    }
                }
            }
            tokio::time::sleep(lease / 3).await;
        }
    }

    async fn take_over(self: &Arc<Self>, id: &str) {
        let mut held = match self.queue.read(id).await {
            Ok(Some(h)) => h,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(event = %id, error = %error_chain(&e), "reading a queued event");
                return;
            }
        };
        if held.event.lease_until_ms > now_ms() {
            return;
        }
        let was = held.event.owner.clone();
        held.event.owner = self.me.clone();
        held.event.lease_until_ms = now_ms() + self.cfg.event_lease.as_millis() as u64;
        match self.queue.write(&mut held).await {
            Ok(true) => {
                tracing::info!(event = %id, function = %held.event.function, from = %was, "took over an event whose gateway stopped renewing it");
                self.start(held);
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(event = %id, error = %error_chain(&e), "taking over a queued event"),
        }
    }
}
