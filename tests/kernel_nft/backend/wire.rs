//! Netlink batches as comparable text: our encoder's bytes, and the bytes nft prints with
//! `--debug=mnl` (rebuilt from its hex dump), decoded into the same canonical form.

/// Canonical text of each nf_tables message (batch begin/end markers excluded): message
/// type, the request/ack/echo flag bits (all nft's dump shows) and the attribute tree.
pub fn decode(batch: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    let mut i = 0;
    while i + 20 <= batch.len() {
        let len = u32::from_ne_bytes(batch[i..i + 4].try_into().unwrap()) as usize;
        let kind = u16::from_ne_bytes(batch[i + 4..i + 6].try_into().unwrap());
        let flags = u16::from_ne_bytes(batch[i + 6..i + 8].try_into().unwrap());
        let family = batch[i + 16];
        if len < 20 || i + len > batch.len() {
            out.push(format!("truncated message at byte {i}"));
            break;
        }
        if kind != 0x10 && kind != 0x11 {
            let mut text = format!(
                "msg {} family {family} flags {:#x}\n",
                msg_name(kind),
                flags & 0xf
            );
            attrs(&batch[i + 20..i + len], 1, &mut text);
            out.push(text);
        }
        i += (len + 3) & !3;
    }
    out
}

fn msg_name(kind: u16) -> String {
    let names = [
        "NEWTABLE",
        "GETTABLE",
        "DELTABLE",
        "NEWCHAIN",
        "GETCHAIN",
        "DELCHAIN",
        "NEWRULE",
        "GETRULE",
        "DELRULE",
        "NEWSET",
        "GETSET",
        "DELSET",
        "NEWSETELEM",
        "GETSETELEM",
        "DELSETELEM",
    ];
    match names.get((kind & 0xff) as usize) {
        Some(n) if kind >> 8 == 10 => n.to_string(),
        _ => format!("type {kind:#x}"),
    }
}

fn attrs(b: &[u8], depth: usize, out: &mut String) {
    let mut i = 0;
    while i + 4 <= b.len() {
        let len = u16::from_ne_bytes(b[i..i + 2].try_into().unwrap()) as usize;
        let kind = u16::from_ne_bytes(b[i + 2..i + 4].try_into().unwrap());
        if len < 4 || i + len > b.len() {
            out.push_str(&format!("{}bad attribute at {i}\n", "  ".repeat(depth)));
            return;
        }
        let data = &b[i + 4..i + len];
        let pad = "  ".repeat(depth);
        if kind & 0x8000 != 0 {
            out.push_str(&format!("{pad}{} {{\n", kind & 0x3fff));
            attrs(data, depth + 1, out);
            out.push_str(&format!("{pad}}}\n"));
        } else {
            let hex: String = data.iter().map(|x| format!("{x:02x}")).collect();
            out.push_str(&format!("{pad}{} = {hex}\n", kind & 0x3fff));
        }
        i += (len + 3) & !3;
    }
}

/// Rebuilds the batch bytes from `nft --debug=mnl` output: every line of the dump is 4
/// bytes of a message (header fields, attribute headers, data), so concatenating them in
/// order restores the buffer. Only the batch (BATCH_BEGIN .. BATCH_END) is kept; netlink
/// flags are reduced to the bits the dump shows (R, M, A, E).
pub fn from_mnl_dump(dump: &str) -> Vec<u8> {
    let mut msgs: Vec<(u16, Vec<u8>)> = Vec::new();
    for raw in dump.lines() {
        let line = strip_ansi(raw);
        let mut cols = line.split('\t');
        let value = cols.next().unwrap_or("").trim().trim_matches('|');
        let Some(field) = cols.next() else {
            continue;
        };
        let num = |s: &str| -> u32 { s.trim().parse().unwrap_or(0) };
        if field.contains("message length") {
            msgs.push((0, num(value).to_ne_bytes().to_vec()));
            continue;
        }
        let Some((kind, msg)) = msgs.last_mut() else {
            continue;
        };
        if field.contains("type | flags") {
            let mut parts = value.split('|');
            *kind = num(parts.next().unwrap_or("")) as u16;
            let letters = parts.next().unwrap_or("");
            let flags = [('R', 1u16), ('M', 2), ('A', 4), ('E', 8)]
                .iter()
                .filter(|(c, _)| letters.contains(*c))
                .fold(0, |acc, (_, bit)| acc | bit);
            msg.extend_from_slice(&kind.to_ne_bytes());
            msg.extend_from_slice(&flags.to_ne_bytes());
        } else if field.contains("sequence number") || field.contains("port ID") {
            msg.extend_from_slice(&num(value).to_ne_bytes());
        } else if field.contains("extra header") || field.contains("data") {
            msg.extend(hex_bytes(value));
        } else if field.contains("len |flags| type") {
            let mut parts = value.split('|');
            let len = num(parts.next().unwrap_or("")) as u16;
            let f = parts.next().unwrap_or("");
            let mut kind = num(parts.next().unwrap_or("")) as u16;
            if f.contains('N') {
                kind |= 0x8000;
            }
            if f.contains('B') {
                kind |= 0x4000;
            }
            msg.extend_from_slice(&len.to_ne_bytes());
            msg.extend_from_slice(&kind.to_ne_bytes());
        }
    }
    let start = msgs
        .iter()
        .position(|(k, _)| *k == 0x10)
        .unwrap_or(msgs.len());
    let end = msgs[start..]
        .iter()
        .position(|(k, _)| *k == 0x11)
        .map_or(msgs.len(), |e| start + e + 1);
    msgs[start..end]
        .iter()
        .flat_map(|(_, m)| m.clone())
        .collect()
}

fn hex_bytes(s: &str) -> Vec<u8> {
    s.split_whitespace()
        .filter_map(|h| u8::from_str_radix(h, 16).ok())
        .collect()
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
