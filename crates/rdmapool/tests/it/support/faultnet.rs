//! A faulty link between two network namespaces, made in user space: two TUN devices, one
//! in each namespace, addressed as a point-to-point pair, and a relay thread that reads each
//! IP packet from one and writes it to the other, after losing, delaying, reordering or
//! duplicating it as configured (the kernel here has no sch_netem). A partition switch drops
//! everything. The RNG is seeded, so a run's decisions are reproducible given the same
//! packet sequence, and every decision is counted so a test can show its faults happened.
//!
//! Needs root (namespaces, /dev/net/tun). Nothing touches the machine's own interfaces: the
//! TUN devices are created with unique names and moved into the namespaces at once.
#![allow(dead_code)]

use std::collections::BinaryHeap;
use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The two ends' addresses (each inside its own namespace, so they never clash).
pub const ADDR_A: &str = "10.77.0.1";
pub const ADDR_B: &str = "10.77.0.2";

/// What the relay does to each packet (both directions alike).
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    /// Packets dropped, in percent.
    pub loss_pct: f64,
    /// Delay added to every packet.
    pub delay_ms: u64,
    /// The delay varies uniformly by up to this much either way (never below zero).
    pub jitter_ms: u64,
    /// Packets held back an extra `4 * delay + 5` ms so later ones overtake them, in percent.
    pub reorder_pct: f64,
    /// Packets sent twice, in percent.
    pub duplicate_pct: f64,
}

/// What the relay did so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Packets read from either TUN.
    pub seen: u64,
    /// Written to the other side (duplicates included).
    pub forwarded: u64,
    /// Dropped by `loss_pct`.
    pub dropped: u64,
    /// Dropped because the link was partitioned.
    pub partitioned: u64,
    /// Held for a non-zero delay.
    pub delayed: u64,
    /// Sent twice.
    pub duplicated: u64,
    /// Delivered after a packet that was read later in the same direction (really
    /// reordered on the wire, whatever caused it: hold-back or jitter).
    pub reordered: u64,
    /// Writes the kernel refused (e.g. the interface already gone).
    pub write_errors: u64,
}

impl std::fmt::Display for Counts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "packets seen={} forwarded={} dropped={} partitioned={} delayed={} duplicated={} reordered={}",
            self.seen,
            self.forwarded,
            self.dropped,
            self.partitioned,
            self.delayed,
            self.duplicated,
            self.reordered
        )
    }
}

#[derive(Default)]
struct Counters {
    seen: AtomicU64,
    forwarded: AtomicU64,
    dropped: AtomicU64,
    partitioned: AtomicU64,
    delayed: AtomicU64,
    duplicated: AtomicU64,
    reordered: AtomicU64,
    write_errors: AtomicU64,
}

struct Shared {
    faults: Mutex<Faults>,
    partition: AtomicBool,
    counts: Counters,
}

