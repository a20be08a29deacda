//! The numbered, fenced view (issue #40, docs/STORE.md section 4): clients place keys by the
//! view the servers hold, a put made under an older view is never acknowledged (it is made
//! again under the new one), gets read the new view's placement once they see its fence,
//! and a change that could lose an acknowledged put is refused.

use super::*;

#[test]
fn a_put_made_under_an_old_view_is_never_acknowledged() {
    let lease = Duration::from_secs(30);
    let servers: Vec<MemoryServer> = (1..=4).map(|n| server(n, lease)).collect();
    let all: Vec<&MemoryServer> = servers.iter().collect();
    let changer = store(&all, 10, 2);
    let (v1, _) = changer.block_on(changer.set_view(&[1, 2])).unwrap();
    assert_eq!((v1.number, &v1.members[..]), (1, &[1, 2][..]));
    assert!(!v1.moving(), "settled after its repair");
    // A client that places keys by view 1, and keeps placing by it.
    let stale = store(&all, 11, 2);
    let keys: Vec<String> = (0..24).map(|i| format!("key {i}")).collect();
    for k in &keys {
        stale
            .block_on(stale.put(k.as_bytes(), b"before the change"))
            .unwrap();
    }
    for k in &keys {
        for at in stale.block_on(stale.locate(k.as_bytes())).unwrap() {
            assert!(
                [1, 2].contains(&at.block.node),
                "{k} on node {}",
                at.block.node
            );
        }
    }
    // The operator moves the store to two other servers; the stale client has not looked.
    let (v2, moved) = changer.block_on(changer.set_view(&[3, 4])).unwrap();
    eprintln!("view 2: {v2:?}, its repair: {moved:?}");
    assert_eq!((v2.number, &v2.members[..]), (2, &[3, 4][..]));
    assert_eq!(
        moved.copied,
        2 * keys.len(),
        "every key copied onto 3 and 4"
    );
    assert_eq!(moved.failed + moved.deferred + moved.unreadable, 0);
    // Its gets find the fence of view 2 beside their first READs and read under view 2.
    let fresh = store(&all, 12, 2);
    for k in &keys {
        assert_eq!(
            stale.block_on(stale.get(k.as_bytes())).unwrap().as_deref(),
            Some(&b"before the change"[..]),
            "{k}"
        );
    }
    assert!(stale.stats().fenced >= 1, "{:?}", stale.stats());
    // Its puts, placed under view 1 by a client that has not looked again (a second stale
    // client, that only ever put): each is refused by the fence and made under view 2.
    let blind = store(&all, 13, 2);
    // It learns view 1 first (its first put), then the change happens.
    let (_, _) = changer.block_on(changer.set_view(&[1, 2])).unwrap();
    blind.block_on(blind.put(b"warm up", b"x")).unwrap();
    changer.block_on(changer.set_view(&[3, 4])).unwrap();
    for k in &keys {
        blind
            .block_on(blind.put(k.as_bytes(), b"after the change"))
            .unwrap();
    }
    assert!(
        blind.stats().fenced >= 1,
        "the fence refused a put made under view 3: {:?}",
        blind.stats()
    );
    for k in &keys {
        assert_eq!(
            fresh.block_on(fresh.get(k.as_bytes())).unwrap().as_deref(),
            Some(&b"after the change"[..]),
            "{k}: an acknowledged put must be what a later get reads"
        );
        for at in fresh.block_on(fresh.locate(k.as_bytes())).unwrap() {
            assert!(
                [3, 4].contains(&at.block.node),
                "{k} on node {}",
                at.block.node
            );
        }
    }
    assert_eq!(fresh.block_on(fresh.view()).unwrap().number, 4);
}

#[test]
fn a_view_change_that_could_lose_an_acknowledged_put_is_refused() {
    let lease = Duration::from_secs(30);
    let servers: Vec<MemoryServer> = (1..=4).map(|n| server(n, lease)).collect();
    let all: Vec<&MemoryServer> = servers.iter().collect();
    let s = store(&all, 20, 2);
    s.block_on(s.set_view(&[1, 2, 3])).unwrap();
    s.block_on(s.put(b"k", b"v")).unwrap();
    // A member no client joined.
    match s.block_on(s.set_view(&[1, 2, 9])) {
        Err(Error::NodeDown { node: 9, .. }) => {}
        other => panic!("a view naming an unknown server: {other:?}"),
    }
    match s.block_on(s.set_view(&[])) {
        Err(Error::Core(CoreError::OutOfLimits { .. })) => {}
        other => panic!("an empty view: {other:?}"),
    }
    // Two of view 1's three members gone (r = 2): a put acknowledged on them alone could
    // be missed by the repair, so the change is refused.
    let mut servers = servers;
    drop(servers.remove(0));
    drop(servers.remove(0));
    std::thread::sleep(Duration::from_millis(200));
    let _ = s.block_on(s.get(b"k")); // notices the dead servers
    let _ = s.block_on(s.put(b"k", b"w"));
    match s.block_on(s.set_view(&[3, 4])) {
        Err(Error::NotEnoughReplicas { .. }) => {}
        other => panic!("a change with two of three old members away: {other:?}"),
    }
    assert_eq!(s.block_on(s.view()).unwrap().number, 1, "nothing changed");
}
