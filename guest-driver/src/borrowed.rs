//! Large inline inputs sent from where the application has them: the request under
//! construction holds their lengths, and their bytes go onto the connection as parts
//! of the frame ([`crate::Connection::call_parts`]) rather than through a copy in the
//! request, whose fresh pages would each fault in.

/// The smallest inline input sent from where it is (below it, copying is cheaper
/// than one more part to write).
pub const BORROW_MIN: usize = 64 * 1024;

/// A request's inputs that stay in the application's memory: where in the request
/// each belongs, and its bytes.
#[derive(Debug, Default)]
pub struct Borrowed(Vec<(usize, *const u8, usize)>);

impl Borrowed {
    /// Notes `len` bytes at `ptr` as belonging at offset `at` of the request.
    ///
    /// # Safety
    /// `ptr` is valid for `len` reads until the request is sent (the API call that
    /// makes it sends it before it returns).
    pub unsafe fn note(&mut self, at: usize, ptr: *const u8, len: usize) {
        self.0.push((at, ptr, len));
    }

    /// How many inputs are borrowed.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether any input is borrowed.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The request's payload: `request` with the borrowed inputs in their places.
    pub fn parts<'a>(&'a self, request: &'a [u8]) -> Vec<&'a [u8]> {
        let mut parts: Vec<&[u8]> = Vec::with_capacity(1 + 2 * self.0.len());
        let mut from = 0;
        for &(at, ptr, len) in &self.0 {
            parts.push(&request[from..at]);
            // SAFETY: valid for `len` reads while the request lives (`note`'s
            // contract).
            parts.push(unsafe { std::slice::from_raw_parts(ptr, len) });
            from = at;
        }
        parts.push(&request[from..]);
        parts
    }
}
