//! Netlink replies (acks and errors with extended-ack attributes) and the walk back from
//! an error to the message, and the element or expression inside it, that caused it.

pub(crate) const NLMSG_HDRLEN: usize = 16;
/// nlmsghdr + nfgenmsg: where the attributes of a netfilter message (nf_tables, ctnetlink)
/// start.
pub(crate) const NFNL_HDRLEN: usize = NLMSG_HDRLEN + 4;
uapi!(pub(crate) u16:
    NLMSG_ERROR,
    NLMSG_DONE,
    NLM_F_REQUEST,
    /// The flag of an attribute that holds attributes.
    NLA_F_NESTED,
    /// The high byte of every nf_tables message's type.
    NFNL_SUBSYS_NFTABLES,
);
uapi!(u16: NLM_F_CAPPED, NLM_F_ACK_TLVS, NLA_TYPE_MASK);
const NLMSGERR_ATTR_MSG: u16 = 1;
const NLMSGERR_ATTR_OFFS: u16 = 2;

/// A kernel error about one message of the batch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelError {
    /// Sequence number of the failing message.
    pub seq: u32,
    pub errno: i32,
    /// The kernel's extended-ack text, if any.
    pub message: Option<String>,
    /// Offset of the failing attribute from the start of the failing message.
    pub offset: Option<u32>,
}

fn u16_at(b: &[u8], i: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(i..i + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], i: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(i..i + 4)?.try_into().ok()?))
}

/// Netlink messages in a buffer: (header fields, whole message bytes).
pub fn messages(buf: &[u8]) -> impl Iterator<Item = (u16, u16, u32, &[u8])> {
    let mut i = 0;
    std::iter::from_fn(move || {
        let len = u32_at(buf, i)? as usize;
        if len < NLMSG_HDRLEN || i + len > buf.len() {
            return None;
        }
        let msg = &buf[i..i + len];
        i += (len + 3) & !3;
        Some((u16_at(msg, 4)?, u16_at(msg, 6)?, u32_at(msg, 8)?, msg))
    })
}

/// Netlink attributes: (type without flags, payload, offset of the header in `buf`). The
/// one attribute walker of the crate (replies, read-back dumps, the drift monitor).
pub(crate) fn attrs(buf: &[u8], base: usize) -> impl Iterator<Item = (u16, &[u8], usize)> {
    let mut i = 0;
    std::iter::from_fn(move || {
        let at = i;
        let (kind, data, next) = attr_at(buf, at)?;
        i = next;
        Some((kind, data, base + at))
    })
}

/// The attribute whose header is at `at` in `buf`: (type without flags, payload, offset of
/// the next attribute); `None` at the end or at a malformed header.
pub(crate) fn attr_at(buf: &[u8], at: usize) -> Option<(u16, &[u8], usize)> {
    let len = u16_at(buf, at)? as usize;
    let kind = u16_at(buf, at + 2)? & NLA_TYPE_MASK;
    if len < 4 || at + len > buf.len() {
        return None;
    }
    Some((kind, &buf[at + 4..at + len], at + ((len + 3) & !3)))
}

/// The error of an `NLMSG_ERROR` message (negative errno; 0 for an ack).
pub(crate) fn error_code(msg: &[u8]) -> i32 {
    u32_at(msg, NLMSG_HDRLEN).map_or(0, |e| e as i32)
}

/// Errors in one datagram of replies; acks (error 0) are skipped.
pub fn parse_errors(buf: &[u8]) -> Vec<KernelError> {
    let mut out = Vec::new();
    for (kind, flags, _, msg) in messages(buf) {
        if kind != NLMSG_ERROR {
            continue;
        }
        let body = &msg[NLMSG_HDRLEN..];
        let Some(err) = u32_at(body, 0).map(|e| e as i32) else {
            continue;
        };
        if err == 0 {
            continue;
        }
        let orig = &body[4..];
        let seq = u32_at(orig, 8).unwrap_or(0);
        // The echoed request: its header only when capped, else the whole message.
        let echoed = if flags & NLM_F_CAPPED != 0 {
            NLMSG_HDRLEN
        } else {
            u32_at(orig, 0).map_or(NLMSG_HDRLEN, |l| (l as usize + 3) & !3)
        };
        let mut e = KernelError {
            seq,
            errno: -err,
            message: None,
            offset: None,
        };
        if flags & NLM_F_ACK_TLVS != 0 && orig.len() >= echoed {
            for (t, v, _) in attrs(&orig[echoed..], 0) {
                match t {
                    NLMSGERR_ATTR_MSG => {
                        let text = v.split(|b| *b == 0).next().unwrap_or_default();
                        e.message = Some(String::from_utf8_lossy(text).into_owned());
                    }
                    NLMSGERR_ATTR_OFFS => e.offset = u32_at(v, 0),
                    _ => {}
                }
            }
        }
        out.push(e);
    }
    out
}

