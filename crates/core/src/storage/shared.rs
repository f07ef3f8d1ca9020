//! Shared memory: the blocks of the `cpu_shared` context, which other processes can map.
//!
//! Owns: [`Segment`], one anonymous shared-memory file per block (Linux `memfd_create`),
//! mapped read-write and shared. Its handle, as stock's `MXNDArrayGetSharedMemHandle` gives it,
//! is the creating process's id and the file descriptor: a process that receives the
//! descriptor (the frontend's DataLoader passes it over a Unix socket, `DupFd`) maps the same
//! memory with [`Segment::adopt`]. The file has no name, so nothing is left in `/dev/shm`
//! whatever happens to the processes; the memory goes back to the system when the last
//! descriptor and mapping are gone. Stock names each segment `/mx_<pid>_<id>` and unlinks it
//! at once; the difference is not visible through the API. Blocks here bypass the pools:
//! each is its own file, as in stock.

use crate::error::{Error, Result};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

/// One shared-memory file: its descriptor and the process that created it. The mapping is
/// the block's (its address and size live in the [`super::Block`]).
pub struct Segment {
    fd: OwnedFd,
    pid: i32,
}

impl Segment {
    /// `(pid, fd)` as `MXNDArrayGetSharedMemHandle` reports them.
    pub fn handle(&self) -> (i32, i32) {
        (self.pid, self.fd.as_raw_fd())
    }

    /// A new file of `size` bytes, mapped (no mapping for 0 bytes; the address is then
    /// dangling and never read).
    pub fn create(size: usize) -> Result<(NonNull<u8>, Segment)> {
        let fd = new_file()?;
        let len = libc::off_t::try_from(size)
            .map_err(|_| Error::value(format!("cannot allocate {size} bytes of shared memory")))?;
        // SAFETY: `fd` is an open file this function owns.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), len) } != 0 {
            return Err(os_error(format!("cannot allocate {size} bytes of shared memory")));
        }
        // SAFETY: getpid has no preconditions.
        let pid = unsafe { libc::getpid() };
        let ptr = map(&fd, size)?;
        Ok((ptr, Segment { fd, pid }))
    }

    /// Map the shared-memory file `fd` (made by [`Segment::create`] in this or another
    /// process) for `size` bytes. On success the segment owns `fd` and closes it when dropped;
    /// on failure the caller keeps it.
    ///
    /// # Safety
    /// `fd` must not be closed by anyone else once this returns `Ok`: the caller gives it up.
    pub unsafe fn adopt(pid: i32, fd: i32, size: usize) -> Result<(NonNull<u8>, Segment)> {
        // SAFETY: fstat writes into the zeroed struct; a bad descriptor is an error return.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if fd < 0 || unsafe { libc::fstat(fd, &mut st) } != 0 {
            return Err(Error::value(format!(
                "shared memory handle ({pid}, {fd}): {fd} is not an open file descriptor"
            )));
        }
        let have = usize::try_from(st.st_size).unwrap_or(0);
        if (st.st_mode & libc::S_IFMT) != libc::S_IFREG || have < size {
            return Err(Error::value(format!(
                "shared memory handle ({pid}, {fd}) holds {have} bytes; the array needs {size}"
            )));
        }
        // SAFETY: checked open above; the caller gives it up on success, and on failure
        // `into_raw_fd` hands it back unclosed.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        match map(&owned, size) {
            Ok(ptr) => Ok((ptr, Segment { fd: owned, pid })),
            Err(e) => {
                let _ = std::os::fd::IntoRawFd::into_raw_fd(owned);
                Err(e)
            }
        }
    }

    /// Unmap the block's memory (`ptr` and `size` from [`Segment::create`] or
    /// [`Segment::adopt`]); the descriptor closes when the segment is dropped.
    ///
    /// # Safety
    /// `ptr`/`size` must be this segment's mapping, not used after this call.
    pub unsafe fn unmap(&self, ptr: NonNull<u8>, size: usize) {
        if size > 0 {
            // SAFETY: per this function's contract, the mapping `map` made.
            unsafe { libc::munmap(ptr.as_ptr().cast(), size) };
        }
    }
}

