// SPDX-License-Identifier: GPL-2.0

//! Owned debugfs directories and read-only files rendered by Rust.
//!
//! debugfs failures are not errors for ibext (as for the rest of the kernel): a directory that
//! could not be made is kept as the error pointer debugfs returned, and every debugfs call
//! accepts that pointer as a parent and does nothing with it.

use crate::bindings;
use core::{
    ffi::c_void,
    fmt,
    marker::PhantomPinned,
    pin::Pin,
    sync::atomic::{AtomicPtr, Ordering},
};
use kernel::{
    c_str, error::from_result, ffi::c_int, prelude::*, str::CStr, sync::Arc, types::Opaque,
};

/// A debugfs directory, removed with everything in it when dropped.
///
/// # Invariants
///
/// `self.0` is either a dentry returned by `debugfs_create_dir` that nothing else removes, or an
/// error pointer returned by it.
pub(crate) struct Dir(*mut bindings::dentry);

// SAFETY: A dentry may be used and removed from any thread; `Dir` only passes it to debugfs.
unsafe impl Send for Dir {}
// SAFETY: `&Dir` only allows making children and renaming, which debugfs serializes itself.
unsafe impl Sync for Dir {}

/// `/sys/kernel/debug/ibext`, while the module's [`RootDir`] exists; null otherwise.
static ROOT: AtomicPtr<bindings::dentry> = AtomicPtr::new(core::ptr::null_mut());

/// The module's debugfs directory, `/sys/kernel/debug/ibext`.
///
/// Owned by the module object, which drops it only after the client is unregistered, so every
/// directory made with [`Dir::new_in_root`] is gone before the root is removed.
pub(crate) struct RootDir(Dir);

impl RootDir {
    /// Makes `/sys/kernel/debug/ibext` and publishes it for [`Dir::new_in_root`].
    pub(crate) fn new() -> Self {
        let dir = Dir::new(c_str!("ibext"), None);
        ROOT.store(dir.0, Ordering::Release);
        RootDir(dir)
    }

    /// Returns the root as a parent for files.
    pub(crate) fn dir(&self) -> &Dir {
        &self.0
    }
}

impl Drop for RootDir {
    fn drop(&mut self) {
        ROOT.store(core::ptr::null_mut(), Ordering::Release);
    }
}

impl Dir {
    /// Makes a directory `name` in the module's root directory.
    pub(crate) fn new_in_root(name: &CStr) -> Self {
        let root = ROOT.load(Ordering::Acquire);
        // SAFETY: `name` is NUL-terminated; `root` is null, or the live root dentry (or an error
        // pointer), which outlives this directory (see `RootDir`).
        // INVARIANT: the result is a new dentry owned by nobody else, or an error pointer.
        Dir(unsafe { bindings::debugfs_create_dir(name.as_char_ptr(), root) })
    }

    /// Makes a directory `name` under `parent`, or at the debugfs root.
    pub(crate) fn new(name: &CStr, parent: Option<&Dir>) -> Self {
        let parent = parent.map_or(core::ptr::null_mut(), |p| p.0);
        // SAFETY: `name` is NUL-terminated; `parent` is null, a live dentry or an error pointer
        // (the type invariant of `Dir`), all of which debugfs accepts.
        // INVARIANT: the result is a new dentry owned by nobody else, or an error pointer.
        Dir(unsafe { bindings::debugfs_create_dir(name.as_char_ptr(), parent) })
    }

    /// Renames this directory in place (for a renamed device).
    pub(crate) fn rename(&self, new_name: &CStr) {
        if kernel::error::from_err_ptr(self.0).is_err() {
            return;
        }
        // SAFETY: `self.0` is a live dentry (checked above); its parent is the dentry debugfs
        // made it in, which outlives it.
        let parent = unsafe { (*self.0).d_parent };
        // SAFETY: Both dentries are live and `new_name` is NUL-terminated. A failed rename leaves
        // the old name, which is harmless.
        let _ = unsafe { bindings::debugfs_rename(parent, self.0, parent, new_name.as_char_ptr()) };
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        // SAFETY: By the type invariant we own `self.0` (or it is an error pointer, which
        // debugfs ignores). Removal waits for readers still inside a file's callbacks.
        unsafe { bindings::debugfs_remove(self.0) };
    }
}

/// Something that renders a debugfs file.
pub(crate) trait Show: Sync {
    /// Writes the file's contents.
    fn show(&self, m: &mut SeqFile) -> fmt::Result;
}

/// The `seq_file` a [`Show`] implementation writes to.
///
/// # Invariants
///
/// `self.0` is the live `seq_file` of a read in progress.
pub(crate) struct SeqFile(*mut bindings::seq_file);

impl fmt::Write for SeqFile {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // SAFETY: `self.0` is live (type invariant) and `s` is valid for `s.len()` bytes. An
        // overflowing seq_file is retried by the core with a bigger buffer, so the result needs
        // no handling here.
        unsafe { bindings::seq_write(self.0, s.as_ptr().cast(), s.len()) };
        Ok(())
    }
}

