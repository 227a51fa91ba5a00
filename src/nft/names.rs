//! Chain and set names derived from user data: a hash keeps them unique and injection-free,
//! a sanitised suffix keeps them readable in `nft list`.

use data_encoding::BASE32_NOPAD;
use sha2::{Digest, Sha256};

/// nft identifiers are limited; stay well under NFT_NAME_MAXLEN (256) and readable.
const MAX_SUFFIX: usize = 40;

/// `<prefix>-<8 chars of base32(sha256(key))>-<sanitised key>`, e.g.
/// `fw-K3XQ2M7A-frontend`. Only `[A-Za-z0-9_-]` appear in the result.
pub fn object_name(prefix: &str, key: &str) -> String {
    let digest = Sha256::digest(key.as_bytes());
    let hash = BASE32_NOPAD.encode(&digest[..5]);
    let suffix: String = key
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .take(MAX_SUFFIX)
        .collect();
    format!("{prefix}-{hash}-{suffix}")
}

/// True when `name` is a valid nft identifier we would emit.
pub fn is_valid_identifier(name: &str) -> bool {
    let mut chars = name.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && name.len() < 200
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_stable_distinct_and_safe() {
        let a = object_name("fw", "frontend");
        assert_eq!(a, object_name("fw", "frontend"));
        assert_ne!(a, object_name("fw", "frontend2"));
        assert!(a.starts_with("fw-") && a.ends_with("-frontend"));
        let evil = object_name("fw", "x\"; flush ruleset; {");
        assert!(is_valid_identifier(&evil), "{evil}");
        // Distinct inputs that sanitise alike still differ by hash.
        assert_ne!(object_name("fw", "a.b"), object_name("fw", "a_b"));
    }
}
