//! What every remoted API shares on the wire, whichever API it is.
//!
//! An API is described in `protocol/api/<name>.api` (`docs/apigen.md`); its crate
//! (`apis/<name>`) holds the opcode table generated from that description as
//! `OpInfo<K>`, `K` being the API's own object kinds. The daemon, which must not know
//! any API, sees every description through the registry crate (`apis/registry`),
//! where kinds are their names.

/// One function of an API as the wire knows it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OpInfo<K: 'static> {
    pub opcode: u16,
    pub name: &'static str,
    /// The description allows forwarding this call without waiting for its reply.
    pub may_async: bool,
    /// The call may wait for the device (or for something another guest thread
    /// does): a blocking flag, a synchronising call, or the `waits` flag.
    pub may_block: bool,
    /// What the call does to API objects, for migration's log.
    pub replay: Replay<K>,
}

/// What a call does to API objects, as the API description says (`rets` and owned
/// `ouths` create, `hret` retains, `hrel` releases, the `configures` flag): the
/// record-and-replay log of a session keeps the calls that create and configure
/// objects still alive, and nothing else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Replay<K> {
    /// Neither creates, configures nor changes references (queries, transfers,
    /// launches).
    None,
    /// Makes one or more objects of this kind.
    Creates(K),
    /// Adds a reference to an object of this kind.
    Retains(K),
    /// Drops a reference to an object of this kind.
    Releases(K),
    /// Changes the state of its first object argument.
    Configures,
}

/// Looks `opcode` up in a table sorted by opcode; `None` for opcodes that name no
/// function.
pub fn find<K>(ops: &'static [OpInfo<K>], opcode: u16) -> Option<&'static OpInfo<K>> {
    ops.binary_search_by_key(&opcode, |o| o.opcode)
        .ok()
        .map(|i| &ops[i])
}

/// An API's description as the registry holds it: its number in the `Hello`, its
/// name, and its functions with their object kinds named.
#[derive(Debug)]
pub struct Description {
    pub api: crate::handshake::ApiId,
    pub name: &'static str,
    pub ops: &'static [OpInfo<&'static str>],
}

impl Description {
    /// The function `opcode` names, if any.
    pub fn op(&self, opcode: u16) -> Option<&'static OpInfo<&'static str>> {
        find(self.ops, opcode)
    }
}

/// Top bit of a host-assigned object id. A guest never sees a host pointer: every
/// object is named on the wire by a 64-bit id scoped to one session. Ids the guest
/// assigns (for objects it creates, so that creating calls can be forwarded without
/// waiting) have the top bit clear; ids the host assigns (objects a call returns
/// without the guest naming them first) have it set. 0 is the null handle.
pub const HOST_ID_BIT: u64 = 1 << 63;

/// Argument tags for byte arguments, the same for every API's marshalling.
pub mod tag {
    /// Bytes follow in the payload (`u32` length, then the bytes).
    pub const INLINE: u8 = 0;
    /// A `u16` index into the frame's data-window spans follows.
    pub const WINDOW: u8 = 1;
    /// The application passed NULL.
    pub const NULL: u8 = 2;
    /// An argument value naming an object: `u8` kind, `u64` id.
    pub const HANDLE: u8 = 3;
    /// Bytes too large for a frame or the window: `u64` token (inputs: then `u64`
    /// length) of bytes staged before the call, or, for an output, kept by the host
    /// after it for the guest to fetch.
    pub const STAGED: u8 = 4;
    /// A pointer inside a shared-virtual-memory allocation: `u64` allocation id,
    /// `u64` offset; the host uses its own allocation.
    pub const SVM: u8 = 5;
    /// An object's initial contents that follow the creating call in chunks through
    /// the data window: `u64` length. The host makes the object without them and
    /// writes each chunk as it comes.
    pub const STREAMED: u8 = 6;
    /// A memory object's storage in the data window, at `u64` offset for `u64`
    /// length: the host makes the object on that memory (`CL_MEM_USE_HOST_PTR`), so
    /// the guest maps it where it is, with no copy either way.
    pub const WINDOW_MEM: u8 = 7;
}

#[cfg(test)]
mod tests {
    use super::*;

    static OPS: &[OpInfo<&str>] = &[
        OpInfo {
            opcode: 1,
            name: "a",
            may_async: false,
            may_block: false,
            replay: Replay::None,
        },
        OpInfo {
            opcode: 7,
            name: "b",
            may_async: true,
            may_block: false,
            replay: Replay::Creates("Thing"),
        },
    ];

    #[test]
    fn find_looks_opcodes_up_by_number() {
        assert_eq!(find(OPS, 7).map(|o| o.name), Some("b"));
        assert!(find(OPS, 0).is_none());
        assert!(find(OPS, 2).is_none());
        assert!(find(OPS, u16::MAX).is_none());
    }
}
