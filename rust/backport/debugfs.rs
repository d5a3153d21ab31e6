// SPDX-License-Identifier: GPL-2.0

//! debugfs directories and read-only files rendered by Rust, whose lifetimes follow their users.
//!
//! A [`Dir`] is shared: its subdirectories and files hold it, and it is removed when the last
//! holder lets go, so a directory never goes before what is inside it (an SRQ pool that outlives
//! ibext's `remove` keeps its device's directory). A [`ShowFile`] holds the object it renders
//! (an `Arc`) and removes itself when dropped, waiting for readers still inside its callback
//! (debugfs's file proxy), before it lets go of the object: no order of drops can leave a file
//! rendering freed memory.
//!
//! debugfs failures are not errors for ibext (as for the rest of the kernel): a directory that
//! could not be made is kept as the error pointer debugfs returned, and every debugfs call
//! accepts that pointer as a parent and does nothing with it.

use crate::bindings;
use core::{
    ffi::c_void,
    fmt,
    sync::atomic::{AtomicPtr, Ordering},
};
use kernel::{
    c_str, error::from_result, ffi::c_int, prelude::*, str::CStr, sync::Arc, types::Opaque,
};

/// A dentry that ibext made and removes when dropped.
///
/// # Invariants
///
/// `self.0` is a dentry made by debugfs that nothing else removes, or an error pointer.
struct Dentry(*mut bindings::dentry);

// SAFETY: A dentry may be used and removed from any thread; `Dentry` only passes it to debugfs.
unsafe impl Send for Dentry {}
// SAFETY: `&Dentry` only allows making children and renaming, which debugfs serializes itself.
unsafe impl Sync for Dentry {}

impl Drop for Dentry {
    fn drop(&mut self) {
        // SAFETY: Ours (type invariant), or an error pointer, which debugfs ignores. Removal
        // waits for readers still inside a file's callbacks.
        unsafe { bindings::debugfs_remove(self.0) };
    }
}

/// A directory's dentry and the parent it keeps.
struct DirNode {
    /// Declared first: removed before the parent is let go.
    dentry: Dentry,
    _parent: Option<Dir>,
}

/// A debugfs directory, removed (with anything still in it) when its last holder drops it.
#[derive(Clone)]
pub(crate) struct Dir(Option<Arc<DirNode>>);

/// `/sys/kernel/debug/ibext`, while the module's [`RootDir`] exists; null otherwise.
static ROOT: AtomicPtr<bindings::dentry> = AtomicPtr::new(core::ptr::null_mut());

/// The module's debugfs directory, `/sys/kernel/debug/ibext`.
///
/// Owned by the module object, which drops it only after the client is unregistered and every
/// user of ibext is gone, so no directory made with [`Dir::new_in_root`] outlives it.
pub(crate) struct RootDir(Dir);

impl RootDir {
    /// Makes `/sys/kernel/debug/ibext` and publishes it for [`Dir::new_in_root`].
    pub(crate) fn new() -> Self {
        let dir = Dir::new(c_str!("ibext"), None);
        ROOT.store(dir.dentry(), Ordering::Release);
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
        let d = unsafe { bindings::debugfs_create_dir(name.as_char_ptr(), root) };
        // INVARIANT: a new dentry owned by nobody else, or an error pointer.
        Self::wrap(Dentry(d), None)
    }

    /// Makes a directory `name` under `parent` (kept until this one goes), or at the root of
    /// debugfs.
    pub(crate) fn new(name: &CStr, parent: Option<&Dir>) -> Self {
        let p = parent.map_or(core::ptr::null_mut(), Dir::dentry);
        // SAFETY: `name` is NUL-terminated; `p` is null, a live dentry or an error pointer, all of
        // which debugfs accepts.
        let d = unsafe { bindings::debugfs_create_dir(name.as_char_ptr(), p) };
        // INVARIANT: a new dentry owned by nobody else, or an error pointer.
        Self::wrap(Dentry(d), parent.cloned())
    }

    /// Shares `dentry`; if that cannot be allocated, the directory is removed at once.
    fn wrap(dentry: Dentry, parent: Option<Dir>) -> Self {
        Dir(Arc::new(
            DirNode {
                dentry,
                _parent: parent,
            },
            GFP_KERNEL,
        )
        .ok())
    }

