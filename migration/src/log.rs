//! The log of calls that made and configured a session's live objects.

use std::collections::{BTreeMap, HashMap, HashSet};

use hira_protocol::api::Replay;

/// An object's id, as the guest assigned it.
pub type ObjectId = u64;

/// One recorded call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// Order of recording; replay follows it.
    pub seq: u64,
    pub opcode: u16,
    /// The request as the guest sent it.
    pub request: Vec<u8>,
    /// Objects the call made.
    pub creates: Vec<ObjectId>,
    /// The object a configuring call changed.
    pub subject: Option<ObjectId>,
    /// Which setting of the subject it changed, when a later call of the same setting
    /// replaces it (a kernel argument's index); `None`: every such call counts (each
    /// callback registered).
    pub key: Option<u64>,
    /// Other objects its arguments name, which must exist when it is replayed (a
    /// kernel's program, a sub-buffer's parent, a buffer set as a kernel argument).
    pub uses: Vec<ObjectId>,
}

/// The calls that made and configured a session's live objects, and the
/// application's reference count of each.
#[derive(Debug, Default)]
pub struct Log {
    entries: BTreeMap<u64, Entry>,
    /// The application's references to each object it holds.
    refs: HashMap<ObjectId, u32>,
    /// The entry holding each keyed setting.
    settings: HashMap<(ObjectId, u64), u64>,
    next_seq: u64,
    /// Entries recorded or objects dropped since the last compaction.
    garbage: usize,
}

/// What a call recorded through [`Log::record`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Call {
    pub opcode: u16,
    pub request: Vec<u8>,
    /// Objects a creating call made, or the object a retain, release or configuring
    /// call names first.
    pub objects: Vec<ObjectId>,
    /// The setting a configuring call changes.
    pub key: Option<u64>,
    /// Other objects its arguments name.
    pub uses: Vec<ObjectId>,
}

impl Log {
    pub fn new() -> Self {
        Self::default()
    }

    /// Records a call that succeeded, by what the API description says it does.
    pub fn record<K>(&mut self, role: Replay<K>, call: Call) {
        let Call {
            opcode,
            request,
            objects,
            key,
            uses,
        } = call;
        match role {
            Replay::None => {}
            Replay::Creates(_) => self.created(opcode, request, objects, uses),
            Replay::Retains(_) => {
                for id in objects {
                    self.retained(id);
                }
            }
            Replay::Releases(_) => {
                for id in objects {
                    self.released(id);
                }
            }
            Replay::Configures => {
                if let Some(&subject) = objects.first() {
                    self.configured(opcode, request, subject, key, uses);
                }
            }
        }
    }