/// The index of the entry of list attribute `list` (a top-level nest of an nf_tables
/// message) that contains byte `offset` of the message: which element of a NEWSETELEM,
/// which expression of a NEWRULE the kernel complained about.
pub fn entry_at(msg: &[u8], list: u16, offset: u32) -> Option<usize> {
    let offset = offset as usize;
    let body = msg.get(NFNL_HDRLEN..)?;
    let (_, nest, nest_at) = attrs(body, NFNL_HDRLEN).find(|(t, _, _)| *t == list)?;
    attrs(nest, nest_at + 4)
        .enumerate()
        .find(|(_, (_, v, at))| offset >= *at && offset < at + 4 + v.len())
        .map(|(i, _)| i)
}

/// `strerror` text plus the errno, e.g. `No such file or directory (errno 2)`.
pub fn errno_text(errno: i32) -> String {
    format!(
        "{} (errno {errno})",
        std::io::Error::from_raw_os_error(errno)
    )
    .replace(&format!(" (os error {errno})"), "")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::netlink::attr;

    fn nlmsg(kind: u16, flags: u16, seq: u32, payload: &[u8]) -> Vec<u8> {
        crate::testing::netlink::nlmsg(kind, flags, seq, 0, payload)
    }

    #[test]
    fn errors_with_extended_ack_are_decoded() {
        let orig = nlmsg(0xa0c, 0, 7, &[]);
        let mut payload = (-2i32).to_ne_bytes().to_vec();
        payload.extend_from_slice(&orig);
        payload.extend(attr(NLMSGERR_ATTR_MSG, b"no such chain\0"));
        payload.extend(attr(NLMSGERR_ATTR_OFFS, &40u32.to_ne_bytes()));
        let mut buf = nlmsg(NLMSG_ERROR, NLM_F_CAPPED | NLM_F_ACK_TLVS, 7, &payload);
        let ack = {
            let mut p = 0i32.to_ne_bytes().to_vec();
            p.extend_from_slice(&nlmsg(0x11, 0, 9, &[]));
            nlmsg(NLMSG_ERROR, NLM_F_CAPPED, 9, &p)
        };
        buf.extend(ack);
        let errs = parse_errors(&buf);
        assert_eq!(
            errs,
            vec![KernelError {
                seq: 7,
                errno: 2,
                message: Some("no such chain".into()),
                offset: Some(40)
            }]
        );
        assert_eq!(errno_text(2), "No such file or directory (errno 2)");
    }

    #[test]
    fn offsets_map_to_list_entries() {
        // nfgenmsg, table attr, then a list (type 3) of three entries.
        let mut body = vec![1, 0, 0, 0];
        body.extend(attr(1, b"t\0"));
        let entries: Vec<u8> = [attr(1, &[1; 4]), attr(1, &[2; 8]), attr(1, &[3; 4])].concat();
        body.extend(attr(3 | 0x8000, &entries));
        let msg = nlmsg(0xa0c, 0, 1, &body);
        // Entries start at 16 + 4 + 8 (table attr) + 4 (list header) = 32.
        assert_eq!(entry_at(&msg, 3, 32), Some(0));
        assert_eq!(entry_at(&msg, 3, 40), Some(1));
        assert_eq!(entry_at(&msg, 3, 52), Some(2));
        assert_eq!(entry_at(&msg, 3, 60), None);
    }
}