    /// The dentry, as a parent for debugfs calls; an error pointer if there is none.
    fn dentry(&self) -> *mut bindings::dentry {
        // `ERR_PTR(-ENOMEM)`: never dereferenced, and ignored by debugfs as a parent.
        let no_dir = ENOMEM.to_errno() as isize as *mut bindings::dentry;
        self.0.as_ref().map_or(no_dir, |n| n.dentry.0)
    }

    /// Renames this directory in place (for a renamed device).
    pub(crate) fn rename(&self, new_name: &CStr) {
        let d = self.dentry();
        if kernel::error::from_err_ptr(d).is_err() {
            return;
        }
        // SAFETY: `d` is a live dentry (checked above, kept by `self`); its parent is the dentry
        // debugfs made it in, which outlives it.
        let parent = unsafe { (*d).d_parent };
        // SAFETY: Both dentries are live and `new_name` is NUL-terminated. A failed rename leaves
        // the old name, which is harmless.
        let _ = unsafe { bindings::debugfs_rename(parent, d, parent, new_name.as_char_ptr()) };
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

/// What a file's callback finds: the C node, the object it keeps, and the part it renders.
#[repr(C)]
struct Node<O: Send + Sync, T: Show> {
    /// First: the `data` debugfs hands back is this node.
    c: Opaque<bindings::ibext_show>,
    owner: Arc<O>,
    part: fn(&O) -> &T,
}

/// A read-only debugfs file rendering `part(owner)`, which it keeps alive.
///
/// # Invariants
///
/// `dentry` is the file made with `node` in `_dir`; `node.c.data` points to `node`.
pub(crate) struct ShowFile<O: Send + Sync, T: Show> {
    /// Declared first: the file is removed (waiting for readers) before the node goes.
    _dentry: Dentry,
    _node: KBox<Node<O, T>>,
    _dir: Dir,
}

// SAFETY: The node's C part is written once in `new`, before debugfs can see it, and only read
// afterwards (by debugfs, on any thread); the owner is `Send + Sync` and the part is `Sync`
// (bound of `Show`); the function pointer is plain data.
unsafe impl<O: Send + Sync, T: Show> Send for ShowFile<O, T> {}
// SAFETY: As for `Send`; `&ShowFile` gives access to nothing.
unsafe impl<O: Send + Sync, T: Show> Sync for ShowFile<O, T> {}

impl<O: Send + Sync, T: Show> ShowFile<O, T> {
    /// Makes file `name` in `dir`, rendering `part(&owner)`.
    pub(crate) fn new(dir: &Dir, name: &CStr, owner: Arc<O>, part: fn(&O) -> &T) -> Result<Self> {
        let node = KBox::new(
            Node {
                c: Opaque::new(bindings::ibext_show {
                    show: Some(Self::show_callback),
                    data: core::ptr::null_mut(),
                }),
                owner,
                part,
            },
            GFP_KERNEL,
        )?;
        let raw = node.c.get();
        // SAFETY: `raw` is valid; nothing reads it before the file exists. The node is on the
        // heap and is dropped only after the file is removed (field order of `ShowFile`).
        unsafe { (*raw).data = core::ptr::from_ref(&*node).cast_mut().cast() };
        // SAFETY: `name` is NUL-terminated, the parent is a dentry or an error pointer, and the
        // node outlives the file (above).
        let d = unsafe {
            bindings::ibext_shim_debugfs_create_show(name.as_char_ptr(), dir.dentry(), raw)
        };
        // INVARIANT: the file just made, with `node`, in `dir`.
        Ok(ShowFile {
            _dentry: Dentry(d),
            _node: node,
            _dir: dir.clone(),
        })
    }

    /// The `show` of the shim's `file_operations`.
    ///
    /// # Safety
    ///
    /// Called by seq_file only, for a file made by [`ShowFile::new`], with its `data`.
    unsafe extern "C" fn show_callback(m: *mut bindings::seq_file, data: *mut c_void) -> c_int {
        from_result(|| {
            // SAFETY: debugfs calls this only while the file exists, and the file is removed
            // before its node is dropped (invariant of `ShowFile`).
            let node = unsafe { &*data.cast::<Node<O, T>>() };
            // INVARIANT: `m` is the seq_file of the read in progress.
            (node.part)(&node.owner)
                .show(&mut SeqFile(m))
                .map_err(|_| ENOMEM)?;
            Ok(0)
        })
    }
}