    fn push(&mut self, mut e: Entry) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        e.seq = seq;
        self.entries.insert(seq, e);
        seq
    }

    /// A call made `creates`, each with one reference of the application's.
    pub fn created(
        &mut self,
        opcode: u16,
        request: Vec<u8>,
        creates: Vec<ObjectId>,
        uses: Vec<ObjectId>,
    ) {
        for &id in &creates {
            *self.refs.entry(id).or_default() += 1;
        }
        self.push(Entry {
            seq: 0,
            opcode,
            request,
            creates,
            subject: None,
            key: None,
            uses,
        });
    }

    /// A call changed setting `key` (or added a setting, with `None`) of `subject`.
    pub fn configured(
        &mut self,
        opcode: u16,
        request: Vec<u8>,
        subject: ObjectId,
        key: Option<u64>,
        uses: Vec<ObjectId>,
    ) {
        let seq = self.push(Entry {
            seq: 0,
            opcode,
            request,
            creates: Vec::new(),
            subject: Some(subject),
            key,
            uses,
        });
        if let Some(k) = key
            && let Some(old) = self.settings.insert((subject, k), seq)
        {
            self.entries.remove(&old);
        }
        self.garbage += 1;
        self.maybe_compact();
    }

    /// The application took another reference to `id`.
    pub fn retained(&mut self, id: ObjectId) {
        if let Some(r) = self.refs.get_mut(&id) {
            *r += 1;
        }
    }

    /// The application dropped a reference to `id`; at its last, the object's calls
    /// go at the next compaction unless a live object still needs it.
    pub fn released(&mut self, id: ObjectId) {
        if let Some(r) = self.refs.get_mut(&id) {
            *r -= 1;
            if *r == 0 {
                self.refs.remove(&id);
                self.garbage += 1;
                self.maybe_compact();
            }
        }
    }

    fn maybe_compact(&mut self) {
        if self.garbage > self.entries.len() / 2 + 64 {
            self.compact();
        }
    }

    /// Drops every entry a replay does not need: an object is kept while the
    /// application holds it or a kept entry names it; an entry is kept while it made
    /// a kept object or configures one.
    pub fn compact(&mut self) {
        let mut kept: HashSet<ObjectId> = self.refs.keys().copied().collect();
        loop {
            let before = kept.len();
            for e in self.entries.values() {
                let needed = e.creates.iter().any(|id| kept.contains(id))
                    || e.subject.is_some_and(|s| kept.contains(&s));
                if needed {
                    kept.extend(e.uses.iter().copied());
                    kept.extend(e.subject);
                }
            }
            if kept.len() == before {
                break;
            }
        }
        self.entries.retain(|_, e| {
            e.creates.iter().any(|id| kept.contains(id))
                || e.subject.is_some_and(|s| kept.contains(&s))
        });
        let entries = &self.entries;
        self.settings.retain(|_, seq| entries.contains_key(seq));
        self.garbage = 0;
    }

    /// The kept calls, in the order they were made.
    pub fn entries(&self) -> impl Iterator<Item = &Entry> {
        self.entries.values()
    }

    /// How many calls are kept.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The application's reference count of each object it holds.
    pub fn refs(&self) -> impl Iterator<Item = (ObjectId, u32)> + '_ {
        self.refs.iter().map(|(&id, &n)| (id, n))
    }

    /// Rebuilds a log from a snapshot's parts.
    pub fn from_parts(entries: Vec<Entry>, refs: Vec<(ObjectId, u32)>) -> Self {
        let mut log = Log {
            next_seq: entries.iter().map(|e| e.seq + 1).max().unwrap_or(0),
            refs: refs.into_iter().filter(|&(_, n)| n > 0).collect(),
            ..Log::default()
        };
        for e in entries {
            if let (Some(s), Some(k)) = (e.subject, e.key) {
                log.settings.insert((s, k), e.seq);
            }
            log.entries.insert(e.seq, e);
        }
        log
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hira_apis_opencl::Kind;
    use proptest::prelude::*;

    fn ops(log: &Log) -> Vec<u16> {
        log.entries().map(|e| e.opcode).collect()
    }

    #[test]
    fn a_released_object_goes_with_its_settings() {
        let mut log = Log::new();
        log.created(1, vec![], vec![10], vec![]);
        log.created(2, vec![], vec![11], vec![]);
        log.configured(3, vec![], 11, Some(0), vec![]);
        log.released(11);
        log.compact();
        assert_eq!(ops(&log), [1]);
        assert_eq!(log.refs().collect::<Vec<_>>(), [(10, 1)]);
    }

    #[test]
    fn an_object_a_live_one_needs_is_kept_though_released() {
        let mut log = Log::new();
        log.created(1, vec![], vec![1], vec![]); // context
        log.created(2, vec![], vec![2], vec![1]); // program
        log.configured(3, vec![], 2, Some(0), vec![]); // its build
        log.created(4, vec![], vec![3], vec![2]); // a kernel of it
        log.released(2);
        log.released(1);
        log.compact();
        assert_eq!(
            ops(&log),
            [1, 2, 3, 4],
            "the kernel needs its built program"
        );
        log.released(3);
        log.compact();
        assert!(log.is_empty());
    }

    #[test]
    fn a_setting_made_again_replaces_the_last_and_retains_count() {
        let mut log = Log::new();
        log.created(1, vec![], vec![5], vec![]);
        log.created(1, vec![], vec![6], vec![]);
        log.configured(7, vec![0], 5, Some(0), vec![]);
        log.configured(7, vec![1], 5, Some(1), vec![6]);
        log.configured(7, vec![2], 5, Some(0), vec![]);
        log.configured(8, vec![3], 5, None, vec![]);
        log.configured(8, vec![4], 5, None, vec![]);
        let requests: Vec<Vec<u8>> = log.entries().map(|e| e.request.clone()).collect();
        assert_eq!(
            requests,
            [vec![], vec![], vec![1], vec![2], vec![3], vec![4]]
        );
        // A buffer set as an argument is kept for the kernel, not for itself.
        log.retained(6);
        log.released(6);
        log.released(6);
        log.compact();
        assert!(log.entries().any(|e| e.creates == [6]));
        assert_eq!(log.refs().count(), 1);
    }

    #[test]
    fn roles_come_from_the_description() {
        let info = |name: &str| {
            hira_apis_opencl::OPS
                .iter()
                .find(|o| o.name == name)
                .unwrap()
                .replay
        };
        assert_eq!(info("clCreateBuffer"), Replay::Creates(Kind::Mem));
        assert_eq!(
            info("clCreateKernelsInProgram"),
            Replay::Creates(Kind::Kernel)
        );
        assert_eq!(info("clRetainKernel"), Replay::Retains(Kind::Kernel));
        assert_eq!(info("clReleaseProgram"), Replay::Releases(Kind::Program));
        assert_eq!(info("clSetKernelArg"), Replay::Configures);
        assert_eq!(info("clBuildProgram"), Replay::Configures);
        assert_eq!(info("clEnqueueNDRangeKernel"), Replay::None);
        assert_eq!(info("clGetDeviceInfo"), Replay::None);
        let mut log = Log::new();
        log.record(
            info("clCreateBuffer"),
            Call {
                opcode: 30,
                objects: vec![9],
                ..Call::default()
            },
        );
        log.record(
            info("clRetainMemObject"),
            Call {
                objects: vec![9],
                ..Call::default()
            },
        );
        assert_eq!(log.refs().collect::<Vec<_>>(), [(9, 2)]);
    }

    /// A model of what a replay of `entries` makes: each object's creating call and
    /// the latest value of each of its settings.
    fn replayed(entries: &[Entry]) -> BTreeMap<ObjectId, (u16, BTreeMap<u64, Vec<u8>>)> {
        let mut m: BTreeMap<ObjectId, (u16, BTreeMap<u64, Vec<u8>>)> = BTreeMap::new();
        for e in entries {
            for &id in &e.creates {
                m.insert(id, (e.opcode, BTreeMap::new()));
            }
            if let (Some(s), Some(k)) = (e.subject, e.key)
                && let Some(o) = m.get_mut(&s)
            {
                o.1.insert(k, e.request.clone());
            }
        }
        m
    }

    #[derive(Clone, Debug)]
    enum Op {
        Create {
            uses: Vec<usize>,
        },
        Configure {
            subject: usize,
            key: u8,
            uses: Vec<usize>,
        },
        Retain(usize),
        Release(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            3 => proptest::collection::vec(0usize..64, 0..3).prop_map(|uses| Op::Create { uses }),
            4 => (0usize..64, 0u8..3, proptest::collection::vec(0usize..64, 0..2))
                .prop_map(|(subject, key, uses)| Op::Configure { subject, key, uses }),
            1 => (0usize..64).prop_map(Op::Retain),
            3 => (0usize..64).prop_map(Op::Release),
        ]
    }

    proptest! {
        // Whatever the application does, replaying the compacted log makes every
        // object it still holds, with the latest value of each of their settings,
        // and everything those need; and nothing only dead objects needed.
        #[test]
        fn compaction_keeps_what_live_objects_need(ops in proptest::collection::vec(op(), 1..200)) {
            let mut log = Log::new();
            let mut full: Vec<Entry> = Vec::new();
            let mut made: Vec<ObjectId> = Vec::new();
            let mut refs: HashMap<ObjectId, u32> = HashMap::new();
            let pick = |made: &[ObjectId], i: usize| made.get(i % made.len().max(1)).copied();
            for (n, o) in ops.into_iter().enumerate() {
                match o {
                    Op::Create { uses } => {
                        let id = 1000 + n as u64;
                        // Only live objects can be named by a call.
                        let uses: Vec<ObjectId> = uses.iter().filter_map(|&i| pick(&made, i)).filter(|u| refs.contains_key(u)).collect();
                        log.created(1, vec![n as u8], vec![id], uses.clone());
                        full.push(Entry { seq: n as u64, opcode: 1, request: vec![n as u8], creates: vec![id], subject: None, key: None, uses });
                        made.push(id);
                        refs.insert(id, 1);
                    }
                    Op::Configure { subject, key, uses } => {
                        let Some(s) = pick(&made, subject).filter(|s| refs.contains_key(s)) else { continue };
                        let uses: Vec<ObjectId> = uses.iter().filter_map(|&i| pick(&made, i)).filter(|u| refs.contains_key(u)).collect();
                        log.configured(2, vec![n as u8], s, Some(u64::from(key)), uses.clone());
                        full.push(Entry { seq: n as u64, opcode: 2, request: vec![n as u8], creates: vec![], subject: Some(s), key: Some(u64::from(key)), uses });
                    }
                    Op::Retain(i) => {
                        if let Some(id) = pick(&made, i).filter(|id| refs.contains_key(id)) {
                            log.retained(id);
                            *refs.get_mut(&id).unwrap() += 1;
                        }
                    }
                    Op::Release(i) => {
                        if let Some(id) = pick(&made, i).filter(|id| refs.contains_key(id)) {
                            log.released(id);
                            let r = refs.get_mut(&id).unwrap();
                            *r -= 1;
                            if *r == 0 { refs.remove(&id); }
                        }
                    }
                }
            }
            log.compact();
            let kept: Vec<Entry> = log.entries().cloned().collect();
            let (from_full, from_kept) = (replayed(&full), replayed(&kept));
            for id in refs.keys() {
                prop_assert_eq!(from_full.get(id), from_kept.get(id), "live object {}", id);
            }
            // Every object a kept entry names is made by a kept entry before it.
            let mut made_so_far = HashSet::new();
            for e in &kept {
                for u in e.uses.iter().chain(e.subject.iter()) {
                    prop_assert!(made_so_far.contains(u), "entry {} needs {} first", e.seq, u);
                }
                made_so_far.extend(e.creates.iter().copied());
            }
            // Nothing is kept for objects no live object needs.
            let mut needed: HashSet<ObjectId> = refs.keys().copied().collect();
            loop {
                let n = needed.len();
                for e in &kept {
                    if e.creates.iter().any(|c| needed.contains(c)) || e.subject.is_some_and(|s| needed.contains(&s)) {
                        needed.extend(e.uses.iter().copied());
                    }
                }
                if needed.len() == n { break; }
            }
            for e in &kept {
                prop_assert!(e.creates.iter().any(|c| needed.contains(c)) || e.subject.is_some_and(|s| needed.contains(&s)));
            }
            prop_assert_eq!(log.refs().collect::<HashMap<_, _>>(), refs);
        }
    }
}
