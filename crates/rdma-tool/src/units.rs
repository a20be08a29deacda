//! Sizes and durations, for every flag that takes one and every table that shows one.
//!
//! Sizes: digits with an optional K, M, G or T (powers of 1024), an optional trailing `B`
//! or `iB` (`8`, `4K`, `512M`, `1GiB`). Durations: a number with us, ms, s or m (`250us`,
//! `500ms`, `1.5s`, `2m`); a bare number is seconds. The `*_arg` functions are clap value
//! parsers, so a bad value is a usage error (exit code 2) that says what is wanted; clap
//! names the flag. Every numeric flag has a bound checked here, at parse time, so that no
//! value can make a command allocate without limit, overflow or panic later.

/// The largest size any flag takes (1T): more than any region this tool could register.
pub const MAX_SIZE: usize = 1 << 40;
/// The largest message or object size (`bench data --size`, `bench pool --*-size`): 1G.
pub const MAX_MESSAGE: usize = 1 << 30;
/// The longest duration any flag takes: a year (8760h).
pub const MAX_DURATION: Duration = Duration::from_secs(365 * 24 * 3600);

use crate::{Result, ToolError};
use std::time::Duration;

/// Parses one size: digits with an optional K, M, G or T (powers of 1024), optionally
/// followed by `B` or `iB`.
pub fn parse_size(s: &str) -> Result<usize> {
    let t = s.trim();
    let t = t
        .strip_suffix("iB")
        .or_else(|| t.strip_suffix("ib"))
        .or_else(|| {
            t.strip_suffix(['B', 'b'])
                .filter(|r| r.ends_with(char::is_alphabetic))
        })
        .unwrap_or(t);
    let (digits, shift) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 30),
        Some('t' | 'T') => (&t[..t.len() - 1], 40),
        _ => (t.strip_suffix(['B', 'b']).unwrap_or(t), 0),
    };
    let n: usize = digits.parse().map_err(|_| {
        ToolError::Msg(format!(
            "bad size {s:?}: want digits with an optional K, M, G or T (e.g. 4K, 512M, 1G)"
        ))
    })?;
    let n = n.checked_mul(1usize << shift).filter(|&v| v <= MAX_SIZE);
    match n {
        Some(0) => Err(ToolError::Msg(format!(
            "bad size {s:?}: must be at least 1 byte"
        ))),
        Some(v) => Ok(v),
        None => Err(ToolError::Msg(format!(
            "bad size {s:?}: too large, at most {}",
            show(MAX_SIZE)
        ))),
    }
}

/// [`parse_size`] up to [`MAX_MESSAGE`], as a clap value parser.
pub fn message_size_arg(s: &str) -> std::result::Result<usize, String> {
    let n = size_arg(s)?;
    if n > MAX_MESSAGE {
        return Err(format!(
            "bad size {s:?}: too large, at most {}",
            show(MAX_MESSAGE)
        ));
    }
    Ok(n)
}

/// A clap value parser for a count from 1 to `max` (`u64`): `0`, `-1`, `10Q` and values
/// past `max` are usage errors that name the flag and the range.
pub fn count_arg(max: u64) -> clap::builder::RangedU64ValueParser<u64> {
    clap::value_parser!(u64).range(1..=max)
}

/// [`count_arg`] for a `usize` (threads, clients, list lengths).
pub fn usize_arg(max: usize) -> clap::builder::RangedU64ValueParser<usize> {
    clap::builder::RangedU64ValueParser::<usize>::new().range(1..=max as u64)
}

/// Milliseconds for the deprecated `--*-ms` flags: from 1 to [`MAX_DURATION`].
pub fn millis_arg(s: &str) -> std::result::Result<u64, String> {
    let max = MAX_DURATION.as_millis() as u64;
    match s.trim().parse::<u64>() {
        Ok(0) => Err("must be positive".into()),
        Ok(n) if n > max => Err(format!("too large, at most {max} (a year)")),
        Ok(n) => Ok(n),
        Err(e) => Err(format!("{s:?}: {e} (want whole milliseconds)")),
    }
}

/// Seconds as a decimal number for the deprecated `bench pool --secs`: more than 0, at
/// most 600.
pub fn secs_arg(s: &str) -> std::result::Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 600.0 => Ok(v),
        Ok(_) => Err(format!(
            "{s:?}: between 0 and 600 seconds (better: --duration 1s)"
        )),
        Err(e) => Err(format!("{s:?}: {e} (want seconds)")),
    }
}

/// A percentile in (0, 100], as a clap value parser.
pub fn percentile_arg(s: &str) -> std::result::Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 100.0 => Ok(v),
        Ok(_) => Err(format!("{s:?}: a percentile is above 0 and at most 100")),
        Err(e) => Err(format!("{s:?}: {e} (want e.g. 50, 99 or 99.9)")),
    }
}

/// [`parse_size`] as a clap value parser (with `value_delimiter = ','` for lists).
pub fn size_arg(s: &str) -> std::result::Result<usize, String> {
    parse_size(s).map_err(|e| e.to_string())
}

/// This machine's physical memory in bytes, if the system says.
pub fn physical_memory() -> Option<u64> {
    // SAFETY: sysconf only reads system configuration; it has no memory-safety
    // preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let (pages, page) = (u64::try_from(pages).ok()?, u64::try_from(page).ok()?);
    pages.checked_mul(page).filter(|&n| n > 0)
}

