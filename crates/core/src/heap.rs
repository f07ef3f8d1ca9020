//! The library's global allocator: mimalloc (see Cargo.toml for why), called so that ordinary
//! Rust allocations take mimalloc's plain fast path.
//!
//! Owns: the mapping from Rust's `Layout` to mimalloc calls. The `mimalloc` crate sends every
//! allocation through `mi_malloc_aligned`, whose fast path needs a free block already on the
//! page's free list; otherwise, for a size whose block is not a power of two, it over-allocates
//! from a larger size class and never collects the page's freed blocks. An allocate/free loop
//! (an NDArray created and freed) then takes the slow path on every call. Every mimalloc block
//! is a multiple of the word size from a word-aligned page start, so an alignment of at most a
//! word is met by `mi_malloc` itself; larger alignments still go through the aligned calls.

use libmimalloc_sys as mi;
use std::alloc::{GlobalAlloc, Layout};
use std::ffi::c_void;

/// The alignment every `mi_malloc` block has.
const WORD: usize = std::mem::size_of::<usize>();

pub struct Heap;

// SAFETY: every call forwards to mimalloc, which returns NULL or a block of at least `size`
// bytes at the alignment asked (by the aligned calls) or at a word's alignment (`mi_malloc`,
// used only when the layout asks for no more); `mi_free` takes blocks from either.
unsafe impl GlobalAlloc for Heap {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl's comment.
        unsafe {
            if layout.align() <= WORD {
                mi::mi_malloc(layout.size()) as *mut u8
            } else {
                mi::mi_malloc_aligned(layout.size(), layout.align()) as *mut u8
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: see the impl's comment.
        unsafe {
            if layout.align() <= WORD {
                mi::mi_zalloc(layout.size()) as *mut u8
            } else {
                mi::mi_zalloc_aligned(layout.size(), layout.align()) as *mut u8
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: `ptr` came from this allocator (GlobalAlloc's contract).
        unsafe { mi::mi_free(ptr as *mut c_void) }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from this allocator with `layout` (GlobalAlloc's contract).
        unsafe {
            if layout.align() <= WORD {
                mi::mi_realloc(ptr as *mut c_void, new_size) as *mut u8
            } else {
                mi::mi_realloc_aligned(ptr as *mut c_void, new_size, layout.align()) as *mut u8
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layouts_get_their_alignment_and_contents_survive_realloc() {
        for align in [1, 2, 4, 8, 16, 32, 64, 4096] {
            for size in [1, 7, 8, 24, 40, 104, 1000, 70_000] {
                let layout = Layout::from_size_align(size, align).unwrap();
                // SAFETY: non-zero sizes; each block is freed once with its layout.
                unsafe {
                    let p = Heap.alloc(layout);
                    assert!(!p.is_null() && p as usize % align == 0, "size {size} align {align}");
                    for i in 0..size {
                        *p.add(i) = i as u8;
                    }
                    let q = Heap.realloc(p, layout, size * 3);
                    assert!(!q.is_null() && q as usize % align == 0, "realloc size {size} align {align}");
                    assert!((0..size).all(|i| *q.add(i) == i as u8));
                    Heap.dealloc(q, Layout::from_size_align(size * 3, align).unwrap());
                    let z = Heap.alloc_zeroed(layout);
                    assert!(!z.is_null() && z as usize % align == 0);
                    assert!((0..size).all(|i| *z.add(i) == 0));
                    Heap.dealloc(z, layout);
                }
            }
        }
    }
}
