//! The one module allowed to use `unsafe`: the operating-system calls that
//! neither std nor rustix offer behind a safe interface. Everything else in
//! the crate is `#![deny(unsafe_code)]` (see `lib.rs`) and uses std or
//! rustix for its system calls.
//!
//! Each item here exposes a safe interface and carries, next to every
//! `unsafe` block, the argument for why that interface cannot be misused:
//!
//! - [`UringReader`] and [`UringQueue`]: io_uring reads. The kernel writes
//!   into a read's buffer at some time between the submission and the
//!   completion, outside of anything the borrow checker sees, so the buffer
//!   must stay allocated and unused by anyone else until the completion has
//!   been reaped. Both types own their buffers, each its own heap
//!   allocation (moving the owner never moves a buffer), and only let them
//!   go once no read on them can still be in flight; when that cannot be
//!   known (the ring failed mid-operation, or the owner is dropped with
//!   reads pending), the ring and the buffers are leaked, never freed. A
//!   read hung on a stalled (network) volume keeps its thread inside the
//!   call, holding the buffer: the wait cannot be interrupted, so the
//!   daemon counts the timeout and abandons the thread rather than free
//!   anything it holds.
//! - [`hold_stop_signals`] and [`release_stop_signals`]: SIGINT, SIGTERM
//!   and SIGHUP held pending from the first instruction of `main` until
//!   their handlers are in place.
//! - [`catch_interrupts`]: SIGINT/SIGTERM/SIGHUP handlers that only set a
//!   flag.
//! - [`nvme_get_log_page`]: the NVMe admin Get Log Page ioctl, whose
//!   kernel side writes into a caller's buffer during the call only.
//! - [`set_tcp_defer_accept`]: a socket option neither std nor rustix
//!   sets.
//!
//! [`AlignedBuf`], the `O_DIRECT` buffer these reads use, needs no `unsafe`
//! (`#[repr(align)]` on a boxed array), but lives here so that the io_uring
//! types can own theirs without this module importing the rest of the crate:
//! it is a leaf and must stay one, so that what the safety arguments rely on
//! is all in this file.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use io_uring::{IoUring, opcode, types};

/// Alignment of [`AlignedBuf`]: 4 KiB covers every logical block size Linux
/// supports for direct IO on common devices.
pub(crate) const DIRECT_IO_ALIGN: usize = 4096;

#[repr(C, align(4096))]
struct Aligned<const N: usize>([u8; N]);

// The attribute above cannot name the constant; this keeps the two equal.
const _: () = assert!(std::mem::align_of::<Aligned<1>>() == DIRECT_IO_ALIGN);

/// `N` bytes on the heap, aligned for `O_DIRECT`, zeroed at creation.
pub(crate) struct AlignedBuf<const N: usize>(Box<Aligned<N>>);

impl<const N: usize> std::fmt::Debug for AlignedBuf<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AlignedBuf").field("len", &N).finish()
    }
}

impl<const N: usize> Default for AlignedBuf<N> {
    fn default() -> Self {
        Self::new()
    }
}

impl<const N: usize> AlignedBuf<N> {
    pub(crate) fn new() -> AlignedBuf<N> {
        // An SQE carries a read's length as a u32.
        const { assert!(N <= u32::MAX as usize) };
        AlignedBuf(Box::new(Aligned([0; N])))
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.0.0
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.0.0
    }
}

/// Leaks what the kernel may still write into: forgetting the ring keeps
/// its descriptor and mappings alive, so a read in flight completes into a
/// buffer that is never freed or reused.
fn leak<T>(what: T) {
    std::mem::forget(what);
}

fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(libc::EIO)
}

const READ: u64 = 3;

/// An io_uring with one `N`-byte `O_DIRECT` read buffer, for one read at a
/// time (the read probe). Built once per probe engine and used from the
/// thread that built it.
pub(crate) struct UringReader<const N: usize> {
    /// `None` once poisoned: leaked, with `buf`.
    ring: Option<IoUring>,
    buf: Option<AlignedBuf<N>>,
    /// A read was pushed and its completion not yet reaped.
    in_flight: bool,
}