fn os_error(what: String) -> Error {
    Error::value(format!("{what}: {}", std::io::Error::last_os_error()))
}

#[cfg(target_os = "linux")]
fn new_file() -> Result<OwnedFd> {
    // SAFETY: a NUL-terminated name; flags are valid.
    let fd = unsafe { libc::memfd_create(c"mxnet-rt cpu_shared".as_ptr(), libc::MFD_CLOEXEC) };
    if fd < 0 {
        return Err(os_error("cannot create shared memory".into()));
    }
    // SAFETY: a descriptor just opened, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(not(target_os = "linux"))]
fn new_file() -> Result<OwnedFd> {
    Err(Error::not_supported("cpu_shared memory on this platform"))
}

fn map(fd: &OwnedFd, size: usize) -> Result<NonNull<u8>> {
    if size == 0 {
        return Ok(NonNull::<[u8; super::ALIGN]>::dangling().cast());
    }
    // SAFETY: a shared read-write mapping of an open file, at an address the system picks.
    let p = unsafe {
        libc::mmap(std::ptr::null_mut(), size, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd.as_raw_fd(), 0)
    };
    if p == libc::MAP_FAILED {
        return Err(os_error(format!("cannot map {size} bytes of shared memory")));
    }
    NonNull::new(p.cast()).ok_or_else(|| Error::internal("mmap returned NULL"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_mapping_of_the_descriptor_sees_the_same_bytes() {
        let (p, seg) = Segment::create(4096 + 3).unwrap();
        // SAFETY: the mapping holds 4099 bytes.
        unsafe { p.as_ptr().add(4098).write(42) };
        let (pid, fd) = seg.handle();
        // SAFETY: dup has no preconditions; the duplicate is handed to `adopt`.
        let dup = unsafe { libc::dup(fd) };
        // SAFETY: nobody else closes `dup`.
        let (q, other) = unsafe { Segment::adopt(pid, dup, 4099) }.unwrap();
        assert_ne!(p, q);
        // SAFETY: both mappings hold 4099 bytes of the same file.
        unsafe {
            assert_eq!(q.as_ptr().add(4098).read(), 42);
            q.as_ptr().write(7);
            assert_eq!(p.as_ptr().read(), 7);
            seg.unmap(p, 4099);
            other.unmap(q, 4099);
        }
        // Too large a request, a closed descriptor and a non-file are refused, and the
        // descriptor stays the caller's.
        let (p2, seg2) = Segment::create(16).unwrap();
        let fd2 = seg2.handle().1;
        // SAFETY: refused: the descriptor stays open (checked below).
        let e = unsafe { Segment::adopt(1, fd2, 17) }.err().unwrap();
        assert!(e.to_string().contains("holds 16 bytes; the array needs 17"), "{e}");
        // SAFETY: fcntl only queries.
        assert!(unsafe { libc::fcntl(fd2, libc::F_GETFD) } >= 0, "still open");
        // SAFETY: -1 and a closed number are not opened by adopt.
        assert!(unsafe { Segment::adopt(1, -1, 4) }.is_err());
        let mut pipe = [0; 2];
        // SAFETY: a two-element array.
        assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
        // SAFETY: refused (not a regular file); closed below.
        assert!(unsafe { Segment::adopt(1, pipe[0], 0) }.is_err());
        // SAFETY: our own pipe.
        unsafe {
            libc::close(pipe[0]);
            libc::close(pipe[1]);
            seg2.unmap(p2, 16);
        }
        // Empty segments have a descriptor but no mapping.
        let (_, empty) = Segment::create(0).unwrap();
        assert!(empty.handle().1 >= 0);
    }
}
