//! Asynchronous invocations (InvocationType=Event): persisted in the registry
//! before the 202 is returned, dispatched by one loop with bounded
//! concurrency, retried with exponential back-off when the function fails
//! (Lambda: two retries), dropped with a warning after the last attempt.
//! Delivery is at-least-once: an event in flight when the node dies runs again.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use thiserror::Error;
use tokio::sync::{watch, Semaphore};
use tracing::{debug, info, warn};

use crate::node::{clock_ms, error_chain, InvokeError, InvokeTarget, Node, Outcome};
use crate::registry::{EventRecord, RegistryError};

/// Lambda's limit for an asynchronous invocation's payload.
pub const MAX_EVENT_PAYLOAD: usize = 256 * 1024;
/// Poll interval of the queue when nothing wakes the dispatcher.
const POLL: Duration = Duration::from_millis(200);

#[derive(Debug, Error)]
pub enum EventError {
    #[error("queueing the event")]
    Queue(#[from] RegistryError),
}

/// Persist an event; the dispatcher picks it up.
pub fn enqueue(node: &Node, id: &str, function: &str, target: &InvokeTarget, payload: Vec<u8>) -> Result<(), EventError> {
    node.registry.enqueue_event(&EventRecord {
        id: id.to_string(),
        function: function.to_string(),
        version: target.version,
        qualifier: target.qualifier.clone(),
        payload,
        attempts: 0,
        next_attempt_ms: clock_ms(),
    })?;
    node.metrics.events_pending.inc();
    node.events_wake.notify_one();
    Ok(())
}

/// Delay before retry number `attempt` (1-based).
pub fn backoff(base: Duration, attempt: u32) -> Duration {
    base * 2u32.saturating_pow(attempt.saturating_sub(1).min(16))
}

/// Dispatch due events until `shutdown` turns true, then wait for those in flight.
pub async fn run(node: Arc<Node>, mut shutdown: watch::Receiver<bool>) {
    let sem = Arc::new(Semaphore::new(node.cfg.event_concurrency.max(1)));
    let inflight: Arc<Mutex<HashSet<String>>> = Arc::new(Mutex::new(HashSet::new()));
    loop {
        if *shutdown.borrow() {
            break;
        }
        let due = match node.registry.due_events(clock_ms(), 64) {
            Ok(d) => d,
            Err(e) => {
                warn!(error = %error_chain(&e), "reading the event queue");
                Vec::new()
            }
        };
        for ev in due {
            if !inflight.lock().map(|mut s| s.insert(ev.id.clone())).unwrap_or(false) {
                continue;
            }
            let permit = tokio::select! {
                p = sem.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
                _ = shutdown.changed() => break,
            };
            let (node, inflight) = (node.clone(), inflight.clone());
            tokio::spawn(async move {
                let id = ev.id.clone();
                process(&node, ev).await;
                if let Ok(mut s) = inflight.lock() {
                    s.remove(&id);
                }
                drop(permit);
                node.events_wake.notify_one();
            });
        }
        tokio::select! {
            _ = node.events_wake.notified() => {}
            _ = tokio::time::sleep(POLL) => {}
            _ = shutdown.changed() => {}
        }
    }
    // Drain: wait for every event in flight.
    let _ = sem.acquire_many(node.cfg.event_concurrency.max(1) as u32).await;
}

async fn process(node: &Arc<Node>, ev: EventRecord) {
    let payload = String::from_utf8_lossy(&ev.payload).into_owned();
    let attempt = ev.attempts + 1;
    let target = InvokeTarget { version: ev.version, qualifier: ev.qualifier.clone() };
    let failure = match node.invoke_version(&ev.function, target, &ev.id, payload).await {
        Ok(inv) => match inv.outcome {
            Outcome::Ok(_) => {
                debug!(request_id = %ev.id, function = %ev.function, attempt, "event done");
                node.note_event(&ev.function, true);
                finish(node, &ev.id);
                return;
            }
            Outcome::Error(e, _) => format!("{}: {}", e.error_type, e.error_message),
        },
        Err(InvokeError::NotFound(_)) => {
            finish(node, &ev.id);
            return;
        }
        Err(InvokeError::Throttled { .. }) | Err(InvokeError::MemoryBudget { .. }) | Err(InvokeError::ShuttingDown) => {
            // Not an attempt: try again shortly.
            let _ = node.registry.reschedule_event(&ev.id, ev.attempts, clock_ms() + 500);
            return;
        }
        Err(InvokeError::NotReady { state }) if state == "Pending" => {
            let _ = node.registry.reschedule_event(&ev.id, ev.attempts, clock_ms() + 500);
            return;
        }
        Err(e) => error_chain(&e),
    };
    if attempt > node.cfg.event_max_retries {
        warn!(request_id = %ev.id, function = %ev.function, attempts = attempt, error = %failure, "event dropped after its last attempt");
        node.note_event(&ev.function, false);
        finish(node, &ev.id);
    } else {
        let delay = backoff(node.cfg.event_retry_delay, attempt);
        info!(request_id = %ev.id, function = %ev.function, attempt, retry_in_ms = delay.as_millis() as u64, error = %failure, "event failed; will retry");
        if let Err(e) = node.registry.reschedule_event(&ev.id, attempt, clock_ms() + delay.as_millis() as i64) {
            warn!(error = %error_chain(&e), "rescheduling an event");
        }
    }
}

fn finish(node: &Node, id: &str) {
    if let Err(e) = node.registry.delete_event(id) {
        warn!(error = %error_chain(&e), "removing a finished event");
    }
    node.metrics.events_pending.set(node.registry.pending_events().unwrap_or(0) as i64);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles() {
        let b = Duration::from_millis(100);
        assert_eq!(backoff(b, 1), b);
        assert_eq!(backoff(b, 2), b * 2);
        assert_eq!(backoff(b, 3), b * 4);
    }
}