impl<const N: usize> std::fmt::Debug for UringReader<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringReader")
            .field("poisoned", &self.is_poisoned())
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

impl<const N: usize> UringReader<N> {
    /// Sets up the ring. One thread submits and reaps (the probe thread
    /// that built it), so the ring can defer completion work to the moment
    /// that thread waits for it (DEFER_TASKRUN, Linux 6.1) instead of
    /// interrupting it with task work: less CPU per IO. Older kernels
    /// refuse the flags with EINVAL; a plain ring then works as before.
    pub(crate) fn new() -> io::Result<UringReader<N>> {
        let ring = IoUring::builder()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .build(4)
            .or_else(|_| IoUring::new(4))?;
        Ok(UringReader {
            ring: Some(ring),
            buf: Some(AlignedBuf::new()),
            in_flight: false,
        })
    }

    /// True once the ring failed mid-operation and was leaked: every later
    /// read fails with EBADF, and the owner should build a new reader.
    pub(crate) fn is_poisoned(&self) -> bool {
        self.ring.is_none()
    }

    fn poison(&mut self) {
        if let Some(ring) = self.ring.take() {
            leak(ring);
        }
        if let Some(buf) = self.buf.take() {
            leak(buf);
        }
    }

    /// Reads `N` bytes at `offset` of `fd` into the buffer and waits for the
    /// completion. Returns the completion's result (bytes read, or a
    /// negated errno) and the time from submission to reaping. `Err` is an
    /// errno of the ring itself: EBADF when poisoned, EBUSY when the
    /// submission queue is full, or what `io_uring_enter` failed with, which
    /// poisons the reader.
    pub(crate) fn read(&mut self, fd: BorrowedFd<'_>, offset: u64) -> Result<(i32, Duration), i32> {
        let (Some(ring), Some(buf)) = (self.ring.as_mut(), self.buf.as_mut()) else {
            return Err(libc::EBADF);
        };
        let sqe = opcode::Read::new(
            types::Fd(fd.as_raw_fd()),
            buf.as_mut_slice().as_mut_ptr(),
            N as u32,
        )
        .offset(offset)
        .build()
        .user_data(READ);
        // SAFETY: the SQE points at `buf`, N bytes owned by `self`. The
        // kernel may write into it until the read's CQE is posted, so it
        // must stay allocated and untouched until then. It does: this
        // function holds `&mut self` and does not return until it has reaped
        // that CQE, except when `io_uring_enter` fails, and then `poison`
        // leaks the ring and the buffer together, so they are never freed
        // or reused. `in_flight` covers the one remaining way out, an unwind
        // through this function: `Drop` then leaks them too. The
        // descriptor only needs to be open at submission, which happens in
        // this call while `fd` is borrowed; the kernel holds its own
        // reference to the file from then on.
        if unsafe { ring.submission().push(&sqe) }.is_err() {
            return Err(libc::EBUSY);
        }
        self.in_flight = true;
        let t0 = Instant::now();
        let mut submitted = false;
        loop {
            let Some(ring) = self.ring.as_mut() else {
                return Err(libc::EBADF);
            };
            let r = if submitted {
                ring.submitter().submit_and_wait(1)
            } else {
                ring.submit_and_wait(1)
            };
            match r {
                Ok(_) => submitted = true,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {
                    // The SQE was consumed if the kernel got that far; the
                    // next enter only waits.
                    submitted = ring.submission().is_empty();
                    continue;
                }
                Err(e) => {
                    // The read may or may not be in flight: nobody can say
                    // when the kernel is done with the buffer.
                    self.poison();
                    return Err(errno_of(&e));
                }
            }
            let now = Instant::now();
            let mut done = None;
            for cqe in ring.completion() {
                if cqe.user_data() == READ {
                    done = Some(cqe.result());
                }
            }
            if let Some(res) = done {
                self.in_flight = false;
                return Ok((res, now - t0));
            }
        }
    }
}

impl<const N: usize> Drop for UringReader<N> {
    fn drop(&mut self) {
        if self.in_flight {
            self.poison();
        }
    }
}

/// Which way an SQE of a [`UringQueue`] moves data.
#[derive(Debug, Clone, Copy)]
enum Dir {
    Read,
    Write,
}

