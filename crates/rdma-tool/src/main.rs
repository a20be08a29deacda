//! `rdma-tool`: rdmapool's command-line tool.

#[macro_use]
mod output;
mod bench;
mod cli_spec;
mod demo;
mod device_args;
mod devices;
mod error;
mod etcd_args;
mod monitor;
mod peer;
mod plot;
mod pool;
mod progress;
mod serve;
mod signals;
mod store;
mod stress;
mod units;

pub use error::{Result, ToolError};

use clap::{Parser, Subcommand};
use std::io::Write;

/// RDMA memory tool: devices, a two-process demo, and benchmarks.
///
/// Exit codes: 0 success; 1 the command failed (the message says why and what to change);
/// 2 bad command-line usage.
#[derive(Parser)]
#[command(name = "rdma-tool", version, about, long_about = None, after_help = "Exit codes: 0 success, 1 the command failed (the message names the cause), 2 bad usage.")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List providers and devices with their limits.
    Devices(devices::Args),
    /// Two processes (soft by default, or --provider verbs): register, exchange the region
    /// descriptor, then WRITE, READ back, CAS and FAA, verifying every result.
    Demo(demo::Args),
    /// Register and deregister memory from many threads through the asynchronous
    /// registrar; report throughput, latency percentiles, failures and retries.
    Stress(stress::Args),
    /// Shows a running process's metrics live (its `rdmapool_exporter::Endpoint`: a Unix
    /// socket or http://127.0.0.1:PORT), or, with no --target, those of a probe workload
    /// run here (on --provider/--device, soft by default).
    Monitor(monitor::Args),
    /// Runs a memory server of the cross-node pool: prints `listening <addr> node <id> ...`
    /// on stdout, serves until SIGINT/SIGTERM (or until stdin closes, when stdin is a pipe,
    /// a socket or a terminal), then drains.
    Serve(serve::Args),
    /// A one-shot client of the cross-node pool: alloc, write, read, cas, faa, free, stats
    ///
    /// Leases: every allocation belongs to the client id that made it and lives while that
    /// client's lease is renewed. A `pool` process renews only while it runs, so what
    /// `pool alloc` allocated is taken back by the server one lease (`serve --lease`)
    /// after the process exits, unless a process with the same --client-id connects again
    /// before then: it finds the allocations and keeps them alive. Reconnecting with an id
    /// waits half a lease first (to make sure no live process holds it), so a later command
    /// must start within about half a lease of the previous one. For longer pauses give the
    /// server a longer lease, or run many commands in one process with `pool shell`.
    #[command(verbatim_doc_comment)]
    Pool(pool::Args),
    /// Makes the key of one client id from the pool's cluster key (RDMAPOOL_POOL_KEY_FILE):
    /// a client given it (RDMAPOOL_POOL_CLIENT_KEY_FILE) can prove that id to the servers,
    /// and no other id, without holding the cluster key.
    ClientKey(pool::ClientKeyArgs),
    /// A one-shot client of the replicated object store on the pool's servers: put, get,
    /// rm, ls, stats (docs/STORE.md). Objects belong to the store, not to the client id.
    Store(store::Args),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(bench::Command),
    /// Prints a shell completion script: `rdma-tool completions bash > /etc/bash_completion.d/rdma-tool`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Prints the man page (roff): `rdma-tool man > rdma-tool.1; man ./rdma-tool.1`.
    Man,
    /// (internal) The target side of `demo` and `bench`: exports a region and serves it.
    #[command(hide = true)]
    Peer(peer::Args),
    /// (internal) Every subcommand's arguments as JSON lines, from the clap definitions:
    /// the tests run hostile values through each numeric one.
    #[command(hide = true)]
    CliSpec,
}

fn main() {
    use std::io::IsTerminal;
    // The soft NIC's exposure warning is kept out of tracing: the library prints it to
    // stderr itself (plainly, once per NIC), so a second, coloured copy through tracing
    // would only repeat it (its module logs nothing else). RDMAPOOL_LOG sets the rest.
    let filter = tracing_subscriber::EnvFilter::try_from_env("RDMAPOOL_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"))
        .add_directive(
            "rdmapool_soft::context=error"
                .parse()
                .expect("a valid directive"),
        );
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        // Its report of a failed write is an eprintln!, which panics when stderr is full.
        .log_internal_errors(false)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Devices(a) => devices::run(a),
        Command::Demo(a) => demo::run(a),
        Command::Stress(a) => stress::run(a),
        Command::Monitor(a) => monitor::run(a),
        Command::Serve(a) => serve::run(a),
        Command::Pool(a) => pool::run(a),
        Command::ClientKey(a) => pool::client_key_command(a),
        Command::Store(a) => store::run(a),
        Command::Bench(c) => bench::run(c),
        Command::Peer(a) => peer::run(a),
        Command::Completions { shell } => {
            // Into a buffer first: clap_complete panics when its writer fails.
            let mut cmd = <Cli as clap::CommandFactory>::command();
            let mut buf = Vec::new();
            clap_complete::generate(shell, &mut cmd, "rdma-tool", &mut buf);
            output::write_all(&buf);
            Ok(())
        }
        Command::Man => {
            let mut buf = Vec::new();
            clap_mangen::Man::new(<Cli as clap::CommandFactory>::command())
                .render(&mut buf)
                .map_err(|e| ToolError::Io("man page".into(), e))
                .map(|()| output::write_all(&buf))
        }
        Command::CliSpec => {
            for line in cli_spec::lines(&<Cli as clap::CommandFactory>::command()) {
                outln!("{line}");
            }
            Ok(())
        }
    };
    match result {
        Ok(()) => output::flush(),
        Err(ToolError::Io(what, e)) if what == "stdout" && output::is_closed_pipe(&e) => {
            std::process::exit(0)
        }
        Err(e) => {
            let code = if matches!(e, ToolError::Usage(_)) {
                2
            } else {
                1
            };
            let _ = writeln!(std::io::stderr(), "rdma-tool: {e}");
            std::process::exit(code);
        }
    }
}
