//! Typed nftables IR: the one description of the ruleset that is both rendered as text
//! (`--dry-run`) and encoded as netlink (the kernel apply). There is no second code path.
//!
//! The IR sits at the level of nft statements (`ip saddr @set`, `dnat ip to ...`), not of
//! bytecode, so that the renderer can print exactly what `nft -f` compiles to the same
//! bytecode the netlink backend emits. Every value is typed; user data never becomes syntax.

mod chain;
mod consts;
mod elem;
mod field;
mod set;
mod stmt;
mod table;
mod value;

pub use chain::*;
pub use consts::*;
pub use elem::*;
pub use field::*;
pub use set::*;
pub use stmt::*;
pub use table::*;
pub use value::*;

#[cfg(test)]
mod part_elements_tests {
    use super::*;

    fn key(n: u16) -> ElemKey {
        vec![Value::Port(n).into()]
    }

    #[test]
    fn part_elements_stay_sorted_and_unique_whatever_the_insert_order() {
        let mut e = PartElements::default();
        for n in [5, 1, 9, 3, 9] {
            e.insert(key(n), ElemValue::default());
        }
        let data = ElemValue {
            data: Some(ElemData::Verdict(Verdict::Accept)),
            ..Default::default()
        };
        e.insert(key(3), data.clone());
        let keys: Vec<_> = e.keys().cloned().collect();
        assert_eq!(keys, [key(1), key(3), key(5), key(9)]);
        assert_eq!(e.get(&key(3)), Some(&data));
        assert!(!e.contains_key(&key(4)));
        e.retain(|k, _| *k != key(5));
        assert_eq!(e.len(), 3);
        assert_eq!(e.iter().count(), 3);
    }
}
