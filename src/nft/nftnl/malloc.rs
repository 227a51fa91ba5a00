//! glibc's malloc controls, for `crate::heap` (which says why and when): FFI calls, so they live
//! here with the crate's other `unsafe`.

#![allow(unsafe_code)]

/// Sets `M_ARENA_MAX`. Call before any thread exists.
pub fn set_arena_max(arenas: i32) {
    // SAFETY: mallopt takes two integers and only changes glibc's allocator settings.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, arenas);
    }
    #[cfg(not(target_env = "gnu"))]
    let _ = arenas;
}

/// `malloc_trim(0)`: returns the free pages of every arena to the kernel.
pub fn trim() {
    // SAFETY: malloc_trim takes no pointer and only walks glibc's own arenas.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
}