struct Slot<const N: usize> {
    buf: AlignedBuf<N>,
    /// Pushed and its CQE not yet reaped.
    in_flight: bool,
}

/// An io_uring with `depth` slots, each with its own `N`-byte `O_DIRECT`
/// buffer, for many reads or writes of one file in flight at once (the
/// queue-depth sweep). A slot's buffer belongs to the slot table for as
/// long as the queue lives, and a slot takes a new read or write only after
/// the CQE of its previous one was reaped.
pub(crate) struct UringQueue<'fd, const N: usize> {
    /// `None` once poisoned: leaked, with the slots.
    ring: Option<IoUring>,
    slots: Vec<Slot<N>>,
    /// The file every read is of, borrowed for the queue's whole life so
    /// that it is open whenever [`UringQueue::wait`] submits a read.
    fd: BorrowedFd<'fd>,
}

impl<const N: usize> std::fmt::Debug for UringQueue<'_, N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringQueue")
            .field("depth", &self.slots.len())
            .field("in_flight", &self.in_flight())
            .field("poisoned", &self.ring.is_none())
            .finish()
    }
}

impl<'fd, const N: usize> UringQueue<'fd, N> {
    pub(crate) fn new(fd: BorrowedFd<'fd>, depth: u32) -> io::Result<UringQueue<'fd, N>> {
        let ring = IoUring::new(depth.next_power_of_two().max(2))?;
        Ok(UringQueue {
            ring: Some(ring),
            fd,
            slots: (0..depth)
                .map(|_| Slot {
                    buf: AlignedBuf::new(),
                    in_flight: false,
                })
                .collect(),
        })
    }

    /// Reads and writes pushed whose completion was not reaped yet.
    pub(crate) fn in_flight(&self) -> usize {
        self.slots.iter().filter(|s| s.in_flight).count()
    }

    fn poison(&mut self) {
        if let Some(ring) = self.ring.take() {
            leak(ring);
        }
        leak(std::mem::take(&mut self.slots));
    }

    /// Queues a read of `N` bytes at `offset` of the queue's file into
    /// `slot`'s buffer; [`UringQueue::wait`] submits it. Refused for a slot
    /// out of range or still in flight, a full submission queue and a
    /// poisoned ring.
    pub(crate) fn push_read(&mut self, slot: usize, offset: u64) -> Result<(), &'static str> {
        self.push(slot, offset, Dir::Read)
    }

