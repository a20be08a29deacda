//! Reading numbers out of a Markdown document, for the tests that hold docs/PROTOCOL.md to
//! the code in each crate (`doc_check.rs`): the document is read at compile time there, and
//! the versions and size limits it states must equal the constants they describe.

/// The text of section `n`: from its heading (`## n. `) to the next `## ` heading.
pub fn section(doc: &str, n: u32) -> &str {
    let head = format!("\n## {n}. ");
    let start = doc
        .find(&head)
        .unwrap_or_else(|| panic!("the document has no section {n}"))
        + 1;
    let end = doc[start + head.len()..]
        .find("\n## ")
        .map_or(doc.len(), |e| start + head.len() + e);
    &doc[start..end]
}

/// Every number written right after `prefix` in `text`, in order (a prefix followed by no
/// digit is skipped).
pub fn numbers_after(text: &str, prefix: &str) -> Vec<u64> {
    text.match_indices(prefix)
        .filter_map(|(at, _)| {
            let rest = &text[at + prefix.len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            digits.parse().ok()
        })
        .collect()
}

/// Asserts that `prefix` appears in `text` followed by a number at least once, and that
/// every such number is `want`.
pub fn all_say(text: &str, prefix: &str, want: u64, what: &str) {
    let found = numbers_after(text, prefix);
    assert!(
        !found.is_empty(),
        "the document no longer says `{prefix}N` ({what}); update this test with it"
    );
    assert!(
        found.iter().all(|&n| n == want),
        "the document says {what} is {found:?} (`{prefix}N`); the code says {want}"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_helpers_find_what_they_look_for() {
        let doc = "x\n## 1. One\nversion = 1, version = 12\n## 2. Two\nversion = 2\n";
        assert_eq!(numbers_after(section(doc, 1), "version = "), [1, 12]);
        assert_eq!(numbers_after(section(doc, 2), "version = "), [2]);
        assert!(std::panic::catch_unwind(|| all_say(doc, "version = ", 1, "v")).is_err());
        assert!(std::panic::catch_unwind(|| all_say(doc, "absent ", 1, "v")).is_err());
    }
}
