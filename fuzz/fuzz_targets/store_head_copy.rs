//! A head's copy as a miss reads it (`thaw_store::fetch::HeadCopy`): the bytes of a
//! store object, untrusted until checked, arriving in parts. The first input byte
//! sets the parts' size (its top bit: once the manifest is here the miss says it checks
//! chunk by chunk, `HeadCopy::unhashed`, else by the pack's hash, `HeadCopy::hashed`),
//! the second the limit the miss sets
//! once the manifest gave the head's size (0: none); the rest is the object. A copy
//! that starts with `HEAD_SPLIT_MAGIC` is split: the input's last byte `r` says what
//! the second object is (0: not requested; 1: missing; else the `r - 2` bytes before
//! it, the rest of the input being the first object). Any other copy is read beside a
//! stale second part, which it must leave unread. Checked against a model of the
//! format (`fetch::HEAD_MAGIC`, the manifest's length, the manifest, the pack): the
//! manifest handed over, the pack's bytes, their hash, and every prefix.
#![no_main]
use futures::StreamExt;
use libfuzzer_sys::fuzz_target;
use sha2::Digest;
use thaw_store::bytes::Bytes;
use thaw_store::fetch::{HeadCopy, PartsRead, HEAD_MAGIC, HEAD_SPLIT_MAGIC};

/// What the second object is.
enum Second<'a> {
    NotAsked,
    Missing,
    Bytes(&'a [u8]),
}

fuzz_target!(|data: &[u8]| {
    let [step, limit, copy @ ..] = data else { return };
    let unhashed = *step & 0x80 != 0;
    let step = usize::from(*step & 0x7f).max(1);
    let limit = (*limit > 0).then(|| usize::from(*limit) * 4);
    let split = copy.starts_with(HEAD_SPLIT_MAGIC);
    let (first, second) = match (split, copy.split_last()) {
        (true, Some((&0, first))) => (first, Second::NotAsked),
        (true, Some((&1, first))) => (first, Second::Missing),
        (true, Some((&r, rest))) => {
            let cut = rest.len().saturating_sub(usize::from(r) - 2);
            (&rest[..cut], Second::Bytes(&rest[cut..]))
        }
        _ => (copy, Second::Bytes(b"a stale second part")),
    };
    // The model: where the pack starts, and the manifest (None: no copy at all).
    let header = HEAD_MAGIC.len() + 4;
    let (manifest, pack_at): (Option<&[u8]>, Option<usize>) =
        if first.len() >= header && (first.starts_with(HEAD_MAGIC) || first.starts_with(HEAD_SPLIT_MAGIC)) {
            let n = u32::from_le_bytes(first[HEAD_MAGIC.len()..header].try_into().unwrap()) as usize;
            match n <= thaw_store::manifest::MAX_MANIFEST_LEN && header + n <= first.len() {
                true => ((n > 0).then(|| &first[header..header + n]), Some(header + n)),
                false => (None, None),
            }
        } else {
            (None, Some(0))
        };
    // A split copy's pack goes on in its second object; it is none without it. (Split
    // as its first object's header tells: one shorter than a header is not.)
    let split = first.len() >= header && first.starts_with(HEAD_SPLIT_MAGIC);
    let pack: Option<Vec<u8>> = pack_at
        .and_then(|p| match (split, &second) {
            (false, _) => Some(first[p..].to_vec()),
            (true, Second::Bytes(rest)) => Some([&first[p..], rest].concat()),
            (true, _) => None,
        })
        .filter(|pack| limit.is_none_or(|l| pack.len() <= l));

    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let read = |bytes: &[u8]| -> PartsRead {
        let parts: Vec<thaw_store::Result<Bytes>> = bytes.chunks(step).map(|c| Ok(Bytes::copy_from_slice(c))).collect();
        Box::pin(async move { Ok(futures::stream::iter(parts).boxed()) })
    };
    let rest: Option<PartsRead> = match second {
        Second::NotAsked => None,
        Second::Missing => Some(Box::pin(async { Err(thaw_store::StoreError::NotFound { object: "s3://fuzz/heads/x.rest".into() }) })),
        Second::Bytes(b) => Some(read(b)),
    };
    let first = read(first);
    rt.block_on(async {
        let head = HeadCopy::from_split("s3://fuzz/heads/x".into(), first, rest);
        if let Some(l) = limit {
            head.limit(l as u64);
        }
        let got = head.manifest().await;
        if unhashed {
            head.unhashed();
        } else {
            head.hashed();
        }
        // A manifest is handed over as soon as it is here, even from a copy whose
        // pack later turns out too long or incomplete; none from a copy without one.
        assert_eq!(got.as_deref(), manifest.filter(|_| pack_at.is_some()), "the manifest");
        match (head.get_hashed().await, pack) {
            (Some((bytes, digest)), Some(pack)) => {
                assert_eq!(&bytes[..], &pack[..], "the pack's bytes");
                // Never hashed when told so; asked to after the copy ended, no digest
                // (the reader hashes it); never a wrong one.
                let want = hex::encode(sha2::Sha256::digest(&pack));
                assert!(if unhashed { digest.is_empty() } else { digest == want || digest.is_empty() }, "their hash, not the manifest's: {digest}");
                for n in [0, 1.min(pack.len()), pack.len() / 2, pack.len()] {
                    assert_eq!(head.prefix(n).await.as_deref(), Some(&pack[..n]));
                }
                assert!(head.prefix(pack.len() + 1).await.is_none());
            }
            (None, None) => {}
            (got, want) => panic!("copy {:?} where the model has {:?}", got.map(|g| g.0.len()), want.map(|w| w.len())),
        }
    });
});