    /// Queues a write of `slot`'s buffer (`N` bytes, as [`UringQueue::fill`]
    /// left it) at `offset` of the queue's file; refused as
    /// [`UringQueue::push_read`] is. The file must be open for writing.
    pub(crate) fn push_write(&mut self, slot: usize, offset: u64) -> Result<(), &'static str> {
        self.push(slot, offset, Dir::Write)
    }

    /// Lets `f` write into every slot's buffer (the data the writes will
    /// carry). Refused while any slot is in flight: the kernel may be
    /// reading or writing those buffers.
    pub(crate) fn fill(&mut self, mut f: impl FnMut(&mut [u8])) -> Result<(), &'static str> {
        if self.ring.is_none() {
            return Err("io_uring failed earlier");
        }
        if self.in_flight() > 0 {
            return Err("slots still in flight");
        }
        for s in &mut self.slots {
            f(s.buf.as_mut_slice());
        }
        Ok(())
    }

    fn push(&mut self, slot: usize, offset: u64, dir: Dir) -> Result<(), &'static str> {
        let Some(ring) = self.ring.as_mut() else {
            return Err("io_uring failed earlier");
        };
        let Some(s) = self.slots.get_mut(slot) else {
            return Err("slot out of range");
        };
        if s.in_flight {
            return Err("slot still in flight");
        }
        let fd = types::Fd(self.fd.as_raw_fd());
        let sqe = match dir {
            Dir::Read => opcode::Read::new(fd, s.buf.as_mut_slice().as_mut_ptr(), N as u32)
                .offset(offset)
                .build(),
            Dir::Write => opcode::Write::new(fd, s.buf.as_slice().as_ptr(), N as u32)
                .offset(offset)
                .build(),
        }
        .user_data(slot as u64);
        // SAFETY: the SQE points at this slot's buffer, N bytes that the
        // slot table owns; the kernel may write into it (a read) or read
        // from it (a write) until the CQE carrying this slot's number is
        // posted. The slot is marked in flight below and is handed out
        // again (here, or to `fill`, which refuses while any slot is in
        // flight) only after `wait` has reaped that CQE; nothing else
        // touches the buffers, so a write never sends bytes being changed
        // under it and a read never lands in a buffer in use. The table is
        // only ever released with no slot in flight: `wait` leaks it with
        // the ring when `io_uring_enter` fails, and `Drop` leaks both when
        // any slot is still in flight (a sweep abandoned mid-way), so the
        // kernel never touches freed or reused memory. The descriptor is
        // borrowed for the queue's life, so it is open when `wait` submits
        // the SQE; the kernel holds its own reference to the file from then
        // until the completion.
        unsafe { ring.submission().push(&sqe) }.map_err(|_| "submission queue full")?;
        s.in_flight = true;
        Ok(())
    }

    /// Submits what was pushed, waits for at least one completion and
    /// returns the reaped ones as (slot, result): bytes moved or a negated
    /// errno. Returns at once with none when nothing is in flight. A failed
    /// `io_uring_enter` (other than EINTR, which is retried) poisons the
    /// queue: ring and buffers are leaked, and later calls fail with EBADF.
    pub(crate) fn wait(&mut self) -> io::Result<Vec<(usize, i32)>> {
        if self.in_flight() == 0 {
            return Ok(Vec::new());
        }
        loop {
            let Some(ring) = self.ring.as_mut() else {
                return Err(io::Error::from_raw_os_error(libc::EBADF));
            };
            match ring.submit_and_wait(1) {
                Ok(_) => break,
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => {
                    self.poison();
                    return Err(e);
                }
            }
        }
        let Some(ring) = self.ring.as_mut() else {
            return Err(io::Error::from_raw_os_error(libc::EBADF));
        };
        let reaped: Vec<(usize, i32)> = ring
            .completion()
            .map(|c| (c.user_data() as usize, c.result()))
            .collect();
        for &(slot, _) in &reaped {
            if let Some(s) = self.slots.get_mut(slot) {
                s.in_flight = false;
            }
        }
        Ok(reaped)
    }
}

impl<const N: usize> Drop for UringQueue<'_, N> {
    fn drop(&mut self) {
        if self.in_flight() > 0 {
            self.poison();
        }
    }
}

/// The signals that stop (SIGINT, SIGTERM) or reload (SIGHUP) the process.
/// Their default action ends it on the spot, leaving behind whatever probe
/// files, lock and probe directory it had created: until a handler is in
/// place they must be held, not delivered.
const STOP_SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

fn change_stop_signals(how: libc::c_int) {
    let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigemptyset initialises the whole set behind the pointer it
    // is given (a live, writable sigset_t) and cannot fail for a valid
    // pointer; sigaddset only sets a bit of that initialised set and fails
    // only for an invalid signal number, which these are not.
    // pthread_sigmask reads the set and, with a null old-set pointer,
    // writes nothing; it changes the calling thread's mask alone and fails
    // only for an invalid `how` (SIG_BLOCK and SIG_UNBLOCK are valid).
    unsafe {
        libc::sigemptyset(set.as_mut_ptr());
        for sig in STOP_SIGNALS {
            libc::sigaddset(set.as_mut_ptr(), sig);
        }
        libc::pthread_sigmask(how, set.as_ptr(), std::ptr::null_mut());
    }
}

/// Holds SIGINT, SIGTERM and SIGHUP pending instead of delivering them to
/// the calling thread. Call it first thing in `main`, before any thread
/// exists: a signal mask is per thread and every thread inherits its
/// creator's, so all threads the process will have (the async runtime's,
/// the blocking pool's, the probe threads) start with the three held, and
/// a signal that arrives at any moment of the start waits for
/// [`release_stop_signals`] instead of killing the process half way. (A
/// child started with `std::process::Command` gets an empty mask: std
/// resets it between fork and exec.)
pub(crate) fn hold_stop_signals() {
    change_stop_signals(libc::SIG_BLOCK);
}

