//! Host callbacks that stand for the guest's: each carries the guest's callback id
//! and sends a notification when the host calls it.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};

use hira_apis_opencl::{CALLBACK_DATA_ONLY, Kind, notify};
use hira_protocol::{FrameKind, Writer};
use opencl_sys::{cl_context, cl_event, cl_int, cl_mem, cl_program};

use super::handles::Handles;
use super::session::Session;
use crate::server::FrameWriter;

/// The `user_data` the host gets when the application passed data but no function:
/// non-null, as the application's was, and never dereferenced (no function is given
/// that could receive it).
const DATA_ONLY: *mut c_void = std::ptr::dangling_mut::<u8>().cast();

/// Context for a host callback: which guest callback it stands for.
struct CallbackContext {
    id: u64,
    handles: Arc<Mutex<Handles>>,
    writer: Arc<FrameWriter>,
    deferred: Arc<super::deferred::Deferred>,
    /// For a one-shot callback (a build's, an event's): the count of those not yet
    /// delivered, which a migration waits to reach zero.
    one_shot: Option<Arc<std::sync::atomic::AtomicUsize>>,
}

impl Drop for CallbackContext {
    fn drop(&mut self) {
        if let Some(n) = &self.one_shot {
            n.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
        }
    }
}

impl CallbackContext {
    fn notify(&self, kind: u16, body: impl FnOnce(&mut Writer, &mut Handles)) {
        let mut w = Writer::new();
        w.u64(self.id);
        {
            let mut h = self.handles.lock().unwrap_or_else(|e| e.into_inner());
            body(&mut w, &mut h);
        }
        self.writer
            .send(FrameKind::Notify, kind, 0, 0, w.as_slice());
    }
}

extern "C" fn context_trampoline(
    errinfo: *const libc::c_char,
    private: *const c_void,
    cb: usize,
    user_data: *mut c_void,
) {
    // SAFETY: `user_data` is the CallbackContext leaked for this context's life.
    let ctx = unsafe { &*(user_data as *const CallbackContext) };
    let info = if errinfo.is_null() {
        Vec::new()
    } else {
        // SAFETY: the host passes a NUL-terminated message.
        unsafe { std::ffi::CStr::from_ptr(errinfo) }
            .to_bytes()
            .to_vec()
    };
    let private = if private.is_null() {
        Vec::new()
    } else {
        // SAFETY: the host passes `cb` readable bytes.
        unsafe { std::slice::from_raw_parts(private.cast::<u8>(), cb.min(64 * 1024)) }.to_vec()
    };
    ctx.notify(notify::CONTEXT, |w, _| {
        w.bytes(&info[..info.len().min(64 * 1024)]).bytes(&private);
    });
}

extern "C" fn program_trampoline(program: cl_program, user_data: *mut c_void) {
    // SAFETY: one-shot: `user_data` is the box leaked for this callback, taken back here.
    let ctx = unsafe { Box::from_raw(user_data as *mut CallbackContext) };
    ctx.notify(notify::PROGRAM, |w, h| {
        w.u64(h.found(Kind::Program, program as usize));
    });
}

extern "C" fn event_trampoline(event: cl_event, status: cl_int, user_data: *mut c_void) {
    // SAFETY: as in `program_trampoline`.
    let ctx = unsafe { Box::from_raw(user_data as *mut CallbackContext) };
    // A read's data reaches the guest before any callback of its event.
    ctx.deferred.settle_event(event, status);
    ctx.notify(notify::EVENT, |w, h| {
        w.u64(h.found(Kind::Event, event as usize)).i32(status);
    });
}

extern "C" fn mem_trampoline(mem: cl_mem, user_data: *mut c_void) {
    // SAFETY: as in `program_trampoline`.
    let ctx = unsafe { Box::from_raw(user_data as *mut CallbackContext) };
    ctx.notify(notify::MEM, |w, h| {
        w.u64(h.id_of(Kind::Mem, mem as usize).unwrap_or(0));
    });
}

extern "C" fn destructor_trampoline(_context: cl_context, user_data: *mut c_void) {
    // SAFETY: as in `program_trampoline`.
    let ctx = unsafe { Box::from_raw(user_data as *mut CallbackContext) };
    ctx.notify(notify::DESTRUCTOR, |_, _| {});
}

pub(super) extern "C" fn free_trampoline(
    _event: cl_event,
    _status: cl_int,
    user_data: *mut c_void,
) {
    // SAFETY: `user_data` is the box leaked by `free_when_complete` for this one call.
    drop(unsafe { Box::from_raw(user_data as *mut Box<[u8]>) });
}

type ContextFn = unsafe extern "C" fn(*const libc::c_char, *const c_void, usize, *mut c_void);
type ProgramFn = unsafe extern "C" fn(cl_program, *mut c_void);
type EventFn = unsafe extern "C" fn(cl_event, cl_int, *mut c_void);
type MemFn = unsafe extern "C" fn(cl_mem, *mut c_void);
type DestructorFn = unsafe extern "C" fn(cl_context, *mut c_void);

