//! Netlink messages built by hand, for the tests of code that decodes them (replies, change
//! notifications) and for requests no library sends (a raw `add table` with flags).

/// One attribute: length, type, payload, padded to 4 bytes.
pub fn attr(kind: u16, payload: &[u8]) -> Vec<u8> {
    let mut v = ((4 + payload.len()) as u16).to_ne_bytes().to_vec();
    v.extend_from_slice(&kind.to_ne_bytes());
    v.extend_from_slice(payload);
    v.resize(v.len().next_multiple_of(4), 0);
    v
}

/// A message: `nlmsghdr` (length, `kind`, `flags`, `seq`, `portid`) and `payload`.
pub fn nlmsg(kind: u16, flags: u16, seq: u32, portid: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = ((16 + payload.len()) as u32).to_ne_bytes().to_vec();
    v.extend_from_slice(&kind.to_ne_bytes());
    v.extend_from_slice(&flags.to_ne_bytes());
    v.extend_from_slice(&seq.to_ne_bytes());
    v.extend_from_slice(&portid.to_ne_bytes());
    v.extend_from_slice(payload);
    v
}

/// An nfnetlink message: [`nlmsg`] whose payload is `nfgenmsg` (`family`, version 0,
/// `res_id` big-endian) and `attrs`.
pub fn nfnl_msg(
    kind: u16,
    flags: u16,
    seq: u32,
    portid: u32,
    family: u8,
    res_id: u16,
    attrs: &[u8],
) -> Vec<u8> {
    let mut payload = vec![family, 0];
    payload.extend_from_slice(&res_id.to_be_bytes());
    payload.extend_from_slice(attrs);
    nlmsg(kind, flags, seq, portid, &payload)
}
