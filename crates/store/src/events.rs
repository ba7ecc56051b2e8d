//! Asynchronous invocations queued in the store (issue #29): the durable queue of the
//! cluster's gateways. A gateway writes an event here before it answers 202, so an
//! event outlives the gateway that took it and the agent that runs it; the gateway
//! then runs it and removes it.
//!
//! One object per event, `events/<id>.json`. Who works on it is a lease written into
//! the record (`owner`, `lease_until_ms`) with S3's conditional writes: every write
//! names the version (ETag) its writer last saw, so of two gateways that find the same
//! expired lease, one takes it and the other learns it lost ([`EventQueue::write`]
//! returns false). The holder renews the lease while the event runs or waits for a
//! retry; a gateway that dies stops renewing, and another takes its events once their
//! lease has run out. Delivery is at least once: an event whose run was cut off (its
//! agent or gateway died) runs again.
//!
//! Not collected by [`crate::gc`] (another prefix).

use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::{Result, StoreError};
use crate::Store;

/// Where the queue lives, under the store's prefix.
pub const PREFIX: &str = "events";
/// The largest record read back (a 256 KiB payload, JSON-escaped, and the fields).
const MAX_RECORD: usize = 1 << 20;

/// A queued asynchronous invocation.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Event {
    /// The request id the 202 gave the caller.
    pub id: String,
    pub function: String,
    /// The Invoke's path and query (its qualifier), run as a synchronous Invoke.
    pub path: String,
    /// The payload (JSON text, checked when the event was taken).
    pub payload: String,
    /// Attempts that ended in a function error.
    pub attempts: u32,
    /// When the event was taken (ms since the epoch).
    pub accepted_ms: u64,
    /// Not run before this (a retry's back-off).
    pub next_attempt_ms: u64,
    /// The gateway working on it, until `lease_until_ms`.
    pub owner: String,
    pub lease_until_ms: u64,
}

/// An event as its holder last read or wrote it: the record and its version.
#[derive(Debug, Clone)]
pub struct Held {
    pub event: Event,
    version: String,
}

/// The queue of the store `store`.
#[derive(Clone)]
pub struct EventQueue {
    store: Arc<Store>,
}

/// An event id a key may be made of: what request ids are (UUIDs), nothing that
/// leaves the prefix.
pub fn check_id(id: &str) -> Result<()> {
    if !id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-') {
        Ok(())
    } else {
        Err(StoreError::Config { detail: format!("'{id}' is not an event id (letters, digits and -, at most 64)"), source: None })
    }
}

fn key(id: &str) -> String {
    format!("{PREFIX}/{id}.json")
}

impl EventQueue {
    pub fn new(store: Arc<Store>) -> EventQueue {
        EventQueue { store }
    }

    /// Queue `event` (its id must be new). Once this returns, the event is durable.
    pub async fn add(&self, event: Event) -> Result<Held> {
        check_id(&event.id)?;
        let (remote, k) = (self.store.remote.clone(), key(&event.id));
        let data = Bytes::from(serde_json::to_vec(&event).expect("an event serializes"));
        match self.store.run(async move { remote.put_if(&k, data, None).await }).await?? {
            Some(version) => Ok(Held { event, version }),
            None => Err(StoreError::Config { detail: format!("event {} is queued already", event.id), source: None }),
        }
    }

    /// Write `held.event` over the version `held` last saw. false: the record changed
    /// meanwhile (another gateway took the event) or was removed; `held` is stale then.
    pub async fn write(&self, held: &mut Held) -> Result<bool> {
        let (remote, k, seen) = (self.store.remote.clone(), key(&held.event.id), held.version.clone());
        let data = Bytes::from(serde_json::to_vec(&held.event).expect("an event serializes"));
        match self.store.run(async move { remote.put_if(&k, data, Some(&seen)).await }).await?? {
            Some(version) => {
                held.version = version;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Event `id` as it is now; None once removed. A record that is not one (too large,
    /// not an event) is an error naming the object.
    pub async fn read(&self, id: &str) -> Result<Option<Held>> {
        check_id(id)?;
        let (remote, k) = (self.store.remote.clone(), key(id));
        let object = self.store.remote.url.object_url(&k);
        let Some((data, version)) = self.store.run(async move { remote.get_versioned(&k).await }).await?? else {
            return Ok(None);
        };
        if data.len() > MAX_RECORD {
            return Err(StoreError::Corrupt { object, detail: format!("{} bytes, over the {MAX_RECORD} byte limit of an event", data.len()) });
        }
        let event: Event = serde_json::from_slice(&data).map_err(|e| StoreError::Corrupt { object: object.clone(), detail: format!("not an event record: {e}") })?;
        if event.id != id {
            return Err(StoreError::Corrupt { object, detail: format!("it holds event {}", event.id) });
        }
        Ok(Some(Held { event, version }))
    }

    /// The ids of every queued event, with when its record was last written (by the
    /// store's clock).
    pub async fn ids(&self) -> Result<Vec<(String, SystemTime)>> {
        let remote = self.store.remote.clone();
        let list = self.store.run(async move { remote.list(PREFIX).await }).await??;
        Ok(list
            .into_iter()
            .filter_map(|(k, meta)| Some((k.strip_prefix("events/")?.strip_suffix(".json")?.to_string(), meta.last_modified.into())))
            .filter(|(id, _)| check_id(id).is_ok())
            .collect())
    }

    /// Remove event `id` (done, or dropped). Removing one that is gone is no error.
    pub async fn remove(&self, id: &str) -> Result<()> {
        check_id(id)?;
        let (remote, k) = (self.store.remote.clone(), key(id));
        match self.store.run(async move { remote.delete(&k).await }).await? {
            Ok(()) | Err(StoreError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_ids_stay_under_the_prefix() {
        check_id("8f14e45f-ceea-467f-a0e6-0b1e3c5d2f10").unwrap();
        for bad in ["", "../x", "a/b", "a.json", "a b", &"a".repeat(65)] {
            assert!(check_id(bad).is_err(), "{bad:?} accepted");
        }
    }
}
