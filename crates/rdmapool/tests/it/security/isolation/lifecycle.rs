//! An isolated client over its lifetime: one-sided inside its own chunks, windows gone
//! before its chunks are handed on, a restart that finds them again, a bound per id.

use super::*;

/// Inside its own chunks a client of an isolated server works one-sided: after the chunk
/// claim, allocations, writes, reads and frees cost the server nothing.
#[test]
fn inside_its_own_chunks_an_isolated_client_is_one_sided() {
    let n = node();
    let server = isolated_server(&n.ctx);
    let c = client(&n, &server, 5);
    let first = c.block_on(c.alloc(64, None)).unwrap();
    let handled = server.stats().requests_handled;
    let buf = Arc::new(n.pd.alloc_mr(4096, AccessFlags::LOCAL_WRITE).unwrap());
    let mut ptrs = vec![first];
    for i in 0..100u64 {
        let p = c.block_on(c.alloc(64, None)).unwrap();
        buf.write_at(0, &i.to_le_bytes()).unwrap();
        let (r, _) = c.block_on(c.write(p, 0, buf.clone(), 0, 8));
        r.unwrap();
        ptrs.push(p);
    }
    for (i, p) in ptrs.iter().skip(1).enumerate() {
        let (r, _) = c.block_on(c.read(*p, 0, buf.clone(), 64, 8));
        r.unwrap();
        assert_eq!(buf.read_u64(64).unwrap(), i as u64);
        assert_eq!(c.block_on(c.fetch_and_add(*p, 8, 1)).unwrap(), 0);
    }
    assert_eq!(
        server.stats().requests_handled,
        handled,
        "101 objects of one chunk written, read and added to: no request after its claim"
    );
    for p in &ptrs {
        c.block_on(c.free(*p)).unwrap();
    }
    assert_eq!(
        server.stats().requests_handled,
        handled + 1,
        "freeing them all: one request, the release of the emptied chunk"
    );
    // The released chunk is no longer reachable through its old window: a pointer into it
    // is refused before anything is posted.
    match c.block_on(c.fetch_and_add(first, 8, 1)) {
        Err(rdmapool::Error::NotAllocated(_)) | Err(rdmapool::Error::Isolated { .. }) => {}
        other => panic!("an operation through a released chunk: {other:?}"),
    }
}

/// A client whose lease expires loses its windows before its chunks go to anyone else: the
/// server disconnects it under the same lock as the sweep that frees the chunks, so the
/// next claimer's data is out of its reach (its old key no longer works).
#[test]
fn an_expired_client_loses_its_windows_before_its_chunks_are_handed_on() {
    let n = node();
    let server = isolated_server(&n.ctx);
    let l = server.descriptor().layout;
    // A client by hand that claims a chunk and then never renews its lease (frozen).
    let frozen = Raw::join(&n, &server, 3);
    let answer = frozen.ask(&n, control(3, 2, 0, 0, 0));
    assert_eq!(u64_at(&answer, 16), 0, "chunk 0 claimed");
    let old_key = u64_at(&answer, 24) as u32;
    assert_eq!(
        frozen.op(&n, "write", l.chunk(0) + 4096, old_key),
        WcStatus::Success
    );
    wait_until("the server expires the frozen client", || {
        server.stats().expired_clients >= 1
    });
    // Another client claims the same chunk and writes to it.
    let next = client(&n, &server, 4);
    let mut on_zero = None;
    for _ in 0..8 {
        let p = next.block_on(next.alloc(200_000, None)).unwrap();
        if l.chunk_of(p.offset) == Some(0) {
            on_zero = Some(p);
            break;
        }
    }
    let p = on_zero.expect("the freed chunk is handed on");
    let buf = Arc::new(n.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap());
    buf.write_at(0, b"the new owner's!").unwrap();
    let (r, _) = next.block_on(next.write(p, 0, buf.clone(), 0, 16));
    r.unwrap();
    // The frozen client wakes up and writes with its old key: refused (its connection was
    // closed and its window revoked), and the new owner's bytes stand.
    let status = frozen.op_within(&n, "write", p.offset, old_key, Duration::from_secs(3));
    assert_ne!(
        status,
        Some(WcStatus::Success),
        "a write through an expired window"
    );
    assert_eq!(&victim_state(&next, p, &buf)[..], b"the new owner's!");
}

