//! Sizes and durations, for every flag that takes one and every table that shows one.
//!
//! Sizes: digits with an optional K, M, G or T (powers of 1024), an optional trailing `B`
//! or `iB` (`8`, `4K`, `512M`, `1GiB`). Durations: a number with us, ms, s or m (`250us`,
//! `500ms`, `1.5s`, `2m`); a bare number is seconds. The `*_arg` functions are clap value
//! parsers, so a bad value is a usage error (exit code 2) that says what is wanted.

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
    n.checked_mul(1usize << shift)
        .filter(|&v| v > 0)
        .ok_or_else(|| {
            ToolError::Msg(format!(
                "bad size {s:?}: must be positive and fit in memory"
            ))
        })
}

/// [`parse_size`] as a clap value parser (with `value_delimiter = ','` for lists).
pub fn size_arg(s: &str) -> std::result::Result<usize, String> {
    parse_size(s).map_err(|e| e.to_string())
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
    if !(secs.is_finite() && secs > 0.0 && secs < 1e9) {
        return Err(format!("{s:?}: a duration must be positive"));
    }
    Ok(Duration::from_secs_f64(secs))
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
        assert_eq!(show_duration(Duration::from_secs(2)), "2s");
        assert_eq!(show_duration(Duration::from_millis(500)), "500ms");
        assert_eq!(show_duration(Duration::from_millis(1500)), "1500ms");
    }
}