/// Gives back a memory object's charge when the host destroys it.
pub(super) unsafe extern "C" fn uncharge_trampoline(_mem: cl_mem, data: *mut c_void) {
    // SAFETY: `data` is the box leaked in `charge_mem`, passed to exactly one callback.
    let (quota, size) =
        *unsafe { Box::from_raw(data.cast::<(Arc<crate::account::Account>, u64)>()) };
    quota.uncharge(size);
}

impl Session<'_> {
    fn callback_context(&self, id: u64, one_shot: bool) -> *mut c_void {
        let one_shot = one_shot.then(|| {
            let n = self.b.migration.one_shot_callbacks();
            n.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
            n
        });
        Box::into_raw(Box::new(CallbackContext {
            id,
            handles: self.b.handles.clone(),
            writer: self.b.writer.clone(),
            deferred: self.b.deferred.clone(),
            one_shot,
        }))
        .cast()
    }

    /// Frees the callback context made for a context that the host did not create.
    /// (The stand-in for data without a function was never allocated.)
    pub fn drop_callback_context(&self, data: *mut c_void) {
        if !data.is_null() && data != DATA_ONLY {
            // SAFETY: made by `callback_context` for a call whose object was not
            // created, so the host never got to keep or call it.
            drop(unsafe { Box::from_raw(data as *mut CallbackContext) });
        }
    }

    /// The host's function and user data for guest callback `id`: none (0), none but a
    /// non-null stand-in ([`CALLBACK_DATA_ONLY`]), or `trampoline` with a context that
    /// delivers the callback to the guest.
    fn callback<F>(&self, id: u64, trampoline: F, one_shot: bool) -> (Option<F>, *mut c_void) {
        match id {
            0 => (None, std::ptr::null_mut()),
            // A replayed build's callback was delivered where the build first ran.
            _ if one_shot && self.b.migration.replaying() => (None, std::ptr::null_mut()),
            CALLBACK_DATA_ONLY => (None, DATA_ONLY),
            _ => (Some(trampoline), self.callback_context(id, one_shot)),
        }
    }

    pub fn callback_context_fn(&self, id: u64) -> (Option<ContextFn>, *mut c_void) {
        self.callback(id, context_trampoline as ContextFn, false)
    }

    pub fn callback_program(&self, id: u64) -> (Option<ProgramFn>, *mut c_void) {
        self.callback(id, program_trampoline as ProgramFn, true)
    }

    pub fn callback_event(&self, id: u64) -> (Option<EventFn>, *mut c_void) {
        self.callback(id, event_trampoline as EventFn, true)
    }

    pub fn callback_destructor(&self, id: u64) -> (Option<DestructorFn>, *mut c_void) {
        self.callback(id, destructor_trampoline as DestructorFn, false)
    }

    pub fn callback_mem(&self, id: u64) -> (Option<MemFn>, *mut c_void) {
        self.callback(id, mem_trampoline as MemFn, false)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering;

    use hira_protocol::Reader;

    use super::*;
    use crate::opencl::test_backend;

    #[test]
    fn no_function_gives_the_host_none_and_data_alone_a_stand_in() {
        let t = test_backend();
        let backend = &t.backend;
        let s = Session::new(backend);
        let (f, data) = s.callback_program(0);
        assert!(f.is_none() && data.is_null());
        let (f, data) = s.callback_program(CALLBACK_DATA_ONLY);
        assert!(f.is_none());
        assert_eq!(data, DATA_ONLY);
        // The stand-in was never allocated: dropping it frees nothing.
        s.drop_callback_context(data);
        assert_eq!(
            backend
                .migration
                .one_shot_callbacks()
                .load(Ordering::Acquire),
            0
        );
    }

    #[test]
    fn a_build_callback_notifies_the_guest_once_with_its_id_and_the_program() {
        let t = test_backend();
        let (backend, sink) = (&t.backend, &t.sink);
        let s = Session::new(backend);
        let (f, data) = s.callback_program(77);
        let one_shot = backend.migration.one_shot_callbacks();
        assert_eq!(
            one_shot.load(Ordering::Acquire),
            1,
            "a migration would not wait for it"
        );
        let program = 0x5000 as cl_program;
        // SAFETY: the host calls a build's callback once with the data it was given.
        unsafe { f.expect("a trampoline")(program, data) };
        assert_eq!(one_shot.load(Ordering::Acquire), 0);
        let frames = sink.frames();
        assert_eq!(frames.len(), 1);
        let (h, body) = &frames[0];
        assert_eq!((h.kind, h.opcode), (FrameKind::Notify, notify::PROGRAM));
        let mut r = Reader::new(body);
        assert_eq!(r.u64().unwrap(), 77);
        let id = r.u64().unwrap();
        r.finish().unwrap();
        assert_eq!(s.handles().id_of(Kind::Program, program as usize), Some(id));
    }
}