/// A read-only debugfs file whose contents come from `T::show`.
///
/// Lives inside the pinned object it shows, so that the pointer debugfs keeps stays valid; the
/// owner removes the file (by dropping its [`Dir`]) before the object goes away.
///
/// # Invariants
///
/// Once [`ShowFile::create`] ran, `node.data` points to a `T` that outlives the file.
#[pin_data]
pub(crate) struct ShowFile<T: Show> {
    #[pin]
    node: Opaque<bindings::ibext_show>,
    _owner: core::marker::PhantomData<T>,
    #[pin]
    _pin: PhantomPinned,
}

// SAFETY: `node` is written only by `create`, before debugfs can see it; afterwards only the
// debugfs callback reads it, on any thread, and the `T` it points to is `Sync` (bound of `Show`).
unsafe impl<T: Show> Send for ShowFile<T> {}
// SAFETY: As for `Send`; `&ShowFile` allows nothing but `create`, which takes a pinned reference
// and is called once by the owner.
unsafe impl<T: Show> Sync for ShowFile<T> {}

impl<T: Show> ShowFile<T> {
    /// An initializer for a file not yet created.
    pub(crate) fn new() -> impl PinInit<Self> {
        pin_init!(Self {
            node <- Opaque::ffi_init(|p: *mut bindings::ibext_show| {
                // SAFETY: `p` is valid for writes (guaranteed by `ffi_init`).
                unsafe {
                    p.write(bindings::ibext_show {
                        show: Some(Self::show_callback),
                        data: core::ptr::null_mut(),
                    })
                };
            }),
            _owner: core::marker::PhantomData,
            _pin: PhantomPinned,
        })
    }

    /// Creates file `name` in `dir`, rendering `owner`.
    ///
    /// # Safety
    ///
    /// The file must be removed (by dropping `dir`) before `self` or `owner` is dropped or
    /// moved.
    pub(crate) unsafe fn create(self: Pin<&Self>, name: &CStr, dir: &Dir, owner: &T) {
        let node = self.node.get();
        // SAFETY: `node` is valid and pinned; nothing reads `data` before the file exists.
        // INVARIANT: `data` now points to `owner`, which outlives the file (caller contract).
        unsafe { (*node).data = core::ptr::from_ref(owner).cast_mut().cast() };
        // SAFETY: `name` is NUL-terminated, `dir.0` is a dentry or an error pointer, and `node`
        // stays valid until the file is removed (caller contract).
        unsafe { bindings::ibext_shim_debugfs_create_show(name.as_char_ptr(), dir.0, node) };
    }

    /// The `show` of the shim's `file_operations`.
    ///
    /// # Safety
    ///
    /// Called by seq_file only, for a file made by [`ShowFile::create`], with its `data`.
    unsafe extern "C" fn show_callback(m: *mut bindings::seq_file, data: *mut c_void) -> c_int {
        from_result(|| {
            // SAFETY: debugfs only calls this while the file exists, and the file is removed
            // before the owner is dropped (contract of `create`), so `data` is a live `T`.
            let owner = unsafe { &*data.cast::<T>() };
            // INVARIANT: `m` is the seq_file of the read in progress.
            owner.show(&mut SeqFile(m)).map_err(|_| ENOMEM)?;
            Ok(0)
        })
    }
}

/// A debugfs directory with one read-only file rendering a shared object, which the file keeps
/// alive: removed (waiting for readers) when dropped, before the file's node and its reference
/// to the object go.
///
/// # Invariants
///
/// `node.data` points to `*_owner`; the file made with `node` is inside `dir`.
pub(crate) struct ShowDir<T: Show> {
    /// Declared first: removed before `_node` and `_owner` are dropped.
    _dir: Dir,
    _node: KBox<Opaque<bindings::ibext_show>>,
    _owner: Arc<T>,
}

impl<T: Show> ShowDir<T> {
    /// Makes file `name` in `dir`, rendering `owner`; `dir` is removed with the result.
    pub(crate) fn new(dir: Dir, name: &CStr, owner: Arc<T>) -> Result<Self> {
        let node = KBox::new(
            Opaque::new(bindings::ibext_show {
                show: Some(ShowFile::<T>::show_callback),
                data: core::ptr::from_ref::<T>(&owner).cast_mut().cast(),
            }),
            GFP_KERNEL,
        )?;
        // SAFETY: `name` is NUL-terminated, `dir.0` is a dentry or an error pointer, and `node`
        // is heap-allocated and outlives the file, which is removed with `dir` first (field
        // order); `data` is kept alive by `_owner`, dropped last.
        unsafe { bindings::ibext_shim_debugfs_create_show(name.as_char_ptr(), dir.0, node.get()) };
        // INVARIANT: as set up above.
        Ok(ShowDir {
            _dir: dir,
            _node: node,
            _owner: owner,
        })
    }
}
