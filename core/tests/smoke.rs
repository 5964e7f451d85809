use gpumem_core::host::Host;
use gpumem_core::*;

#[test]
fn smoke() {
    let pool = MemoryPool::<Host>::new();
    let p = pool.malloc(1000).unwrap();
    p.memset(7, 1000).unwrap();
    let mut back = vec![0u8; 1000];
    p.copy_to_host(&mut back, 1000).unwrap();
    assert!(back.iter().all(|&b| b == 7));
    let s = Stream::<Host>::non_blocking().unwrap();
    (&p + 10).memset_async(1, 10, Some(&s)).unwrap();
    s.synchronize().unwrap();
    p.copy_to_host(&mut back, 1000).unwrap();
    assert_eq!(&back[8..22], &[7, 7, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 7, 7]);
    let n = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    s.begin_capture(None).unwrap();
    let n2 = n.clone();
    p.memset_async(3, 4, Some(&s)).unwrap();
    s.launch_host_func(move || { n2.fetch_add(1, std::sync::atomic::Ordering::SeqCst); }).unwrap();
    let g = s.end_capture().unwrap();
    for _ in 0..3 { g.launch(Some(&s)).unwrap(); }
    s.synchronize().unwrap();
    assert_eq!(n.load(std::sync::atomic::Ordering::SeqCst), 3);
    drop(p);
    assert_eq!(pool.used_bytes(), 0);
    assert_eq!(pool.total_bytes(), 1024);
}
