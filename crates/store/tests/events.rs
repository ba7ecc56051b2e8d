//! The store's queue of asynchronous invocations against a real MinIO: a queued event
//! is durable and read back as written; of two writers that saw the same version only
//! one wins (the lease a gateway takes); a removed event is gone for its holder too.

#[path = "common/minio.rs"]
mod minio;

use std::sync::Arc;

use thaw_store::events::{Event, EventQueue};
use thaw_store::{Store, StoreConfig, StoreUrl};

fn event(id: &str) -> Event {
    Event {
        id: id.into(),
        function: "hello".into(),
        path: "/2015-03-31/functions/hello/invocations?Qualifier=live".into(),
        payload: "{\"n\": 1, \"text\": \"a \\\"quoted\\\" line\\n\"}".into(),
        attempts: 0,
        accepted_ms: 1,
        next_attempt_ms: 1,
        owner: "gateway-a".into(),
        lease_until_ms: 1000,
    }
}

#[test]
fn queued_events_are_leased_by_one_writer_at_a_time() {
    let m = minio::Minio::start();
    let cfg = StoreConfig {
        endpoint: Some(m.endpoint()),
        region: Some("us-east-1".into()),
        access_key_id: Some(minio::ACCESS_KEY.into()),
        secret_access_key: Some(minio::SECRET_KEY.into()),
        ..Default::default()
    };
    let store = Arc::new(Store::open(&StoreUrl::parse("s3://thaw-events/cluster-a").unwrap(), &cfg).unwrap());
    store.ensure_bucket().unwrap();
    let q = EventQueue::new(store.clone());
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        assert!(q.ids().await.unwrap().is_empty());
        let mut a = q.add(event("e-1")).await.unwrap();
        assert!(q.add(event("e-1")).await.is_err(), "an id is queued once");
        q.add(event("e-2")).await.unwrap();
        let mut ids: Vec<String> = q.ids().await.unwrap().into_iter().map(|(id, _)| id).collect();
        ids.sort();
        assert_eq!(ids, ["e-1", "e-2"]);
        assert_eq!(q.read("e-1").await.unwrap().unwrap().event, event("e-1"), "read back as written");

        // Two gateways find the same record; the first write wins, the second learns it lost.
        let mut b = q.read("e-1").await.unwrap().unwrap();
        b.event.owner = "gateway-b".into();
        b.event.lease_until_ms = 5000;
        assert!(q.write(&mut b).await.unwrap(), "b takes the lease over the version it read");
        a.event.attempts = 1;
        assert!(!q.write(&mut a).await.unwrap(), "a's version is stale: it must not overwrite b's lease");
        assert_eq!(q.read("e-1").await.unwrap().unwrap().event.owner, "gateway-b");
        // The holder renews over its own writes.
        b.event.lease_until_ms = 9000;
        assert!(q.write(&mut b).await.unwrap());
        assert!(q.write(&mut b).await.unwrap());

        q.remove("e-1").await.unwrap();
        q.remove("e-1").await.unwrap();
        assert!(q.read("e-1").await.unwrap().is_none());
        assert!(!q.write(&mut b).await.unwrap(), "a removed event is not written back");
        assert!(q.read("e-1").await.unwrap().is_none());
        assert_eq!(q.ids().await.unwrap().into_iter().map(|(id, _)| id).collect::<Vec<_>>(), ["e-2"]);
        assert!(q.read("../snapshots/x").await.is_err(), "ids stay under the prefix");
    });
    // A record that is not an event is refused by name, not taken as one.
    let remote = store.remote.clone();
    store.block_on(remote.put("events/e-3.json", thaw_store::bytes::Bytes::from_static(b"{\"id\": \"e-3\"}"))).unwrap();
    let err = rt.block_on(q.read("e-3")).unwrap_err().to_string();
    assert!(err.contains("events/e-3.json") && err.contains("not an event record"), "{err}");
}
