//! `rdma-tool cli-spec` (hidden): every argument of every subcommand as one JSON line, read
//! from the clap definitions, so that tests cover flags added later without listing them.

use clap::builder::ValueParser;
use std::any::TypeId;
use std::time::Duration;

/// Whether `parser` produces a number (counts, sizes, ids, percentiles) or a duration.
fn numeric(parser: &ValueParser) -> bool {
    let id = parser.type_id();
    [
        TypeId::of::<u8>(),
        TypeId::of::<u16>(),
        TypeId::of::<u32>(),
        TypeId::of::<u64>(),
        TypeId::of::<usize>(),
        TypeId::of::<i32>(),
        TypeId::of::<i64>(),
        TypeId::of::<f32>(),
        TypeId::of::<f64>(),
        TypeId::of::<Duration>(),
    ]
    .into_iter()
    .any(|t| id == t)
}

/// One line per argument: `{"command": ["bench", "data"], "arg": "--iters", "positional":
/// false, "numeric": true, "duration": false, "hidden": false}`; for a positional, `arg` is
/// its value name (`SIZE`). `--help` and `--version` are left out.
pub fn lines(root: &clap::Command) -> Vec<String> {
    let mut out = Vec::new();
    walk(root, &mut Vec::new(), false, &mut out);
    out
}

fn walk(cmd: &clap::Command, path: &mut Vec<String>, hidden: bool, out: &mut Vec<String>) {
    for arg in cmd.get_arguments() {
        let id = arg.get_id().as_str();
        if matches!(id, "help" | "version") || !arg.get_action().takes_values() {
            continue;
        }
        let positional = arg.is_positional();
        let name = match (positional, arg.get_long()) {
            (false, Some(long)) => format!("--{long}"),
            _ => arg
                .get_value_names()
                .and_then(|v| v.first())
                .map_or_else(|| id.to_uppercase(), |v| v.to_string()),
        };
        let parser = arg.get_value_parser();
        out.push(
            serde_json::json!({
                "command": path,
                "arg": name,
                "positional": positional,
                "numeric": numeric(parser),
                "duration": parser.type_id() == TypeId::of::<Duration>(),
                "hidden": hidden || arg.is_hide_set(),
            })
            .to_string(),
        );
    }
    for sub in cmd.get_subcommands() {
        if sub.get_name() == "help" {
            continue;
        }
        path.push(sub.get_name().to_string());
        walk(sub, path, hidden || sub.is_hide_set(), out);
        path.pop();
    }
}