/// Refuses `size` bytes for `flag` when they exceed this machine's memory: memory that is
/// touched or pinned beyond it ends in the OOM killer, not an error.
pub fn fits_in_memory(flag: &str, size: usize) -> Result<()> {
    match physical_memory() {
        Some(ram) if size as u64 > ram => Err(ToolError::Msg(format!(
            "{flag} {}: more than this machine's memory ({:.1}G)",
            show(size),
            ram as f64 / (1u64 << 30) as f64
        ))),
        _ => Ok(()),
    }
}

/// Shows a size the way it was probably written (`4K`, `1G`), exactly: a size that is not a
/// whole number of K/M/G/T is shown in bytes.
pub fn show(n: usize) -> String {
    show_u64(n as u64)
}

/// [`show`] for a `u64`.
pub fn show_u64(n: u64) -> String {
    for (shift, unit) in [(40, 'T'), (30, 'G'), (20, 'M'), (10, 'K')] {
        if n >= 1 << shift && n.is_multiple_of(1 << shift) {
            return format!("{}{unit}", n >> shift);
        }
    }
    n.to_string()
}

/// A size for a table: exact when it is a whole number of K/M/G/T (`4K`), otherwise
/// rounded to one decimal of the largest unit that fits (`1.5G`, `16.0E`).
pub fn human(n: u64) -> String {
    let exact = show_u64(n);
    if n < 1024 || !exact.chars().all(|c| c.is_ascii_digit()) {
        return exact;
    }
    let units = ['K', 'M', 'G', 'T', 'P', 'E'];
    let mut v = n as f64 / 1024.0;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    format!("{v:.1}{}", units[i])
}

/// Parses a duration: `1s`, `500ms`, `250us`, `2m`, `1.5s`; a bare number is seconds.
pub fn parse_duration(s: &str) -> std::result::Result<Duration, String> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let v: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a duration like 10s, 500ms or 2m"))?;
    let secs = match unit.trim() {
        "" | "s" => v,
        "ms" => v / 1e3,
        "us" | "µs" => v / 1e6,
        "m" | "min" => v * 60.0,
        "h" => v * 3600.0,
        u => return Err(format!("{s:?}: unknown unit {u:?} (use us, ms, s, m or h)")),
    };
    if !secs.is_finite() || secs > MAX_DURATION.as_secs_f64() {
        return Err(format!(
            "{s:?}: too long, at most {}h (a year)",
            MAX_DURATION.as_secs() / 3600
        ));
    }
    let d = Duration::from_secs_f64(secs);
    if d.is_zero() {
        return Err(format!("{s:?}: a duration must be positive"));
    }
    Ok(d)
}

/// [`parse_duration`] under the name the flags use.
pub fn duration_arg(s: &str) -> std::result::Result<Duration, String> {
    parse_duration(s)
}

/// Shows a duration compactly (`2s`, `500ms`, `1.5s`).
pub fn show_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if d.subsec_nanos() == 0 {
        format!("{}s", d.as_secs())
    } else if d.as_nanos() == ms * 1_000_000 && ms < 10_000 {
        format!("{ms}ms")
    } else {
        format!("{:.3}s", d.as_secs_f64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes_and_reject_garbage() {
        let list: Vec<usize> = "8,4K,1M,2g,1T"
            .split(',')
            .map(|s| size_arg(s).unwrap())
            .collect();
        assert_eq!(list, vec![8, 4096, 1 << 20, 2 << 30, 1 << 40]);
        assert_eq!(parse_size("512MiB").unwrap(), 512 << 20);
        assert_eq!(parse_size("1GB").unwrap(), 1 << 30);
        assert_eq!(parse_size("64B").unwrap(), 64);
        assert!(parse_size("0").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("B").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
        assert!(parse_size("2T")
            .unwrap_err()
            .to_string()
            .contains("at most 1T"));
        assert!(parse_size("0")
            .unwrap_err()
            .to_string()
            .contains("at least 1 byte"));
        assert!(message_size_arg("2G").unwrap_err().contains("at most 1G"));
        assert_eq!(millis_arg("700"), Ok(700));
        assert!(millis_arg("0").is_err() && millis_arg("18446744073709551615").is_err());
        assert!(percentile_arg("0").is_err() && percentile_arg("101").is_err());
        assert_eq!(percentile_arg("99.9"), Ok(99.9));
        assert!(secs_arg("0").is_err() && secs_arg("1e300").is_err());
        assert_eq!(show(4096), "4K");
        assert_eq!(show(100), "100");
        assert_eq!(human(1 << 40), "1T");
        assert_eq!(human(3 << 29), "1536M");
        assert_eq!(human(1_500_000_000), "1.4G");
        assert_eq!(human(u64::MAX), "16.0E");
        assert_eq!(human(1000), "1000");
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("5d").is_err());
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("1000000h")
            .unwrap_err()
            .contains("at most 8760h"));
        assert!(parse_duration("99999999999999999999")
            .unwrap_err()
            .contains("too long"));
        assert!(parse_duration("-1").is_err());
        assert_eq!(parse_duration("8760h"), Ok(MAX_DURATION));
        assert!(parse_duration("0.0000000001s").is_err());
        assert_eq!(show_duration(Duration::from_secs(2)), "2s");
        assert_eq!(show_duration(Duration::from_millis(500)), "500ms");
        assert_eq!(show_duration(Duration::from_millis(1500)), "1500ms");
    }
}
