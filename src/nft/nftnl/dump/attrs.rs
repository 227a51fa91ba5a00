//! Netlink attributes as a dump's replies carry them: one attribute ([`Attr`]) with its
//! typed readers, a payload's attribute list ([`Attrs`]) and the allocation-free walk over it
//! ([`AttrIter`]). Every other part of the read-back reads the kernel's answers through these.

/// One netlink attribute: type (flags masked off) and payload.
#[derive(Clone, Copy)]
pub struct Attr<'a> {
    pub kind: u16,
    pub data: &'a [u8],
}

impl<'a> Attr<'a> {
    pub fn be32(&self) -> Option<u32> {
        Some(u32::from_be_bytes(self.data.get(..4)?.try_into().ok()?))
    }

    pub fn be64(&self) -> Option<u64> {
        Some(u64::from_be_bytes(self.data.get(..8)?.try_into().ok()?))
    }

    /// A NUL-terminated string attribute.
    pub fn string(&self) -> String {
        String::from_utf8_lossy(self.str_bytes()).into_owned()
    }

    /// A NUL-terminated string attribute's bytes, without the NUL.
    pub fn str_bytes(&self) -> &'a [u8] {
        let end = self
            .data
            .iter()
            .position(|b| *b == 0)
            .unwrap_or(self.data.len());
        &self.data[..end]
    }

    pub fn nested(&self) -> Attrs<'a> {
        Attrs(self.data)
    }
}

/// The attributes of a payload, in order.
#[derive(Clone, Copy)]
pub struct Attrs<'a>(pub &'a [u8]);

impl<'a> Attrs<'a> {
    pub fn get(&self, kind: u16) -> Option<Attr<'a>> {
        self.into_iter().find(|a| a.kind == kind)
    }

    pub fn be32(&self, kind: u16) -> Option<u32> {
        self.get(kind)?.be32()
    }
}

/// The attributes of a payload in order. A named type, not a boxed iterator: a read-back
/// walks several attribute lists per element, hundreds of thousands of elements at a large
/// node's restart, and a box per walk was a malloc and a free each.
pub struct AttrIter<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Iterator for AttrIter<'a> {
    type Item = Attr<'a>;

    fn next(&mut self) -> Option<Attr<'a>> {
        let (kind, data, next) = super::super::reply::attr_at(self.buf, self.at)?;
        self.at = next;
        Some(Attr { kind, data })
    }
}

impl<'a> IntoIterator for Attrs<'a> {
    type Item = Attr<'a>;
    type IntoIter = AttrIter<'a>;

    fn into_iter(self) -> AttrIter<'a> {
        AttrIter { buf: self.0, at: 0 }
    }
}