/// Two namespaces joined by the relay. Dropping it stops the relay and deletes both.
pub struct FaultNet {
    /// Namespace names (ends A and B).
    pub ns_a: String,
    pub ns_b: String,
    shared: Arc<Shared>,
    stop: Option<OwnedFd>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn sh(args: &[&str]) -> bool {
    Command::new(args[0])
        .args(&args[1..])
        .stdout(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Opens a new TUN device named `name` (IFF_TUN | IFF_NO_PI: the fd carries bare IP
/// packets), non-blocking.
fn open_tun(name: &str) -> std::io::Result<OwnedFd> {
    let f: File = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/net/tun")?;
    // SAFETY: all-zero is a valid ifreq (an empty name, zero flags).
    let mut req: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in req.ifr_name.iter_mut().zip(name.bytes().take(15)) {
        *d = s as libc::c_char;
    }
    req.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: TUNSETIFF reads and writes one ifreq, which lives on our stack.
    if unsafe { libc::ioctl(f.as_raw_fd(), libc::TUNSETIFF, &mut req) } < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fcntl on a descriptor we own.
    unsafe {
        let fl = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        libc::fcntl(f.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK);
    }
    Ok(f.into())
}

impl FaultNet {
    /// Makes namespaces `<tag>a-<pid>` and `<tag>b-<pid>` joined by the relay (no faults
    /// yet). Err says why not (not root, no `ip`, no TUN).
    pub fn new(tag: &str, seed: u64) -> Result<Self, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root".into());
        }
        if !sh(&["ip", "-V"]) {
            return Err("iproute2's ip not installed".into());
        }
        let id = std::process::id();
        let (ns_a, ns_b) = (format!("{tag}a-{id}"), format!("{tag}b-{id}"));
        let shared = Arc::new(Shared {
            faults: Mutex::new(Faults::default()),
            partition: AtomicBool::new(false),
            counts: Counters::default(),
        });
        let mut net = FaultNet {
            ns_a,
            ns_b,
            shared,
            stop: None,
            thread: None,
        };
        let mut tuns = Vec::new();
        for (ns, me, peer, end) in [
            (net.ns_a.clone(), ADDR_A, ADDR_B, 'a'),
            (net.ns_b.clone(), ADDR_B, ADDR_A, 'b'),
        ] {
            // Unique in the root namespace for the moment it lives there.
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let dev = format!("rpf{end}{}x{n}", id % 1_000_000);
            let dev = &dev[..dev.len().min(15)];
            let fd = open_tun(dev).map_err(|e| format!("TUN device: {e}"))?;
            let ok = sh(&["ip", "netns", "add", &ns])
                && sh(&["ip", "-n", &ns, "link", "set", "lo", "up"])
                && sh(&["ip", "link", "set", dev, "netns", &ns])
                && sh(&[
                    "ip",
                    "-n",
                    &ns,
                    "addr",
                    "add",
                    &format!("{me}/32"),
                    "peer",
                    peer,
                    "dev",
                    dev,
                ])
                && sh(&["ip", "-n", &ns, "link", "set", dev, "up"]);
            if !ok {
                return Err(format!("setting up namespace {ns} failed"));
            }
            tuns.push(fd);
        }
        let mut p = [0i32; 2];
        // SAFETY: pipe2 fills two descriptors into our array.
        if unsafe { libc::pipe2(p.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
            return Err("pipe2 failed".into());
        }
        // SAFETY: pipe2 just gave us these two descriptors; each is owned once.
        let (rx, tx) = unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) };
        let b = tuns.pop().unwrap();
        let a = tuns.pop().unwrap();
        let shared = net.shared.clone();
        net.thread = Some(
            std::thread::Builder::new()
                .name("faultnet-relay".into())
                .spawn(move || relay([a, b], rx, &shared, seed))
                .map_err(|e| e.to_string())?,
        );
        net.stop = Some(tx);
        Ok(net)
    }

    /// Changes what happens to packets from now on.
    pub fn set(&self, faults: Faults) {
        *self.shared.faults.lock().unwrap() = faults;
    }

    /// Cuts (true) or heals (false) the link.
    pub fn partition(&self, on: bool) {
        self.shared.partition.store(on, Ordering::Release);
    }

    pub fn counts(&self) -> Counts {
        let c = &self.shared.counts;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        Counts {
            seen: g(&c.seen),
            forwarded: g(&c.forwarded),
            dropped: g(&c.dropped),
            partitioned: g(&c.partitioned),
            delayed: g(&c.delayed),
            duplicated: g(&c.duplicated),
            reordered: g(&c.reordered),
            write_errors: g(&c.write_errors),
        }
    }

    /// Runs `f` on a thread inside namespace `ns` (sockets it opens stay in that namespace,
    /// usable from any thread afterwards).
    pub fn in_ns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
        let file = File::open(format!("/var/run/netns/{ns}")).expect("namespace file");
        std::thread::spawn(move || {
            // SAFETY: setns on this short-lived thread only, with a namespace fd we hold.
            let r = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(r, 0, "setns: {}", std::io::Error::last_os_error());
            f()
        })
        .join()
        .expect("the namespace thread")
    }
}

impl Drop for FaultNet {
    fn drop(&mut self) {
        if let Some(tx) = self.stop.take() {
            // SAFETY: one byte from our stack to a pipe we own.
            unsafe { libc::write(tx.as_raw_fd(), [1u8].as_ptr().cast(), 1) };
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        sh(&["ip", "netns", "del", &self.ns_a]);
        sh(&["ip", "netns", "del", &self.ns_b]);
    }
}

/// xorshift64*: small, seeded, good enough to decide packet fates.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn chance(&mut self, pct: f64) -> bool {
        pct > 0.0 && (self.next() % 1_000_000) as f64 <= pct * 10_000.0
    }

    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