/// Lets SIGINT, SIGTERM and SIGHUP through to the calling thread again,
/// once their handlers are installed: a signal held meanwhile is delivered
/// to a handler now. Only the calling thread's mask changes; the kernel
/// delivers a signal sent to the process to a thread that does not hold
/// it, so releasing them on the main thread alone is enough.
pub(crate) fn release_stop_signals() {
    change_stop_signals(libc::SIG_UNBLOCK);
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Makes SIGINT (Ctrl-C), SIGTERM and SIGHUP (the terminal closed) set the
/// flag [`interrupted`] reads instead of ending the process, so a run can
/// stop early and still clean up, then releases them (see
/// [`hold_stop_signals`]): one that arrived while they were held is
/// delivered to the handler now. signal(2) fails only for an invalid or
/// uncatchable signal number, which these are not.
pub(crate) fn catch_interrupts() {
    let handler = on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: the handler only stores to an atomic, which is
    // async-signal-safe, and it is a plain function that lives as long as
    // the process.
    unsafe {
        for sig in STOP_SIGNALS {
            libc::signal(sig, handler);
        }
    }
    release_stop_signals();
}

/// Whether SIGINT, SIGTERM or SIGHUP arrived since [`catch_interrupts`].
pub(crate) fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// Size of an NVMe log page read by [`nvme_get_log_page`]: the AWS EBS
/// statistics page (0xD0) is 4096 bytes.
pub(crate) const NVME_LOG_PAGE_LEN: usize = 4096;

/// `struct nvme_passthru_cmd` of `<linux/nvme_ioctl.h>` (also
/// `nvme_admin_cmd`): 72 bytes, which the ioctl number encodes.
#[repr(C)]
#[derive(Debug, Default)]
struct NvmePassthruCmd {
    opcode: u8,
    flags: u8,
    rsvd1: u16,
    nsid: u32,
    cdw2: u32,
    cdw3: u32,
    metadata: u64,
    addr: u64,
    metadata_len: u32,
    data_len: u32,
    cdw10: u32,
    cdw11: u32,
    cdw12: u32,
    cdw13: u32,
    cdw14: u32,
    cdw15: u32,
    timeout_ms: u32,
    result: u32,
}

const _: () = assert!(std::mem::size_of::<NvmePassthruCmd>() == 72);

/// `NVME_IOCTL_ADMIN_CMD` = `_IOWR('N', 0x41, struct nvme_admin_cmd)`.
const NVME_IOCTL_ADMIN_CMD: u32 = (3 << 30) | (72 << 16) | ((b'N' as u32) << 8) | 0x41;
const _: () = assert!(NVME_IOCTL_ADMIN_CMD == 0xC048_4E41);

/// NVMe admin opcode Get Log Page.
const NVME_ADMIN_GET_LOG_PAGE: u8 = 0x02;

/// Command dword 10 of Get Log Page for a whole [`NVME_LOG_PAGE_LEN`]-byte
/// page of `log_id`: NUMDL (bits 31:16) is the number of dwords *minus
/// one*, so 4096 bytes = 1024 dwords is 1023 (0x3FF). Some tools send 1024,
/// which asks for 4100 bytes: off by one, and harmless only as long as the
/// controller stops at the 4096 bytes the kernel mapped for `data_len`.
const fn get_log_page_cdw10(log_id: u8) -> u32 {
    let numdl = (NVME_LOG_PAGE_LEN / 4 - 1) as u32;
    (numdl << 16) | log_id as u32
}
const _: () = assert!(get_log_page_cdw10(0xD0) == 0x03FF_00D0);

/// How a Get Log Page admin command ended without an OS error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum LogPage {
    /// The page was transferred into the buffer.
    Read,
    /// The controller answered with this NVMe status (the ioctl's positive
    /// return: status code type and status code, e.g. 0x109 "invalid log
    /// page" from a controller that has no such page).
    Status(u32),
}

