//! etcd over TLS with users: only holders of the credentials get in.

use super::*;
use rdmapool::CoreError;

/// Issue #22 ("support etcd's own TLS and user/password auth"): against a real etcd that
/// serves TLS only, asks for client certificates and has authentication on, a server with
/// the CA, a client certificate and the user's password registers and a follower joins it;
/// everyone short of one of these is refused with `Unauthenticated` naming etcd, and so
/// cannot add, rewrite or remove a member. A token etcd forgot (simple tokens expire after
/// `--auth-token-ttl` of disuse) is renewed without the caller seeing it.
#[test]
fn etcd_over_tls_with_authentication_admits_only_holders_of_the_credentials() {
    let Some((etcd, pki)) = Etcd::start_tls("tls", 1) else {
        return;
    };
    etcd.enable_auth("r00t-pw");
    let mut cfg = etcd.config("/rdmapool/test-tls");
    cfg.credentials = Some(EtcdCredentials::new("root", "r00t-pw").unwrap());

    // Everything short of the full set is refused, and says who refused and why.
    let refused = |what: &str, c: &EtcdConfig| {
        let r = EtcdRegistration::register(c, 9, "127.0.0.1:1".parse().unwrap());
        match r {
            Err(Error::Unauthenticated { peer, reason }) => {
                assert!(peer.contains(&etcd.url), "{what}: names {peer}");
                eprintln!("{what}: refused: {reason}");
                reason
            }
            Err(e) => panic!("{what}: {e} (want Unauthenticated)"),
            Ok(_) => panic!("{what}: registered"),
        }
    };
    let mut no_user = cfg.clone();
    no_user.credentials = None;
    assert!(refused("no user", &no_user).contains("user name is empty"));
    let mut bad_password = cfg.clone();
    bad_password.credentials = Some(EtcdCredentials::new("root", "guess").unwrap());
    assert!(refused("a wrong password", &bad_password).contains("authentication failed"));
    let mut web_roots = cfg.clone();
    web_roots.tls = Some(EtcdTls {
        ca_file: None,
        ..pki.client()
    });
    assert!(refused("the web's roots", &web_roots).contains("TLS"));
    let mut other_ca = cfg.clone();
    other_ca.tls = Some(EtcdTls {
        ca_file: Some(pki.other_ca.clone()),
        ..pki.client()
    });
    assert!(refused("another CA", &other_ca).contains("TLS"));
    let mut no_client_cert = cfg.clone();
    no_client_cert.tls = Some(EtcdTls {
        ca_file: Some(pki.ca.clone()),
        ..EtcdTls::default()
    });
    // etcd ends the TLS connection after the handshake (TLS 1.3 sends its alert then), so
    // this side sees the connection break as it sends: a connection error with a hint.
    match EtcdRegistration::register(&no_client_cert, 9, "127.0.0.1:1".parse().unwrap()) {
        Err(Error::Core(CoreError::Connection { reason, .. }))
        | Err(Error::Unauthenticated { reason, .. }) => {
            eprintln!("no client certificate: refused: {reason}");
            assert!(reason.contains("cert"), "{reason}");
        }
        Err(e) => panic!("no client certificate: {e}"),
        Ok(_) => panic!("no client certificate: registered"),
    }
    let mut plain = cfg.clone();
    plain.tls = None;
    plain.endpoints = vec![etcd.url.replace("https://", "http://")];
    assert!(
        EtcdMembership::new(&plain).unwrap().servers().is_err(),
        "plain HTTP to a TLS port"
    );
    // A client key that others may read is refused before any connection, as ssh does.
    {
        use std::os::unix::fs::PermissionsExt;
        let open = pki.client_key.with_extension("open");
        std::fs::copy(&pki.client_key, &open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
        let mut c = cfg.clone();
        c.tls = Some(EtcdTls {
            key_file: Some(open),
            ..pki.client()
        });
        match EtcdMembership::new(&c) {
            Err(Error::Core(CoreError::BadKey { reason, .. })) => {
                assert!(reason.contains("chmod 600"), "{reason}")
            }
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("a key file of mode 0644 was taken"),
        }
    }

    // A key that is not the certificate's is refused up front (ureq 3.5 would panic on it
    // at the first connection).
    let mut mismatched = cfg.clone();
    mismatched.tls = Some(EtcdTls {
        key_file: Some(pki.server_key.clone()),
        ..pki.client()
    });
    match EtcdMembership::new(&mismatched) {
        Err(Error::Core(CoreError::BadKey { reason, .. })) => {
            assert!(reason.contains("KeyMismatch"), "{reason}")
        }
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("a key of another certificate was taken"),
    }

    // With all of it: a server registers, a client finds it and follows the prefix.
    let (_s1, _r1) = registered(&cfg, 1);
    let members = EtcdMembership::new(&cfg).unwrap();
    let c = client(&members, 31, Box::new(RoundRobin::default()));
    assert_eq!(node_ids(&c), vec![1]);
    let follower = members.follow(c.clone()).unwrap();

    // Unused for longer than the token's TTL, a gateway logs in again on its own.
    let idle = EtcdMembership::new(&cfg).unwrap();
    assert_eq!(idle.servers().unwrap().len(), 1);
    std::thread::sleep(Duration::from_millis(2500));
    assert_eq!(
        idle.servers().expect("an expired token is renewed").len(),
        1
    );

    // A second server registers: the follower (over TLS, as the user) joins it.
    let (_s2, _r2) = registered(&cfg, 2);
    wait_until("the follower joins the second server", || {
        node_ids(&c).contains(&2)
    });
    let on: Vec<u32> = (0..8)
        .map(|_| c.block_on(c.alloc(4096, None)).unwrap().node)
        .collect();
    assert!(on.contains(&1) && on.contains(&2), "allocations on {on:?}");
    assert_eq!(
        c.block_on(c.fetch_and_add(c.block_on(c.alloc(64, None)).unwrap(), 0, 7))
            .unwrap(),
        0
    );
    drop(follower);
}
