//! Sizes with K/M/G suffixes ("8", "4K", "1M").

use crate::{Result, ToolError};

/// Parses one size: digits with an optional K, M or G (powers of 1024).
pub fn parse_size(s: &str) -> Result<usize> {
    let s = s.trim();
    let (digits, mult) = match s.chars().last() {
        Some('k' | 'K') => (&s[..s.len() - 1], 1usize << 10),
        Some('m' | 'M') => (&s[..s.len() - 1], 1 << 20),
        Some('g' | 'G') => (&s[..s.len() - 1], 1 << 30),
        _ => (s, 1),
    };
    let n: usize = digits.parse().map_err(|_| {
        ToolError::Msg(format!(
            "bad size {s:?}: want digits with an optional K, M or G"
        ))
    })?;
    n.checked_mul(mult).filter(|&v| v > 0).ok_or_else(|| {
        ToolError::Msg(format!(
            "bad size {s:?}: must be positive and fit in memory"
        ))
    })
}

/// Parses a comma-separated list of sizes.
pub fn parse_sizes(s: &str) -> Result<Vec<usize>> {
    s.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(parse_size)
        .collect()
}

/// Shows a size the way it was probably written.
pub fn show(n: usize) -> String {
    match n {
        n if n >= 1 << 30 && n % (1 << 30) == 0 => format!("{}G", n >> 30),
        n if n >= 1 << 20 && n % (1 << 20) == 0 => format!("{}M", n >> 20),
        n if n >= 1 << 10 && n % (1 << 10) == 0 => format!("{}K", n >> 10),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_suffixes_and_reject_garbage() {
        assert_eq!(
            parse_sizes("8,4K,1M,2g").unwrap(),
            vec![8, 4096, 1 << 20, 2 << 30]
        );
        assert!(parse_size("0").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
        assert_eq!(show(4096), "4K");
        assert_eq!(show(100), "100");
    }
}