/// Reads log page `log_id` of namespace `nsid` from the NVMe controller or
/// namespace open at `fd` into `buf`, with `NVME_IOCTL_ADMIN_CMD`. Needs
/// CAP_SYS_ADMIN: the kernel lets unprivileged callers send only a few
/// identify commands. An `Err` is the ioctl's errno (EACCES/EPERM without
/// the capability, ENOTTY on a file that is not an NVMe device).
///
/// `timeout_ms` stays 0 (the kernel's admin timeout, 60 s by default): on
/// PCIe an admin command that times out makes the driver reset the
/// controller, and the controller of an EBS volume may be the root disk's.
pub(crate) fn nvme_get_log_page(
    fd: BorrowedFd<'_>,
    nsid: u32,
    log_id: u8,
    buf: &mut AlignedBuf<NVME_LOG_PAGE_LEN>,
) -> io::Result<LogPage> {
    let mut cmd = NvmePassthruCmd {
        opcode: NVME_ADMIN_GET_LOG_PAGE,
        nsid,
        addr: buf.as_mut_slice().as_mut_ptr() as u64,
        data_len: NVME_LOG_PAGE_LEN as u32,
        cdw10: get_log_page_cdw10(log_id),
        ..NvmePassthruCmd::default()
    };
    // SAFETY: the kernel writes at most `data_len` bytes to `addr`, and
    // `addr` is the start of `buf`, which is exactly NVME_LOG_PAGE_LEN
    // bytes, exclusively borrowed for this whole call (so nothing else
    // reads or frees it meanwhile) and 4096-aligned (more than the dword
    // alignment NVMe data transfers need, so the kernel maps it without a
    // bounce buffer). The ioctl is synchronous: it returns only after the
    // command completed, failed or was cancelled by a controller reset,
    // and the kernel unmaps the user buffer before returning, so it never
    // writes into `buf` after the borrow ends. `metadata` and
    // `metadata_len` are 0, so the kernel follows no other pointer. `cmd`
    // is a live, correctly laid out (repr(C), 72 bytes, size asserted
    // above) struct the kernel reads and writes `result` back into during
    // the call only.
    let rc = unsafe {
        libc::ioctl(
            fd.as_raw_fd(),
            NVME_IOCTL_ADMIN_CMD as _,
            &mut cmd as *mut NvmePassthruCmd,
        )
    };
    match rc {
        0 => Ok(LogPage::Read),
        n if n > 0 => Ok(LogPage::Status(n as u32)),
        _ => Err(io::Error::last_os_error()),
    }
}

