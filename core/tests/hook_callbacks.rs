//! Which callbacks a hook declares, and hooks installed or removed from inside a callback.

use std::cell::RefCell;
use std::rc::Rc;

use gpumem_core::hooks::{self, Callbacks};
use gpumem_core::host::Host;
use gpumem_core::{FreeEvent, HookResult, MallocEvent, MemoryHook, MemoryPool};

/// Logs every callback it gets, and declares `declared`.
struct Log {
    name: &'static str,
    declared: Callbacks,
    log: Rc<RefCell<Vec<String>>>,
}

impl Log {
    fn push(&self, what: &str) -> HookResult {
        self.log.borrow_mut().push(format!("{} {what}", self.name));
        Ok(())
    }
}

impl MemoryHook for Log {
    fn name(&self) -> &str {
        self.name
    }
    fn callbacks(&self) -> Callbacks {
        self.declared
    }
    fn malloc_preprocess(&self, _: &MallocEvent) -> HookResult {
        self.push("malloc_pre")
    }
    fn malloc_postprocess(&self, _: &MallocEvent) -> HookResult {
        self.push("malloc_post")
    }
    fn free_preprocess(&self, _: &FreeEvent) -> HookResult {
        self.push("free_pre")
    }
    fn free_postprocess(&self, _: &FreeEvent) -> HookResult {
        self.push("free_post")
    }
}

#[test]
fn only_the_declared_callbacks_are_called() {
    let pool = MemoryPool::<Host>::new();
    drop(pool.malloc(512).unwrap());
    let log = Rc::new(RefCell::new(Vec::new()));
    let post =
        hooks::install(Log { name: "post", declared: Callbacks::POSTPROCESS, log: log.clone() }).unwrap();
    let all = hooks::install(Log { name: "all", declared: Callbacks::ALL, log: log.clone() }).unwrap();
    let malloc_pre = hooks::install(Log {
        name: "malloc_pre",
        declared: Callbacks::MALLOC_PREPROCESS | Callbacks::ALLOC_PREPROCESS,
        log: log.clone(),
    })
    .unwrap();
    drop(pool.malloc(512).unwrap());
    assert_eq!(
        *log.borrow(),
        [
            "all malloc_pre",
            "malloc_pre malloc_pre",
            "post malloc_post",
            "all malloc_post",
            "all free_pre",
            "post free_post",
            "all free_post",
        ]
    );
    drop((post, all, malloc_pre));
    // A hook declaring nothing is still installed: the pool's hook path runs, and calls nothing.
    log.borrow_mut().clear();
    let none = hooks::install(Log { name: "none", declared: Callbacks::NONE, log: log.clone() }).unwrap();
    assert!(hooks::active());
    assert_eq!(hooks::installed(), ["none"]);
    drop(pool.malloc(512).unwrap());
    assert!(log.borrow().is_empty());
    drop(none);
    assert!(!hooks::active());
}

#[test]
fn callbacks_combine() {
    assert!(Callbacks::ALL.contains(Callbacks::POSTPROCESS | Callbacks::PREPROCESS));
    assert_eq!(Callbacks::POSTPROCESS | Callbacks::PREPROCESS, Callbacks::ALL);
    assert!(!Callbacks::POSTPROCESS.contains(Callbacks::FREE_PREPROCESS));
    assert!(Callbacks::NONE.union(Callbacks::FREE_POSTPROCESS).contains(Callbacks::FREE_POSTPROCESS));
}

/// On its first `malloc_postprocess`, installs `Log` "late" and removes "victim".
struct Installer {
    log: Rc<RefCell<Vec<String>>>,
    late: RefCell<Option<hooks::HookGuard<Log>>>,
    victim: RefCell<Option<hooks::HookGuard<Log>>>,
}

impl MemoryHook for Installer {
    fn name(&self) -> &str {
        "installer"
    }
    fn malloc_postprocess(&self, _: &MallocEvent) -> HookResult {
        if self.late.borrow().is_none() {
            let late = hooks::install(Log { name: "late", declared: Callbacks::ALL, log: self.log.clone() })?;
            *self.late.borrow_mut() = Some(late);
            drop(self.victim.borrow_mut().take());
        }
        Ok(())
    }
}

#[test]
fn an_operation_calls_the_hooks_installed_when_it_began() {
    let pool = MemoryPool::<Host>::new();
    let log = Rc::new(RefCell::new(Vec::new()));
    let installer =
        hooks::install(Installer { log: log.clone(), late: RefCell::new(None), victim: RefCell::new(None) })
            .unwrap();
    let victim = hooks::install(Log { name: "victim", declared: Callbacks::ALL, log: log.clone() }).unwrap();
    *installer.victim.borrow_mut() = Some(victim);
    let p = pool.malloc(512).unwrap();
    // "victim" was removed during this malloc's post callbacks, and still ran in them; "late"
    // was installed then, and runs from the next callback on.
    assert_eq!(*log.borrow(), ["victim malloc_pre", "victim malloc_post"]);
    assert_eq!(hooks::installed(), ["installer", "late"]);
    drop(p);
    assert_eq!(log.borrow()[2..], ["late free_pre", "late free_post"]);
    drop(installer);
    assert!(hooks::installed().is_empty());
    assert!(!hooks::active());
}
