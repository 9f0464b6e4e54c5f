//! Where a crash happened, for hosts without a debugger (the GPU host has no gdb): on SIGSEGV
//! or SIGBUS print the faulting address, the thread's name, the instruction pointer and the
//! stack (each frame as `object+offset`, resolvable with `addr2line -f -e object offset`, or
//! against the executable's symbol table where it has no line tables), then die of the same
//! signal (the handler is one-shot: returning re-runs the faulting instruction under the
//! default action). The output is written with `write(2)` from fixed buffers: nothing here
//! allocates or takes a lock, except glibc's `backtrace` and `dladdr`, which a dying process
//! may call (`backtrace` is warmed up at install, so its library is loaded already).

#![allow(dead_code)]

use std::ffi::{c_int, c_void, CStr};
use std::fmt::Write as _;
use std::sync::Once;

extern "C" {
    // glibc's execinfo.h.
    fn backtrace(buffer: *mut *mut c_void, size: c_int) -> c_int;
}

/// Install the handler for this process (once; later calls do nothing).
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let mut warm = [std::ptr::null_mut::<c_void>(); 4];
        // SAFETY: `warm` has room for the 4 frames asked for.
        unsafe { backtrace(warm.as_mut_ptr(), 4) };
        for sig in [libc::SIGSEGV, libc::SIGBUS] {
            // SAFETY: a zeroed sigaction is a valid starting point; the handler has the
            // SA_SIGINFO signature; SA_RESETHAND makes it one-shot so a fault inside it ends
            // the process instead of recursing.
            unsafe {
                let mut sa: libc::sigaction = std::mem::zeroed();
                sa.sa_sigaction = on_fault as *const () as usize;
                sa.sa_flags = libc::SA_SIGINFO | libc::SA_RESETHAND | libc::SA_ONSTACK;
                libc::sigemptyset(&mut sa.sa_mask);
                libc::sigaction(sig, &sa, std::ptr::null_mut());
            }
        }
    });
}

/// A line in a stack buffer (no allocation), written to stderr.
struct Line {
    buf: [u8; 512],
    len: usize,
}

impl Line {
    fn new() -> Self {
        Self {
            buf: [0; 512],
            len: 0,
        }
    }
    fn flush(&mut self) {
        if self.len < self.buf.len() {
            self.buf[self.len] = b'\n';
            self.len += 1;
        }
        // SAFETY: the first `len` bytes of `buf` are initialised.
        unsafe { libc::write(2, self.buf.as_ptr().cast(), self.len) };
        self.len = 0;
    }
}

impl std::fmt::Write for Line {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let n = s.len().min(self.buf.len() - 1 - self.len);
        self.buf[self.len..self.len + n].copy_from_slice(&s.as_bytes()[..n]);
        self.len += n;
        Ok(())
    }
}

/// `object+0xoffset (symbol+0xoffset)` of an address, as far as the dynamic linker knows it.
fn describe(l: &mut Line, addr: usize) {
    // SAFETY: dladdr fills `info` or returns 0; the strings it points to live as long as the
    // object stays loaded (it is: the process is stopping).
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(addr as *const c_void, &mut info) == 0 || info.dli_fname.is_null() {
            let _ = write!(l, "{addr:#x} (in no loaded object)");
            return;
        }
        let file = CStr::from_ptr(info.dli_fname).to_str().unwrap_or("?");
        let _ = write!(
            l,
            "{addr:#x} {file}+{:#x}",
            addr.wrapping_sub(info.dli_fbase as usize)
        );
        if !info.dli_sname.is_null() {
            let sym = CStr::from_ptr(info.dli_sname).to_str().unwrap_or("?");
            let _ = write!(
                l,
                " ({sym}+{:#x})",
                addr.wrapping_sub(info.dli_saddr as usize)
            );
        }
    }
}

extern "C" fn on_fault(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut c_void) {
    let mut l = Line::new();
    let mut name = [0u8; 32];
    // SAFETY: `name` has room for the 16 bytes a thread name takes; info and ctx are the
    // kernel's, valid for the handler's duration; REG_RIP indexes x86_64's gregs.
    unsafe {
        libc::pthread_getname_np(libc::pthread_self(), name.as_mut_ptr().cast(), name.len());
        let thread = CStr::from_ptr(name.as_ptr().cast()).to_str().unwrap_or("?");
        let _ = write!(
            l,
            "CRASH: signal {sig} at address {:#x} in thread '{thread}' (tid {})",
            (*info).si_addr() as usize,
            libc::syscall(libc::SYS_gettid)
        );
        l.flush();
        #[cfg(target_arch = "x86_64")]
        {
            let uc = ctx as *const libc::ucontext_t;
            let rip = (*uc).uc_mcontext.gregs[libc::REG_RIP as usize] as usize;
            let _ = write!(l, "CRASH: instruction ");
            describe(&mut l, rip);
            l.flush();
        }
        #[cfg(not(target_arch = "x86_64"))]
        let _ = ctx;
        let mut frames = [std::ptr::null_mut::<c_void>(); 64];
        let n = backtrace(frames.as_mut_ptr(), frames.len() as c_int).max(0) as usize;
        for (i, f) in frames[..n].iter().enumerate() {
            let _ = write!(l, "CRASH: frame {i:2} ");
            describe(&mut l, *f as usize);
            l.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    /// The handler prints the frames of a real fault and the process dies of SIGSEGV: run in
    /// a child process (this test binary, this test alone, with CRASH_CHILD set).
    #[test]
    fn a_fault_prints_where_and_the_process_dies_of_it() {
        if std::env::var_os("CRASH_CHILD").is_some() {
            super::install();
            // SAFETY: none: this is the fault the test wants (a write to address 16).
            unsafe { std::ptr::write_volatile(16 as *mut u64, 1) };
            unreachable!("the write above faults");
        }
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new(exe)
            .args([
                "--exact",
                "crash::tests::a_fault_prints_where_and_the_process_dies_of_it",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("CRASH_CHILD", "1")
            .output()
            .unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(out.status.signal(), Some(libc::SIGSEGV), "{out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("CRASH: signal 11 at address 0x10"), "{err}");
        assert!(err.contains("CRASH: instruction 0x"), "{err}");
        assert!(err.contains("CRASH: frame  0"), "{err}");
    }
}
