//! Lists decoded to their exact length. serde_json cannot tell a sequence's length before
//! reading it, so a decoded `Vec` grows by doubling and keeps up to half its capacity unused
//! (a one-address endpoint holds room for four). Held for every object of the cluster, that
//! slack was ~10 MB at 10,000 services x 10 endpoints; these `deserialize_with` helpers give
//! it back as each list is decoded.

use serde::{Deserialize, Deserializer};

/// `#[serde(deserialize_with = "exact::vec")]`
pub fn vec<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Vec<T>, D::Error> {
    let mut v = Vec::<T>::deserialize(d)?;
    v.shrink_to_fit();
    Ok(v)
}

/// `#[serde(default, deserialize_with = "exact::option_vec")]`
pub fn option_vec<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<Vec<T>>, D::Error> {
    let mut v = Option::<Vec<T>>::deserialize(d)?;
    if let Some(v) = v.as_mut() {
        v.shrink_to_fit();
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    #[derive(serde::Deserialize)]
    struct Lists {
        #[serde(deserialize_with = "super::vec")]
        a: Vec<u64>,
        #[serde(default, deserialize_with = "super::option_vec")]
        b: Option<Vec<u64>>,
        #[serde(default, deserialize_with = "super::option_vec")]
        c: Option<Vec<u64>>,
    }

    #[test]
    fn decoded_lists_hold_no_spare_room() {
        let l: Lists = serde_json::from_str(r#"{"a": [1, 2, 3, 4, 5], "b": [1]}"#).unwrap();
        assert_eq!((l.a.len(), l.a.capacity()), (5, 5));
        let b = l.b.unwrap();
        assert_eq!((b.len(), b.capacity()), (1, 1));
        assert_eq!(l.c, None);
    }
}
