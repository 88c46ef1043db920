//! A session's handle table, one for every API: the ids a guest names objects by, the
//! host objects they stand for, and back.
//!
//! Ids the guest assigns (for objects it creates, so that creating calls need not wait)
//! have [`HOST_ID_BIT`] clear; ids this table assigns to objects the host returns
//! unasked (devices, a primary context) have it set. One id names one object, whatever
//! its kind; a host object has at most one id per kind.

use std::collections::HashMap;
use std::hash::Hash;

use hira_protocol::api::HOST_ID_BIT;

/// A kind of object an API has.
pub trait ObjectKind: Copy + Eq + Hash + std::fmt::Debug {
    /// Whether the guest's references to an object of this kind are counted (it may
    /// retain and release them), given how many it holds when it is named.
    fn counted(self, guest_refs: u32) -> bool;
}

/// One object the guest can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry<K> {
    pub kind: K,
    /// The host's handle.
    pub host: usize,
    /// References the guest holds (0 for objects it only found, such as devices).
    pub guest_refs: u32,
    /// Whether those references are counted.
    pub counted: bool,
}

/// Ids to host objects and back.
#[derive(Debug)]
pub struct Handles<K> {
    by_id: HashMap<u64, Entry<K>>,
    by_host: HashMap<(K, usize), u64>,
    next_host_id: u64,
}

impl<K> Default for Handles<K> {
    fn default() -> Self {
        Handles {
            by_id: HashMap::new(),
            by_host: HashMap::new(),
            next_host_id: 0,
        }
    }
}

impl<K: ObjectKind> Handles<K> {
    /// The host object `id` names, if it is of `kind`.
    pub fn get(&self, id: u64, kind: K) -> Option<usize> {
        self.by_id
            .get(&id)
            .filter(|e| e.kind == kind)
            .map(|e| e.host)
    }

    pub fn entry(&self, id: u64) -> Option<&Entry<K>> {
        self.by_id.get(&id)
    }

    pub fn entry_mut(&mut self, id: u64) -> Option<&mut Entry<K>> {
        self.by_id.get_mut(&id)
    }

    /// Whether `id` names anything.
    pub fn contains(&self, id: u64) -> bool {
        self.by_id.contains_key(&id)
    }

    /// Names host object `host` of `kind` as `id`, with the guest's `guest_refs`.
    pub fn insert(&mut self, id: u64, kind: K, host: usize, guest_refs: u32) {
        // An id the host assigned in an earlier life of the session (a replay) is not
        // handed out again.
        if id & HOST_ID_BIT != 0 {
            self.next_host_id = self.next_host_id.max(id & !HOST_ID_BIT);
        }
        let counted = kind.counted(guest_refs);
        self.by_id.insert(
            id,
            Entry {
                kind,
                host,
                guest_refs,
                counted,
            },
        );
        self.by_host.insert((kind, host), id);
    }

    /// The id of host object `host` of `kind`, giving it the next host-assigned id if
    /// the guest never saw it (the null handle is id 0).
    pub fn found(&mut self, kind: K, host: usize) -> u64 {
        if host == 0 {
            return 0;
        }
        if let Some(&id) = self.by_host.get(&(kind, host)) {
            return id;
        }
        let id = self.fresh_host_id();
        self.insert(id, kind, host, 0);
        id
    }

    /// The next host-assigned id.
    pub fn fresh_host_id(&mut self) -> u64 {
        self.next_host_id += 1;
        HOST_ID_BIT | self.next_host_id
    }

    /// The id host object `host` of `kind` has, if any.
    pub fn id_of(&self, kind: K, host: usize) -> Option<u64> {
        self.by_host.get(&(kind, host)).copied()
    }

    /// Every id with its object.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Entry<K>)> {
        self.by_id.iter().map(|(&id, e)| (id, e))
    }

    /// Swaps the host objects two ids name (both must be known and of one kind); the
    /// guest's references stay with the ids.
    pub fn swap(&mut self, a: u64, b: u64) -> bool {
        let (Some(ea), Some(eb)) = (self.by_id.get(&a).copied(), self.by_id.get(&b).copied())
        else {
            return false;
        };
        if ea.kind != eb.kind {
            return false;
        }
        self.insert(a, eb.kind, eb.host, ea.guest_refs);
        self.insert(b, ea.kind, ea.host, eb.guest_refs);
        true
    }

    /// Forgets `id`; the way back from its host object goes too if it led to `id`.
    pub fn forget(&mut self, id: u64) -> Option<Entry<K>> {
        let e = self.by_id.remove(&id)?;
        if self.by_host.get(&(e.kind, e.host)) == Some(&id) {
            self.by_host.remove(&(e.kind, e.host));
        }
        Some(e)
    }

    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }

    /// Empties the table, returning every object the guest holds counted references
    /// to.
    pub fn drain_owned(&mut self) -> Vec<Entry<K>> {
        let v = self
            .by_id
            .drain()
            .map(|(_, e)| e)
            .filter(|e| e.guest_refs > 0 && e.counted)
            .collect();
        self.by_host.clear();
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
    enum K {
        Counted,
        Found,
    }

    impl ObjectKind for K {
        fn counted(self, _: u32) -> bool {
            self == K::Counted
        }
    }

    #[test]
    fn found_objects_keep_one_host_id_per_kind_and_null_is_zero() {
        let mut h = Handles::<K>::default();
        let a = h.found(K::Found, 0x10);
        assert_ne!(a & HOST_ID_BIT, 0);
        assert_eq!(h.found(K::Found, 0x10), a);
        assert_eq!(h.found(K::Found, 0), 0);
        assert_eq!(h.get(a, K::Found), Some(0x10));
        assert_eq!(h.get(a, K::Counted), None, "the wrong kind names nothing");
        assert_eq!(h.id_of(K::Found, 0x10), Some(a));
        // A replayed host id is never handed out again.
        h.insert(HOST_ID_BIT | 40, K::Found, 0x20, 0);
        assert_eq!(h.fresh_host_id(), HOST_ID_BIT | 41);
    }

    #[test]
    fn forgetting_keeps_another_ids_way_back_and_swaps_keep_references() {
        let mut h = Handles::<K>::default();
        h.insert(1, K::Counted, 0x10, 2);
        h.insert(2, K::Counted, 0x20, 1);
        assert!(h.swap(1, 2));
        assert_eq!(
            (h.get(1, K::Counted), h.entry(1).unwrap().guest_refs),
            (Some(0x20), 2)
        );
        assert_eq!(h.id_of(K::Counted, 0x10), Some(2));
        h.insert(3, K::Found, 0x30, 0);
        assert!(!h.swap(1, 3), "objects of two kinds do not swap");
        h.insert(4, K::Counted, 0x10, 1);
        assert_eq!(h.forget(2).unwrap().host, 0x10);
        assert_eq!(h.id_of(K::Counted, 0x10), Some(4), "id 4 still leads back");
        assert!(h.forget(2).is_none());
        let owned = h.drain_owned();
        assert_eq!(
            owned.len(),
            2,
            "the found object is not the guest's: {owned:?}"
        );
        assert!(h.is_empty() && h.id_of(K::Found, 0x30).is_none());
    }
}
