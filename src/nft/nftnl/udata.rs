//! libnftnl userdata TLVs (`struct nftnl_udata`: u8 type, u8 length, value), built in Rust
//! so the exact bytes nft writes for sets, rules and elements are testable without FFI.

/// Set userdata types (`enum nftnl_udata_set_types`).
pub const SET_KEYBYTEORDER: u8 = 0;
pub const SET_DATABYTEORDER: u8 = 1;
pub const SET_MERGE_ELEMENTS: u8 = 2;
pub const SET_KEY_TYPEOF: u8 = 3;
pub const SET_DATA_TYPEOF: u8 = 4;
pub const SET_DATA_INTERVAL: u8 = 6;
/// Rule userdata: `NFTNL_UDATA_RULE_COMMENT`.
pub const RULE_COMMENT: u8 = 0;
/// Element userdata: `NFTNL_UDATA_SET_ELEM_COMMENT`.
const SET_ELEM_COMMENT: u8 = 0;
/// Element userdata: `NFTNL_UDATA_SET_ELEM_FLAGS` with `NFTNL_SET_ELEM_F_INTERVAL_OPEN`.
const SET_ELEM_FLAGS: u8 = 1;
const SET_ELEM_F_INTERVAL_OPEN: u32 = 1;

/// nft's `enum byteorder`, as stored in set userdata.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ByteOrder {
    Invalid = 0,
    Host = 1,
    Big = 2,
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Udata {
    buf: Vec<u8>,
}

impl Udata {
    pub fn put(&mut self, kind: u8, value: &[u8]) {
        // nft values are short (comments are capped at 128 bytes), so a u8 length suffices.
        debug_assert!(value.len() <= u8::MAX as usize);
        self.buf.push(kind);
        self.buf.push(value.len() as u8);
        self.buf.extend_from_slice(value);
    }

    /// A u32 in host byte order, as `nftnl_udata_put_u32` writes it.
    pub fn put_u32(&mut self, kind: u8, v: u32) {
        self.put(kind, &v.to_ne_bytes());
    }

    /// A NUL-terminated string (`nftnl_udata_put_strz`).
    pub fn put_strz(&mut self, kind: u8, s: &str) {
        let mut v = s.as_bytes().to_vec();
        v.push(0);
        self.put(kind, &v);
    }

    pub fn put_byteorder(&mut self, kind: u8, bo: ByteOrder) {
        self.put_u32(kind, bo as u32);
    }

    /// A nested TLV whose length covers what `f` writes.
    pub fn nest(&mut self, kind: u8, f: impl FnOnce(&mut Udata)) {
        let start = self.buf.len();
        self.buf.push(kind);
        self.buf.push(0);
        f(self);
        let len = self.buf.len() - start - 2;
        debug_assert!(len <= u8::MAX as usize);
        self.buf[start + 1] = len as u8;
    }

    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

/// Rule comment userdata.
pub fn rule_comment(text: &str) -> Vec<u8> {
    let mut u = Udata::default();
    u.put_strz(RULE_COMMENT, text);
    u.into_bytes()
}

/// The comment in rule or element userdata (`NFTNL_UDATA_RULE_COMMENT` and
/// `NFTNL_UDATA_SET_ELEM_COMMENT` are both type 0), without its NUL.
pub fn comment_of(udata: &[u8]) -> Option<String> {
    let mut rest = udata;
    while let [kind, len, tail @ ..] = rest {
        let value = tail.get(..usize::from(*len))?;
        if *kind == RULE_COMMENT {
            let text = value.split(|b| *b == 0).next().unwrap_or_default();
            return Some(String::from_utf8_lossy(text).into_owned());
        }
        rest = &tail[usize::from(*len)..];
    }
    None
}

/// Appends an element comment TLV (sanitized like every comment, NUL-terminated) to `out`
/// without allocating: the element encoder writes it straight into the batch. nft puts it
/// before [`INTERVAL_OPEN`] when an element has both.
pub fn put_elem_comment(out: &mut Vec<u8>, text: &str) {
    let start = out.len();
    out.extend_from_slice(&[SET_ELEM_COMMENT, 0]);
    crate::nft::render::sanitize_into(text, out);
    out.push(0);
    // At most 127 bytes of text plus the NUL: fits the u8 length.
    out[start + 1] = (out.len() - start - 2) as u8;
}

/// Userdata nft puts on the start element of an interval that runs to the end of the key
/// space (it has no end element): `NFTNL_UDATA_SET_ELEM_FLAGS` =
/// `NFTNL_SET_ELEM_F_INTERVAL_OPEN`, a host-order u32.
pub static INTERVAL_OPEN: [u8; 6] = {
    let v = SET_ELEM_F_INTERVAL_OPEN.to_ne_bytes();
    [SET_ELEM_FLAGS, 4, v[0], v[1], v[2], v[3]]
};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn comment_and_open_interval_bytes_match_nft() {
        assert_eq!(rule_comment("hi"), b"\x00\x03hi\x00");
        assert_eq!(&INTERVAL_OPEN, b"\x01\x04\x01\x00\x00\x00");
        // `comment "ab"` on an open-ended interval, from `nft --debug=mnl`.
        let mut u = Vec::new();
        put_elem_comment(&mut u, "ab");
        u.extend_from_slice(&INTERVAL_OPEN);
        assert_eq!(u, b"\x00\x03ab\x00\x01\x04\x01\x00\x00\x00");
    }

    #[test]
    fn comments_are_read_back_from_rule_and_element_userdata() {
        assert_eq!(
            comment_of(&rule_comment("rule 3: Deny")).as_deref(),
            Some("rule 3: Deny")
        );
        let mut u = INTERVAL_OPEN.to_vec();
        put_elem_comment(&mut u, "rule 0: Allow");
        assert_eq!(comment_of(&u).as_deref(), Some("rule 0: Allow"));
        assert_eq!(comment_of(&INTERVAL_OPEN), None);
        assert_eq!(comment_of(b"\x00\x09short"), None, "a length past the end");
    }

    #[test]
    fn nests_carry_their_length() {
        let mut u = Udata::default();
        u.nest(3, |u| {
            u.put_u32(0, 13);
            u.nest(1, |_| {});
        });
        assert_eq!(u.into_bytes(), b"\x03\x08\x00\x04\x0d\x00\x00\x00\x01\x00");
    }
}
