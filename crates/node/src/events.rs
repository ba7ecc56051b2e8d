//! Asynchronous invocations (InvocationType=Event): persisted in the registry
//! before the 202 is returned, dispatched by one loop with bounded
//! concurrency, retried with exponential back-off when the function fails
//! (Lambda: two retries), dropped with a warning after the last attempt.
//! Delivery is at-least-once: an event in flight when the node dies runs again.
//! With a node key, a queued event's payload is stored sealed (registry.rs).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use thiserror::Error;
use tokio::sync::{watch, Semaphore};
use tracing::{debug, info, warn};

use crate::node::{clock_ms, error_chain, InvokeError, InvokeTarget, Node, Outcome};
use crate::registry::{EventRecord, Opened, Registry, RegistryError};

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
        for (ev, opened) in due {
            if !claim(&node.registry, &inflight, &ev, clock_ms()) {
                continue;
            }
            let permit = tokio::select! {
                p = sem.clone().acquire_owned() => match p { Ok(p) => p, Err(_) => break },
                _ = shutdown.changed() => break,
            };
            let (node, inflight) = (node.clone(), inflight.clone());
            tokio::spawn(async move {
                let id = ev.id.clone();
                process(&node, ev, opened).await;
                release(&inflight, &id);
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

/// Marks `ev` in flight if nothing else runs it and the queue still holds it as listed.
/// The listing may be stale: an attempt that ended after it was read has rescheduled or
/// deleted the event and left the in-flight set; running the stale copy would run the
/// event again at once — a finished event twice, a failed one without its back-off and
/// with an attempt count one short (a version-1 event dropped twice was seen). An
/// attempt leaves the set only after the queue has its outcome, so a check made after
/// the mark sees it.
fn claim(registry: &Registry, inflight: &Mutex<HashSet<String>>, ev: &EventRecord, now_ms: i64) -> bool {
    if !inflight.lock().map(|mut s| s.insert(ev.id.clone())).unwrap_or(false) {
        return false;
    }
    match registry.event_still_due(ev, now_ms) {
        Ok(true) => true,
        Ok(false) => {
            debug!(request_id = %ev.id, "event listed before its last attempt ended; not run again");
            release(inflight, &ev.id);
            false
        }
        Err(e) => {
            warn!(error = %error_chain(&e), "checking a queued event");
            release(inflight, &ev.id);
            false
        }
    }
}

fn release(inflight: &Mutex<HashSet<String>>, id: &str) {
    if let Ok(mut s) = inflight.lock() {
        s.remove(id);
    }
}

/// One attempt of `ev`; `opened`: whether its stored payload could be read (if not, the
/// attempt fails with why, and the event is dropped after its last, as a failing
/// function's is).
async fn process(node: &Arc<Node>, ev: EventRecord, opened: Opened) {
    let payload = String::from_utf8_lossy(&ev.payload).into_owned();
    let attempt = ev.attempts + 1;
    let target = InvokeTarget { version: ev.version, qualifier: ev.qualifier.clone() };
    let failure = match opened {
        Err(why) => format!("the queued event cannot be read: {why}"),
        Ok(()) => match node.invoke_version(&ev.function, target, &ev.id, payload).await {
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
        },
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
    fn a_stale_listing_does_not_run_an_event_again() {
        let reg = Registry::open_in_memory().unwrap();
        let inflight = Mutex::new(HashSet::new());
        let ev = EventRecord { id: "e".into(), function: "f".into(), version: Some(1), qualifier: None, payload: b"{}".to_vec(), attempts: 2, next_attempt_ms: 10 };
        reg.enqueue_event(&ev).unwrap();
        let listed = reg.due_events(20, 10).unwrap().remove(0).0;
        assert!(claim(&reg, &inflight, &listed, 20), "a due event is claimed");
        assert!(!claim(&reg, &inflight, &listed, 20), "not twice while in flight");
        // The attempt fails and is retried later: the listing read before is stale.
        reg.reschedule_event("e", 3, 1000).unwrap();
        release(&inflight, "e");
        assert!(!claim(&reg, &inflight, &listed, 20), "a rescheduled event is not run from a stale listing");
        assert!(inflight.lock().unwrap().is_empty(), "a refused claim leaves nothing in flight");
        let relisted = reg.due_events(1000, 10).unwrap().remove(0).0;
        assert!(claim(&reg, &inflight, &relisted, 1000), "it runs when due again");
        // The attempt ends the event: the listing is stale again.
        reg.delete_event("e").unwrap();
        release(&inflight, "e");
        assert!(!claim(&reg, &inflight, &relisted, 1000), "a finished event is not run again");
    }

    #[test]
    fn backoff_doubles() {
        let b = Duration::from_millis(100);
        assert_eq!(backoff(b, 1), b);
        assert_eq!(backoff(b, 2), b * 2);
        assert_eq!(backoff(b, 3), b * 4);
    }
}