/// A packet waiting for its time. Ordered by due time, then by arrival (a min-heap via
/// reversed comparison).
struct Held {
    due: Instant,
    order: u64,
    dir: usize,
    seq: u64,
    data: Vec<u8>,
}

impl PartialEq for Held {
    fn eq(&self, o: &Self) -> bool {
        (self.due, self.order) == (o.due, o.order)
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Held {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        (o.due, o.order).cmp(&(self.due, self.order))
    }
}

/// The relay loop: until a byte arrives on `stop`.
fn relay(tun: [OwnedFd; 2], stop: OwnedFd, shared: &Shared, seed: u64) {
    let mut rng = Rng(seed | 1);
    let c = &shared.counts;
    let mut heap: BinaryHeap<Held> = BinaryHeap::new();
    let (mut order, mut next_seq) = (0u64, [0u64; 2]);
    let mut last_out: [Option<u64>; 2] = [None, None];
    let mut buf = vec![0u8; 65536];
    let emit = |h: &Held, last_out: &mut [Option<u64>; 2]| {
        let out = &tun[1 - h.dir];
        // SAFETY: writes one packet from a live buffer to a TUN fd we own.
        let n = unsafe { libc::write(out.as_raw_fd(), h.data.as_ptr().cast(), h.data.len()) };
        if n < 0 {
            c.write_errors.fetch_add(1, Ordering::Relaxed);
            return;
        }
        c.forwarded.fetch_add(1, Ordering::Relaxed);
        match last_out[h.dir] {
            Some(m) if h.seq < m => {
                c.reordered.fetch_add(1, Ordering::Relaxed);
            }
            _ => last_out[h.dir] = Some(h.seq),
        }
    };
    loop {
        let now = Instant::now();
        while heap.peek().is_some_and(|h| h.due <= now) {
            let h = heap.pop().unwrap();
            emit(&h, &mut last_out);
        }
        let timeout = heap
            .peek()
            .map(|h| h.due.saturating_duration_since(now).as_millis() as i32 + 1)
            .unwrap_or(1000);
        let mut fds = [
            libc::pollfd {
                fd: tun[0].as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: tun[1].as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
            libc::pollfd {
                fd: stop.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            },
        ];
        // SAFETY: three valid pollfds on our stack.
        unsafe { libc::poll(fds.as_mut_ptr(), 3, timeout) };
        if fds[2].revents != 0 {
            return;
        }
        for dir in 0..2 {
            if fds[dir].revents & libc::POLLIN == 0 {
                continue;
            }
            loop {
                // SAFETY: reads at most buf.len() bytes into our buffer.
                let n =
                    unsafe { libc::read(tun[dir].as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
                if n <= 0 {
                    break;
                }
                c.seen.fetch_add(1, Ordering::Relaxed);
                let seq = next_seq[dir];
                next_seq[dir] += 1;
                if shared.partition.load(Ordering::Acquire) {
                    c.partitioned.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let f = *shared.faults.lock().unwrap();
                if rng.chance(f.loss_pct) {
                    c.dropped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let copies = if rng.chance(f.duplicate_pct) {
                    c.duplicated.fetch_add(1, Ordering::Relaxed);
                    2
                } else {
                    1
                };
                for _ in 0..copies {
                    let jitter = rng.below(2 * f.jitter_ms + 1) as i64 - f.jitter_ms as i64;
                    let mut ms = (f.delay_ms as i64 + jitter).max(0) as u64;
                    if rng.chance(f.reorder_pct) {
                        ms += 4 * f.delay_ms + 5;
                    }
                    let h = Held {
                        due: Instant::now() + Duration::from_millis(ms),
                        order,
                        dir,
                        seq,
                        data: buf[..n as usize].to_vec(),
                    };
                    order += 1;
                    if ms == 0 {
                        emit(&h, &mut last_out);
                    } else {
                        c.delayed.fetch_add(1, Ordering::Relaxed);
                        heap.push(h);
                    }
                }
            }
        }
    }
}