/// Sets TCP_DEFER_ACCEPT on the listening socket `fd`: the kernel hands a
/// connection to accept(2) only once its first data has arrived, or when
/// about `seconds` have passed without any (then it completes the
/// connection as usual). HTTP and TLS clients speak first, so a real client
/// is not delayed at all, while connections that never send a byte wait in
/// the kernel's queue of half-open connections, holding no descriptor of
/// the exporter's and no place in its accept queue.
pub(crate) fn set_tcp_defer_accept(fd: BorrowedFd<'_>, seconds: u32) -> io::Result<()> {
    let value = libc::c_int::try_from(seconds).unwrap_or(libc::c_int::MAX);
    // SAFETY: setsockopt reads `optlen` bytes from `optval` during the call
    // only: `optval` points to `value`, a live c_int on this stack frame,
    // and `optlen` is the size of a c_int, which is what the kernel expects
    // for TCP_DEFER_ACCEPT. `fd` is a borrowed, open descriptor for the
    // whole call; on anything but a TCP socket the call fails cleanly
    // (ENOTSOCK, ENOPROTOOPT).
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_DEFER_ACCEPT,
            (&value as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsFd;
    use std::os::unix::fs::OpenOptionsExt;

    const B: usize = 8192;

    /// The ioctl on a file that is no NVMe device: the kernel refuses it
    /// (ENOTTY) without touching the buffer.
    #[test]
    fn nvme_log_page_on_a_plain_file_is_enotty() {
        let dir = tempfile::tempdir().unwrap();
        let f = std::fs::File::create(dir.path().join("x")).unwrap();
        let mut buf = AlignedBuf::<NVME_LOG_PAGE_LEN>::new();
        let e = nvme_get_log_page(f.as_fd(), 1, 0xD0, &mut buf).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOTTY));
        assert!(buf.as_slice().iter().all(|b| *b == 0));
    }

    /// A file of `blocks` 8 KiB blocks, block i filled with byte i + 1.
    fn patterned(dir: &std::path::Path, blocks: u8) -> std::path::PathBuf {
        let p = dir.join("data");
        let mut f = std::fs::File::create(&p).unwrap();
        for i in 0..blocks {
            f.write_all(&[i + 1; B]).unwrap();
        }
        f.sync_all().unwrap();
        p
    }

    /// O_DIRECT when the filesystem has it (tmpfs does not); the ring reads
    /// the same either way.
    fn open_read(p: &std::path::Path) -> std::fs::File {
        std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECT)
            .open(p)
            .or_else(|_| std::fs::File::open(p))
            .unwrap()
    }

    #[test]
    fn aligned_buffer_is_aligned_and_zeroed() {
        let b = AlignedBuf::<B>::new();
        assert_eq!(b.as_slice().as_ptr() as usize % DIRECT_IO_ALIGN, 0);
        assert_eq!(b.as_slice().len(), B);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        let mut v: Vec<AlignedBuf<512>> = (0..5).map(|_| AlignedBuf::new()).collect();
        for b in &mut v {
            assert_eq!(b.as_mut_slice().as_ptr() as usize % DIRECT_IO_ALIGN, 0);
        }
    }

    #[test]
    fn uring_reader_reads_blocks_and_reports_errors() {
        let mut r = match UringReader::<B>::new() {
            Ok(r) => r,
            Err(e) => {
                eprintln!("io_uring unavailable here ({e}); skipping");
                return;
            }
        };
        let tmp = tempfile::tempdir().unwrap();
        let f = open_read(&patterned(tmp.path(), 3));
        let (res, took) = r.read(f.as_fd(), 2 * B as u64).unwrap();
        assert_eq!(res, B as i32);
        assert!(took > Duration::ZERO);
        assert!(r.buf.as_ref().unwrap().as_slice().iter().all(|&x| x == 3));
        // Past the end: a short (empty) read, not an error of the ring.
        assert_eq!(r.read(f.as_fd(), 3 * B as u64).unwrap().0, 0);
        // A descriptor opened for writing only: the read fails with EBADF
        // in the completion, and the reader stays usable.
        let w = std::fs::OpenOptions::new()
            .write(true)
            .open(tmp.path().join("data"))
            .unwrap();
        assert_eq!(r.read(w.as_fd(), 0).unwrap().0, -libc::EBADF);
        assert!(!r.is_poisoned());
        assert_eq!(r.read(f.as_fd(), 0).unwrap().0, B as i32);
        assert!(r.buf.as_ref().unwrap().as_slice().iter().all(|&x| x == 1));
        // Poisoned: nothing is freed, every read fails with EBADF.
        r.poison();
        assert!(r.is_poisoned());
        assert_eq!(r.read(f.as_fd(), 0), Err(libc::EBADF));
    }

    #[test]
    fn uring_queue_keeps_many_reads_in_flight_and_frees_slots_when_reaped() {
        let depth = 16u32;
        let tmp = tempfile::tempdir().unwrap();
        let f = open_read(&patterned(tmp.path(), 4));
        let mut q = match UringQueue::<B>::new(f.as_fd(), depth) {
            Ok(q) => q,
            Err(e) => {
                eprintln!("io_uring unavailable here ({e}); skipping");
                return;
            }
        };
        assert!(q.wait().unwrap().is_empty(), "nothing in flight");
        for slot in 0..depth as usize {
            q.push_read(slot, (slot % 4 * B) as u64).unwrap();
        }
        assert_eq!(q.in_flight(), depth as usize);
        assert_eq!(
            q.push_read(0, 0),
            Err("slot still in flight"),
            "a buffer the kernel may be writing is never handed out again"
        );
        assert_eq!(q.push_read(depth as usize, 0), Err("slot out of range"));
        let mut seen = 0;
        while q.in_flight() > 0 {
            for (slot, res) in q.wait().unwrap() {
                assert_eq!(res, B as i32, "slot {slot}");
                let want = (slot % 4) as u8 + 1;
                assert!(q.slots[slot].buf.as_slice().iter().all(|&x| x == want));
                seen += 1;
            }
        }
        assert_eq!(seen, depth);
        // Reaped slots take new reads.
        q.push_read(3, 0).unwrap();
        let done = q.wait().unwrap();
        assert_eq!(done, vec![(3, B as i32)]);
    }

    #[test]
    fn a_queue_dropped_with_reads_in_flight_leaks_instead_of_freeing() {
        let tmp = tempfile::tempdir().unwrap();
        let f = open_read(&patterned(tmp.path(), 1));
        let Ok(mut q) = UringQueue::<B>::new(f.as_fd(), 4) else {
            return;
        };
        q.push_read(0, 0).unwrap();
        q.push_read(1, 0).unwrap();
        // Dropped with both pending: Drop must leak, not free (under Miri
        // or ASan a free here would show as a use after free once the
        // kernel completes the read).
        drop(q);
        let Ok(mut q) = UringQueue::<B>::new(f.as_fd(), 4) else {
            return;
        };
        q.poison();
        assert_eq!(q.push_read(0, 0), Err("io_uring failed earlier"));
        assert!(
            q.wait().unwrap().is_empty(),
            "nothing in flight to wait for"
        );
    }

    #[test]
    fn uring_queue_writes_the_filled_buffers_and_refuses_to_fill_in_flight() {
        let tmp = tempfile::tempdir().unwrap();
        let p = patterned(tmp.path(), 4);
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(&p)
            .or_else(|_| std::fs::OpenOptions::new().read(true).write(true).open(&p))
            .unwrap();
        let Ok(mut q) = UringQueue::<B>::new(f.as_fd(), 2) else {
            return;
        };
        let mut n = 0u8;
        q.fill(|b| {
            n += 1;
            b.fill(0xA0 + n);
        })
        .unwrap();
        q.push_write(0, 3 * B as u64).unwrap();
        q.push_write(1, B as u64).unwrap();
        assert_eq!(
            q.fill(|b| b.fill(0)),
            Err("slots still in flight"),
            "a buffer the kernel may be reading is never changed"
        );
        let mut done = Vec::new();
        while q.in_flight() > 0 {
            done.extend(q.wait().unwrap());
        }
        done.sort_unstable();
        assert_eq!(done, vec![(0, B as i32), (1, B as i32)]);
        drop(q);
        let data = std::fs::read(&p).unwrap();
        let block = |i: usize| &data[i * B..(i + 1) * B];
        assert!(block(0).iter().all(|&x| x == 1), "untouched");
        assert!(block(1).iter().all(|&x| x == 0xA2));
        assert!(block(2).iter().all(|&x| x == 3), "untouched");
        assert!(block(3).iter().all(|&x| x == 0xA1));
    }

    /// A SIGTERM sent while the three are held waits, and reaches the
    /// handler once they are released. (raise sends to the calling thread,
    /// so the other tests' threads do not see it.)
    #[test]
    fn a_held_sigterm_is_delivered_to_the_handler_on_release() {
        hold_stop_signals();
        let pending = || {
            let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
            // SAFETY: sigpending fills the set it is given; sigismember
            // reads that initialised set.
            unsafe {
                assert_eq!(libc::sigpending(set.as_mut_ptr()), 0);
                libc::sigismember(set.as_ptr(), libc::SIGTERM) == 1
            }
        };
        // SAFETY: raise sends to this thread only, which holds SIGTERM.
        assert_eq!(unsafe { libc::raise(libc::SIGTERM) }, 0);
        assert!(pending(), "held, not delivered");
        catch_interrupts();
        assert!(!pending());
        assert!(interrupted());
    }

    #[test]
    fn a_caught_sigterm_sets_the_flag_instead_of_ending_the_process() {
        catch_interrupts();
        // SAFETY: raise only sends a signal to this thread; the handler
        // installed above only stores to an atomic.
        assert_eq!(unsafe { libc::raise(libc::SIGTERM) }, 0);
        assert!(interrupted());
    }
}
