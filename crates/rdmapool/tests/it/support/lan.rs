//! Hosts on one LAN for multi-host tests: a network namespace per host, each with a veth
//! into a bridge in a switch namespace (made here, removed on drop). Needs root and
//! iproute2.

use std::process::Command;

/// Runs a command; whether it succeeded.
pub fn sh(args: &[&str]) -> bool {
    Command::new(args[0])
        .args(&args[1..])
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Hosts on one LAN: a namespace per host, each with a veth into a bridge that lives in a
/// switch namespace. Nothing touches the machine's own interfaces.
pub struct Lan {
    switch: String,
    /// (namespace, address) of each host.
    pub hosts: Vec<(String, String)>,
}

impl Lan {
    /// `n` hosts, or why they cannot be made here (not root, no `ip`).
    pub fn new(n: usize) -> Result<Self, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root".into());
        }
        if !sh(&["ip", "-V"]) {
            return Err("iproute2's ip not installed".into());
        }
        // Unique names: tests of one binary run at once, each with a LAN of its own.
        static LANS: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let k = LANS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = format!("{}-{k}", std::process::id());
        let subnet = format!("10.{}.{}", 100 + k % 100, std::process::id() % 250);
        let lan = Lan {
            switch: format!("rpsw-{id}"),
            hosts: (1..=n)
                .map(|i| (format!("rph{i}-{id}"), format!("{subnet}.{i}")))
                .collect(),
        };
        let sw = lan.switch.clone();
        let mut ok = sh(&["ip", "netns", "add", &sw])
            && sh(&["ip", "-n", &sw, "link", "add", "br0", "type", "bridge"])
            && sh(&["ip", "-n", &sw, "link", "set", "br0", "up"]);
        for (i, (ns, addr)) in lan.hosts.iter().enumerate() {
            let (h, b) = (format!("rph{i}"), format!("rpb{i}"));
            ok = ok
                && sh(&["ip", "netns", "add", ns])
                && sh(&[
                    "ip", "-n", &sw, "link", "add", &b, "type", "veth", "peer", "name", &h,
                ])
                && sh(&["ip", "-n", &sw, "link", "set", &h, "netns", ns])
                && sh(&["ip", "-n", &sw, "link", "set", &b, "master", "br0"])
                && sh(&["ip", "-n", &sw, "link", "set", &b, "up"])
                && sh(&[
                    "ip",
                    "-n",
                    ns,
                    "addr",
                    "add",
                    &format!("{addr}/24"),
                    "dev",
                    &h,
                ])
                && sh(&["ip", "-n", ns, "link", "set", &h, "up"])
                && sh(&["ip", "-n", ns, "link", "set", "lo", "up"]);
        }
        if ok {
            Ok(lan)
        } else {
            Err("creating the namespaces failed".into())
        }
    }
}

impl Drop for Lan {
    fn drop(&mut self) {
        for (ns, _) in &self.hosts {
            sh(&["ip", "netns", "del", ns]);
        }
        sh(&["ip", "netns", "del", &self.switch]);
    }
}