/// A client that restarts under its id gets its slot back (taken over after half a lease,
/// as on a trusted server) and its chunks: their windows are granted again on the new
/// connection, and what it allocated before is still there to read and free.
#[test]
fn a_restarted_isolated_client_gets_its_slot_and_chunks_back() {
    let n = node();
    let server = isolated_server(&n.ctx);
    let buf = Arc::new(n.pd.alloc_mr(64, AccessFlags::LOCAL_WRITE).unwrap());
    let p = {
        let first = client(&n, &server, 6);
        let p = first.block_on(first.alloc(64, None)).unwrap();
        buf.write_at(0, b"before a restart").unwrap();
        let (r, _) = first.block_on(first.write(p, 0, buf.clone(), 0, 16));
        r.unwrap();
        p
        // dropped here: its lease stops being renewed, as in a crash
    };
    let again = client(&n, &server, 6);
    assert_eq!(&victim_state(&again, p, &buf)[..], b"before a restart");
    let mine = again.block_on(again.allocations()).unwrap();
    assert!(mine.contains(&p), "{mine:?}");
    again.block_on(again.free(p)).unwrap();
}

/// One id cannot take every chunk of an isolated server that bounds them per id: beyond its
/// quota its allocations find the node full, while another id still allocates.
#[test]
fn an_isolated_server_bounds_the_chunks_of_one_id() {
    let n = node();
    let server = isolated_server_with(&n.ctx, 2);
    let greedy = client(&n, &server, 8);
    // Whole-chunk objects: each takes a chunk of its own.
    let big = 200_000;
    let held: Vec<RemotePtr> = (0..2)
        .map(|_| greedy.block_on(greedy.alloc(big, None)).unwrap())
        .collect();
    match greedy.block_on(greedy.alloc(big, None)) {
        Err(rdmapool::Error::RemoteExhausted { .. }) => {}
        other => panic!("a third chunk for one id: {other:?}"),
    }
    assert_eq!(server.stats().chunks_owned, 2);
    let other = client(&n, &server, 9);
    other.block_on(other.alloc(big, None)).unwrap();
    // Freeing one gives the id room again.
    greedy.block_on(greedy.free(held[0])).unwrap();
    greedy.block_on(greedy.alloc(big, None)).unwrap();
}

/// Issue #41, finding 1's second half: taking a chunk back only zeroed its magic, so the next
/// tenant to claim it read the last one's bytes. Now a chunk is wiped before it is handed on,
/// whether its holder released it or its lease expired.
#[test]
fn a_chunk_is_wiped_before_another_tenant_claims_it() {
    let n = node();
    let server = isolated_server(&n.ctx);
    let l = server.descriptor().layout;
    let secret = u64::from_le_bytes(*b"SECRET!!");
    for how in ["released", "expired"] {
        let holder = Raw::join(&n, &server, if how == "released" { 22 } else { 23 });
        let (j, key) = holder.claim_free(&n, 0);
        let at = l.chunk(j) + l.chunk_size - 8;
        assert_eq!(
            holder.write_word(&n, at, key, secret),
            Some(WcStatus::Success)
        );
        if how == "released" {
            let answer = holder.ask(&n, control(4, 3, j, 0, 0));
            assert_eq!(u64_at(&answer, 16), 22, "released");
        } else {
            let before = server.stats().expired_clients;
            wait_until("the holder's lease expires", || {
                server.stats().expired_clients > before && server.stats().chunks_owned == 0
            });
        }
        // (Joined now: a client by hand never renews its lease.)
        let reader = Raw::join(&n, &server, 21);
        let answer = reader.ask(&n, control(3, 4, j, 0, 0));
        assert_eq!(u64_at(&answer, 16), 0, "{how}: chunk {j} claimed again");
        let key = u64_at(&answer, 24) as u32;
        assert_eq!(
            reader.read_word(&n, at, key),
            Ok(0),
            "{how}: the last holder's bytes are gone"
        );
        let answer = reader.ask(&n, control(4, 5, j, 0, 0));
        assert_eq!(u64_at(&answer, 16), 21);
    }
}
