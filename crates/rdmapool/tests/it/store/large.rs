//! Large values: striped over every server, and put and got straight between registered
//! memory and the servers.

use super::*;

#[test]
fn large_values_are_striped_over_every_server_and_read_back_whole() {
    let lease = Duration::from_secs(10);
    let big = |node| {
        let listen = SocketAddr::new(listen_ip(), 0);
        server_of(node, lease, 96 << 20, listen).expect("server starts")
    };
    let s: Vec<MemoryServer> = (1..=3).map(big).collect();
    let refs: Vec<&MemoryServer> = s.iter().collect();
    let st = store(&refs, 1, 2);
    // 3 MiB: twelve parts of 256 KiB less 100 bytes, each on two of the three servers.
    let three = value(5, 3 << 20);
    st.block_on(st.put(b"three", &three)).unwrap();
    for server in &s {
        let owned = server.stats().chunks_owned;
        assert!(
            owned >= 2,
            "index and parts on every server: {owned} chunks"
        );
    }
    assert_eq!(st.block_on(st.get(b"three")).unwrap().unwrap(), three);
    assert!(st.block_on(st.exists(b"three")).unwrap());
    assert_eq!(
        st.block_on(st.list(b"")).unwrap(),
        [b"three".to_vec()],
        "parts are not keys"
    );
    let at = st.block_on(st.locate(b"three")).unwrap();
    assert_eq!(at.len(), 2, "the manifest, on two servers");
    assert!(at[0].block.len < 1024, "a manifest is small: {at:?}");
    // The largest value there is, and one byte more.
    let max = value(9, 64 << 20);
    st.block_on(st.put(b"max", &max)).unwrap();
    let other = store(&refs, 2, 2);
    assert!(
        other.block_on(other.get(b"max")).unwrap().unwrap() == max,
        "64 MiB read back"
    );
    let over = vec![1u8; (64 << 20) + 1];
    assert!(matches!(
        st.block_on(st.put(b"over", &over)),
        Err(Error::Core(CoreError::OutOfLimits {
            what: "value length",
            ..
        }))
    ));
    // Replaced by a small value, then removed: the old parts are cleared after the grace.
    st.block_on(st.put(b"three", b"small now")).unwrap();
    assert_eq!(
        st.block_on(st.get(b"three")).unwrap().unwrap(),
        b"small now"
    );
    assert!(st.block_on(st.remove(b"max")).unwrap());
    assert_eq!(other.block_on(other.get(b"max")).unwrap(), None);
    std::thread::sleep(Duration::from_millis(60));
    let freed = st.block_on(st.flush_retired());
    let parts = 12 + (64usize << 20).div_ceil((256 << 10) - 100);
    assert!(
        freed >= 2 * parts,
        "every part's two copies cleared: {freed} of {parts} parts"
    );
    // A repair finds only the two keys (a value and a tombstone), nothing to copy.
    let r = st.block_on(st.repair()).unwrap();
    assert_eq!((r.keys, r.copied, r.failed), (2, 0, 0), "{r:?}");
    let handled: u64 = s.iter().map(|s| s.stats().requests_handled).sum();
    assert_eq!(handled, 0, "striped puts and gets are one-sided too");
}

#[test]
fn zero_copy_puts_and_gets_move_values_straight_between_registered_memory_and_the_servers() {
    let lease = Duration::from_secs(10);
    let big = |node| {
        let listen = SocketAddr::new(listen_ip(), 0);
        server_of(node, lease, 32 << 20, listen).expect("server starts")
    };
    let s: Vec<MemoryServer> = (1..=3).map(big).collect();
    let refs: Vec<&MemoryServer> = s.iter().collect();
    let st = store(&refs, 1, 2);
    let pd = st.pool().pd();
    let region = |len: usize| Arc::new(pd.alloc_mr(len, AccessFlags::LOCAL_WRITE).unwrap());
    for (name, len) in [("small", 4000usize), ("striped", 3 << 20)] {
        let bytes = value(len, len);
        let src = region(len);
        src.write_at(0, &bytes).unwrap();
        st.block_on(st.put_from(name.as_bytes(), &Mr::share(&src)))
            .unwrap();
        // Read back into a larger buffer, and by the copying get; and the other way round.
        let out = region(len + 100);
        let got = st
            .block_on(st.get_into(name.as_bytes(), &Mr::share(&out)))
            .unwrap();
        assert_eq!(got, Some(len), "{name}");
        let mut back = vec![0u8; len];
        out.read_at(0, &mut back).unwrap();
        assert!(back == bytes, "{name}: the bytes put_from wrote");
        assert!(
            st.block_on(st.get(name.as_bytes())).unwrap().unwrap() == bytes,
            "{name}"
        );
        let copied = format!("{name}-copied");
        st.block_on(st.put(copied.as_bytes(), &bytes)).unwrap();
        let out2 = region(len);
        let got = st.block_on(st.get_into(copied.as_bytes(), &Mr::share(&out2)));
        assert_eq!(got.unwrap(), Some(len));
        out2.read_at(0, &mut back).unwrap();
        assert!(back == bytes, "{name}: get_into of a copying put");
        // Too small a buffer: a typed refusal.
        let small = region(len - 1);
        let r = st.block_on(st.get_into(name.as_bytes(), &Mr::share(&small)));
        assert!(matches!(r, Err(Error::OutOfBounds { .. })), "{name}: {r:?}");
        // A sub-range of a region is a value too.
        let part = Mr::share_range(&src, 10, 100).unwrap();
        st.block_on(st.put_from(b"sub", &part)).unwrap();
        assert_eq!(
            st.block_on(st.get(b"sub")).unwrap().unwrap(),
            &bytes[10..110]
        );
    }
    // A damaged replica is read around, a removed key and a missing one are None.
    let at = st.block_on(st.locate(b"small")).unwrap();
    let p = st.pool();
    let damaged = at[0].block;
    let buf = Arc::new(p.pd().alloc_mr(8, AccessFlags::LOCAL_WRITE).unwrap());
    buf.write_at(0, &[0xEE]).unwrap();
    let (r, _) = p.block_on(p.write(damaged, damaged.len - 1, buf, 0, 1));
    r.unwrap();
    let out = region(4000);
    assert_eq!(
        st.block_on(st.get_into(b"small", &Mr::share(&out)))
            .unwrap(),
        Some(4000)
    );
    let mut back = vec![0u8; 4000];
    out.read_at(0, &mut back).unwrap();
    assert!(back == value(4000, 4000), "read from the sound replica");
    assert!(st.block_on(st.remove(b"small")).unwrap());
    assert_eq!(
        st.block_on(st.get_into(b"small", &Mr::share(&out)))
            .unwrap(),
        None
    );
    assert_eq!(
        st.block_on(st.get_into(b"never", &Mr::share(&out)))
            .unwrap(),
        None
    );
    let handled: u64 = s.iter().map(|s| s.stats().requests_handled).sum();
    assert_eq!(handled, 0);
}
